// Policy search over a grid, and FlexGen's published cost model for comparison.
//
// Why a grid and not FlexGen's LP: the LP relaxes the weight split to continuous fractions,
// but the midpoint rule places whole tensors, so the realised split is a step function of the
// percentages (and so are memory and bytes); our time is a list-scheduled makespan, not a
// linear max. A grid is exact for what the engine can run: weights in steps of 5%, KV in
// steps of 10%, activations on device or host, CPU attention on/off, every gpu_batch_size of
// a grid and num_gpu_batches 1..64. Pruning that loses nothing: for fixed batch, KV and
// activation placement, moving weights to a faster tier never adds bytes to any link, so
// only the highest-tier weight split that fits is timed (device share first, then host);
// memory is checked before any timing; and num_gpu_batches stops growing once nothing fits
// or throughput has not improved for 3 steps (it is unimodal in practice, as FlexGen uses).
// Compression (weights, KV) is two more booleans of the grid, searched only when the profile
// prices dequantization: it shrinks every byte count, so without its compute cost it would
// always win and the accuracy it costs is not in the model.
#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {

bool fits(const CostModel& cm, const Policy& p, int tier, int64_t groups) {
  return cm.hardware().charged(tier, cm.memory(p, groups)) <= cm.hardware().usable(tier);  // one tier of fits()
}

// Highest-tier weight split that fits (device share, then host share); false if none. Where the
// device and the host share RAM (the CPU device), a lower device share leaves the host more room,
// so a device share whose rest fits no host share is passed over rather than ending the search.
bool place_weights_greedy(const CostModel& cm, Policy& p, int step, bool allow_disk, int64_t groups) {
  auto host_fits_at = [&](int wc) {
    p.w_cpu_percent = wc;
    return fits(cm, p, 1, groups);
  };
  bool passed_over = false;
  for (int wg = 100; wg >= 0; wg -= step) {
    p.w_gpu_percent = wg;
    p.w_cpu_percent = 100 - wg;
    if (!fits(cm, p, 0, groups)) continue;
    // After a share passed over, the host's two ends (the rest all on it, or all on disk) are
    // tried before every share between them: most device shares fit neither, and the search
    // calls this for every block shape.
    if (passed_over && !host_fits_at(100 - wg) && (!allow_disk || !host_fits_at(0))) continue;
    for (int wc = 100 - wg; wc >= 0; wc -= step) {
      if (!allow_disk && wg + wc < 100) break;
      if (host_fits_at(wc)) return fits(cm, p, 2, groups);
    }
    // Separate memories: a lower device share only adds to what the host holds.
    if (!cm.hardware().shared_memory) return false;
    passed_over = true;
  }
  return false;
}

std::pair<std::vector<bool>, std::vector<bool>> compression_choices(const CostModel& cm, const SearchOptions& o) {
  auto choices = [&](std::optional<bool> fixed) {
    if (fixed) return std::vector<bool>{*fixed};
    return cm.hardware().prices_compression() ? std::vector<bool>{false, true} : std::vector<bool>{false};
  };
  // A Q4 KV dtype in the workload is cache compression (the engine treats them as one setting).
  const bool kv_q4 = cm.workload().kv_dtype == DType::Q4;
  return {choices(o.compress_weight), kv_q4 ? std::vector<bool>{true} : choices(o.compress_cache)};
}

std::string gb(double b) {
  std::ostringstream os;
  os.precision(4);
  os << b / 1e9 << " GB";
  return os.str();
}

}  // namespace

void for_each_block_shape(const SearchOptions& o, double min_gain,
                          const std::function<std::optional<double>(int64_t gbs, int64_t ngb)>& eval) {
  static const std::vector<int64_t> kBatches = {1,  2,  4,  8,  12,  16,  20,  24,  32,  40,  48,
                                                52, 56, 64, 80, 96, 128, 160, 192, 256, 384, 512};
  for (int64_t gbs : o.gpu_batch_sizes.empty() ? kBatches : o.gpu_batch_sizes) {
    double best = 0;
    int stale = 0;
    for (int64_t ngb = 1; ngb <= o.max_num_gpu_batches; ++ngb) {
      if (o.max_block > 0 && gbs * ngb > o.max_block) break;
      const std::optional<double> tp = eval(gbs, ngb);
      if (!tp) break;
      if (*tp > best * (1 + min_gain)) best = *tp, stale = 0;
      else if (++stale >= 3) break;
    }
  }
}

std::string smallest_run_verdict(const HardwareProfile& hw, const std::array<uint64_t, 3>& memory) {
  const std::string note = hw.overflow_note(memory);
  return note.empty() ? " fits, but no block shape of the search does" : " does not: " + note;
}

Policy smallest_policy(bool allow_disk) {
  Policy p;
  p.gpu_batch_size = p.num_gpu_batches = 1;
  p.w_gpu_percent = p.cache_gpu_percent = 0;
  p.w_cpu_percent = p.cache_cpu_percent = allow_disk ? 0 : 100;
  return p;
}

