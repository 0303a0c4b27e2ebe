// OffloadEngine setup (budgets, the disk store, weight homes and their device views), the
// token-step driver (schedule shape, executor, trace) and the run report. Batch buffers are in
// offload_batch.cpp, the step actions in offload_moves.cpp and offload_compute.cpp.
#include "engine/offload_engine.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <ostream>

#include "core/error.h"
#include "engine/compress.h"
#include "engine/offload_impl.h"
#include "kernels/cpu/ops.h"

namespace flexh2o {

const char* link_name(Link l) {
  switch (l) {
    case Link::kDiskToHost: return "disk_to_host";
    case Link::kHostToDevice: return "host_to_device";
    case Link::kDeviceToHost: return "device_to_host";
    case Link::kHostToDisk: return "host_to_disk";
  }
  return "?";
}

namespace {

std::string store_name(const std::string& tensor, DType dt) {
  std::string s = "w." + tensor + "." + std::string(dtype_name(dt));
  for (char& ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-')) ch = '_';
  return s;
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Throws for the first tier whose budget `need` exceeds: "<tier> budget X is too small for
// <what>: it needs <at_least>Y<needed_for>:\n<breakdown><remedy>".
void check_budgets(const std::array<std::unique_ptr<TierBudget>, 3>& budgets, const MemoryPlan& need,
                   const std::string& what, const char* at_least, const std::string& needed_for,
                   const std::string& remedy) {
  for (int t = 0; t < 3; ++t) {
    const uint64_t cap = budgets[size_t(t)]->capacity(), bytes = need.bytes[size_t(t)];
    if (cap && bytes > cap)
      FH_FAIL(tier_name(Tier(t)), " budget ", human_bytes_beside(cap, bytes), " is too small for ", what, ": it needs ",
              at_least, human_bytes_beside(bytes, cap), needed_for, ":\n", need.breakdown(), remedy);
  }
}

bool within_budgets(const std::array<std::unique_ptr<TierBudget>, 3>& budgets, const MemoryPlan& need) {
  for (int t = 0; t < 3; ++t) {
    const uint64_t cap = budgets[size_t(t)]->capacity();
    if (cap && need.bytes[size_t(t)] > cap) return false;
  }
  return true;
}

// The most of `lengths`'s sequences (the longest first) whose batch `fits`, found by bisection (a
// batch's need grows with its sequences): 0 when not even one does.
int64_t largest_fitting(std::vector<int64_t> lengths, const std::function<bool(std::span<const int64_t>)>& fits) {
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  const auto first = [&](int64_t k) { return std::span<const int64_t>(lengths.data(), size_t(k)); };
  if (fits(first(int64_t(lengths.size())))) return int64_t(lengths.size());
  if (!fits(first(1))) return 0;
  int64_t lo = 1, hi = int64_t(lengths.size());  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(first(mid)) ? lo : hi) = mid;
  }
  return lo;
}

// The dtype every weight has on `dev` (nullopt: each keeps its checkpoint dtype).
std::optional<DType> placement_dtype(const Device& dev) {
  if (dev.weight_dtype(DType::F32) == DType::F32) return std::nullopt;
  return dev.weight_dtype(DType::F32);
}

}  // namespace

OffloadEngine::Impl::Impl(OffloadEngine& engine)
    : e(engine),
      dev(engine.dev_),
      c(engine.config()),
      p(engine.opts_.policy),
      user_policy(engine.opts_.kv_policy),
      kvdt(engine.opts_.kv_dtype),
      adt(engine.dev_.act_dtype()),
      kv_row(row_nbytes(kvdt, engine.config().head_dim)),
      es_a(dtype_size(adt)),
      hidden_in(!engine.model_.stage_range().embed()),
      hidden_out(!engine.model_.stage_range().head()) {
  parked.resize(1);
  if (c.sliding_window > 0) window_policy = make_policy(window_local_policy(c));
}

void OffloadEngine::Impl::select_group(int g) {
  FH_CHECK(g >= 0 && size_t(g) < parked.size(), "group ", g, " outside [0, ", parked.size(), ")");
  if (g == group) return;
  dev.synchronize();
  const int from = group;
  std::swap(static_cast<BatchState&>(*this), parked[size_t(from)]);
  std::swap(static_cast<BatchState&>(*this), parked[size_t(g)]);
  group = g;  // a group's state keeps its own index; a fresh one takes it here
}

DType offload_kv_dtype(const OffloadOptions& o) { return o.policy.compress_cache ? DType::Q4 : o.kv_dtype; }

MemoryPlan offload_memory_plan(const Model& model, const Device& dev, const OffloadOptions& opts,
                               const BatchDims& dims) {
  const WeightPlacement wp = place_weights(model, opts.policy, placement_dtype(dev));
  BatchDims d = dims;
  d.head_logits_bytes = opts.head_logits_bytes;  // as the engine plans its batches
  return plan_memory(model.config(), WeightBytes::of(wp), opts.policy, d,
                     {dev.kind(), offload_kv_dtype(opts), dev.act_dtype()});
}

OffloadEngine::OffloadEngine(const Model& model, Device& dev, const OffloadOptions& opts)
    : model_(model), dev_(dev), opts_(opts) {
  opts_.policy.validate();
  // compress_cache and a Q4 KV dtype are one setting: either turns on both.
  opts_.kv_dtype = offload_kv_dtype(opts_);
  opts_.policy.compress_cache = opts_.kv_dtype == DType::Q4;
  FH_CHECK(opts_.kv_dtype == DType::F16 || opts_.kv_dtype == DType::BF16 || opts_.kv_dtype == DType::F32 ||
               opts_.kv_dtype == DType::Q4,
           "KV cache dtype must be f16, bf16, f32 or q4, got ", dtype_name(opts_.kv_dtype));
  const ModelConfig& c = model.config();
  if (const std::string why = dev.kv_unsupported(c, opts_.kv_dtype); !why.empty()) FH_FAIL(dev.name(), ": ", why);
  placement_ = place_weights(model, opts_.policy, placement_dtype(dev));
  budgets_[0] = std::make_unique<TierBudget>(Tier::kDevice, opts.device_mem ? opts.device_mem : dev.memory_bytes());
  budgets_[1] = std::make_unique<TierBudget>(Tier::kHost, opts.host_mem);
  budgets_[2] = std::make_unique<TierBudget>(Tier::kDisk, opts.disk_mem);
  // The smallest run (one token of prompt) must fit before anything is written.
  BatchDims small;
  small.kv_policy = opts_.kv_policy != nullptr;
  small.scores = opts_.kv_policy && opts_.kv_policy->needs_scores();
  small.hidden_in = !model.stage_range().embed();
  small.hidden_out = !model.stage_range().head();
  const MemoryPlan need = plan_memory(c, WeightBytes::of(placement_), opts_.policy, small,
                                      {dev.kind(), opts_.kv_dtype, dev.act_dtype()});
  check_budgets(budgets_, need, "policy " + opts_.policy.str() + " on " + dev.name(), "at least ",
                " for a block of one-token prompts",
                "home less on this tier (--percent; without it everything is on the device), a smaller block, "
                "or let --policy auto choose");
  impl_ = std::make_unique<Impl>(*this);
  if (placement_.bytes[2] > 0 || opts_.policy.cache_disk_percent() > 1e-9) {
    if (opts_.offload_dir.empty())
      FH_FAIL("policy ", opts_.policy.str(), " homes data on disk: give --offload-dir DIR");
    std::string why;
    IoBackend* io = opts_.io_backend;
    if (!io) {
      io_ = make_io_backend(opts_.io, &why);
      if (!io_) FH_FAIL("no usable I/O backend: ", why);
      io = io_.get();
    } else {
      why = std::string(io->name()) + " backend (caller-provided)";
    }
    open_store(*io);
    impl_->io_note = why + "; " + store_->io_note();
  }
  if (opts_.before_placing) opts_.before_placing(*this);
  impl_->place_weights();
  impl_->build_views();
  if (store_) placed_read_ = store_->bytes_read(), placed_written_ = store_->bytes_written();
  opts_.on_place = nullptr;  // the caller's callbacks need not outlive construction
  opts_.while_waiting = nullptr;
  opts_.before_placing = nullptr;
}

OffloadEngine::~OffloadEngine() {
  try {
    dev_.synchronize();
  } catch (...) {  // a failed step already reported its error
  }
}

// ---- weights -------------------------------------------------------------------------------

void OffloadEngine::Impl::place_weights() {
  const WeightPlacement& wp = e.placement_;
  units.resize(wp.units.size());
  std::map<const void*, const std::byte*> device_home, host_home;  // by source: a tied lm_head shares
  std::map<const void*, std::string> disk_home;                     // ... and on disk, the file
  const bool want_pinned = dev.kind() != DeviceKind::kCpu && p.pin_weight;
  std::vector<std::pair<size_t, size_t>> disk_homes;  // (unit, index in the unit)
  {  // a tied lm_head homed with the embedding shares its home: one copy to place
    std::set<std::pair<const void*, Tier>> seen;
    for (const UnitPlacement& up : wp.units)
      for (const PlacedTensor& t : up.tensors) {
        if (seen.emplace(t.source.data, t.tier).second) to_place += t.bytes;
        if (t.tier == Tier::kHost) host_sourced.insert(t.source.data);
      }
  }
  for (size_t u = 0; u < wp.units.size(); ++u) {
    size_t slot_off = 0, stage_off = 0;
    for (const PlacedTensor& t : wp.units[u].tensors) {
      WeightHome h;
      h.tier = t.tier;
      h.source = t.source;
      h.dtype = t.dtype;
      h.bytes = t.bytes;
      h.token_table = u == 0 && t.source.data == e.model_.weights().embed.data;
      if (h.token_table && t.tier != Tier::kDevice) token_streamed = true;
      const std::string what = std::string("weight ") + t.name;
      bool placed_here = false;  // a device or host home made now (not one shared with the embedding)
      if (t.tier == Tier::kDevice) {
        if (auto it = device_home.find(t.source.data); it != device_home.end()) {
          h.device_ptr = it->second;
        } else {
          placed_here = true;
          h.device = alloc(MemKind::kDevice, Tier::kDevice, h.bytes, what);
          if (h.dtype == DType::Q4) {  // compressed on the host, uploaded as records
            std::vector<std::byte> tmp(h.bytes);
            convert_tensor(t.source, h.dtype, tmp.data(), what);
            TensorView q = t.source;
            q.data = tmp.data(), q.dtype = h.dtype;
            dev.upload(h.device.data(), q);
          } else {
            dev.upload(h.device.data(), t.source);
          }
          let_go(h);
          h.device_ptr = h.device.data();
          device_home[t.source.data] = h.device_ptr;
        }
      } else if (t.tier == Tier::kHost) {
        if (auto it = host_home.find(t.source.data); it != host_home.end()) {
          h.host = it->second;
        } else {
          placed_here = true;
          // In place when the model already holds the device's dtype (and, for a GPU, the
          // pages can be pinned where they are); otherwise one converted / pinned copy.
          if (t.source.dtype == h.dtype && want_pinned) h.pin = dev.pin_in_place(t.source.data, h.bytes);
          if (t.source.dtype == h.dtype && (!want_pinned || h.pin)) {
            TierCharge::reserve(*e.budgets_[1], h.bytes, what, &h.host_charge).throw_if_error();
            h.host = static_cast<const std::byte*>(t.source.data);
            pinned_in_place += h.bytes;
          } else {
            h.host_copy = alloc(p.pin_weight ? MemKind::kPinned : MemKind::kPageable, Tier::kHost, h.bytes, what);
            convert_tensor(t.source, h.dtype, h.host_copy.data(), what);
            h.host = h.host_copy.data();
            e.model_.release_pages(t.source.data, t.source.nbytes());  // every host home of it is this copy
          }
          host_home[t.source.data] = h.host;
        }
      } else {
        if (auto it = disk_home.find(t.source.data); it != disk_home.end()) {
          h.store_name = it->second;  // checked or written with the embedding's home
        } else {
          h.store_name = store_name(t.name, h.dtype);
          TierCharge::reserve(*e.budgets_[2], h.bytes, what, &h.disk_charge).throw_if_error();
          disk_homes.emplace_back(u, units[u].size());
          disk_home[t.source.data] = h.store_name;
        }
        h.stage_offset = stage_off;
        stage_off += round_up(h.bytes, kStageAlign);
      }
      if (t.tier != Tier::kDevice) {
        h.slot_offset = slot_off;
        slot_off += round_up(h.bytes, kSlotAlign);
      }
      if (placed_here) placed(h.bytes);  // disk homes: as their files are checked or written
      units[u].push_back(std::move(h));
    }
    FH_CHECK(slot_off == wp.units[u].slot_bytes && stage_off == wp.units[u].stage_bytes,
             "weight slot layout disagrees with the placement of unit ", u);
  }
  if (!disk_homes.empty()) place_disk_weights(disk_homes);
  const size_t max_stream = wp.max_streamed, max_disk = wp.max_disk;
  for (int s = 0; s < 2; ++s) {
    if (max_stream) weight_slot[size_t(s)] = alloc(MemKind::kDevice, Tier::kDevice, max_stream, "weight double buffer");
    if (max_disk) weight_stage[size_t(s)] = alloc(MemKind::kPinned, Tier::kHost, max_disk, "weight disk staging");
  }
}

void OffloadEngine::Impl::build_views() {
  const ModelWeights& mw = e.model_.weights();
  for (int s = 0; s < 2; ++s) {
    views[size_t(s)].assign(units.size(), ModelWeights{});
    for (size_t u = 0; u < units.size(); ++u) {
      auto remap = [&](TensorView& v) {
        if (v.empty()) return;
        for (const WeightHome& h : units[u]) {
          if (h.source.data != v.data) continue;
          v.data = h.tier == Tier::kDevice ? static_cast<const void*>(h.device_ptr)
                                           : static_cast<const void*>(weight_slot[size_t(s)].data() + h.slot_offset);
          v.dtype = h.dtype;
          return;
        }
        v = TensorView();  // another unit's tensor: not readable from this unit
      };
      ModelWeights& w = views[size_t(s)][u];
      const UnitKind kind = e.placement_.units[u].kind;
      if (kind == UnitKind::kEmbed) {
        w.embed = mw.embed, w.pos_embed = mw.pos_embed;
        remap(w.embed), remap(w.pos_embed);
      } else if (kind == UnitKind::kHead) {
        w.final_norm_w = mw.final_norm_w, w.final_norm_b = mw.final_norm_b, w.lm_head = mw.lm_head;
        remap(w.final_norm_w), remap(w.final_norm_b), remap(w.lm_head);
      } else {
        LayerWeights L = mw.layers[size_t(e.placement_.units[u].layer)];
        for (TensorView* v : L.all())
          remap(*v);
        w.layers.push_back(L);
      }
    }
  }
}

const ModelWeights& OffloadEngine::Impl::weights(int u) const {
  return views[size_t((u + slot_phase) % 2)][size_t(u)];
}

// ---- token steps ---------------------------------------------------------------------------

void OffloadEngine::begin_batch(int64_t B, int64_t capacity) {
  FH_CHECK(B >= 1 && B <= max_batch(), "batch of ", B, " outside [1, ", max_batch(), "]");
  FH_CHECK(capacity > 0, "KV capacity must be positive");
  impl_->begin_batch(B, capacity);
  kv_bytes_ = 0;
}

void OffloadEngine::reserve_rows(int64_t rows) {
  FH_CHECK(!impl_->allocated, "reserve_rows() after the batch's first step");
  FH_CHECK(rows >= 0 && rows <= model_.config().max_positions, "reserve of ", rows, " rows outside [0, ",
           model_.config().max_positions, "]");
  // Only a batch that can rewind takes refill steps: another would hold the rows for nothing.
  impl_->rows_reserved = impl_->rewindable() ? rows : 0;
}

void OffloadEngine::budget_lengths(std::span<const int64_t> lengths) {
  check_budget_lengths(lengths, impl_->batch, impl_->allocated);
  impl_->budget_lengths.assign(lengths.begin(), lengths.end());
}

void OffloadEngine::check_batch(std::span<const int64_t> lengths, int64_t rows, int64_t capacity) const {
  FH_CHECK(!lengths.empty(), "a batch of no sequences");
  const MemoryPlan need = impl_->plan_batch(lengths, rows, capacity);
  if (!within_budgets(budgets_, need)) {
    const int64_t k = largest_fitting({lengths.begin(), lengths.end()}, [&](auto some) {
      return within_budgets(budgets_, impl_->plan_batch(some, rows, capacity));
    });
    const int64_t g = std::min(k, opts_.policy.gpu_batch_size), n = k / std::max<int64_t>(g, 1);
    const std::string remedy =
        k == 0 ? std::string("not even one sequence of this length fits these budgets (the weights' homes and one "
                             "sequence's cache and activations): move data to a lower tier, use a smaller KV budget "
                             "or shorter sequences, or give the tiers more memory")
               : detail::concat("at most ", k, " of these ", lengths.size(), " sequences fit these budgets (e.g. "
                                "--gpu-batch-size ", g, " --num-gpu-batches ", n, ", a block of ", g * n,
                                "): ", batch_fit_remedy(opts_.kv_policy != nullptr));
    check_budgets(budgets_, need,
                  detail::concat("a batch of this run (", lengths.size(), " sequences, prompt ", rows, ", capacity ",
                                 capacity, ")"),
                  "", "", remedy);
  }
  // The filesystem under --offload-dir, too: its KV files are created at the batch's prefill.
  const uint64_t kv = store_ ? impl_->kv_disk_space(need, impl_->sizing(capacity).classes, int64_t(lengths.size())) : 0;
  if (kv && store_->read_only())
    FH_FAIL("offload directory ", store_->dir().string(), " is not writable by this process (a read-only mount, "
            "or another user's); this run homes ", human_bytes(kv), " of KV cache there: home the cache on the GPU "
            "or the host (--percent), or give a writable --offload-dir");
  if (const uint64_t free = kv ? store_->free_bytes() : 0; free && kv > free)
    FH_FAIL("offload directory ", store_->dir().string(), " has ", human_bytes_beside(free, kv),
            " free; the KV cache of a batch of this run (", lengths.size(), " sequences, capacity ", capacity,
            ") needs ", human_bytes_beside(kv, free),
            " there: free space, give another --offload-dir, or home less of the cache on disk (--percent)");
}

void OffloadEngine::set_groups(int n) {
  FH_CHECK(n >= 1, "groups must be at least 1, got ", n);
  Impl& m = *impl_;
  m.select_group(0);
  m.parked.resize(size_t(n));
}

int OffloadEngine::groups() const { return int(impl_->parked.size()); }

void OffloadEngine::select_group(int g) {
  impl_->select_group(g);
  kv_bytes_ = group_kv_bytes();
}

size_t OffloadEngine::group_kv_bytes() const {
  const Impl& m = *impl_;
  if (!m.allocated) return 0;
  size_t n = 0;
  for (const auto& mb : m.mbs)
    for (int l = 0; l < config().n_layers; ++l) {
      const KvSlots& s = m.kv_class(l);
      n += size_t(mb.split.n_device) * s.device_seq + size_t(mb.n - mb.split.n_device) * s.home_seq;
    }
  return n;
}

void OffloadEngine::step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                         std::vector<float>& logits) {
  step_rows(ids, positions, T, real_rows, 1, logits);
}

