// OffloadEngine batches: buffers sized by the memory plan at the prefill (when the prompt
// lengths, and so the KV budgets, are known), the per-step lengths and inputs, and the logits.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "engine/offload_impl.h"

namespace flexh2o {

Buffer OffloadEngine::Impl::alloc(MemKind kind, Tier t, size_t bytes, const std::string& what) {
  Buffer b;
  if (!bytes) return b;
  if (kind == MemKind::kPinned && t == Tier::kHost)
    for (Buffer& s : spare_host)
      if (s.size() == bytes) {
        std::swap(s, spare_host.back());
        b = std::move(spare_host.back());
        spare_host.pop_back();
        reused_bytes += bytes;
        return b;
      }
  Status s = dev.allocate(kind, bytes, *e.budgets_[size_t(t)], what, &b);
  if (!s.ok() && !spare_host.empty()) {  // the spares' bytes may be what the budget lacks
    spare_host.clear();
    s = dev.allocate(kind, bytes, *e.budgets_[size_t(t)], what, &b);
  }
  fail_unless(s);
  return b;
}

Status OffloadEngine::Impl::charge_host(uint64_t bytes, const std::string& what, TierCharge* out) {
  Status s = TierCharge::reserve(*e.budgets_[1], bytes, what, out);
  if (!s.ok() && !spare_host.empty()) {
    spare_host.clear();
    s = TierCharge::reserve(*e.budgets_[1], bytes, what, out);
  }
  return s;
}

void OffloadEngine::Impl::retire(Buffer& b) {
  if (b && b.kind() == MemKind::kPinned) spare_host.push_back(std::move(b));
  b = Buffer();
}

void OffloadEngine::Impl::fail_unless(const Status& s) {
  if (s.ok()) return;
  if (!allocated && batch == 0) FH_FAIL(s.message());
  const MemoryPlan need =
      plan_memory(c, WeightBytes::of(e.placement_), batch_policy(batch), dims(), {dev.kind(), kvdt, adt});
  FH_FAIL(s.message(), "\nthis batch (", batch, " sequences, prompt ", s_max, ", capacity ", capacity,
          ") needs per tier:\n", need.breakdown(), batch_fit_remedy(user_policy != nullptr));
}

BatchDims OffloadEngine::Impl::dims() const {
  return dims_of({window, kv_policy, n_classes}, batch, s_max, capacity, logit_rows, kvc[0].budgets);
}

OffloadEngine::Impl::Sizing OffloadEngine::Impl::sizing(int64_t cap) const {
  Sizing z;
  z.window = e.opts_.window_cap ? full_cache_window(c, user_policy != nullptr, cap) : 0;
  z.policy = z.window ? window_policy.get() : user_policy;
  z.classes = z.window && count_sliding_layers(c) < c.n_layers ? 2 : 1;
  return z;
}

std::vector<KvBudget> OffloadEngine::Impl::class_budgets(const Sizing& z, int cls, int64_t B,
                                                         const std::function<int64_t(int64_t)>& length) const {
  // Under a window cap of a model with full-attention layers, class 0 is those: unbounded.
  std::vector<KvBudget> budgets;
  for (int64_t b = 0; b < B && z.policy; ++b)
    budgets.push_back(z.classes > 1 && cls == 0 ? KvBudget{.unbounded = true} : z.policy->budget(length(b)));
  return budgets;
}

BatchDims OffloadEngine::Impl::dims_of(const Sizing& z, int64_t B, int64_t rows, int64_t cap, int64_t logits,
                                       const std::vector<KvBudget>& first_class) const {
  BatchDims d;
  d.batch = B;
  d.rows = std::max<int64_t>(rows, 1);
  d.capacity = std::max<int64_t>(cap, 1);
  d.logit_rows = logits;
  d.head_logits_bytes = head_logits_bytes;
  d.kv_policy = z.policy != nullptr;
  d.hidden_in = hidden_in;
  d.hidden_out = hidden_out;
  d.scores = z.policy && z.policy->needs_scores();
  d.window = z.window;
  d.window_layers = z.window ? count_sliding_layers(c) : 0;
  bool bounded = z.policy != nullptr && !first_class.empty();
  for (const KvBudget& b : first_class) {
    if (b.unbounded) bounded = false;
    else d.budget_max = std::max(d.budget_max, b.total());
  }
  if (!bounded) d.budget_max = 0;
  return d;
}

MemoryPlan OffloadEngine::Impl::plan_batch(std::span<const int64_t> lengths, int64_t rows, int64_t cap) const {
  const int64_t B = int64_t(lengths.size());
  const Sizing z = sizing(cap);
  // A batch that cannot rewind never refills (reserve_rows() holds nothing for it): its widest
  // step is its prefill, as wide as its longest prompt.
  if (!rewindable(z)) rows = *std::max_element(lengths.begin(), lengths.end());
  auto length = [&](int64_t b) { return lengths[size_t(b)]; };
  // What the prefill would refuse first: a budget wider than a sliding window the sequences pass.
  for (int i = 1; i < z.classes; ++i) check_window_budgets(c, class_budgets(z, i, B, length), cap, lengths);
  const std::vector<KvBudget> budgets = class_budgets(z, 0, B, length);
  check_window_budgets(c, budgets, cap, lengths);
  return plan_memory(c, WeightBytes::of(e.placement_), batch_policy(B), dims_of(z, B, rows, cap, 1, budgets),
                     {dev.kind(), kvdt, adt});
}

Policy OffloadEngine::Impl::batch_policy(int64_t B) const {
  Policy q = p;  // micro-batches of gpu_batch_size as allocate_batch() makes them, the last the rest
  q.gpu_batch_size = std::clamp<int64_t>(B, 1, p.gpu_batch_size);
  q.num_gpu_batches = (std::max<int64_t>(B, 1) + q.gpu_batch_size - 1) / q.gpu_batch_size;
  return q;
}

uint64_t OffloadEngine::Impl::kv_disk_file_bytes(const MemoryPlan& plan, int classes, int l, int64_t n_disk) const {
  return uint64_t(n_disk) * plan.slots(classes > 1 && c.attention_window(l) > 0).home_seq;
}

uint64_t OffloadEngine::Impl::kv_disk_space(const MemoryPlan& plan, int classes, int64_t B) const {
  uint64_t space = 0;
  for (int64_t first = 0; first < B; first += p.gpu_batch_size) {
    const int64_t n_disk = split_kv(std::min(p.gpu_batch_size, B - first), p).n_disk;
    for (int l = 0; l < c.n_layers && n_disk > 0; ++l)
      space += DiskStore::entry_bytes(kv_disk_file_bytes(plan, classes, l, n_disk));
  }
  return space;
}

void OffloadEngine::Impl::begin_batch(int64_t B, int64_t cap) {
  // Free the previous batch's buffers, keeping the pinned ones for the prefill to reuse; the new
  // ones are sized at the prefill.
  dev.synchronize();
  if (allocated) spare_dims = dims();
  for (MicroBatch& mb : mbs) {
    // Its KV files go before this batch's are created: check_batch weighs a batch's files against
    // the disk's free space alone, and a file renamed over holds its blocks until then.
    for (const std::string& name : mb.kv_disk) e.store_->remove(name).throw_if_error();
    for (Buffer& b : mb.kv_host) retire(b);
    retire(mb.hidden_host);
  }
  mbs.clear();
  for (auto* slots : {&kv_stage_device, &kv_stage_host, &scores_device, &scores_host, &keep_host,
                      &keep_device, &hidden_slot, &qkv_pipe, &attn_pipe, &qkv_host, &attn_host})
    for (auto& b : *slots) retire(b);
  for (Buffer* b : {&qkv_step, &attn_step, &inputs_device, &inputs_host, &logits_device, &logits_host,
                    &hidden_in_device, &hidden_in_host, &hidden_out_device, &hidden_out_host})
    retire(*b);
  if (!allocated) spare_host.clear();  // a prefill that failed midway: its buffers fit no plan
  pipe_rows = 0;
  logit_rows = 1;
  head_logits_bytes = e.opts_.head_logits_bytes;
  batch = B;
  capacity = cap;
  allocated = false;
  s_max = 0;
  rows_reserved = 0;
  budget_lengths.clear();
  const Sizing z = sizing(cap);
  window = z.window;
  kv_policy = z.policy;
  n_classes = z.classes;
  for (KvClass& k : kvc) {
    k.budgets.clear();
    k.len_before.assign(size_t(B), 0);
    k.len_after.assign(size_t(B), 0);
    k.len_final.assign(size_t(B), 0);
  }
  seen.assign(size_t(B), 0);
}

void OffloadEngine::Impl::allocate_batch(const int32_t* real_rows) {
  const auto t0 = std::chrono::steady_clock::now();
  struct FreeSpares {  // on every way out: a refused batch must not keep the last one's pages
    std::vector<Buffer>& spares;
    ~FreeSpares() { spares.clear(); }
  } free_spares{spare_host};
  FH_CHECK(mbs.empty(), "allocate_batch() after a batch was allocated");
  // A batch refused midway (a budget, a full disk) leaves no micro-batches and no KV files behind
  // for the next one to need room beside: micro-batches join mbs as they are built, and unless the
  // batch is whole they and their files go on the way out.
  struct DropPartial {
    Impl& im;
    ~DropPartial() {
      if (im.allocated) return;
      for (MicroBatch& mb : im.mbs)
        for (const std::string& name : mb.kv_disk) {
          // A destructor during unwinding: a file that stays is logged (the store's close
          // removes it), nothing is thrown.
          std::string note;
          try {
            if (const Status st = im.e.store_->remove(name); !st.ok()) note = st.message();
          } catch (const std::exception& x) {
            note = detail::concat("cannot remove KV file ", name, ": ", x.what());
          }
          try {
            if (!note.empty()) im.say(note);
          } catch (...) {  // a caller's notice that throws: nothing more to say
          }
        }
      im.mbs.clear();
    }
  } drop_partial{*this};
  s_max = std::max(T, rows_reserved);
  auto length = [&](int64_t b) -> int64_t {
    return !budget_lengths.empty() ? budget_lengths[size_t(b)] : real_rows ? real_rows[b] : T;
  };
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < batch; ++b) lengths.push_back(length(b));
  for (int i = 0; i < n_classes; ++i) {
    kvc[size_t(i)].budgets = class_budgets({window, kv_policy, n_classes}, i, batch, length);
    check_window_budgets(c, kvc[size_t(i)].budgets, capacity, lengths);
  }
  plan = plan_memory(c, WeightBytes::of(e.placement_), batch_policy(batch), dims(), {dev.kind(), kvdt, adt});
  if (!(dims() == spare_dims)) spare_host.clear();  // other sizes: free them before allocating
  static_cast<KvSlots&>(kvc[0]) = plan.slots(false);
  static_cast<KvSlots&>(kvc[1]) = plan.slots(true);
  const int64_t L = c.n_layers;
  int64_t n_max = 0, off_max = 0, nk_max = 0;
  for (int64_t first = 0, k = 0; first < batch; first += p.gpu_batch_size, ++k) {
    MicroBatch& mb = mbs.emplace_back();
    mb.first = first;
    mb.n = std::min(p.gpu_batch_size, batch - first);
    mb.split = split_kv(mb.n, p);
    const KvSplit& sp = mb.split;
    n_max = std::max(n_max, mb.n);
    off_max = std::max(off_max, sp.n_host + sp.n_disk);
    nk_max = std::max(nk_max, sp.n_disk);
    uint64_t state_bytes = 0;
    for (int l = 0; l < L; ++l) {
      const KvClass& kc = kv_class(l);
      const std::string tag = "KV layer " + std::to_string(l) + " micro-batch " + std::to_string(k);
      mb.kv_device.push_back(alloc(MemKind::kDevice, Tier::kDevice, size_t(sp.n_device) * kc.device_seq, tag));
      mb.kv_host.push_back(alloc(MemKind::kPinned, Tier::kHost, size_t(sp.n_host) * kc.home_seq, tag));
      if (sp.n_disk > 0) {
        const uint64_t bytes = kv_disk_file_bytes(plan, n_classes, l, sp.n_disk);
        mb.kv_disk_charge.emplace_back();
        fail_unless(TierCharge::reserve(*e.budgets_[2], bytes, tag, &mb.kv_disk_charge.back()));
        // A per-run name: concurrent runs on one directory never share a KV file, and it is
        // removed when the store closes (after a failure too).
        const std::string g = group ? "kv.g" + std::to_string(group) + ".L" : "kv.L";
        mb.kv_disk.push_back(e.store_->run_name(g + std::to_string(l) + ".mb" + std::to_string(k)));
        e.store_->create(mb.kv_disk.back(), bytes).throw_if_error();
      }
      if (kv_policy) {  // a class that never evicts keeps no state (evict_args passes none)
        mb.policy_state.emplace_back();
        if (kc.evicts()) mb.policy_state.back().reset(mb.n, c.n_kv_heads, kc.cap_h);
        state_bytes += mb.policy_state.back().bytes();
      }
    }
    if (state_bytes)
      fail_unless(charge_host(state_bytes, "KV policy state micro-batch " + std::to_string(k), &mb.policy_charge));
    const size_t hidden = size_t(mb.n * s_max * c.hidden) * es_a;
    if (p.act_cpu_percent == 100) mb.hidden_host = alloc(MemKind::kPinned, Tier::kHost, hidden, "hidden states");
    else mb.hidden_device = alloc(MemKind::kDevice, Tier::kDevice, hidden, "hidden states");
  }
  int64_t decide_cap = 0;  // the widest prefill row of a class that evicts
  for (int i = 0; i < n_classes; ++i)
    if (kv_policy && kvc[size_t(i)].evicts()) decide_cap = std::max(decide_cap, kvc[size_t(i)].cap_w);
  prefill_state = KvPolicyState{};
  prefill_state_charge = TierCharge();
  if (decide_cap) {
    prefill_state.reset(n_max, c.n_kv_heads, decide_cap);
    fail_unless(charge_host(prefill_state.bytes(), "KV policy state (prefill)", &prefill_state_charge));
  }
  for (int s = 0; s < 2; ++s) {
    const size_t i = size_t(s);
    kv_stage_device[i] = alloc(MemKind::kDevice, Tier::kDevice, size_t(off_max) * plan.kv_device_seq, "KV staging");
    kv_stage_host[i] = alloc(MemKind::kPinned, Tier::kHost, kv_disk_stage_bytes(nk_max, plan.kv_home_seq), "KV disk staging");
    // Scores and keep lists hold any layer's rows: the widest class's (MemoryPlan::cap_w).
    scores_device[i] = alloc(MemKind::kDevice, Tier::kDevice, plan.scores, "attention scores");
    scores_host[i] = alloc(MemKind::kPinned, Tier::kHost, plan.scores, "attention scores");
    keep_host[i] = alloc(MemKind::kPinned, Tier::kHost, plan.keep, "keep lists");
    keep_device[i] = alloc(MemKind::kDevice, Tier::kDevice, plan.keep, "keep lists");
    if (p.act_cpu_percent == 100) hidden_slot[i] = alloc(MemKind::kDevice, Tier::kDevice, plan.hidden, "hidden slots");
  }
  qkv_step = alloc(MemKind::kDevice, Tier::kDevice, size_t(n_max * s_max) * plan.qkv_rows, "q/k/v rows");
  attn_step = alloc(MemKind::kDevice, Tier::kDevice, size_t(n_max * s_max) * plan.attn_rows, "attention rows");
  inputs_device = alloc(MemKind::kDevice, Tier::kDevice, plan.inputs, "step inputs");
  inputs_host = alloc(MemKind::kPinned, Tier::kHost, plan.inputs, "step inputs");
  logits_host = alloc(MemKind::kPinned, Tier::kHost, size_t(plan.logits_host), "logits");
  hidden_in_device = alloc(MemKind::kDevice, Tier::kDevice, plan.hidden_in, "stage hidden rows in");
  hidden_in_host = alloc(MemKind::kPinned, Tier::kHost, plan.hidden_in, "stage hidden rows in");
  hidden_out_device = alloc(MemKind::kDevice, Tier::kDevice, plan.hidden_out, "stage hidden rows out");
  hidden_out_host = alloc(MemKind::kPinned, Tier::kHost, plan.hidden_out, "stage hidden rows out");
  scratch = TierCharge();
  scratch = dev.reserve(c, n_max * s_max, n_max, *e.budgets_[0]);
  // Last: a scoring step's larger slot (more head rows a call) is worth its bytes only where the
  // device budget has them after everything the batch needs; else the generation slot.
  Status s = plan.logits ? dev.allocate(MemKind::kDevice, size_t(plan.logits), *e.budgets_[0], "logits", &logits_device)
                         : Status::Ok();
  if (!s.ok() && plan.logits > uint64_t(batch * c.vocab_size) * 4) {
    head_logits_bytes = 0;
    plan = plan_memory(c, WeightBytes::of(e.placement_), batch_policy(batch), dims(), {dev.kind(), kvdt, adt});
    s = dev.allocate(MemKind::kDevice, size_t(plan.logits), *e.budgets_[0], "logits", &logits_device);
  }
  fail_unless(s);
  dirty_lo.assign(size_t(L), std::vector<int32_t>(size_t(batch * c.n_kv_heads), 0));
  dirty_hi.assign(size_t(L), std::vector<int32_t>(size_t(batch * c.n_kv_heads), 0));
  spare_host.clear();  // here, not only in free_spares: freeing pinned pages is setup time too
  allocated = true;
  setup_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void OffloadEngine::Impl::ensure_pipeline(int64_t rows_per_seq) {
  int64_t n_max = 0, off_max = 0;
  for (const MicroBatch& mb : mbs) {
    n_max = std::max(n_max, mb.n);
    off_max = std::max(off_max, mb.split.n_host + mb.split.n_disk);
  }
  if (pipe_rows >= n_max * rows_per_seq) return;
  pipe_rows = n_max * rows_per_seq;
  const size_t off_rows = size_t(off_max * rows_per_seq);
  for (size_t i = 0; i < 2; ++i) {
    for (Buffer* b : {&qkv_pipe[i], &attn_pipe[i], &qkv_host[i], &attn_host[i]}) *b = Buffer();
    qkv_pipe[i] = alloc(MemKind::kDevice, Tier::kDevice, size_t(pipe_rows) * plan.qkv_rows, "q/k/v rows (host attention)");
    attn_pipe[i] = alloc(MemKind::kDevice, Tier::kDevice, size_t(pipe_rows) * plan.attn_rows, "attention rows (host attention)");
    qkv_host[i] = alloc(MemKind::kPinned, Tier::kHost, off_rows * plan.qkv_rows, "host attention rows");
    attn_host[i] = alloc(MemKind::kPinned, Tier::kHost, off_rows * plan.attn_rows, "host attention rows");
  }
}

void OffloadEngine::Impl::prepare_step(const int32_t* step_ids, const int32_t* step_pos, int64_t steps_T,
                                       const int32_t* real_rows) {
  FH_CHECK(batch > 0, "begin_batch() first");
  FH_CHECK(steps_T > 0, "step needs at least one token");
  T = steps_T;
  prefill = !allocated;
  FH_CHECK(step_logit_rows >= 1 && step_logit_rows <= T, "logits of ", step_logit_rows, " rows of a step of ", T);
  if (prefill) {
    logit_rows = step_logit_rows;
    allocate_batch(real_rows);
  }
  FH_CHECK(T <= s_max, "step of ", T, " rows after a prefill of ", s_max);
  FH_CHECK(step_logit_rows <= logit_rows, "logits of ", step_logit_rows, " rows after a first step of ", logit_rows);
  for (int i = 0; i < n_classes; ++i) {
    KvClass& k = kvc[size_t(i)];
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t add = real_rows ? real_rows[b] : T;
      FH_CHECK(add >= 0 && add <= T, "real rows ", add, " outside [0, ", T, "]");
      k.len_after[size_t(b)] = int32_t(k.len_before[size_t(b)] + add);
      FH_CHECK(k.len_after[size_t(b)] <= k.cap_w, "KV cache full: sequence ", b, " needs ", k.len_after[size_t(b)],
               " slots, capacity ", k.cap_w);
      int64_t keep = k.len_after[size_t(b)];
      if (!k.budgets.empty()) keep = k.budgets[size_t(b)].kept(keep);
      FH_CHECK(keep <= k.cap_h, "KV home holds ", k.cap_h, " slots, sequence keeps ", keep);
      k.len_final[size_t(b)] = int32_t(keep);
    }
  }
  const int64_t M = batch * T;
  for (int64_t i = 0; i < M; ++i) {
    FH_CHECK(step_pos[i] >= 0 && step_pos[i] < c.max_positions, "position ", step_pos[i], " outside the model's ",
             c.max_positions, " positions");
    FH_CHECK(step_ids[i] >= 0 && step_ids[i] < c.vocab_size, "token id ", step_ids[i], " outside the vocabulary [0, ",
             c.vocab_size, ")");
  }
  gather_rows = token_streamed && M < c.vocab_size;
  // Inputs: ids | positions | OPT position rows | local ids | seq_keys of each class, laid out
  // for this T.
  int32_t* h = inputs_host.as<int32_t>();
  std::memcpy(h, step_ids, size_t(M) * 4);
  std::memcpy(h + M, step_pos, size_t(M) * 4);
  for (int64_t i = 0; i < M; ++i) h[2 * M + i] = step_pos[i] + int32_t(c.position_offset());
  for (int64_t i = 0; i < M; ++i) h[3 * M + i] = int32_t(i);
  for (int i = 0; i < n_classes; ++i)
    std::memcpy(h + 4 * M + i * batch, kvc[size_t(i)].len_after.data(), size_t(batch) * 4);
  const size_t bytes = size_t(4 * M + n_classes * batch) * 4;
  dev.host_access(kMainAgent, h, bytes, true);
  dev.begin_schedule();
  dev.copy(Queue::kHostToDevice, inputs_device.data(), h, bytes);
  if (hidden_in) {
    const size_t rows_bytes = size_t(M * c.hidden) * es_a;
    FH_CHECK(step_hidden_in.size() == rows_bytes, "stage input of ", step_hidden_in.size(), " bytes; ", M,
             " rows of ", c.hidden, " need ", rows_bytes);
    std::memcpy(hidden_in_host.data(), step_hidden_in.data(), rows_bytes);
    dev.host_access(kMainAgent, hidden_in_host.data(), rows_bytes, true);
    dev.copy(Queue::kHostToDevice, hidden_in_device.data(), hidden_in_host.data(), rows_bytes);
  }
  dev.wait(Queue::kCompute, dev.record(Queue::kHostToDevice));
  int32_t* d = inputs_device.as<int32_t>();
  in_ids = d, in_pos = d + M, in_pos_rows = d + 2 * M, in_local = d + 3 * M, in_keys = d + 4 * M;
}

