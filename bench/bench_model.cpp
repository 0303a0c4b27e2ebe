// Model benchmark on the CPU device: prefill GFLOP/s against the sgemm ceiling and decode
// tokens/s against the memory-bandwidth bound (weight bytes per token / measured bandwidth),
// for OPT dummy shapes. Ceilings are measured in the same run. Prints a table, writes JSON.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "ceilings.h"
#include "engine/generate.h"
#include "kernels/cpu/isa.h"

namespace {
using namespace flexh2o;
using Clock = std::chrono::steady_clock;

struct Case {
  std::string preset;
  int64_t prefill_batch, prefill_len, decode_prompt, decode_tokens, decode_batch;
};

double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Matmul + attention FLOPs of one prefill step of B sequences of S tokens (lm_head on last rows).
double prefill_flops(const ModelConfig& c, int64_t B, int64_t S) {
  const double H = double(c.hidden), L = double(c.n_layers);
  const double per_token_layer =
      2.0 * (H * double(c.q_dim()) + 2 * H * double(c.kv_dim()) + double(c.q_dim()) * H + c.mlp_row_params());
  const double attn = 2.0 * 2.0 * double(c.q_dim()) * double(S) * double(S + 1) / 2.0;  // per sequence per layer
  return L * (per_token_layer * double(B * S) + attn * double(B)) + 2.0 * H * double(c.vocab_size) * double(B);
}

// Bytes of weights one decode step must read (all layers + final norm + lm_head).
double decode_weight_bytes(const Model& m) {
  const ModelWeights& w = m.weights();
  double bytes = double(m.weight_bytes()) - double(w.embed.nbytes()) - double(w.pos_embed.empty() ? 0 : w.pos_embed.nbytes());
  return bytes + double(w.lm_head.nbytes()) - (m.config().tie_embeddings ? 0.0 : double(w.lm_head.nbytes()));
}

}  // namespace

int main(int argc, char** argv) {
  bench::ensure_openblas_coretype(argv);
  std::string json_path = "bench_model.json", configs = FLEXH2O_SOURCE_CONFIGS;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--quick") quick = true;
    else if (a == "--help") {
      std::puts("bench_model [--json FILE] [--quick]: OPT-125M / OPT-1.3B dummy prefill + decode on the CPU device");
      return 0;
    }
  }
  const int threads = int(std::thread::hardware_concurrency());
  std::printf("machine: %s\n", bench::machine_info().c_str());
  const double gemm_ceiling = bench::measure_sgemm_gflops(threads);
  const double bw_ceiling = bench::measure_read_bandwidth_gbs(threads);
  std::printf("ceilings: OpenBLAS sgemm %.1f GFLOP/s, read bandwidth %.1f GB/s\n\n", gemm_ceiling, bw_ceiling);

  std::vector<Case> cases = {{"opt-125m", 4, 256, 64, 32, 1}, {"opt-1.3b", 1, 256, 64, 16, 1}};
  if (quick) cases.resize(1);
  nlohmann::json out{{"machine", bench::machine_info()},
                     {"sgemm_ceiling_gflops", gemm_ceiling},
                     {"read_bandwidth_gbs", bw_ceiling},
                     {"cases", nlohmann::json::array()}};
  std::printf("%-10s %-28s %12s %12s %8s\n", "model", "phase", "measured", "ceiling", "ratio");
  CpuDevice dev(threads);
  for (const Case& k : cases) {
    ModelConfig c = ModelConfig::from_file(configs + "/models/" + k.preset + ".json");
    c.name = k.preset;
    Model m = Model::dummy(c, 1);
    Forward fwd(m, dev);
    // Prefill: one step over B x S tokens (after a warm-up run).
    std::vector<int32_t> ids(size_t(k.prefill_batch * k.prefill_len)), pos(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = int32_t((i * 7919) % size_t(c.vocab_size));
      pos[i] = int32_t(i % size_t(k.prefill_len));
    }
    std::vector<float> logits;
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      KvCache cache(c, k.prefill_batch, k.prefill_len);
      auto t0 = Clock::now();
      fwd.step(ids.data(), pos.data(), k.prefill_len, nullptr, cache, LogitsRows::kLast, logits);
      best = std::min(best, secs(t0));
    }
    const double gflops = prefill_flops(c, k.prefill_batch, k.prefill_len) / best / 1e9;
    // Decode: batch 1, greedy, fixed length.
    GenerationRequest r;
    r.prompt_ids.assign(size_t(k.decode_prompt), 5);
    r.max_new_tokens = k.decode_tokens;
    r.sampling.temperature = 0;
    GenerateOptions o;
    o.ignore_eos = true;
    o.batch_size = k.decode_batch;
    GenerateStats st;
    generate(fwd, {r}, o, &st);
    const double tok_s = double(st.decode_steps) / st.decode_seconds;
    const double bytes = decode_weight_bytes(m);
    const double bound = bw_ceiling * 1e9 / bytes;
    std::printf("%-10s %-28s %9.1f GF/s %9.1f GF/s %7.0f%%\n", k.preset.c_str(),
                ("prefill " + std::to_string(k.prefill_batch) + "x" + std::to_string(k.prefill_len)).c_str(), gflops,
                gemm_ceiling, 100 * gflops / gemm_ceiling);
    std::printf("%-10s %-28s %8.2f tok/s %8.2f tok/s %7.0f%%  (%.0f MB weights/token)\n", k.preset.c_str(),
                "decode batch 1", tok_s, bound, 100 * tok_s / bound, bytes / 1e6);
    out["cases"].push_back({{"model", k.preset},
                            {"prefill_batch", k.prefill_batch},
                            {"prefill_len", k.prefill_len},
                            {"prefill_seconds", best},
                            {"prefill_gflops", gflops},
                            {"prefill_ratio", gflops / gemm_ceiling},
                            {"decode_tokens_per_s", tok_s},
                            {"decode_bound_tokens_per_s", bound},
                            {"decode_weight_bytes_per_token", bytes},
                            {"decode_ratio", tok_s / bound}});
  }
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf("\nwrote %s\n", json_path.c_str());
  return 0;
}
