// Group-wise asymmetric 4-bit quantisation in FlexGen's packed layout (PAPERS.md section 5),
// on the GPU and as a host reference that runs the same per-group math (detail/quant_math.h).
// A tensor is viewed as [outer, len, inner] with groups of group_size consecutive elements
// along len (group_dim), zero-padded to a multiple of group_size (the zeros count in min/max).
//   codes: uint8 [outer, padded_len/2, inner]; byte p holds element 2p in its high nibble and
//          2p+1 in its low nibble.   meta: fp16 [outer, groups, 2, inner] = (scale, min).
//   scale = 15/(mx-mn), q = round_half_even(clamp((x-mn)*scale, 0, 15)), x ~= q/scale + mn.
// Guard (FlexGen has none): scale is clamped to [2^-14, 65504], so a constant group (mx == mn)
// stores scale 65504 and codes 0 and decodes to exactly min; nothing becomes non-finite.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace flexh2o::gpu {

struct QuantLayout {
  int64_t outer = 1, len = 0, inner = 1;  // the tensor as [outer, len, inner]
  int64_t group_size = 64;                // even, > 0

  // Shape `s` grouped along dimension `group_dim` (weights: 0; KV cache [.., head_dim]: last).
  static QuantLayout of(const Shape& s, int group_dim, int64_t group_size);
  int64_t groups() const { return (len + group_size - 1) / group_size; }
  int64_t padded_len() const { return groups() * group_size; }
  int64_t numel() const { return outer * len * inner; }
  int64_t code_bytes() const { return outer * (padded_len() / 2) * inner; }
  int64_t meta_elems() const { return outer * groups() * 2 * inner; }  // fp16 values
};

// Host reference (blocking, thread-safe): x is fp32 numel(); meta holds fp16 bits.
void quantize_4bit_host(const QuantLayout& l, const float* x, uint8_t* codes, uint16_t* meta);
void dequantize_4bit_host(const QuantLayout& l, const uint8_t* codes, const uint16_t* meta, float* x);

// GPU, asynchronous on `stream`; x / out in dt (F16 or BF16), meta fp16 (device pointers).
// Bit-identical to the host reference on the same (dt-rounded) inputs.
void quantize_4bit(const QuantLayout& l, DType dt, const void* x, uint8_t* codes, void* meta,
                   cudaStream_t stream);
void dequantize_4bit(const QuantLayout& l, const uint8_t* codes, const void* meta, DType dt,
                     void* out, cudaStream_t stream);

}  // namespace flexh2o::gpu