std::optional<Estimate> best_placement(CostModel& cm, const SearchOptions& o, int64_t gbs, int64_t ngb,
                                       PlanResult* stats) {
  const auto [cws, ccs] = compression_choices(cm, o);
  std::optional<Estimate> best;
  for (int cg = 100; cg >= 0; cg -= o.cache_step) {
    for (int cc = 100 - cg; cc >= 0; cc -= o.cache_step) {
      if (!o.allow_disk && cg + cc < 100) continue;
      for (int act = 0; act < (o.allow_act_on_host ? 2 : 1); ++act) {
        for (int cpu = 0; cpu < (o.allow_cpu_cache_compute && cg < 100 ? 2 : 1); ++cpu) {
          Policy p;
          p.gpu_batch_size = gbs;
          p.num_gpu_batches = ngb;
          p.cache_gpu_percent = cg;
          p.cache_cpu_percent = cc;
          p.act_gpu_percent = act ? 0 : 100;
          p.act_cpu_percent = act ? 100 : 0;
          p.cpu_cache_compute = cpu;
          p.overlap = o.overlap;
          p.sep_layer = o.sep_layer;
          for (bool cw : cws) {
            for (bool ckv : ccs) {
              p.compress_weight = cw;
              p.compress_cache = ckv;
              Policy q = p;
              if (!place_weights_greedy(cm, q, o.weight_step, o.allow_disk, o.groups)) {
                if (stats) ++stats->rejected_memory;
                continue;
              }
              const Estimate e = cm.quick(q);
              if (stats) ++stats->evaluated;
              if (!best || e.throughput > best->throughput) best = e;
            }
          }
        }
      }
    }
  }
  return best;
}

PlanResult search_policy(CostModel& cm, const SearchOptions& o) {
  const HardwareProfile& hw = cm.hardware();
  const auto choices = compression_choices(cm, o);  // not a structured binding: a lambda below uses it
  const std::vector<bool>&cws = choices.first, &ccs = choices.second;
  // Infeasible outright: the weights plus one sequence's KV exceed all tiers together, however
  // the weights are placed. Batch 1, the cache on disk, the weights either resident on the device
  // (no streaming buffers: the least in all) or streamed from the host (a tied head sharing the
  // embedding's home), whichever needs less.
  {
    auto tiny = [&](bool resident, bool q4) {
      Policy t;
      t.gpu_batch_size = t.num_gpu_batches = 1;
      t.w_gpu_percent = resident ? 100 : 0;
      t.w_cpu_percent = resident ? 0 : 100;
      t.cache_gpu_percent = t.cache_cpu_percent = 0;
      t.act_gpu_percent = 100;
      t.act_cpu_percent = 0;
      t.compress_weight = q4 || cws.back();  // the smallest the search may make it
      t.compress_cache = q4 || ccs.back();
      const auto m = cm.memory(t, o.groups);
      return std::pair{t, double(m[0] + m[1] + m[2])};
    };
    const auto [resident, on_device] = tiny(true, false);
    const double need = std::min(on_device, tiny(false, false).second);
    const double have = (hw.shared_memory ? 0 : hw.usable(0)) + hw.usable(1) + (o.allow_disk ? hw.usable(2) : 0);
    if (need > have) {
      // Where the search keeps full precision, whether 4 bits would fit (lossy: the user's call).
      const double q4 = std::min(tiny(true, true).second, tiny(false, true).second);
      const bool q4_fits = !(resident.compress_weight && resident.compress_cache) && q4 <= have;
      FH_FAIL("infeasible: ", cm.shape().config.name, " needs at least ", gb(need), " (weights ",
              gb(double(cm.shape().weight_bytes(resident))), resident.compress_weight ? " at 4 bits" : "",
              " + one sequence's KV and buffers) but the tiers of ", hw.name,
              " hold ", gb(have), " usable together (device ", gb(hw.usable(0)), ", host ", gb(hw.usable(1)),
              hw.shared_memory ? " shared with the device" : "",
              o.allow_disk ? ", disk " + gb(hw.usable(2)) : std::string(", no disk: homing data on disk needs an offload directory (--offload-dir)"),
              "): short by ", gb(need - have),
              !q4_fits ? std::string()
                       : "; 4-bit weights and KV cache (lossy: --compress-weight --compress-cache" +
                             std::string(hw.prices_compression() ? ", or --allow-compress with --policy auto" : "") +
                             ") would need " + gb(q4));
    }
  }
  PlanResult r;
  bool found = false;
  // Ties keep the smaller block (1e-9: only a larger throughput counts as a gain).
  for_each_block_shape(o, 1e-9, [&](int64_t gbs, int64_t ngb) -> std::optional<double> {
    const std::optional<Estimate> e = best_placement(cm, o, gbs, ngb, &r);
    if (!e) return std::nullopt;
    if (!found || e->throughput > r.best.throughput) r.best = *e, found = true;
    return e->throughput;
  });
  if (!found) {
    Policy p = smallest_policy(o.allow_disk);
    p.compress_weight = cws.back();
    p.compress_cache = ccs.back();
    FH_FAIL("infeasible: no policy of the search space fits ", cm.shape().config.name, " on ", hw.name,
            ": the smallest (batch 1, everything offloaded", o.allow_disk ? "" : " to the host: no disk is allowed",
            ")", smallest_run_verdict(hw, cm.memory(p, o.groups)),
            o.allow_disk ? "" : "; homing data on disk needs an offload directory (--offload-dir)", "\n",
            cm.memory_breakdown(p));
  }
  r.best = cm.estimate(r.best.policy);
  return r;
}