bool OffloadEngine::can_step_rows() const { return model_.stage_range().whole() && impl_->user_policy == nullptr; }

void OffloadEngine::step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                              int64_t rows, std::vector<float>& logits) {
  FH_CHECK(model_.stage_range().whole(), "step() runs a whole model; a pipeline stage runs step_stage()");
  FH_CHECK(rows == 1 || can_step_rows(), "logits of ", rows, " rows a step need a runner without a KV policy");
  run_step(ids, positions, T, real_rows, rows, {}, nullptr, logits, stop_);
}

void OffloadEngine::step_stage(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                               std::span<const std::byte> hidden_in, std::vector<std::byte>* hidden_out,
                               std::vector<float>& logits) {
  run_step(ids, positions, T, real_rows, 1, hidden_in, hidden_out, logits, nullptr);
}

void OffloadEngine::run_step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                             int64_t logit_rows, std::span<const std::byte> hidden_in,
                             std::vector<std::byte>* hidden_out, std::vector<float>& logits,
                             const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  m.step_logit_rows = logit_rows;
  FH_CHECK(m.hidden_in == !hidden_in.empty(), m.hidden_in ? "this stage needs the previous stage's hidden rows"
                                                           : "the first stage embeds tokens: no hidden rows in");
  FH_CHECK(!m.hidden_out || hidden_out, "a stage before the last returns hidden rows: give hidden_out");
  m.step_hidden_in = hidden_in;
  m.prepare_step(ids, positions, T, real_rows);
  if (m.prefill) kv_bytes_ = group_kv_bytes();
  ScheduleShape& sh = shape_;
  sh = ScheduleShape();
  for (const UnitPlacement& u : placement_.units) {
    sh.kinds.push_back(u.kind);
    sh.unit_streams.push_back(u.streamed_bytes() > 0);
    sh.unit_disk.push_back(u.bytes[2] > 0);
  }
  sh.micro_batches = int(m.mbs.size());
  sh.prefill = m.prefill;
  sh.kv_device = sh.kv_host = sh.kv_disk = false;
  for (const auto& mb : m.mbs) {
    sh.kv_device = sh.kv_device || mb.split.n_device > 0;
    sh.kv_host = sh.kv_host || mb.split.n_host > 0;
    sh.kv_disk = sh.kv_disk || mb.split.n_disk > 0;
  }
  // --cpu-cache-compute is FlexGen's decode attention on the host, a row a sequence; a wider
  // step (continuous batching's refill, a scoring chunk) attends on the device, as the prefill
  // does, over the cache sent there (the host-attention rows are sized for one row a sequence).
  sh.cpu_attention = opts_.policy.cpu_cache_compute && T == 1;
  sh.act_on_host = opts_.policy.act_cpu_percent == 100;
  sh.kv_policy = m.kv_policy != nullptr;
  sh.first_layer_loaded = first_layer_loaded_;
  sh.prefetch_next = more_steps_;
  if (sh.host_attention()) m.ensure_pipeline(T);
  schedule_ = build_schedule(sh);
  if (opts_.edit_schedule) opts_.edit_schedule(schedule_);
  // Set once the schedule has run; a failed step leaves slot 1 in an unknown state.
  first_layer_loaded_ = false;
  const double t0 = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  auto action = [&](const Step& s) {
    if (stop && stop->load(std::memory_order_relaxed)) throw StepStopped();
    m.run(s);
  };
  QueueTimes t = run_schedule(dev_, schedule_, opts_.policy.overlap, action, opts_.trace, idle_);
  for (const StepSpan& sp : t.spans)
    trace_.push_back({schedule_.label(sp.step) + (m.prefill ? " prefill" : ""),
                      schedule_.steps[size_t(sp.step)].queue, t0 + sp.start, t0 + sp.end});
  for (int q = 0; q < kNumQueues; ++q) {
    times_.busy[size_t(q)] += t.busy[size_t(q)];
    times_.wait[size_t(q)] += t.wait[size_t(q)];
  }
  times_.wall += t.wall;
  step_bound_ += *std::max_element(t.busy.begin(), t.busy.end());
  ++steps_;
  first_layer_loaded_ = schedule_.find(StepKind::kLoadWeight, sh.units(), 0) >= 0;
  // The prefetched unit 1 sits in the slot of this step's unit `units`: shift the parity so
  // the next step finds it there.
  if (first_layer_loaded_) m.slot_phase = (sh.units() - 1 + m.slot_phase) % 2;
  m.finish_step(logits, hidden_out);
}

