// attention.h: attention for every activation x KV dtype x head_dim (and sliding windows, score
// caps, head_dim 256) against cpu::attention on
// fp32 copies of the same rounded values (which a double-precision host reference with the
// seq_keys semantics cross-checks on the CPU); write_kv (converting) and kv_gather must match
// host references bit for bit, padding rows and untouched slots included.
#include <algorithm>
#include <tuple>
#include <utility>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "util.h"

namespace flexh2o::gpu::test {
namespace {

// ---- host references --------------------------------------------------------------------

// E is float (layout cross-check) or uint32_t raw bits; conv(x) is the element conversion.
template <class E, class Conv>
void write_kv_ref(const std::vector<E>& src, int64_t src_stride, int64_t B, int64_t T, int64_t kvh, int64_t hd,
                  std::vector<E>& cache, int64_t cap, const std::vector<int32_t>& seq_keys, Conv conv) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = seq_keys[size_t(b)] - T + t;
      if (slot < 0 || slot >= cap) continue;
      for (int64_t h = 0; h < kvh; ++h)
        for (int64_t d = 0; d < hd; ++d)
          cache[size_t(((b * kvh + h) * cap + slot) * hd + d)] = conv(src[size_t((b * T + t) * src_stride + h * hd + d)]);
    }
}

struct AttnShape {
  int64_t tq, n_heads, kv_heads, head_dim, capacity;
  std::vector<int32_t> seq_keys;
};

void attention_ref(const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, float scale, std::vector<float>& out,
                   std::vector<float>& scores) {
  const int64_t B = int64_t(s.seq_keys.size()), H = s.n_heads, hd = s.head_dim, cap = s.capacity;
  const int64_t row = H * hd, grp = H / s.kv_heads;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < s.tq; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* o = &out[size_t((b * s.tq + t) * row + h * hd)];
        const int64_t slot = s.seq_keys[size_t(b)] - s.tq + t;
        if (slot < 0) {
          for (int64_t d = 0; d < hd; ++d) o[d] = 0.f;
          continue;
        }
        const float* qr = &q[size_t((b * s.tq + t) * row + h * hd)];
        const int64_t base = (b * s.kv_heads + h / grp) * cap;
        std::vector<double> p(size_t(slot + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= slot; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += double(qr[d]) * k[size_t((base + j) * hd + d)];
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= slot; ++j) acc += p[size_t(j)] * v[size_t((base + j) * hd + d)];
          o[d] = float(acc / sum);
        }
        for (int64_t j = 0; j <= slot; ++j) scores[size_t((b * H + h) * cap + j)] += float(p[size_t(j)] / sum);
      }
}

// Per (b, h) row r: new slot i <- old slot keep[r*keep_stride + i] for i < keep_count[r].
template <class E>
void kv_gather_ref(std::vector<E>& buf, int64_t rows, int64_t cap, int64_t row, const std::vector<int32_t>& keep,
                   int64_t keep_stride, const std::vector<int32_t>& keep_count) {
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<E> old(buf.begin() + r * cap * row, buf.begin() + (r + 1) * cap * row);
    for (int64_t i = 0; i < keep_count[size_t(r)]; ++i)
      for (int64_t e = 0; e < row; ++e)
        buf[size_t((r * cap + i) * row + e)] = old[size_t(keep[size_t(r * keep_stride + i)] * row + e)];
  }
}

// ---- write_kv / kv_gather ---------------------------------------------------------------

TEST(WriteKvReference, AgreesWithCpuKernel) {
  const int64_t B = 3, kvh = 2, hd = 5, cap = 11, T = 5, stride = kvh * hd + 7;
  const std::vector<int32_t> seq_keys = {5, 8, 2};
  const std::vector<float> src = randn(size_t(B * T * stride), 20);
  std::vector<float> cache = randn(size_t(B * kvh * cap * hd), 21), cpu_cache = cache;
  cpu::write_kv(src.data(), stride, B, T, kvh, hd, cpu_cache.data(), cap, seq_keys.data());
  write_kv_ref(src, stride, B, T, kvh, hd, cache, cap, seq_keys, [](float x) { return x; });
  EXPECT_EQ(cpu_cache, cache);
}

