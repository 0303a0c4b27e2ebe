// KV-policy decisions at a big model's shapes: decide_kv_policy and apply_kv_policy (which moves
// the f16 K/V rows too) for an H2O prefill and its decode steps, on one thread and on all; ns per
// decided slot against reading each slot's scores, acc and pos once at the streaming rate measured
// in the same run. Usage: bench_kv_policy [--seqs 48] [--heads 56] [--kv-heads 56] [--prompt 512]
// [--gen 32] [--layers 4] [--ratio 0.1] [--policy h2o|random] [--json FILE]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "ceilings.h"
#include "core/dtype.h"
#include "engine/kv_evict.h"

namespace {
using namespace flexh2o;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t seqs = 48, heads = 56, kv_heads = 56, prompt = 512, gen = 32, layers = 4;
  double ratio = 0.1;
  std::string policy = "h2o", json;
};

struct Layer {
  KvPolicyState state;
  std::vector<int32_t> len;  // cached rows per sequence
};

struct Phase {
  double seconds = 0;
  int64_t slots = 0;  // slots decided: rows x their n before eviction, summed over calls
  double ns_per_slot() const { return slots ? seconds * 1e9 / double(slots) : 0; }
};

struct Result {
  Phase prefill, decide, apply;
};

// One prefill and `gen` decode steps over `layers` layers, the scores drawn fresh each call.
// apply_kv_policy moves the f16 K/V rows of a buffer of kept + 1 slots a sequence (decode only).
Result run(const Args& a, const ModelConfig& c, const KvPolicy& policy) {
  const KvBudget budget = policy.budget(a.prompt);
  const int64_t kept = budget.kept(a.prompt), dcap = kept + 1, pcap = a.prompt;
  const size_t nb = size_t(a.seqs);
  const std::vector<KvBudget> budgets(nb, budget);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> scores(size_t(a.seqs * c.n_heads * pcap));
  std::vector<uint16_t> k(size_t(a.seqs * c.n_kv_heads * dcap * c.head_dim), f32_to_f16(0.01f)), v(k);
  std::vector<Layer> ls(size_t(a.layers));
  std::vector<int32_t> before(nb), after(nb), seen(nb), dlo, dhi;
  EvictArgs ea;
  ea.policy = &policy;
  ea.config = &c;
  ea.len_before = before.data();
  ea.len_after = after.data();
  ea.seen_before = seen.data();
  ea.budgets = budgets.data();
  ea.dirty_lo = &dlo;
  ea.dirty_hi = &dhi;
  auto fill_scores = [&](int64_t n) {
    for (int64_t r = 0; r < a.seqs * c.n_heads; ++r)
      for (int64_t s = 0; s < n; ++s) scores[size_t(r * pcap + s)] = u(rng);
  };
  auto call = [&](Layer& l, int64_t n_new, bool prefill, bool move_kv, Phase& ph) {
    for (size_t b = 0; b < nb; ++b) {
      before[b] = l.len[b];
      after[b] = l.len[b] + int32_t(n_new);
      ph.slots += int64_t(after[b]) * c.n_kv_heads;
    }
    fill_scores(after[0]);  // not timed
    ea.prefill = prefill;
    ea.state = &l.state;
    ea.score_capacity = pcap;
    ea.seg = KvSegment{move_kv ? k.data() : nullptr, move_kv ? v.data() : nullptr, DType::F16, 0, a.seqs,
                       move_kv ? dcap : pcap, scores.data()};
    const auto t0 = Clock::now();
    if (move_kv)
      apply_kv_policy(ea);
    else
      decide_kv_policy(ea, [](int64_t, int64_t, std::span<const int32_t>) {});
    ph.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    std::copy(after.begin(), after.end(), l.len.begin());
  };
  Result res;
  for (Layer& l : ls) {
    l.state.reset(a.seqs, c.n_kv_heads, pcap);
    l.len.assign(nb, 0);
  }
  std::fill(seen.begin(), seen.end(), 0);
  for (Layer& l : ls) call(l, a.prompt, true, false, res.prefill);
  for (int64_t t = 0; t < a.gen; ++t) {
    std::fill(seen.begin(), seen.end(), int32_t(a.prompt + t));
    // Odd steps move the K/V too; both phases see the same evolving rows.
    for (Layer& l : ls) call(l, 1, false, t % 2 == 1, t % 2 == 1 ? res.apply : res.decide);
  }
  return res;
}

