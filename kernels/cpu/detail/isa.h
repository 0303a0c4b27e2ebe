// Private: the ISA variants of the CPU kernels and the per-variant function tables.
// Each variant lives in its own translation unit compiled with its own flags (isa_*.cpp);
// the TBB drivers (linear.cpp, attention.cpp) call into a table picked once at run time.
#pragma once

#include <cstdint>

#include "kernels/cpu/ops.h"

namespace flexh2o::cpu::detail {

enum class Isa { kScalar, kAvx2, kAvx512 };

// Raw 16-bit storage types used to select the conversion in the vector loads.
struct half_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };
// Tag for Q4 rows (core/quant4.h). A Q4 row is not an array of elements, so kernels address
// rows through handles (detail/rows_impl.h): Q4Row is one record and its length.
struct q4_t {};
struct Q4Row {
  const uint8_t* rec = nullptr;
  int64_t cols = 0;
};

// ---- linear -------------------------------------------------------------------------
// Reduction order of every output (all variants, all paths): lane-wise FMA chains over
// vectors of L along all of K (masked tail last), then a fixed halving tree to a scalar;
// then + bias; then the epilogue. The packed path cuts K into chunks of kLinearKC (a
// multiple of every L) for cache blocking only: the chains' state is carried between
// chunks, so nothing depends on M, on the tile an output falls in, or on the thread.
// K chunk (floats). Each chunk costs every tile a load and a store of its accumulators, so a
// chunk is as long as an AVX-512 tile's w rows (6 x KC floats) and x rows still fit a 32 KiB
// L1 together: on a Zen 4 core 768 measured 4-20% faster than 512, and up to 19% faster
// than 1024; on an AVX2-only EPYC (512 KiB L2) 7-8% faster than 512 at K = 768 and within 5%
// of both elsewhere; on an AVX-512 Xeon with 48 KiB L1d, 1024 and 1152 (also with a padded
// panel stride) came within 5% of it at every shape (bench/RESULTS.md, 2026-12-02 fifth
// session, and 2026-12-03).
constexpr int64_t kLinearKC = 768;
constexpr int64_t kLinearMB = 96;   // rows of x per packed task (multiple of every MR)
constexpr int64_t kLinearNB = 96;   // rows of w per task (multiple of every NR)
constexpr int64_t kLinearDirectMaxM = 8;  // M at or below this: read w in its dtype directly
constexpr int64_t kLinearMaxL = 16;       // widest vector (floats) of any variant

struct LinearTask {
  const float* x = nullptr;  // [M, K]
  int64_t M = 0, K = 0, N = 0;
  const void* w = nullptr;  // [N, K] in wdtype
  DType wdtype = DType::F32;
  const float* bias = nullptr;  // [N] fp32 or null
  float* y = nullptr;           // [M, N]
  Epilogue ep = Epilogue::kStore;
  int64_t m0 = 0, m1 = 0, n0 = 0, n1 = 0;  // the block this task computes
  float* scratch = nullptr;  // packed path only: linear_scratch_floats() floats, 64-B aligned
  bool packed = false;       // convert w blocks to fp32 (large M) vs read w directly
  // (Q4 weights: both paths decode each element exactly as q4::decode_rows, so a Q4 linear
  // is bit-identical to the fp32 linear over the decoded weight.)
};
// fp32 panel [NB, KC] + accumulator state (MB x NB outputs x L lanes; MR | MB, NR | NB).
constexpr int64_t linear_scratch_floats() {
  return kLinearNB * kLinearKC + kLinearMB * kLinearNB * kLinearMaxL;
}

// ---- attention ----------------------------------------------------------------------
constexpr int64_t kAttnQB = 32;  // queries per score block
// With key_scores and tq > 1, tasks are (sequence, head, block of kAttnScoreQB cache slots):
// a block's queries add their probabilities, in query order, into a zeroed partial row, and
// the partials are added to key_scores block by block in slot order. Blocks are aligned to
// slots, not to query rows, so left padding (batch composition) never moves a boundary.
constexpr int64_t kAttnScoreQB = 256;
// A task may take nh > 1 query heads of one kv group (decode): its rows are then (query,
// head) pairs, and each row's arithmetic is the same as alone, so nh never changes a bit.
struct AttnTask {
  const AttentionArgs* a = nullptr;
  int64_t b = 0, h = 0, nh = 1, t0 = 0, t1 = 0;  // sequence, query heads [h, h+nh), queries
  float* scores = nullptr;  // key-score row of head h (head h+i: + i*capacity); null: none
  float* scratch = nullptr;  // attention_scratch_floats(max seq_keys) floats
};
constexpr int64_t attention_scratch_floats(int64_t n_keys) { return kAttnQB * (n_keys + 64); }

struct KernelTable {
  const char* name;
  void (*linear_task)(const LinearTask& t);
  void (*attention_task)(const AttnTask& t);
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  void (*gelu_tanh_mul)(float* gate, const float* up, int64_t n);
  void (*softcap)(float* x, int64_t n, float cap);
  void (*to_f32)(DType dtype, const void* src, int64_t n, float* dst);    // one block, no checks
  void (*from_f32)(const float* src, int64_t n, DType dtype, void* dst);  // one block, no checks
  void (*q4_decode)(const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride);
};

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();

bool isa_supported(Isa isa);   // can this machine run the variant?
Isa best_isa();                // detected once, cached in a function-local static
const KernelTable& kernels(Isa isa);  // throws if the variant is unsupported here

// The public ops with the variant chosen explicitly (tests use these to cover every variant).
void linear_isa(Isa isa, const float* x, int64_t M, int64_t K, const TensorView& w,
                const TensorView* bias, float* y, Epilogue ep);
void attention_isa(Isa isa, const AttentionArgs& a);
void silu_mul_isa(Isa isa, float* gate, const float* up, int64_t n);
void gelu_tanh_mul_isa(Isa isa, float* gate, const float* up, int64_t n);
void softcap_isa(Isa isa, float* x, int64_t n, float cap);
void check_kv_dtype(DType dtype, const char* what);     // throws unless F32, F16, BF16 or Q4
void check_float_dtype(DType dtype, const char* what);  // throws unless F32, F16 or BF16
void to_f32_isa(Isa isa, DType src_dtype, const void* src, int64_t n, float* dst);
void from_f32_isa(Isa isa, const float* src, int64_t n, DType dst_dtype, void* dst);
void decode_q4_isa(Isa isa, const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride);

}  // namespace flexh2o::cpu::detail