// (activation dtype of the source rows, KV dtype of the cache)
using WriteKvParam = std::tuple<DType, DType>;
class WriteKvGpu : public GpuTest, public ::testing::WithParamInterface<WriteKvParam> {};

TEST_P(WriteKvGpu, ConvertsLikeHostAndSkipsPadding) {
  const auto [st, ct] = GetParam();
  const int64_t B = 3, kvh = 2, hd = 5, cap = 11;
  for (int64_t T : {1, 5}) {
    const std::vector<int32_t> seq_keys = {int32_t(T), int32_t(T + 3), 2};  // b=2: T=5 -> 3 rows padding
    const int64_t stride = kvh * hd + 7;
    // Random bit patterns: NaNs, infs, subnormals, and (bf16 -> f16) values that overflow.
    const std::vector<uint32_t> src = random_bits(size_t(B * T * stride), st, 20);
    std::vector<uint32_t> cache = random_bits(size_t(B * kvh * cap * hd), ct, 21);  // garbage to keep
    void* dcache = upload_bits(cache, ct);
    void* dsrc = upload_bits(src, st);
    write_kv_ref(src, stride, B, T, kvh, hd, cache, cap, seq_keys,
                 [&](uint32_t x) { return host_convert_bits(x, st, ct); });
    if (st == ct)  // the old overload: cache dtype == src dtype
      write_kv(st, dsrc, stride, B, T, kvh, hd, dcache, cap, upload_raw(seq_keys), stream());
    else
      write_kv(st, dsrc, stride, B, T, kvh, hd, dcache, ct, cap, upload_raw(seq_keys), stream());
    expect_bits_equal(download_bits(dcache, cache.size(), ct), cache,
                      std::string("write_kv ") + dt_str(st) + "->" + dt_str(ct) + " T=" + std::to_string(T));
  }
}

TEST(WriteKvDispatch, RejectsOtherDtypesBeforeTouchingCuda) {
  int32_t dummy = 0;
  const std::vector<std::pair<DType, DType>> bad = {{DType::F32, DType::F16}, {DType::F16, DType::I32}, {DType::U8, DType::U8}};
  for (auto [st, ct] : bad)
    EXPECT_THROW(write_kv(st, &dummy, 4, 1, 1, 1, 4, &dummy, ct, 4, &dummy, nullptr), Error)
        << dt_str(st) << "->" << dt_str(ct);
}

class KvGatherGpu : public GpuTest, public ::testing::WithParamInterface<DType> {};