bool OffloadEngine::can_rewind() const { return impl_->allocated && impl_->rewindable(); }
bool OffloadEngine::rewinds(int64_t capacity) const { return impl_->rewindable(impl_->sizing(capacity)); }

void OffloadEngine::rewind(int64_t b, int64_t len) {
  Impl& m = *impl_;
  FH_CHECK(can_rewind(), "rewind() needs a whole model's full cache, after the first step");
  FH_CHECK(b >= 0 && b < m.batch, "sequence ", b, " outside the batch of ", m.batch);
  for (int i = 0; i < m.n_classes; ++i) {
    int32_t& n = m.kvc[size_t(i)].len_before[size_t(b)];
    FH_CHECK(len >= 0 && len <= n, "rewind of sequence ", b, " to ", len, " tokens; it has ", n);
    n = int32_t(len);
  }
  m.seen[size_t(b)] = int32_t(len);
}

std::vector<int32_t> OffloadEngine::lengths() const { return impl_->kvc[0].len_before; }
int64_t OffloadEngine::window_cap() const { return impl_->window; }

void OffloadEngine::write_trace(std::ostream& os) const {
  os << "{\"traceEvents\": [\n";
  for (int q = 0; q < kNumQueues; ++q)
    os << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": " << q
       << ", \"args\": {\"name\": \"" << queue_name(Queue(q)) << "\"}},\n";
  char buf[64];
  for (size_t i = 0; i < trace_.size(); ++i) {
    const TraceEvent& ev = trace_[i];
    std::snprintf(buf, sizeof buf, "%.1f, \"dur\": %.1f", ev.start * 1e6, (ev.end - ev.start) * 1e6);
    os << "{\"name\": \"" << ev.name << "\", \"ph\": \"X\", \"pid\": 1, \"tid\": " << int(ev.queue)
       << ", \"ts\": " << buf << "}" << (i + 1 < trace_.size() ? ",\n" : "\n");
  }
  os << "], \"displayTimeUnit\": \"ms\"}\n";
}