StepRows OffloadEngine::Impl::rows(int k, int l) const {
  const MicroBatch& mb = mbs[size_t(k)];
  const int64_t M = batch * T, off = mb.first * T;
  const int32_t* h = inputs_host.as<int32_t>();
  StepRows r;
  r.n = mb.n;
  r.T = T;
  const int64_t ids_at = gather_rows ? 3 * M : 0;
  r.ids = (gather_rows ? in_local : in_ids) + off;
  r.positions = in_pos + off;
  r.pos_rows = in_pos_rows + off;
  const int64_t cls = class_of(l);
  const std::vector<int32_t>& len_after = kvc[size_t(cls)].len_after;
  r.seq_keys = in_keys + cls * batch + mb.first;
  r.host_ids = h + ids_at + off;
  r.host_positions = h + M + off;
  r.host_pos_rows = h + 2 * M + off;
  r.host_seq_keys = h + 4 * M + cls * batch + mb.first;
  for (int64_t b = mb.first; b < mb.first + mb.n; ++b) r.max_keys = std::max<int64_t>(r.max_keys, len_after[size_t(b)]);
  return r;
}

void OffloadEngine::Impl::finish_step(std::vector<float>& logits, std::vector<std::byte>* out) {
  if (hidden_out) {
    const size_t bytes = size_t(batch * T * c.hidden) * es_a;
    dev.copy(Queue::kDeviceToHost, hidden_out_host.data(), hidden_out_device.data(), bytes);
    dev.synchronize();
    dev.host_access(kMainAgent, hidden_out_host.data(), bytes, false);
    out->resize(bytes);
    std::memcpy(out->data(), hidden_out_host.data(), bytes);
    logits.clear();
  } else {
    // Many rows are already in the host logits (the head copied each out).
    const size_t bytes = size_t(batch * step_logit_rows * c.vocab_size) * 4;
    if (step_logit_rows == 1) dev.copy(Queue::kDeviceToHost, logits_host.data(), logits_device.data(), bytes);
    dev.synchronize();
    dev.host_access(kMainAgent, logits_host.data(), bytes, false);
    logits.resize(bytes / 4);
    std::memcpy(logits.data(), logits_host.data(), bytes);
  }
  for (int64_t b = 0; b < batch; ++b) seen[size_t(b)] += kvc[0].len_after[size_t(b)] - kvc[0].len_before[size_t(b)];
  for (KvClass& k : kvc) k.len_before = k.len_final;
}

}  // namespace flexh2o