TEST_P(KvGatherGpu, CompactsInPlace) {
  const DType dt = GetParam();
  const int64_t B = 2, heads = 3, cap = 10, ks = 8, rows = B * heads;
  // Per (b, h) row: stable compactions, a swap-remove (slot 2 <- last), identity, empty.
  const std::vector<int32_t> keep = {0, 2, 3, 7, 9, 0, 0, 0,   1, 4, 5, 6, 8, 9, 0, 0,
                                     0, 1, 9, 3, 4, 5, 6, 7,   0, 1, 2, 3, 0, 0, 0, 0,
                                     9, 0, 0, 0, 0, 0, 0, 0,   0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<int32_t> keep_count = {5, 6, 8, 4, 1, 0};
  for (int64_t row : {5, 64}) {  // 64: a K/V row of head_dim 64 (F32 rows are 256 bytes)
    std::vector<float> buf = round_to(randn(size_t(rows * cap * row), 22), dt);
    void* d = upload(buf, dt);
    kv_gather_ref(buf, rows, cap, row, keep, ks, keep_count);
    kv_gather(dt, d, B, heads, cap, row, upload_raw(keep), ks, upload_raw(keep_count), stream());
    expect_close(download(d, buf.size(), dt), buf, {0.f, 0.f},
                 std::string("kv_gather ") + dt_str(dt) + " row=" + std::to_string(row));
  }
  // key_scores: fp32 [B, n_heads, cap], one element per slot
  std::vector<float> sc = randn(size_t(rows * cap), 23);
  float* dsc = upload_raw(sc);
  std::vector<float> cpu_sc = sc;
  cpu::kv_gather(cpu_sc.data(), B, heads, cap, 1, keep.data(), ks, keep_count.data());
  kv_gather_ref(sc, rows, cap, 1, keep, ks, keep_count);
  ASSERT_EQ(cpu_sc, sc) << "host reference disagrees with cpu::kv_gather";
  kv_gather(DType::F32, dsc, B, heads, cap, 1, upload_raw(keep), ks, upload_raw(keep_count), stream());
  expect_close(download_raw(dsc, sc.size()), sc, {0.f, 0.f}, "kv_gather scores");
}

// ---- attention --------------------------------------------------------------------------

// Every shape mixes awkward sizes; key_scores is on for shapes 1 and 2, off for 0 and 3.
AttnShape attn_shape(int which, int64_t hd) {
  switch (which) {
    case 0: return {37, 8, 2, hd, 50, {45}};           // B=1 prefill continuing a cache, GQA 4:1
    case 1: return {37, 4, 1, hd, 40, {37, 20, 5}};    // B=3 prefill, left-padding rows, 4:1
    case 2: return {1, 8, 2, hd, 300, {257, 1, 300}};  // B=3 decode, longer keys, one full cache
    default: return {1, 4, 4, hd, 13, {13}};           // B=1 decode, MHA
  }
}
bool attn_scores_on(int which) { return which == 1 || which == 2; }

cpu::AttentionArgs cpu_args(const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v, float scale, std::vector<float>& out,
                            std::vector<float>* scores) {
  cpu::AttentionArgs c;
  c.q = q.data();
  c.q_stride = c.out_stride = s.n_heads * s.head_dim;
  c.k = k.data();
  c.v = v.data();
  c.batch = int64_t(s.seq_keys.size());
  c.tq = s.tq;
  c.n_heads = s.n_heads;
  c.kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.capacity = s.capacity;
  c.seq_keys = s.seq_keys.data();
  c.scale = scale;
  c.out = out.data();
  c.key_scores = scores ? scores->data() : nullptr;
  return c;
}

// CPU-only: the seq_keys host reference above agrees with cpu::attention on every test shape.
TEST(AttentionReference, AgreesWithCpuKernel) {
  for (int which = 0; which < 4; ++which) {
    const AttnShape s = attn_shape(which, 64);
    const int64_t B = int64_t(s.seq_keys.size()), row = s.n_heads * s.head_dim;
    const size_t cache_n = size_t(B * s.kv_heads * s.capacity * s.head_dim);
    std::vector<float> q = randn(size_t(B * s.tq * row), 50), k = randn(cache_n, 51), v = randn(cache_n, 52);
    std::vector<float> out(q.size()), scores(size_t(B * s.n_heads * s.capacity));
    std::vector<float> cout(q.size(), 7.f), cscores = scores;
    attention_ref(s, q, k, v, 0.125f, out, scores);
    cpu::attention(cpu_args(s, q, k, v, 0.125f, cout, &cscores));
    expect_close(cout, out, {1e-5f, 1e-4f}, "cpu::attention shape " + std::to_string(which));
    expect_close(cscores, scores, {1e-5f, 1e-4f}, "cpu key_scores shape " + std::to_string(which));
  }
}

// CPU-only: the dispatch list is act {F16, BF16} x kv {F16, BF16, F32} x head_dim {64, 96, 128,
// 256}, and kv Q4 for head_dim {64, 128, 256} (a Q4 row's groups of 64 do not divide 96).
TEST(AttentionDispatch, KvDtypeIsIndependentOfActivationDtype) {
  for (DType act : {DType::F16, DType::BF16, DType::F32, DType::I32})
    for (DType kv : {DType::F16, DType::BF16, DType::F32, DType::Q4, DType::I32, DType::U8})
      for (int64_t hd : {32, 64, 80, 96, 128, 256, 512}) {
        const bool plain = (kv == DType::F16 || kv == DType::BF16 || kv == DType::F32) &&
                           (hd == 64 || hd == 96 || hd == 128 || hd == 256);
        const bool q4 = kv == DType::Q4 && (hd == 64 || hd == 128 || hd == 256);
        const bool want = (act == DType::F16 || act == DType::BF16) && (plain || q4);
        EXPECT_EQ(attention_supported(act, kv, hd), want) << dt_str(act) << " " << dt_str(kv) << " " << hd;
      }
  EXPECT_TRUE(attention_supported(DType::BF16, 64));  // 2-argument form: kv == act
  EXPECT_FALSE(attention_supported(DType::F32, 64));
  AttentionArgs a;
  a.dtype = DType::F32;  // F32 activations are not supported, F32 KV is
  a.kv_dtype = DType::F32;
  a.batch = a.tq = a.n_heads = a.kv_heads = 1;
  a.head_dim = 64;
  a.capacity = 4;
  try {
    attention(a, nullptr);  // rejected before anything touches CUDA
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dtype F32 / kv_dtype F32"), std::string::npos) << e.what();
  }
}

// The CUDA attention against cpu::attention on the same values; `window` > 0 slides (Mistral,
// Gemma), `softcap` > 0 caps the scores (Gemma 2).
class AttnCheck : public GpuTest {
 protected:
  void check_attention(DType act, DType kvt, int64_t hd, int which, int64_t window = 0, float softcap = 0.f);
};

void AttnCheck::check_attention(DType act, DType kvt, int64_t hd, int which, int64_t window, float softcap) {
  const AttnShape s = attn_shape(which, hd);
  const bool with_scores = attn_scores_on(which);
  const int64_t B = int64_t(s.seq_keys.size()), row = s.n_heads * s.head_dim;
  const size_t cache_n = size_t(B * s.kv_heads * s.capacity * hd);
  // The CPU gets fp32 copies of exactly the values the GPU reads: q in act, k/v in kvt.
  const std::vector<float> q = round_to(randn(size_t(B * s.tq * row), 30), act);
  const std::vector<float> k = round_to(randn(cache_n, 31), kvt), v = round_to(randn(cache_n, 32), kvt);
  const float scale = 1.f / std::sqrt(float(hd));
  const std::vector<float> scores_init = randn(size_t(B * s.n_heads * s.capacity), 33);
  std::vector<float> out(q.size(), 7.f), scores = scores_init;
  cpu::AttentionArgs c = cpu_args(s, q, k, v, scale, out, with_scores ? &scores : nullptr);
  c.window = window;
  c.softcap = softcap;
  cpu::attention(c);

  AttentionArgs a;
  a.dtype = act;
  a.kv_dtype = kvt;
  a.q = upload(q, act);
  a.q_stride = row;
  a.k = upload(k, kvt);
  a.v = upload(v, kvt);
  a.batch = B;
  a.tq = s.tq;
  a.n_heads = s.n_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = hd;
  a.capacity = s.capacity;
  a.seq_keys = upload_raw(s.seq_keys);
  a.scale = scale;
  a.window = window;
  a.softcap = softcap;
  a.out_stride = row;
  // With max_keys unset (the capacity) and as the engine calls it: the longest sequence's keys,
  // below the capacity in some shapes, which sizes the kernel's score rows.
  // Each on both kernels: scores in shared memory, and streamed (what rows too long for shared
  // memory take).
  const int64_t longest = *std::max_element(s.seq_keys.begin(), s.seq_keys.end());
  for (const AttentionPath path : {AttentionPath::kShared, AttentionPath::kStreamed})
  for (const int64_t max_keys : {int64_t(0), longest}) {
    a.path = path;
    a.max_keys = max_keys;
    a.out = upload(std::vector<float>(q.size(), 7.f), act);  // garbage that must be overwritten
    a.key_scores = with_scores ? upload_raw(scores_init) : nullptr;
    attention(a, stream());
    const std::string what = std::string("attention ") + dt_str(act) + "/kv " + dt_str(kvt) +
                             " hd=" + std::to_string(hd) + " shape=" + std::to_string(which) +
                             " window=" + std::to_string(window) + " softcap=" + std::to_string(softcap) +
                             " max_keys=" + std::to_string(max_keys) +
                             (path == AttentionPath::kStreamed ? " streamed" : " shared");
    // Inputs are identical, so the output differs by fp32 summation order and one rounding to
    // act: half an ulp is 2^-11 (f16) or 2^-8 (bf16) relative; outputs are O(1) averages of v.
    const Tol out_tol = act == DType::F16 ? Tol{2e-3f, 4e-3f} : Tol{1.6e-2f, 1.6e-2f};
    expect_close(download(a.out, out.size(), act), out, out_tol, what + " out");
    // Scores are fp32 sums of <= 37 probabilities (plus an O(1) start value) in any order.
    if (with_scores)
      expect_close(download_raw(a.key_scores, scores.size()), scores, {1e-5f, 1e-4f}, what + " key_scores");
  }
}

// (activation dtype, KV dtype, head_dim, shape)
using AttnParam = std::tuple<DType, DType, int64_t, int>;
class AttnGpu : public AttnCheck, public ::testing::WithParamInterface<AttnParam> {};

TEST_P(AttnGpu, MatchesCpuAttention) {
  const auto [act, kvt, hd, which] = GetParam();
  check_attention(act, kvt, hd, which);
}

// Sliding windows narrower than the prompts and the decode keys (7 of up to 300), Gemma 2's score
// cap, and head_dim 256 (Gemma), each alone and together, prefill with padding and decode with
// key scores (shapes 1 and 2).
// The KV cache in the activations' dtype or in f32.
using AttnVariantParam = std::tuple<DType, int64_t, int, std::pair<int64_t, float>, bool>;
class AttnVariantGpu : public AttnCheck, public ::testing::WithParamInterface<AttnVariantParam> {};

TEST_P(AttnVariantGpu, WindowAndSoftcapMatchCpuAttention) {
  const auto [act, hd, which, ws, f32_kv] = GetParam();
  check_attention(act, f32_kv ? DType::F32 : act, hd, which, ws.first, ws.second);
}

class AttnBoundGpu : public GpuTest {};

TEST_F(AttnBoundGpu, MaxKeysBoundViolationGivesNaN) {
  const int64_t B = 4, H = 4, hd = 64, cap = 37, row = H * hd;
  const std::vector<int32_t> seq_keys = {13, 1, 29, 37};
  for (DType act : {DType::F16, DType::BF16})
    for (DType kvt : {DType::F16, DType::BF16, DType::F32}) {
      AttentionArgs a;
      a.dtype = act;
      a.kv_dtype = kvt;
      a.q = upload(std::vector<float>(size_t(B * row), 0.5f), act);
      a.q_stride = a.out_stride = row;
      a.k = a.v = upload(std::vector<float>(size_t(B * H * cap * hd), 1.f), kvt);
      a.batch = B;
      a.tq = 1;
      a.n_heads = a.kv_heads = H;
      a.head_dim = hd;
      a.capacity = cap;
      a.max_keys = 13;  // sequences 2 and 3 exceed it
      a.seq_keys = upload_raw(seq_keys);
      a.scale = 1.f;
      a.out = alloc<uint16_t>(size_t(B * row));
      attention(a, stream());
      auto o = download(a.out, size_t(B * row), act);
      for (int64_t b = 0; b < B; ++b)
        EXPECT_EQ(std::isnan(o[size_t(b * row)]), seq_keys[size_t(b)] > 13) << dt_str(kvt) << " b=" << b;
      EXPECT_NEAR(o[0], 1.f, 1e-3) << dt_str(act) << "/kv " << dt_str(kvt);
    }
}

// Long rows against the CPU reference, each path in `paths` (kShared must fit): tq = 3 rows
// (one prefill-like pair and a last row that does a decode row's arithmetic), key scores, no
// window and `window`. The outputs are O(0.006) (~1/sqrt(keys attended) of N(0,1) values), so the
// tolerance is near their rounding, not the generic one: a dropped warp or a 0.9x scale fails.
class AttnLongGpu : public GpuTest, public ::testing::WithParamInterface<std::tuple<DType, int64_t>> {
 protected:
  void check_long(DType act, int64_t hd, int64_t cap, int64_t window, std::initializer_list<AttentionPath> paths);
};

void AttnLongGpu::check_long(DType act, int64_t hd, int64_t cap, int64_t window,
                             std::initializer_list<AttentionPath> paths) {
  const int64_t B = 2, tq = 3, H = 4, kvh = 2, row = H * hd;
  const std::vector<int32_t> seq_keys = {int32_t(cap), 2};  // the second: one padding row, two real
  const AttnShape shape{tq, H, kvh, hd, cap, seq_keys};
  const size_t cache_n = size_t(B * kvh * cap * hd);
  const std::vector<float> q = round_to(randn(size_t(B * tq * row), 40), act);
  const std::vector<float> k = round_to(randn(cache_n, 41), act), v = round_to(randn(cache_n, 42), act);
  const float scale = 1.f / std::sqrt(float(hd));
  const void* dq = upload(q, act);
  const void* dk = upload(k, act);
  const void* dv = upload(v, act);
  const int32_t* dkeys = upload_raw(seq_keys);
  void* dout = alloc<uint16_t>(q.size());
  float* dscores = alloc<float>(size_t(B * H * cap));
  const Tol out_tol = act == DType::F16 ? Tol{1e-4f, 4e-3f} : Tol{2e-4f, 1.6e-2f};
  for (const int64_t w : {int64_t(0), window}) {
    std::vector<float> out(q.size(), 7.f), scores(size_t(B * H * cap), 0.f);
    cpu::AttentionArgs c = cpu_args(shape, q, k, v, scale, out, &scores);
    c.window = w;
    cpu::attention(c);
    for (const AttentionPath path : paths) {
      AttentionArgs a;
      a.dtype = act;
      a.q = dq;
      a.q_stride = a.out_stride = row;
      a.k = dk;
      a.v = dv;
      a.batch = B;
      a.tq = tq;
      a.n_heads = H;
      a.kv_heads = kvh;
      a.head_dim = hd;
      a.capacity = cap;
      a.seq_keys = dkeys;
      a.scale = scale;
      a.window = w;
      a.out = dout;
      a.key_scores = dscores;
      a.path = path;
      FH_CUDA_CHECK(cudaMemsetAsync(dout, 0x7f, q.size() * 2, stream()));  // garbage to overwrite
      FH_CUDA_CHECK(cudaMemsetAsync(dscores, 0, scores.size() * sizeof(float), stream()));
      attention(a, stream());
      const std::string what = std::string("long attention ") + dt_str(act) + " hd=" + std::to_string(hd) +
                               " keys=" + std::to_string(cap) + " window=" + std::to_string(w) + " path=" +
                               std::to_string(int(path));
      expect_close(download(a.out, out.size(), act), out, out_tol, what + " out");
      // Probabilities of ~1/keys each, three query rows summed: the absolute part dominates.
      expect_close(download_raw(a.key_scores, scores.size()), scores, {1e-7f, 1e-3f}, what + " key_scores");
    }
  }
}

// Rows longer than shared memory holds (70000 keys: 280 KB of fp32 scores, over the H200's
// 227 KB): kAuto streams them; forcing the shared path throws, naming the bytes.

TEST_P(AttnLongGpu, RowsBeyondSharedMemoryAreStreamed) {
  const auto [act, hd] = GetParam();
  check_long(act, hd, 70000, 60000, {AttentionPath::kAuto});
  AttentionArgs a;
  a.dtype = act;
  a.batch = 1, a.tq = 1, a.n_heads = a.kv_heads = 1, a.head_dim = hd, a.capacity = 70000;
  a.q = a.k = a.v = a.out = alloc<uint16_t>(size_t(hd) * 70000);
  a.q_stride = a.out_stride = hd;
  a.seq_keys = upload_raw(std::vector<int32_t>{70000});
  a.scale = 1.f;
  a.path = AttentionPath::kShared;
  try {
    attention(a, stream());
    FAIL() << "the shared path took 70000 keys";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of shared memory"), std::string::npos) << e.what();
  }
}

// 20000 keys: 82 KB of shared memory at hd 128, past the 48 KiB a launch gets without opting in
// (cudaFuncAttributeMaxDynamicSharedMemorySize): the shared path's opt-in, both paths and kAuto.
TEST_P(AttnLongGpu, RowsPastFortyEightKiBOptInOnTheSharedPath) {
  const auto [act, hd] = GetParam();
  check_long(act, hd, 20000, 15000, {AttentionPath::kAuto, AttentionPath::kShared, AttentionPath::kStreamed});
}

INSTANTIATE_TEST_SUITE_P(Long, AttnLongGpu,
                         ::testing::Combine(::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values(int64_t(64), int64_t(128))),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_hd" +
                                  std::to_string(std::get<1>(i.param));
                         });

