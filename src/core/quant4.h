// 4-bit group-wise asymmetric compression (FlexGen's scheme: 4 bits, groups of 64 elements, a
// min and a scale per group) in flexh2o's row format, shared by the CPU kernels, the CUDA
// kernels, the engine's byte counts and the planner. Pure functions; thread-safe; no state.
//
// A Q4 tensor is a matrix [rows, cols] stored row by row. Groups run along the last dimension
// (weights [out, in]: along the reduction dimension, as fused GEMM kernels want; the KV cache
// [.., head_dim]: along head_dim, as FlexGen). Each row is one self-contained record of
// row_bytes(cols) bytes, so moving, gathering or evicting rows (KV slots, embedding rows) moves
// whole records and never touches the math:
//   codes: code_bytes(cols) bytes; byte p holds element 2p in its low nibble and 2p+1 in its
//          high nibble (an odd cols leaves the last high nibble 0); then zero padding up to a
//          multiple of 4 bytes;
//   meta:  groups(cols) pairs of IEEE fp16 {d, m}, little-endian, at offset meta_offset(cols).
// Group k covers elements [64k, min(64k + 64, cols)) (the last group may be shorter).
// Decoding is one rounding everywhere (host, AVX2/AVX-512, CUDA): x = fmaf(float(q), d, m).
// Encoding a group of finite values with min mn and max mx:
//   m = f16(mn), d = f16((mx - m) / 15) (round to nearest even; fp32 arithmetic),
//   q = d == 0 ? 0 : clamp(rint((x - m) / d), 0, 15)   (fp32 division, round half to even),
// so a constant group of fp16 values (d == 0) decodes to exactly that value (any other constant
// rounds m and d carries the difference) and |x - decode(q)| <= |d|/2 + |mn - m| + 15 |fp16
// rounding of d| (bounds in the tests). NaN/Inf inputs, and groups whose m or d would not
// be finite in fp16, are refused with an error naming the tensor and the group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flexh2o::q4 {

inline constexpr int64_t kGroup = 64;

constexpr int64_t groups(int64_t cols) { return (cols + kGroup - 1) / kGroup; }
constexpr int64_t code_bytes(int64_t cols) { return (cols + 1) / 2; }
constexpr int64_t meta_offset(int64_t cols) { return (code_bytes(cols) + 3) / 4 * 4; }
constexpr int64_t row_bytes(int64_t cols) { return meta_offset(cols) + 4 * groups(cols); }
// Bytes of a [rows, cols] Q4 tensor.
constexpr uint64_t tensor_bytes(int64_t rows, int64_t cols) { return uint64_t(rows) * uint64_t(row_bytes(cols)); }

// Encodes `rows` rows of `cols` fp32 values (row r at src + r*src_stride) into rows records
// at dst (row r at dst + r*row_bytes(cols)). Throws flexh2o::Error naming `what`, the row and
// the group on NaN/Inf or values beyond fp16 range; nothing is written for a failing row.
void encode_rows(const float* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                 const std::string& what);
// The same from f16 / bf16 source rows (dtype-converted exactly, then encoded).
void encode_rows_f16(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                     const std::string& what);
void encode_rows_bf16(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                      const std::string& what);
// Decodes rows records into fp32 (row r at dst + r*dst_stride). The scalar reference.
void decode_rows(const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride);

}  // namespace flexh2o::q4
