// OffloadEngine setup: weight homes (device / host buffers, disk store files), per-batch KV
// homes and staging buffers, memory needs, and the token-step driver. The per-step actions
// (loads, stores, compute) are in offload_actions.cpp.
#include "engine/offload_engine.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <sstream>

#include "core/error.h"
#include "engine/offload_impl.h"

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

std::string store_name(const std::string& tensor) {
  std::string s = "w." + tensor;
  for (char& ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-')) ch = '_';
  return s;
}

std::string human(uint64_t b) {
  std::ostringstream os;
  if (b >= (1ull << 30)) os << double(b) / double(1ull << 30) << " GiB";
  else if (b >= (1ull << 20)) os << double(b) / double(1ull << 20) << " MiB";
  else os << b << " B";
  return os.str();
}

uint64_t kv_seq_bytes(const ModelConfig& c, int64_t capacity) {
  return uint64_t(2 * c.n_kv_heads * capacity * c.head_dim) * sizeof(float);
}

}  // namespace

int64_t kv_capacity_align(const ModelConfig& c) {
  // Slots per (sequence, head) such that every row block starts on a 4096-byte boundary.
  const int64_t row = c.head_dim * int64_t(sizeof(float));
  int64_t g = 4096, r = row;
  while (r) std::swap(g, r), r %= g;  // gcd(4096, row)
  return 4096 / g;
}

MemoryNeed memory_need(const ModelConfig& c, const WeightPlacement& wp, const Policy& p, int64_t prompt_len,
                       int64_t capacity) {
  MemoryNeed m;
  const KvSplit split = split_kv(p.gpu_batch_size, p);
  const uint64_t per_seq = kv_seq_bytes(c, capacity);
  const uint64_t L = uint64_t(c.n_layers), K = uint64_t(p.num_gpu_batches);
  const uint64_t hidden = uint64_t(p.gpu_batch_size * prompt_len * c.hidden) * sizeof(float);
  const bool act_host = p.act_cpu_percent == 100;
  const uint64_t off_dev = uint64_t(split.n_host + split.n_disk);
  struct Item { Tier t; const char* what; uint64_t bytes; };
  const Item items[] = {
      {Tier::kDevice, "weights homed", wp.bytes[0]},
      {Tier::kDevice, "weight double buffer", 2 * wp.max_streamed},
      {Tier::kDevice, "KV homed", L * K * uint64_t(split.n_device) * per_seq},
      {Tier::kDevice, "KV staging", off_dev ? 2 * off_dev * per_seq : 0},
      {Tier::kDevice, "hidden states", act_host ? 2 * hidden : K * hidden},
      {Tier::kDevice, "compute scratch", uint64_t(LayerCompute::scratch_bytes(c, p.gpu_batch_size * prompt_len))},
      {Tier::kHost, "weights homed", wp.bytes[1]},
      {Tier::kHost, "weight disk staging", wp.max_disk ? 2 * wp.max_disk : 0},
      {Tier::kHost, "KV homed", L * K * uint64_t(split.n_host) * per_seq},
      {Tier::kHost, "KV disk staging + bounce", split.n_disk ? 4 * uint64_t(split.n_disk) * per_seq : 0},
      {Tier::kHost, "hidden states", act_host ? K * hidden : 0},
      {Tier::kDisk, "weights homed", wp.bytes[2]},
      {Tier::kDisk, "KV homed", L * K * uint64_t(split.n_disk) * per_seq},
  };
  std::ostringstream os;
  for (const Item& it : items) {
    if (!it.bytes) continue;
    m.bytes[size_t(it.t)] += it.bytes;
    os << "  " << tier_name(it.t) << ": " << it.what << " " << human(it.bytes) << "\n";
  }
  m.breakdown = os.str();
  return m;
}