Policy plan_policy(const ModelConfig& c, const HardwareProfile& hw, const Workload& w, const SearchOptions& opts) {
  CostModel cm(ModelShape::from_config(c), hw, w);
  return search_policy(cm, opts).best.policy;
}

Estimate plan_policy(const Model& m, const HardwareProfile& hw, const Workload& w, const SearchOptions& opts,
                     std::optional<DType> as) {
  CostModel cm(ModelShape::from_model(m, as), hw, w);
  return search_policy(cm, opts).best;
}

double flexgen_reference_throughput(const ModelConfig& c, const HardwareProfile& hw, const Workload& w,
                                    const Policy& p) {
  // experimental/cost_model.py (PAPERS.md §4), per layer, fp16, fractions from the policy.
  const double s = double(w.prompt_len), n = double(w.gen_len), l = double(c.n_layers);
  const double h1 = double(c.hidden), h2 = double(c.ffn_dim), bls = double(p.block_size());
  const double gbs = double(p.gpu_batch_size);
  double ctx = s + n / 2;  // average context; H2O: the kept budget
  if (w.kv && w.kv->kind != KvPolicyKind::kFull) {
    const KvBudget b = make_policy(*w.kv)->budget(w.prompt_len);
    if (!b.unbounded) ctx = std::min(ctx, double(b.total()));
  }
  const double wg = p.w_gpu_percent / 100, wc = p.w_cpu_percent / 100, wn = 1 - wg - wc;
  const double cg = p.cache_gpu_percent / 100, cc = p.cache_cpu_percent / 100, cn = 1 - cg - cc;
  const double hc = p.act_cpu_percent / 100, hn = 1 - p.act_gpu_percent / 100 - hc;
  // FlexGen's model divides the weight bytes by 4 when weights are compressed (a rough factor;
  // it has no term for cache compression or dequantization).
  const double wi = (8 * h1 * h1 + 4 * h1 * h2) / (p.compress_weight ? 4 : 1);
  const double ctog_p = (wi * (wc + wn) + 2 * s * h1 * bls * (hc + hn)) / hw.host_to_device;
  const double gtoc_p = 4 * (s + 1) * h1 * bls * (cc + cn) / hw.device_to_host_cache +
                        2 * s * h1 * bls * (hc + hn) / hw.device_to_host;
  const double dtoc_p = (wi * wn + 2 * s * h1 * bls * hn) / hw.disk_to_host;
  const double ctod_p = 4 * bls * (s + 1) * h1 * cn / hw.host_to_disk_cache + 2 * s * h1 * bls * hn / hw.host_to_disk;
  const double comp_p = bls * (8 * s * h1 * h1 + 4 * s * h1 * h2) / hw.device_gemm_prefill +
                        4 * bls * s * s * h1 / hw.device_attention_prefill;
  const double t_pre = std::max({ctog_p + dtoc_p, gtoc_p + ctod_p, comp_p});
  const double a = std::max(0.0, std::log2(64 / gbs)), b = std::max(0.0, std::log2(4096 / h1));
  const double f_cpu = hw.host_attention * std::max(0.1, 1 + hw.host_eff_c1 * a * b - hw.host_eff_c2 * a - hw.host_eff_c3 * b);
  const double ctog_g = (wi * (wc + wn) + 2 * h1 * bls * (hc + hn)) / hw.host_to_device;
  const double gtoc_g = 2 * h1 * bls * (hc + hn) / hw.device_to_host;
  const double dtoc_g = (4 * bls * ctx * h1 * cn + 2 * h1 * bls * hn) / hw.disk_to_host + wi * wn / (0.95 * hw.disk_to_host);
  const double ctod_g = (4 * bls * h1 * cn + 2 * h1 * bls * hn) / hw.host_to_disk;
  const double comp_g = bls * (8 * h1 * h1 + 4 * h1 * h2) / hw.device_gemm_decode +
                        4 * bls * ctx * h1 * cg / hw.device_attention_decode + 4 * bls * ctx * h1 * (cc + cn) / f_cpu;
  const double t_gen = ctog_g + std::max({gtoc_g, dtoc_g, ctod_g, comp_g});
  const double total = t_pre * l + t_gen * (n - 1) * l;
  return bls * n / total;
}

}  // namespace flexh2o
