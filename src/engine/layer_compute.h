// The transformer's compute, unit by unit (embedding, attention, MLP, head), on the CPU kernels
// with fp32 activations and caller-provided buffers. The in-memory Forward, the CPU device's
// unit ops and the host attention of the offloading engine all call these, so a run's numbers
// do not depend on where the weights or the KV cache were homed. Every op computes each row
// independently (the kernels' determinism contract), so chunking rows never changes a bit.
// KV segments (unit_args.h) hold K/V in f32/f16/bf16. Not thread-safe (owns scratch).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/unit_args.h"
#include "model/weights.h"

namespace flexh2o {

// One step's shape: B sequences x T rows (left-padded); positions [B*T]; seq_keys [B] =
// cached tokens per sequence once this step's rows are written (rows mapping to a negative
// slot, seq_keys[b] - T + t < 0, are padding).
struct StepShape {
  int64_t B = 0, T = 0;
  const int32_t* positions = nullptr;
  const int32_t* seq_keys = nullptr;
};

// Rows the MLP processes at a time (bounds its scratch; the result is the same bit for bit).
inline constexpr int64_t kMlpChunkRows = 4096;

class LayerCompute {
 public:
  // hidden[B*T, H] = token embedding (+ OPT learned positions).
  void embed(const ModelConfig& c, const ModelWeights& w, const int32_t* ids, const StepShape& s, float* hidden);
  // q [B*T, q_dim], k and v [B*T, kv_dim] from the first norm of hidden (bias, rotary applied).
  void qkv(const ModelConfig& c, const LayerWeights& L, const StepShape& s, const float* hidden, float* q, float* k,
           float* v);
  // The new K/V rows of seg's sequences go into seg's cache, then attention over it; q/k/v/attn
  // are the whole step's rows (sequence b's rows at b*T).
  void attend(const ModelConfig& c, const StepShape& s, const float* q, const float* k, const float* v,
              const KvSegment& seg, float* attn);
  // hidden += o_proj(attn)
  void attention_out(const ModelConfig& c, const LayerWeights& L, const StepShape& s, const float* attn,
                     float* hidden);
  // hidden += mlp(norm(hidden)), kMlpChunkRows rows at a time.
  void mlp(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden);
  // One transformer layer in place on hidden[B*T, H]; segments must cover sequences [0, B) in order.
  void layer(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden,
             std::span<const KvSegment> segs);
  // Final norm + lm_head of every row: logits [B*T, V].
  void head(const ModelConfig& c, const ModelWeights& w, const StepShape& s, const float* hidden,
            std::vector<float>& logits);
  // head() into caller memory for rows first..first+rows-1 of each sequence: logits [rows, B, V],
  // block i the rows first + i (first T - 1, rows 1: [B, V] of the last rows).
  void head_rows(const ModelConfig& c, const ModelWeights& w, const StepShape& s, const float* hidden, int64_t first,
                 int64_t rows, float* logits);

  // Bytes of scratch this object holds for steps of M = B*T rows using only the unit ops above
  // (not layer()/head(), which also keep q/k/v/attention rows); head_rows() of up to M rows in all.
  static int64_t unit_scratch_bytes(const ModelConfig& c, int64_t M);

 private:
  // Final norm + lm_head of the first R rows of normed_ (in place) into logits [R, V].
  void head_of_gathered(const ModelConfig& c, const ModelWeights& w, int64_t R, float* logits);
  // out[n, H] = an expert's SwiGLU of width F over x[n, H] (through ffn_a_ / ffn_b_).
  void expert_ffn(const ExpertWeights& w, const float* x, int64_t n, int64_t H, int64_t F, float* out);
  // A MoE MLP over m rows of normed_, added into h.
  void moe(const ModelConfig& c, const LayerWeights& L, int64_t m, float* h);

  std::vector<float> normed_, q_, k_, v_, attn_, ffn_a_, ffn_b_;
  std::vector<float> router_, route_w_, gathered_, expert_out_, moe_sum_, expert_w_, shared_gate_;  // MoE
  std::vector<int32_t> route_e_;
  std::vector<int64_t> expert_rows_, expert_start_, expert_at_;
};

}  // namespace flexh2o