OffloadEngine::OffloadEngine(const Model& model, CpuDevice& dev, const OffloadOptions& opts)
    : model_(model), dev_(dev), opts_(opts) {
  opts_.policy.validate();
  const ModelConfig& c = model.config();
  placement_ = place_weights(model, opts_.policy);
  budgets_[0] = std::make_unique<TierBudget>(Tier::kDevice, opts.device_mem);
  budgets_[1] = std::make_unique<TierBudget>(Tier::kHost, opts.host_mem);
  budgets_[2] = std::make_unique<TierBudget>(Tier::kDisk, opts.disk_mem);
  // The smallest run (one token of prompt) must fit before anything is written.
  const MemoryNeed need = memory_need(c, placement_, opts_.policy, 1, 1);
  for (int t = 0; t < 3; ++t) {
    const uint64_t cap = budgets_[size_t(t)]->capacity();
    if (cap && need.bytes[size_t(t)] > cap)
      FH_FAIL(tier_name(Tier(t)), " budget ", human(cap), " is too small for policy ", opts_.policy.str(),
              ": it needs at least ", human(need.bytes[size_t(t)]), " before any KV cache:\n", need.breakdown);
  }
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
    const std::string identity = c.name + "|" + c.model_type + "|" + std::to_string(c.n_layers) + "x" +
                                 std::to_string(c.hidden) + "|" + model.signature();
    store_ = DiskStore::open(opts_.offload_dir, identity, *io);
    impl_->io_note = why + "; " + store_->io_note();
  }
  impl_->place_weights();
}

OffloadEngine::~OffloadEngine() = default;

void OffloadEngine::Impl::place_weights() {
  const WeightPlacement& wp = e.placement_;
  units.resize(wp.units.size());
  size_t max_stream = 0, max_disk = 0;
  for (size_t u = 0; u < wp.units.size(); ++u) {
    size_t slot_off = 0, stage_off = 0;
    for (const PlacedTensor& t : wp.units[u].tensors) {
      WeightHome h;
      h.tier = t.tier;
      h.source = t.source;
      h.bytes = t.bytes;
      h.token_table = u == 0 && t.source.data == e.model_.weights().embed.data;
      if (h.token_table && t.tier != Tier::kDevice) token_streamed = true;
      const std::string what = std::string("weight ") + t.name;
      if (t.tier == Tier::kDisk) {
        h.store_name = store_name(t.name);
        Status s = TierCharge::reserve(*e.budgets_[2], t.bytes, what, &h.disk_charge);
        if (!s.ok()) FH_FAIL(s.message());
        std::string why;
        if (e.opts_.verify_store ? e.store_->reuse(h.store_name, t.source.dtype, t.source.shape, &why) &&
                                       e.store_->verify(h.store_name).ok()
                                 : e.store_->reuse(h.store_name, t.source.dtype, t.source.shape, &why)) {
          ++e.reused_;
        } else {
          e.store_->put(h.store_name, t.source).throw_if_error();
          ++e.written_;
        }
        h.stage_offset = stage_off;
        stage_off += align(t.bytes);
      } else {
        Status s = TierBuffer::allocate(*e.budgets_[size_t(t.tier)], t.bytes, what, &h.home);
        if (!s.ok()) FH_FAIL(s.message());
        std::memcpy(h.home.data(), t.source.data, t.bytes);
      }
      if (t.tier != Tier::kDevice) {
        h.slot_offset = slot_off;
        slot_off += align(t.bytes);
      }
      units[u].push_back(std::move(h));
    }
    max_stream = std::max(max_stream, slot_off);
    max_disk = std::max(max_disk, stage_off);
  }
  for (int s = 0; s < 2; ++s) {
    alloc(Tier::kDevice, max_stream, "weight double buffer", weight_slot[size_t(s)]);
    alloc(Tier::kHost, max_disk, "weight disk staging", weight_stage[size_t(s)]);
  }
}

void OffloadEngine::Impl::alloc(Tier t, size_t bytes, const std::string& what, TierBuffer& out) {
  Status s = TierBuffer::allocate(*e.budgets_[size_t(t)], bytes, what, &out);
  if (!s.ok()) {
    const MemoryNeed need = memory_need(c, e.placement_, p, s_max, capacity);
    FH_FAIL(s.message(), "\nthis batch (", batch, " sequences, prompt ", s_max, ", capacity ", capacity,
            ") needs per tier:\n", need.breakdown, "lower the batch size or move data to a lower tier");
  }
}

