// Device addresses of a model's weights, as the GPU unit compute reads them: plain pointers
// in one dtype (F16 or BF16), owned by whoever uploaded them (GpuModel, or later an offloading
// engine's device buffers). Trivially copyable views; no CUDA headers. Unused fields are null
// (LLaMA has no biases; OPT has no gate/up/down; pos_embed is OPT only).
#pragma once

#include <vector>

#include "core/dtype.h"

namespace flexh2o::gpu {

struct GpuLayerWeights {
  const void *ln1_w = nullptr, *ln1_b = nullptr;
  const void *q_w = nullptr, *q_b = nullptr, *k_w = nullptr, *k_b = nullptr;
  const void *v_w = nullptr, *v_b = nullptr, *o_w = nullptr, *o_b = nullptr;
  const void *ln2_w = nullptr, *ln2_b = nullptr;
  const void *fc1_w = nullptr, *fc1_b = nullptr, *fc2_w = nullptr, *fc2_b = nullptr;  // OPT
  const void *gate_w = nullptr, *gate_b = nullptr, *up_w = nullptr, *up_b = nullptr;  // LLaMA
  const void *down_w = nullptr, *down_b = nullptr;
};

struct GpuModelWeights {
  DType dtype = DType::F16;  // of every tensor below
  const void* embed = nullptr;      // [vocab, hidden]
  const void* pos_embed = nullptr;  // OPT: [max_positions + 2, hidden]
  std::vector<GpuLayerWeights> layers;
  const void *final_norm_w = nullptr, *final_norm_b = nullptr;
  const void* lm_head = nullptr;  // [vocab, hidden]; == embed when tied
};

}  // namespace flexh2o::gpu