INSTANTIATE_TEST_SUITE_P(Dtypes, WriteKvGpu,
                         ::testing::Combine(::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values(DType::F16, DType::BF16, DType::F32)),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_to_" + dt_str(std::get<1>(i.param));
                         });
INSTANTIATE_TEST_SUITE_P(Dtypes, KvGatherGpu, ::testing::Values(DType::F16, DType::BF16, DType::F32),
                         [](const auto& i) { return std::string(dt_str(i.param)); });
INSTANTIATE_TEST_SUITE_P(Shapes, AttnGpu,
                         ::testing::Combine(::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values(DType::F16, DType::BF16, DType::F32),
                                            ::testing::Values(int64_t(64), int64_t(96), int64_t(128)),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_kv" + dt_str(std::get<1>(i.param)) +
                                  "_hd" + std::to_string(std::get<2>(i.param)) + "_s" +
                                  std::to_string(std::get<3>(i.param));
                         });

INSTANTIATE_TEST_SUITE_P(Variants, AttnVariantGpu,
                         ::testing::Combine(::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values(int64_t(64), int64_t(256)), ::testing::Values(1, 2),
                                            ::testing::Values(std::pair<int64_t, float>{0, 0.f},
                                                              std::pair<int64_t, float>{7, 0.f},
                                                              std::pair<int64_t, float>{0, 2.f},
                                                              std::pair<int64_t, float>{7, 2.f}),
                                            ::testing::Bool()),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_hd" +
                                  std::to_string(std::get<1>(i.param)) + "_s" + std::to_string(std::get<2>(i.param)) +
                                  "_w" + std::to_string(std::get<3>(i.param).first) + "_cap" +
                                  std::to_string(int(std::get<3>(i.param).second)) +
                                  (std::get<4>(i.param) ? "_kvF32" : "");
                         });

}  // namespace
}  // namespace flexh2o::gpu::test