void OffloadEngine::begin_batch(int64_t B, int64_t capacity) {
  FH_CHECK(B >= 1 && B <= max_batch(), "batch of ", B, " outside [1, ", max_batch(), "]");
  impl_->begin_batch(B, capacity);
  kv_bytes_ = 0;
}

void OffloadEngine::step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
                         std::vector<float>& logits) {
  impl_->prepare_step(ids, positions, T, real_rows);
  if (impl_->prefill) {
    kv_bytes_ = 0;
    for (const auto& mb : impl_->mbs) {
      kv_bytes_ += size_t(mb.split.n_device) * kv_seq_bytes(config(), impl_->cap_w) * size_t(config().n_layers);
      kv_bytes_ += size_t(mb.n - mb.split.n_device) * kv_seq_bytes(config(), impl_->cap_h) * size_t(config().n_layers);
    }
  }
  const Policy& p = opts_.policy;
  ScheduleShape shape;
  shape.units = config().n_layers + 2;
  shape.micro_batches = int(impl_->mbs.size());
  for (const auto& u : placement_.units) {
    shape.unit_streams.push_back(u.streamed_bytes() > 0);
    shape.unit_disk.push_back(u.bytes[2] > 0);
  }
  shape.prefill = impl_->prefill;
  shape.kv_host = shape.kv_disk = false;
  for (const auto& mb : impl_->mbs) {
    shape.kv_host = shape.kv_host || mb.split.n_host > 0;
    shape.kv_disk = shape.kv_disk || mb.split.n_disk > 0;
  }
  shape.cpu_attention = p.cpu_cache_compute;
  shape.act_on_host = p.act_cpu_percent == 100;
  shape.first_layer_loaded = first_layer_loaded_;
  shape.prefetch_next = more_steps_;
  schedule_ = build_schedule(shape);
  // Set once the schedule has run; a failed step leaves slot 1 in an unknown state.
  first_layer_loaded_ = false;
  const double t0 = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  QueueTimes t = run_schedule(schedule_, p.overlap, [&](const Step& s) { impl_->run(s); }, opts_.trace);
  for (const StepSpan& sp : t.spans)
    trace_.push_back({schedule_.label(sp.step) + (impl_->prefill ? " prefill" : ""),
                      schedule_.steps[size_t(sp.step)].queue, t0 + sp.start, t0 + sp.end});
  for (int q = 0; q < kNumQueues; ++q) {
    times_.busy[size_t(q)] += t.busy[size_t(q)];
    times_.wait[size_t(q)] += t.wait[size_t(q)];
  }
  times_.wall += t.wall;
  step_bound_ += *std::max_element(t.busy.begin(), t.busy.end());
  first_layer_loaded_ = schedule_.find(StepKind::kLoadWeight, shape.units, 0) >= 0;
  // The prefetched unit 1 sits in the slot of this step's unit `units`: shift the parity so
  // the next step finds it there.
  if (first_layer_loaded_) impl_->slot_phase = (shape.units - 1 + impl_->slot_phase) % 2;
  impl_->finish_step(logits);
}

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

OffloadReport OffloadEngine::report() const {
  OffloadReport r;
  for (int l = 0; l < kNumLinks; ++l) r.bytes[size_t(l)] = counters_.get(Link(l));
  r.kv_bytes = counters_.kv.load();
  r.busy = times_.busy;
  r.wait = times_.wait;
  r.wall = times_.wall;
  double busiest = 0;
  for (int q = 1; q < kNumQueues; ++q) busiest = std::max(busiest, times_.busy[size_t(q)]);
  r.overlap_efficiency = r.wall > 0 ? std::max(times_.busy[0], busiest) / r.wall : 0;
  r.step_overlap_efficiency = r.wall > 0 ? step_bound_ / r.wall : 0;
  for (int t = 0; t < 3; ++t) r.peak[size_t(t)] = budgets_[size_t(t)]->peak();
  r.io_note = impl_->io_note;
  r.weights_reused = reused_;
  r.weights_written = written_;
  return r;
}

}  // namespace flexh2o
