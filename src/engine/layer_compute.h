// The transformer's compute, unit by unit (embedding, one layer, head), on caller-provided
// buffers. Both the in-memory Forward and the offloading executor call these, so a run's
// numbers do not depend on where the weights or the KV cache were homed.
// KV layout: per segment of sequences, K and V each [n_seq, kv_heads, capacity, head_dim],
// left-aligned: sequence b's tokens fill slots [0, n_b). Not thread-safe (owns scratch).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/weights.h"

namespace flexh2o {

// A contiguous range of the micro-batch's sequences whose K/V live in one buffer.
struct KvSegment {
  float* k = nullptr;
  float* v = nullptr;
  int64_t first_seq = 0, n_seq = 0;
  int64_t capacity = 0;  // slots per (sequence, kv head) in this buffer
  // Optional [n_seq, n_heads, capacity], zeroed by the caller: += each slot's attention
  // probability summed over this step's queries (H2O scores).
  float* key_scores = nullptr;
};

// One step's shape: B sequences x T rows (left-padded); positions [B*T]; seq_keys [B] =
// cached tokens per sequence once this step's rows are written (rows mapping to a negative
// slot, seq_keys[b] - T + t < 0, are padding).
struct StepShape {
  int64_t B = 0, T = 0;
  const int32_t* positions = nullptr;
  const int32_t* seq_keys = nullptr;
};

class LayerCompute {
 public:
  // hidden[B*T, H] = token embedding (+ OPT learned positions).
  void embed(const ModelConfig& c, const ModelWeights& w, const int32_t* ids, const StepShape& s, float* hidden);
  // One transformer layer in place on hidden[B*T, H]. New K/V rows are written into the
  // segments and attention runs over them. Segments must cover sequences [0, B) in order.
  void layer(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden,
             std::span<const KvSegment> segs);
  // Final norm + lm_head. last_only: logits [B, V] of each sequence's last row; else [B*T, V].
  void head(const ModelConfig& c, const ModelWeights& w, const StepShape& s, const float* hidden, bool last_only,
            std::vector<float>& logits);

  // Split of a layer for cpu_cache_compute: projections, attention per segment, the rest.
  // layer() == qkv(); attend(seg) for each seg; finish().
  void qkv(const ModelConfig& c, const LayerWeights& L, const StepShape& s, const float* hidden);
  void attend(const ModelConfig& c, const StepShape& s, const KvSegment& seg);
  void finish(const ModelConfig& c, const LayerWeights& L, const StepShape& s, float* hidden);
  // attend() on projections computed elsewhere (the CUDA runner's decode attention on the
  // host): q [B*T, q_dim], k and v [B*T, kv_dim] fp32, as qkv() leaves them. attn() is
  // attend()'s output [B*T, q_dim], valid until the next call.
  void load_qkv(const ModelConfig& c, const StepShape& s, const float* q, const float* k, const float* v);
  const float* attn() const { return attn_.data(); }
  const float* q() const { return q_.data(); }  // qkv()'s projections, as load_qkv() takes them
  const float* k() const { return k_.data(); }
  const float* v() const { return v_.data(); }
  // finish() on an attention output computed elsewhere: attn [B*T, q_dim] fp32.
  void load_attn(const ModelConfig& c, const StepShape& s, const float* attn);

  // Bytes of scratch this object holds for a step of M = B*T rows (for memory budgets).
  static int64_t scratch_bytes(const ModelConfig& c, int64_t M);

 private:
  std::vector<float> normed_, q_, k_, v_, attn_, ffn_a_, ffn_b_, last_;
};

}  // namespace flexh2o
