// Mixture-of-experts routing (ops.h: moe_route): softmax over each row's router logits, then
// the top k, as transformers' Mixtral and Qwen3-MoE routers compute them. Plain loops: the
// work is M x n_experts, nothing beside the experts' matrix products.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu {

void moe_route(const float* logits, int64_t M, int64_t E, int64_t k, bool normalize, int32_t* experts, float* weights) {
  FH_CHECK(E >= 1 && k >= 1 && k <= E, "moe_route: ", k, " of ", E, " experts");
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t r = 0; r < M; ++r) {
    const float* l = logits + r * E;
    float mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] /= sum;
      order[size_t(e)] = int32_t(e);
    }
    // A NaN logit must not leave the order undefined: NaN ranks below every number.
    auto before = [&](int32_t a, int32_t b) {
      const float pa = p[size_t(a)], pb = p[size_t(b)];
      const bool na = std::isnan(pa), nb = std::isnan(pb);
      if (na != nb) return nb;
      if (!na && pa != pb) return pa > pb;
      return a < b;
    };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    float chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      experts[r * k + j] = order[size_t(j)];
      weights[r * k + j] = normalize ? p[size_t(order[size_t(j)])] / chosen : p[size_t(order[size_t(j)])];
    }
  }
}

}  // namespace flexh2o::cpu
