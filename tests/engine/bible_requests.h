// Four greedy requests of different lengths (the batch is left-padded), and the greedy tokens
// a runner generates for them, shared by the tests that compare runners (CPU KV policies, GPU
// runners, the CUDA runner's host cache) on the tiny models.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/test_util.h"
#include "policies/kv_config.h"
#include "policies/kv_policy.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::test {

inline std::vector<GenerationRequest> bible_requests(const std::string& model, int64_t gen) {
  Tokenizer tok = Tokenizer::load(model_dir(model));
  std::vector<GenerationRequest> reqs;
  for (const char* p : {"In the beginning God created the heaven and the earth. And the earth was without form",
                        "And", "The LORD is my shepherd; I shall not want. He maketh me to lie down", "Jesus wept."}) {
    GenerationRequest r;
    r.prompt_ids = tok.encode(p, true);
    r.max_new_tokens = gen;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  return reqs;
}

// The left-padded [B, S] batch generate() builds from `reqs`: ids, positions, real rows.
struct PaddedBatch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> ids, pos, real;
};
inline PaddedBatch left_pad(const std::vector<GenerationRequest>& reqs, int32_t pad_id) {
  PaddedBatch pb;
  pb.B = int64_t(reqs.size());
  for (const auto& r : reqs) pb.S = std::max<int64_t>(pb.S, int64_t(r.prompt_ids.size()));
  pb.ids.assign(size_t(pb.B * pb.S), pad_id);
  pb.pos.assign(size_t(pb.B * pb.S), 0);
  pb.real.assign(size_t(pb.B), 0);
  for (int64_t b = 0; b < pb.B; ++b) {
    const auto& p = reqs[size_t(b)].prompt_ids;
    const int64_t pad = pb.S - int64_t(p.size());
    pb.real[size_t(b)] = int32_t(p.size());
    for (size_t t = 0; t < p.size(); ++t) {
      pb.ids[size_t(b * pb.S + pad) + t] = p[t];
      pb.pos[size_t(b * pb.S + pad) + t] = int32_t(t);
    }
  }
  return pb;
}

// Every request's generated tokens (EOS ignored), in request order.
inline std::vector<std::vector<int32_t>> greedy_tokens(StepRunner& r, const std::vector<GenerationRequest>& reqs) {
  GenerateOptions o;
  o.ignore_eos = true;
  std::vector<std::vector<int32_t>> out;
  for (auto& g : generate(r, reqs, o)) out.push_back(g.tokens);
  return out;
}

// H2O keeping `heavy` scored and `recent` latest tokens.
inline std::unique_ptr<KvPolicy> h2o_policy(int64_t heavy, int64_t recent) {
  KvPolicyConfig c;
  c.kind = KvPolicyKind::kH2o;
  c.heavy_budget = heavy;
  c.recent_budget = recent;
  return make_policy(c);
}

}  // namespace flexh2o::test