std::array<uint64_t, kNumLinks> OffloadEngine::link_bytes() const {
  std::array<uint64_t, kNumLinks> b{};
  for (int l = 0; l < kNumLinks; ++l) b[size_t(l)] = counters_.get(Link(l));
  return b;
}

namespace {

void set_efficiencies(OffloadReport& r) {
  const double busiest = *std::max_element(r.busy.begin(), r.busy.end());
  r.overlap_efficiency = r.wall > 0 ? busiest / r.wall : 0;
  r.step_overlap_efficiency = r.wall > 0 ? r.step_bound / r.wall : 0;
}

}  // namespace

OffloadReport report_interval(const OffloadReport& now, const OffloadReport& base) {
  OffloadReport r = now;
  for (int l = 0; l < kNumLinks; ++l) r.bytes[size_t(l)] -= base.bytes[size_t(l)];
  for (int q = 0; q < kNumQueues; ++q) {
    r.busy[size_t(q)] -= base.busy[size_t(q)];
    r.wait[size_t(q)] -= base.wait[size_t(q)];
  }
  r.kv_bytes -= base.kv_bytes;
  r.disk_read -= base.disk_read;
  r.disk_written -= base.disk_written;
  r.wall -= base.wall;
  r.batch_setup_seconds -= base.batch_setup_seconds;
  r.batch_buffers_reused_bytes -= base.batch_buffers_reused_bytes;
  r.step_bound -= base.step_bound;
  r.token_steps -= base.token_steps;
  set_efficiencies(r);
  return r;
}

