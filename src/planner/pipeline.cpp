// Pipeline plans: the balanced layer split (exact dynamic programming), the pipeline formula
// (wall, busy, bubble, groups to hide the round trip), and the planner that searches a shared
// batch shape, per-stage placements and the group count with the cost model.
#include "planner/pipeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace flexh2o {

std::vector<int64_t> even_bounds(int64_t n_layers, int64_t stages) {
  if (stages < 1 || stages > n_layers)
    FH_FAIL("--pipeline-stages must be in [1, ", n_layers, "] (one layer or more each: the model has ", n_layers,
            " layers), got ", stages);
  std::vector<int64_t> b{0};
  for (int64_t s = 0; s < stages; ++s) b.push_back(b.back() + n_layers / stages + (s < n_layers % stages ? 1 : 0));
  return b;
}

std::vector<int64_t> balance_layers(const std::vector<double>& layer_cost, const std::vector<double>& stage_extra,
                                    const std::vector<double>& stage_scale) {
  const size_t L = layer_cost.size(), S = stage_extra.size();
  FH_CHECK(S >= 1 && S <= L, "balance_layers: stages must be in [1, ", L, "] (one layer or more each), got ", S);
  FH_CHECK(stage_scale.empty() || stage_scale.size() == S, "balance_layers: ", stage_scale.size(),
           " stage scales for ", S, " stages");
  auto ok = [](double v) { return std::isfinite(v) && v >= 0; };
  for (double v : layer_cost) FH_CHECK(ok(v), "balance_layers: a layer cost must be finite and >= 0, got ", v);
  for (double v : stage_extra) FH_CHECK(ok(v), "balance_layers: a stage's extra cost must be finite and >= 0, got ", v);
  for (double v : stage_scale) FH_CHECK(ok(v), "balance_layers: a stage scale must be finite and >= 0, got ", v);
  std::vector<double> prefix(L + 1, 0);
  for (size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layer_cost[i];
  auto cost = [&](size_t s, size_t a, size_t b) {
    return stage_extra[s] + (stage_scale.empty() ? 1.0 : stage_scale[s]) * (prefix[b] - prefix[a]);
  };
  // f[s][i]: the least largest cost of stages 0..s-1 covering layers [0, i); from[s][i]: where stage s-1 starts.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> f(S + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<size_t>> from(S + 1, std::vector<size_t>(L + 1, 0));
  f[0][0] = 0;
  for (size_t s = 1; s <= S; ++s) {
    for (size_t i = s; i + (S - s) <= L; ++i) {
      for (size_t j = s - 1; j < i; ++j) {
        if (f[s - 1][j] == inf) continue;
        const double v = std::max(f[s - 1][j], cost(s - 1, j, i));
        if (v < f[s][i]) f[s][i] = v, from[s][i] = j;
      }
    }
  }
  std::vector<int64_t> b(S + 1);
  size_t i = L;
  for (size_t s = S; s > 0; --s) {
    b[s] = int64_t(i);
    i = from[s][i];
  }
  b[0] = 0;
  return b;
}

std::vector<int64_t> balance_stages(const ModelShape& m, const std::vector<HardwareProfile>& hw, const Workload& w,
                                    int64_t stages, const Policy& p) {
  const int64_t L = m.config.n_layers, S = stages;
  std::vector<int64_t> b = even_bounds(L, S);
  FH_CHECK(hw.size() == 1 || int64_t(hw.size()) == S, "a pipeline of ", S, " stages needs 1 or ", S,
           " hardware profiles, got ", hw.size());
  if (S == 1) return b;
  std::vector<double> extra(static_cast<size_t>(S)), scale(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    // Stage times are affine in the layer count (the schedule is periodic in the layers), so
    // two counts give the per-layer cost and the rest.
    const int64_t n = b[size_t(s) + 1] - b[size_t(s)];
    const HardwareProfile& h = hw[hw.size() == 1 ? 0 : size_t(s)];
    auto t = [&](int64_t layers) {
      CostModel cm(m.stage(layers, s == 0, s == S - 1), h, w);
      const Estimate e = cm.estimate(p);
      return e.prefill_s + e.decode_s;
    };
    const double tn = t(n), tn1 = t(n + 1);
    scale[size_t(s)] = std::max(0.0, tn1 - tn);
    extra[size_t(s)] = std::max(0.0, tn - double(n) * scale[size_t(s)]);
  }
  return balance_layers(std::vector<double>(static_cast<size_t>(L), 1.0), extra, scale);
}

// ---- the pipeline formula ------------------------------------------------------------------

namespace {

void check_timing(const PipelineTiming& t) {
  const size_t S = t.prefill_s.size();
  FH_CHECK(S >= 1 && t.decode_s.size() == S, "pipeline timing: ", t.prefill_s.size(), " prefill and ", t.decode_s.size(),
           " decode stage times (need the same count, >= 1)");
  FH_CHECK(t.prefill_hop_s.size() == S - 1 && t.decode_hop_s.size() == S - 1, "pipeline timing: ", S,
           " stages need ", S - 1, " hops, got ", t.prefill_hop_s.size(), " and ", t.decode_hop_s.size());
  FH_CHECK(t.groups >= 1 && t.gen_len >= 1, "pipeline timing: groups and gen_len must be >= 1, got ", t.groups, " and ",
           t.gen_len);
}

double step_sum(double pre, double dec, int64_t T) { return pre + double(T - 1) * dec; }

struct Bounds {
  double chain = 0, resource = 0;
};

Bounds bounds_of(const PipelineTiming& t) {
  check_timing(t);
  const size_t S = t.prefill_s.size();
  const double G = double(t.groups);
  const int64_t T = t.gen_len;
  // The last step's values (the drain): decode unless the job is its prefill alone.
  auto c_last = [&](size_t s) { return T > 1 ? t.decode_s[s] : t.prefill_s[s]; };
  auto x_last = [&](size_t b) { return T > 1 ? t.decode_hop_s[b] : t.prefill_hop_s[b]; };
  Bounds r;
  r.chain = (G - 1) * t.prefill_s[0] + double(T - 1) * (S > 1 ? t.return_s : 0.0);
  for (size_t s = 0; s < S; ++s) r.chain += step_sum(t.prefill_s[s], t.decode_s[s], T);
  for (size_t b = 0; b + 1 < S; ++b) r.chain += step_sum(t.prefill_hop_s[b], t.decode_hop_s[b], T);
  for (size_t s = 0; s < S; ++s) {
    double v = G * step_sum(t.prefill_s[s], t.decode_s[s], T);
    for (size_t j = 0; j < s; ++j) v += t.prefill_s[j] + t.prefill_hop_s[j];
    for (size_t j = s + 1; j < S; ++j) v += x_last(j - 1) + c_last(j);
    r.resource = std::max(r.resource, v);
  }
  for (size_t b = 0; b + 1 < S; ++b) {  // boundary b between stages b and b + 1
    double v = G * step_sum(t.prefill_hop_s[b], t.decode_hop_s[b], T);
    for (size_t j = 0; j <= b; ++j) v += t.prefill_s[j] + (j < b ? t.prefill_hop_s[j] : 0.0);
    for (size_t j = b + 1; j < S; ++j) v += c_last(j) + (j > b + 1 ? x_last(j - 1) : 0.0);
    r.resource = std::max(r.resource, v);
  }
  return r;
}

}  // namespace

double pipeline_wall_s(const PipelineTiming& t) {
  const Bounds b = bounds_of(t);
  return std::max(b.chain, b.resource);
}

double stage_busy_s(const PipelineTiming& t, size_t stage) {
  check_timing(t);
  FH_CHECK(stage < t.prefill_s.size(), "pipeline timing: no stage ", stage, " of ", t.prefill_s.size());
  return double(t.groups) * step_sum(t.prefill_s[stage], t.decode_s[stage], t.gen_len);
}

double bubble_fraction(const PipelineTiming& t) {
  const double wall = pipeline_wall_s(t);
  if (wall <= 0) return 0;
  double busy = 0;
  for (size_t s = 0; s < t.prefill_s.size(); ++s) busy += stage_busy_s(t, s);
  return std::max(0.0, 1 - busy / (double(t.prefill_s.size()) * wall));
}

int64_t groups_to_hide(const PipelineTiming& t, int64_t max_groups) {
  FH_CHECK(max_groups >= 1, "groups_to_hide: max_groups must be >= 1, got ", max_groups);
  PipelineTiming u = t;
  for (int64_t g = 1; g <= max_groups; ++g) {
    u.groups = g;
    const Bounds b = bounds_of(u);
    if (b.chain <= b.resource * (1 + 1e-12)) return g;
  }
  return max_groups;
}

// ---- the planner ------------------------------------------------------------------------

namespace {

struct Planner {
  Planner(const ModelShape& m_, const std::vector<HardwareProfile>& hw_, const Workload& w_, const PipelineOptions& o_)
      : m(m_), hw(hw_), w(w_), o(o_), S(o_.stages) {}
  const ModelShape& m;
  const std::vector<HardwareProfile>& hw;
  const Workload& w;
  const PipelineOptions& o;
  int64_t S = 1;
  std::vector<StageLink> links;
  // (stage layers, embed, head, profile, gbs, ngb, groups) -> best placement (quick estimate).
  using Key = std::tuple<int64_t, bool, bool, size_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::optional<Estimate>> cache;
  std::map<std::tuple<int64_t, bool, bool, size_t>, std::unique_ptr<CostModel>> models;

  size_t profile_of(int64_t s) const { return hw.size() == 1 ? 0 : size_t(s); }
  const HardwareProfile& hw_of(int64_t s) const { return hw[profile_of(s)]; }

  CostModel& model(int64_t layers, bool embed, bool head, size_t prof) {
    auto& p = models[{layers, embed, head, prof}];
    if (!p) p = std::make_unique<CostModel>(m.stage(layers, embed, head), hw[prof], w);
    return *p;
  }
  CostModel& model_of(const std::vector<int64_t>& b, int64_t s) {
    return model(b[size_t(s) + 1] - b[size_t(s)], s == 0, s == S - 1, profile_of(s));
  }

  const std::optional<Estimate>& place(const std::vector<int64_t>& b, int64_t s, int64_t gbs, int64_t ngb, int64_t G) {
    const int64_t n = b[size_t(s) + 1] - b[size_t(s)];
    const Key k{n, s == 0, s == S - 1, profile_of(s), gbs, ngb, G};
    auto it = cache.find(k);
    if (it != cache.end()) return it->second;
    SearchOptions so = o.search;
    so.groups = G;
    return cache[k] = best_placement(model_of(b, s), so, gbs, ngb);
  }

  // All stages' placements for a shape, or nullopt with the first stage that cannot fit.
  std::optional<std::vector<Estimate>> place_all(const std::vector<int64_t>& b, int64_t gbs, int64_t ngb, int64_t G,
                                                 int64_t* failed = nullptr) {
    std::vector<Estimate> out;
    for (int64_t s = 0; s < S; ++s) {
      const std::optional<Estimate>& e = place(b, s, gbs, ngb, G);
      if (!e) {
        if (failed) *failed = s;
        return std::nullopt;
      }
      out.push_back(*e);
    }
    return out;
  }

  uint64_t hop_bytes(int64_t block, bool prefill) const {
    const uint64_t act = dtype_size(act_dtype_of(hw_of(0).device));
    return uint64_t(block) * uint64_t(prefill ? w.prompt_len : 1) * uint64_t(m.config.hidden) * act;
  }

  PipelineTiming timing(const std::vector<Estimate>& es, int64_t G) const {
    PipelineTiming t;
    t.groups = G;
    t.gen_len = w.gen_len;
    const int64_t block = es[0].block;
    for (const Estimate& e : es) {
      t.prefill_s.push_back(e.prefill_s);
      t.decode_s.push_back(w.gen_len > 1 ? e.decode_s / double(w.gen_len - 1) : 0.0);
    }
    for (int64_t b = 0; b + 1 < S; ++b) {
      t.prefill_hop_s.push_back(links[size_t(b)].seconds(hop_bytes(block, true)));
      t.decode_hop_s.push_back(links[size_t(b)].seconds(hop_bytes(block, false)));
    }
    t.return_s = S > 1 ? links.back().seconds(uint64_t(block) * 12) : 0.0;
    return t;
  }

  double throughput(const std::vector<Estimate>& es, int64_t G) const {
    const double wall = pipeline_wall_s(timing(es, G));
    return double(G * es[0].block * w.gen_len) / std::max(wall, 1e-12);
  }

  std::string stage_name(const std::vector<int64_t>& b, int64_t s) const {
    std::ostringstream os;
    os << "stage " << s << " (layers " << b[size_t(s)] << ".." << b[size_t(s) + 1] - 1 << (s == 0 ? ", embedding" : "")
       << (s == S - 1 ? ", lm_head" : "") << ") of " << m.config.name << " on " << hw_of(s).name;
    return os.str();
  }

  [[noreturn]] void infeasible(const std::vector<int64_t>& b, int64_t s, int64_t G) {
    // The smallest run of that stage, everything offloaded, for the numbers in the message.
    const bool disk = o.search.allow_disk;
    FH_FAIL("pipeline infeasible: no policy fits ", stage_name(b, s), " with ", G, " group", G > 1 ? "s" : "",
            " in flight; its smallest run (batch 1, everything offloaded",
            disk ? "" : " to the host: no disk is allowed", ")",
            smallest_run_verdict(hw_of(s), model_of(b, s).memory(smallest_policy(disk), G)));
  }
};

}  // namespace

PipelinePlan plan_pipeline(const ModelConfig& c, const std::vector<HardwareProfile>& hw, const Workload& w,
                           const PipelineOptions& o) {
  return plan_pipeline(ModelShape::from_config(c), hw, w, o);
}

PipelinePlan plan_pipeline(const ModelShape& m, const std::vector<HardwareProfile>& hw, const Workload& w,
                           const PipelineOptions& o) {
  const int64_t L = m.config.n_layers, S = o.stages;
  if (S < 1 || S > L)
    FH_FAIL("--pipeline-stages must be in [1, ", L, "] (", m.config.name, " has ", L,
            " layers, one or more per stage), got ", S);
  FH_CHECK(hw.size() == 1 || int64_t(hw.size()) == S, "a pipeline of ", S, " stages needs 1 or ", S,
           " hardware profiles, got ", hw.size());
  FH_CHECK(o.groups >= 0, "--groups must be >= 0 (0 = choose), got ", o.groups);
  FH_CHECK(o.max_groups >= 1, "max_groups must be >= 1, got ", o.max_groups);
  std::vector<int64_t> bounds = o.bounds.empty() ? even_bounds(L, S) : o.bounds;
  if (!o.bounds.empty()) {
    bool ok = int64_t(bounds.size()) == S + 1 && bounds.front() == 0 && bounds.back() == L;
    for (size_t i = 1; ok && i < bounds.size(); ++i) ok = bounds[i] > bounds[i - 1];
    std::ostringstream os;
    for (int64_t v : bounds) os << (os.tellp() > 0 ? "," : "") << v;
    FH_CHECK(ok, "pipeline bounds ", os.str(), " must be ", S + 1, " increasing layer indices from 0 to ", L);
  }
  Planner pl(m, hw, w, o);
  for (int64_t b = 0; b + 1 < S; ++b) {
    pl.links.push_back(o.link ? *o.link : pl.hw_of(b).between_stages());
    FH_CHECK(pl.links.back().bandwidth > 0, "the stage link after stage ", b, " (", pl.links.back().name,
             ") has no bandwidth");
  }
  if (S == 1) pl.links.clear();

  // 1. The shared batch shape on the starting split, G fixed at the given count or S.
  // When S groups do not fit, the search runs again with one (step 3 then finds what fits).
  int64_t G = o.groups > 0 ? o.groups : S;
  std::optional<std::vector<Estimate>> best;
  int64_t failed = 0;
  for (;;) {
    double best_tp = 0;
    // Larger blocks stop paying once they add under 1% for 3 steps (the pipeline's fixed fill
    // and link latencies would otherwise reward every larger block a little).
    for_each_block_shape(o.search, 0.01, [&](int64_t gbs, int64_t ngb) -> std::optional<double> {
      const auto es = pl.place_all(bounds, gbs, ngb, G, &failed);
      if (!es) return std::nullopt;
      const double tp = pl.throughput(*es, G);
      if (!best || tp > best_tp) best = es, best_tp = tp;
      return tp;
    });
    if (best || o.groups > 0 || G == 1) break;
    G = 1;
  }
  if (!best) pl.infeasible(bounds, failed, G);
  const int64_t gbs = (*best)[0].policy.gpu_batch_size, ngb = (*best)[0].policy.num_gpu_batches;

  // 2. Re-balance the split by the stages' own cost-model times, while the slowest improves.
  auto job_time = [&](const Estimate& e) { return e.prefill_s + e.decode_s; };
  auto slowest = [&](const std::vector<Estimate>& es) {
    double v = 0;
    for (const Estimate& e : es) v = std::max(v, job_time(e));
    return v;
  };
  for (int iter = 0; o.bounds.empty() && S > 1 && iter < 4; ++iter) {
    std::vector<double> extra(static_cast<size_t>(S)), scale(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) {
      const int64_t n = bounds[size_t(s) + 1] - bounds[size_t(s)];
      const Policy& p = (*best)[size_t(s)].policy;
      // The stage's time with one layer more, same policy: its per-layer cost; the rest is
      // what it costs besides its layers (embedding, head, fixed overheads).
      const double t_n = job_time(pl.model(n, s == 0, s == S - 1, pl.profile_of(s)).quick(p));
      const double t_n1 = job_time(pl.model(n + 1, s == 0, s == S - 1, pl.profile_of(s)).quick(p));
      scale[size_t(s)] = std::max(0.0, t_n1 - t_n);
      extra[size_t(s)] = std::max(0.0, t_n - double(n) * scale[size_t(s)]);
    }
    const std::vector<int64_t> next = balance_layers(std::vector<double>(size_t(L), 1.0), extra, scale);
    if (next == bounds) break;
    const auto es = pl.place_all(next, gbs, ngb, G);
    if (!es || slowest(*es) >= slowest(*best)) break;
    bounds = next;
    best = es;
  }

  // 3. Groups: as many as hiding the round trip asks, as memory allows.
  PipelinePlan plan;
  plan.groups_to_hide = groups_to_hide(pl.timing(*best, G), o.max_groups);
  for (int iter = 0; o.groups == 0 && iter < 4; ++iter) {
    const int64_t want = groups_to_hide(pl.timing(*best, G), o.max_groups);
    plan.groups_to_hide = want;
    if (want == G) break;
    std::optional<std::vector<Estimate>> es = pl.place_all(bounds, gbs, ngb, want);
    int64_t g = want;
    while (!es && g > 1) {  // fewer groups fit more
      --g;
      es = pl.place_all(bounds, gbs, ngb, g);
    }
    if (!es) break;
    plan.groups_capped = g < want;
    const bool same = g == G;
    G = g;
    best = es;
    if (same || plan.groups_capped) break;
  }
  if (o.groups > 0) plan.groups_to_hide = groups_to_hide(pl.timing(*best, G), o.max_groups);

  // 4. Full estimates of the chosen policies, and the job's numbers.
  std::vector<Estimate> full;
  for (int64_t s = 0; s < S; ++s) full.push_back(pl.model_of(bounds, s).estimate((*best)[size_t(s)].policy));
  plan.bounds = bounds;
  plan.groups = G;
  plan.block = full[0].block;
  plan.links = pl.links;
  plan.prefill_hop_bytes = S > 1 ? pl.hop_bytes(plan.block, true) : 0;
  plan.decode_hop_bytes = S > 1 ? pl.hop_bytes(plan.block, false) : 0;
  plan.return_bytes = S > 1 ? uint64_t(plan.block) * 12 : 0;
  plan.timing = pl.timing(full, G);
  for (int64_t s = 0; s < S; ++s) {
    StagePlan sp;
    sp.first = bounds[size_t(s)];
    sp.end = bounds[size_t(s) + 1];
    sp.embed = s == 0;
    sp.head = s == S - 1;
    sp.hardware = pl.hw_of(s).name;
    sp.estimate = full[size_t(s)];
    sp.prefill_step_s = plan.timing.prefill_s[size_t(s)];
    sp.decode_step_s = plan.timing.decode_s[size_t(s)];
    sp.memory = pl.model_of(bounds, s).memory(sp.estimate.policy, G);
    plan.stages.push_back(sp);
  }
  plan.wall_s = pipeline_wall_s(plan.timing);
  plan.throughput = double(G * plan.block * w.gen_len) / std::max(plan.wall_s, 1e-12);
  plan.bubble = bubble_fraction(plan.timing);
  if (w.gen_len > 1) {
    PipelineTiming pre = plan.timing;
    pre.gen_len = 1;
    plan.decode_throughput = double(G * plan.block * (w.gen_len - 1)) / std::max(plan.wall_s - pipeline_wall_s(pre), 1e-12);
  }
  return plan;
}

}  // namespace flexh2o