nlohmann::json report(const char* name, const Result& r, double floor_ns, int64_t layers_of_model, int64_t seqs,
                      const Args& a) {
  // Host seconds a whole run would spend: each phase's time per layer, scaled to the model's layers.
  const double per_layer = double(layers_of_model) / double(a.layers);
  const double run_s = per_layer * (r.prefill.seconds + (r.decide.seconds + r.apply.seconds));
  std::printf("%-10s prefill %6.2f ns/slot | decode decide %6.2f, apply %6.2f ns/slot (floor %.2f: %.0f%%, %.0f%%)"
              " | a %lld-layer run: %.2f s for %lld sequences\n",
              name, r.prefill.ns_per_slot(), r.decide.ns_per_slot(), r.apply.ns_per_slot(), floor_ns,
              100 * floor_ns / r.decide.ns_per_slot(), 100 * floor_ns / r.apply.ns_per_slot(),
              static_cast<long long>(layers_of_model), run_s, static_cast<long long>(seqs));
  return {{"prefill_ns_per_slot", r.prefill.ns_per_slot()},
          {"decide_ns_per_slot", r.decide.ns_per_slot()},
          {"apply_ns_per_slot", r.apply.ns_per_slot()},
          {"floor_ns_per_slot", floor_ns},
          {"run_seconds_48_layers", run_s}};
}

}  // namespace

int main(int argc, char** argv) {
  bench::ensure_openblas_coretype(argv);
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* flag) -> const char* {
      if (std::strcmp(argv[i], flag) != 0 || i + 1 >= argc) return nullptr;
      return argv[++i];
    };
    if (const char* s = next("--seqs")) a.seqs = std::stoll(s);
    else if (const char* s = next("--heads")) a.heads = std::stoll(s);
    else if (const char* s = next("--kv-heads")) a.kv_heads = std::stoll(s);
    else if (const char* s = next("--prompt")) a.prompt = std::stoll(s);
    else if (const char* s = next("--gen")) a.gen = std::stoll(s);
    else if (const char* s = next("--layers")) a.layers = std::stoll(s);
    else if (const char* s = next("--ratio")) a.ratio = std::stod(s);
    else if (const char* s = next("--policy")) a.policy = s;
    else if (const char* s = next("--json")) a.json = s;
    else {
      std::fprintf(stderr, "bench_kv_policy: unknown or incomplete argument %s (see the file's head)\n", argv[i]);
      return 2;
    }
  }
  if (a.seqs < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0 || a.prompt < 2 || a.gen < 2 || a.layers < 1 ||
      (a.policy != "h2o" && a.policy != "random")) {
    std::fprintf(stderr, "bench_kv_policy: bad shape or policy (heads must be a multiple of kv-heads)\n");
    return 2;
  }
  const int64_t hd = 128;
  const ModelConfig c = ModelConfig::from_json_text(
      "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": " + std::to_string(a.heads * hd) +
          ", \"intermediate_size\": 256, \"num_hidden_layers\": 48, \"num_attention_heads\": " +
          std::to_string(a.heads) + ", \"num_key_value_heads\": " + std::to_string(a.kv_heads) +
          ", \"max_position_embeddings\": 65536, \"torch_dtype\": \"float16\"}",
      "bench_kv_policy shape");
  KvPolicyConfig kc;
  kc.kind = a.policy == "h2o" ? KvPolicyKind::kH2o : KvPolicyKind::kRandom;
  kc.heavy_ratio = a.ratio;
  kc.recent_ratio = a.ratio;
  const auto policy = make_policy(kc);
  const int64_t threads = tbb::info::default_concurrency();
  std::printf("%s\n", bench::machine_info().c_str());
  std::printf("%s: %lld sequences x %lld KV heads (group %lld), prompt %lld + %lld steps, heavy %.2f + recent %.2f, "
              "%lld layers\n",
              a.policy.c_str(), static_cast<long long>(a.seqs), static_cast<long long>(a.kv_heads),
              static_cast<long long>(a.heads / a.kv_heads), static_cast<long long>(a.prompt),
              static_cast<long long>(a.gen), a.ratio, a.ratio, static_cast<long long>(a.layers));
  // The floor: read a slot's scores (one per query head of its group), acc and pos once.
  const double bytes = double(a.heads / a.kv_heads) * 4 + 8;
  const double bw1 = bench::measure_read_bandwidth_gbs(1), bwn = bench::measure_read_bandwidth_gbs(0);
  std::printf("streaming read: %.1f GB/s on 1 thread, %.1f on %lld; floor %.0f B/slot\n", bw1, bwn,
              static_cast<long long>(threads), bytes);
  tbb::task_arena one(1);
  Result r1;
  one.execute([&] { r1 = run(a, c, *policy); });
  const Result rn = run(a, c, *policy);
  nlohmann::json j{{"machine", bench::machine_info()}, {"policy", a.policy}, {"seqs", a.seqs},
                   {"kv_heads", a.kv_heads}, {"heads", a.heads}, {"prompt", a.prompt}, {"gen", a.gen}};
  j["one_thread"] = report("1 thread", r1, bytes / bw1, 48, a.seqs, a);
  j["all_threads"] = report((std::to_string(threads) + " threads").c_str(), rn, bytes / bwn, 48, a.seqs, a);
  if (!a.json.empty()) std::ofstream(a.json) << j.dump(2) << "\n";
  return 0;
}