OffloadReport OffloadEngine::report() const {
  OffloadReport r;
  r.device = dev_.name();
  r.kv_dtype = std::string(dtype_name(opts_.kv_dtype));
  r.act_dtype = std::string(dtype_name(dev_.act_dtype()));
  for (const UnitPlacement& u : placement_.units)  // a later pipeline stage's embedding unit holds none
    if (!u.tensors.empty()) {
      r.weight_dtype = std::string(dtype_name(u.tensors[0].dtype));
      break;
    }
  r.bytes = link_bytes();
  r.kv_bytes = counters_.kv.load();
  r.busy = times_.busy;
  r.wait = times_.wait;
  r.wall = times_.wall;
  r.token_steps = steps_;
  r.step_bound = step_bound_;
  set_efficiencies(r);
  for (int t = 0; t < 3; ++t) r.peak[size_t(t)] = budgets_[size_t(t)]->peak();
  r.weights_pinned_in_place = impl_->pinned_in_place;
  r.batch_setup_seconds = impl_->setup_seconds;
  r.batch_buffers_reused_bytes = impl_->reused_bytes;
  r.io_note = impl_->io_note;
  if (store_) {
    r.disk_read = store_->bytes_read() - placed_read_, r.disk_written = store_->bytes_written() - placed_written_;
    r.placement_disk_read = placed_read_, r.placement_disk_written = placed_written_;
  }
  r.weights_reused = reused_;
  r.weights_written = written_;
  return r;
}

}  // namespace flexh2o
