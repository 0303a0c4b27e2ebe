// The CUDA device's own pieces (label gpu; skipped without a GPU): read-only registration of a
// memory-mapped checkpoint in place and the zero-copy row gather from it, 2-D copies, events,
// each unit op against the CPU device computing in F16 on the same inputs, and the unit ops on
// Q4 weights against the same ops on those weights decoded to F16.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "core/quant4.h"
#include "engine/cpu_device.h"
#include "engine/test_util.h"
#include "gpu/cuda_device.h"
#include "kernels/cpu/ops.h"
#include "gpu/skip_without_gpu.h"

namespace flexh2o {
namespace {
using test::model_dir;

class CudaDeviceTest : public test::SkipWithoutGpu<> {
 protected:
  void SetUp() override {
    SkipWithoutGpu::SetUp();
    if (IsSkipped()) return;
    dev = gpu::make_cuda_device({});
  }
  std::unique_ptr<Device> dev;
  TierBudget device_budget{Tier::kDevice, 0}, host_budget{Tier::kHost, 0};
};

TEST_F(CudaDeviceTest, CheckpointPinnedInPlaceFeedsTheRowGather) {
  Model m = Model::load_dir(model_dir("tiny-opt"));  // memory-mapped, read-only
  const TensorView& table = m.weights().embed;
  HostPin pin = dev->pin_in_place(table.data, table.nbytes());
  int read_only = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0), cudaSuccess);
  if (!read_only) {  // such a GPU cannot pin a read-only mapping: the engine copies it instead
    EXPECT_FALSE(pin) << "pin_in_place claimed a read-only mapping the device cannot register";
    return;
  }
  ASSERT_TRUE(pin) << "the driver refused to register a read-only mapping";
  cudaPointerAttributes at{};
  ASSERT_EQ(cudaPointerGetAttributes(&at, table.data), cudaSuccess);
  EXPECT_NE(at.type, cudaMemoryTypeUnregistered);
  const std::vector<int32_t> ids = {5, 0, 4095, 17, 17, 2};
  const size_t row = size_t(table.shape[1]) * 2;
  Buffer d_ids, d_rows, h_rows;
  ASSERT_TRUE(dev->allocate(MemKind::kDevice, ids.size() * 4, device_budget, "ids", &d_ids).ok());
  ASSERT_TRUE(dev->allocate(MemKind::kDevice, ids.size() * row, device_budget, "rows", &d_rows).ok());
  ASSERT_TRUE(dev->allocate(MemKind::kPinned, ids.size() * row, host_budget, "rows", &h_rows).ok());
  dev->copy(Queue::kHostToDevice, d_ids.data(), ids.data(), ids.size() * 4);
  dev->gather_rows(Queue::kHostToDevice, d_rows.data(), table.data, table.shape[0], row, d_ids.as<int32_t>(),
                   ids.data(), int64_t(ids.size()));
  dev->copy(Queue::kHostToDevice, h_rows.data(), d_rows.data(), ids.size() * row);
  dev->synchronize();
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(std::memcmp(h_rows.data() + i * row, static_cast<const std::byte*>(table.data) + size_t(ids[i]) * row, row), 0)
        << "row " << i;
  // A row outside the table is refused by name before anything is enqueued, as on the CPU.
  const std::vector<int32_t> bad = {1, int32_t(table.shape[0])};
  EXPECT_THROW(dev->gather_rows(Queue::kHostToDevice, d_rows.data(), table.data, table.shape[0], row,
                                d_ids.as<int32_t>(), bad.data(), int64_t(bad.size())),
               Error);
  pin.reset();  // unregistered again
  ASSERT_EQ(cudaPointerGetAttributes(&at, table.data), cudaSuccess);
  EXPECT_EQ(at.type, cudaMemoryTypeUnregistered);
}

// A registration the driver refuses (here: a page someone else registered) returns null at
// once, without unpinning what other pins hold: the refusal path once dropped its half-built
// pin under the registry lock (a self-deadlock) and released references it never took.
TEST_F(CudaDeviceTest, RefusedRegistrationReturnsNullAndKeepsOtherPins) {
  int read_only = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0), cudaSuccess);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* raw = std::aligned_alloc(page, 3 * page);
  ASSERT_NE(raw, nullptr);
  auto* base = static_cast<std::byte*>(raw);
  auto registered = [](const void* p) {
    cudaPointerAttributes at{};
    EXPECT_EQ(cudaPointerGetAttributes(&at, p), cudaSuccess);
    return at.type != cudaMemoryTypeUnregistered;
  };
  if (!read_only) {  // every registration is refused (gpu_check counts a skip as a failure)
    EXPECT_FALSE(dev->pin_in_place(base, 3 * page));
    EXPECT_FALSE(registered(base));
    std::free(raw);
    return;
  }
  HostPin first = dev->pin_in_place(base, page);
  ASSERT_TRUE(first);
  ASSERT_EQ(cudaHostRegister(base + 2 * page, page, cudaHostRegisterDefault), cudaSuccess);
  EXPECT_FALSE(dev->pin_in_place(base, 3 * page)) << "pages 1-2 overlap an outside registration";
  EXPECT_TRUE(registered(base)) << "the refused pin released page 0, which `first` holds";
  EXPECT_FALSE(registered(base + page)) << "the refused pin left page 1 registered";
  first.reset();
  EXPECT_FALSE(registered(base));
  EXPECT_EQ(cudaHostUnregister(base + 2 * page), cudaSuccess);
  std::free(raw);
}

// Tensors pinned in place share pages, so the second of two neighbours lies across two
// registrations: the driver refuses one copy spanning both (cudaErrorInvalidValue, seen on an
// H200 with every host-homed checkpoint weight), so the device copies it in pieces, 1-D and
// 2-D, including a 2-D row that itself straddles the boundary.
TEST_F(CudaDeviceTest, ATensorAcrossTwoRegistrationsCopies) {
  int read_only = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0), cudaSuccess);
  if (!read_only) GTEST_SKIP() << "this GPU cannot register read-only memory in place";
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* raw = std::aligned_alloc(page, 4 * page);
  ASSERT_NE(raw, nullptr);
  auto* base = static_cast<std::byte*>(raw);
  for (size_t i = 0; i < 4 * page; ++i) base[i] = std::byte((i * 131 + 7) & 0xff);
  HostPin a = dev->pin_in_place(base, page + 64);  // pages 0-1
  ASSERT_TRUE(a);
  const std::byte* b = base + page + 64;  // pages 1 (shared) to 3: a second registration
  const size_t nb = 3 * page - 64 - 8;
  HostPin pb = dev->pin_in_place(b, nb);
  ASSERT_TRUE(pb);
  Buffer d, back;
  ASSERT_TRUE(dev->allocate(MemKind::kDevice, nb, device_budget, "d", &d).ok());
  ASSERT_TRUE(dev->allocate(MemKind::kPinned, nb, host_budget, "back", &back).ok());
  std::memset(back.data(), 0, nb);
  dev->copy(Queue::kHostToDevice, d.data(), b, nb);
  dev->synchronize();
  dev->copy(Queue::kDeviceToHost, back.data(), d.data(), nb);
  dev->synchronize();
  EXPECT_EQ(std::memcmp(back.data(), b, nb), 0) << "1-D copy across the registrations";
  // Rows of 200 bytes every 1000: with 4 KiB pages the boundary (at 4032) falls inside row 4.
  const size_t w = 200, sp = 1000, h = (nb - w) / sp + 1;
  std::memset(back.data(), 0, nb);
  dev->copy_2d(Queue::kHostToDevice, d.data(), w, b, sp, w, h);
  dev->synchronize();
  dev->copy(Queue::kDeviceToHost, back.data(), d.data(), w * h);
  dev->synchronize();
  for (size_t r = 0; r < h; ++r) EXPECT_EQ(std::memcmp(back.data() + r * w, b + r * sp, w), 0) << "2-D row " << r;
  pb.reset();
  a.reset();
  std::free(raw);
}

TEST_F(CudaDeviceTest, CopiesAndEventsOrderTheQueues) {
  const size_t w = 96, h = 7, sp = 128, dp = 256;
  Buffer src, mid, dst;
  ASSERT_TRUE(dev->allocate(MemKind::kPinned, sp * h, host_budget, "src", &src).ok());
  ASSERT_TRUE(dev->allocate(MemKind::kDevice, dp * h, device_budget, "mid", &mid).ok());
  ASSERT_TRUE(dev->allocate(MemKind::kPinned, sp * h, host_budget, "dst", &dst).ok());
  for (size_t i = 0; i < sp * h; ++i) src.data()[i] = std::byte(i * 7);
  std::memset(dst.data(), 0, sp * h);
  dev->copy_2d(Queue::kHostToDevice, mid.data(), dp, src.data(), sp, w, h);
  dev->wait(Queue::kDeviceToHost, dev->record(Queue::kHostToDevice));
  dev->copy_2d(Queue::kDeviceToHost, dst.data(), sp, mid.data(), dp, w, h);
  const Event done = dev->record(Queue::kDeviceToHost);
  dev->host_wait(done);
  for (size_t r = 0; r < h; ++r)
    for (size_t i = 0; i < sp; ++i)
      EXPECT_EQ(dst.data()[r * sp + i], i < w ? src.data()[r * sp + i] : std::byte(0)) << r << "," << i;
  EXPECT_GE(dev->seconds_between(done, done), 0.0);
}

// Each unit op on the GPU against the CPU device with F16 activations (the same inputs, the
// same rounding of what goes in and out).
TEST_F(CudaDeviceTest, UnitOpsMatchTheCpuDeviceWithinF16Tolerance) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model m = Model::load_dir(model_dir(name));
    const ModelConfig& c = m.config();
    CpuDeviceOptions co;
    co.act_dtype = DType::F16;
    CpuDevice cpu(co);
    const int64_t n = 3, T = 5, M = n * T, H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), cap = 8;
    // Weights of layer 0, the embedding and the head, uploaded to the GPU.
    std::vector<Buffer> keep;
    auto up = [&](const TensorView& v) {
      if (v.empty()) return v;
      keep.emplace_back();
      EXPECT_TRUE(dev->allocate(MemKind::kDevice, size_t(v.numel()) * 2, device_budget, "w", &keep.back()).ok());
      dev->upload(keep.back().data(), v);
      TensorView d = v;
      d.data = keep.back().data();
      d.dtype = DType::F16;
      return d;
    };
    ModelWeights w = m.weights(), wd;
    wd.embed = up(w.embed), wd.pos_embed = up(w.pos_embed), wd.final_norm_w = up(w.final_norm_w);
    wd.final_norm_b = up(w.final_norm_b), wd.lm_head = up(w.lm_head);
    LayerWeights L = w.layers[0], Ld = L;
    for (TensorView* t : {&Ld.ln1_w, &Ld.ln1_b, &Ld.q_w, &Ld.q_b, &Ld.k_w, &Ld.k_b, &Ld.v_w, &Ld.v_b, &Ld.o_w, &Ld.o_b,
                          &Ld.ln2_w, &Ld.ln2_b, &Ld.fc1_w, &Ld.fc1_b, &Ld.fc2_w, &Ld.fc2_b, &Ld.gate_w, &Ld.up_w,
                          &Ld.down_w, &Ld.gate_b, &Ld.up_b, &Ld.down_b})
      *t = up(*t);
    const TierCharge scratch_gpu = dev->reserve(c, M, n, device_budget), scratch_cpu = cpu.reserve(c, M, n, device_budget);
    // Inputs: ids, positions, OPT position rows, seq_keys (sequence 1 is 2 rows of left padding).
    std::vector<int32_t> ids(static_cast<size_t>(M)), pos(ids), rows(ids), keys = {5, 3, 5};
    std::mt19937 g(3);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t t = 0; t < T; ++t) {
        ids[size_t(b * T + t)] = int32_t(g() % uint64_t(c.vocab_size));
        pos[size_t(b * T + t)] = int32_t(std::max<int64_t>(0, t - (T - keys[size_t(b)])));
        rows[size_t(b * T + t)] = pos[size_t(b * T + t)] + int32_t(c.position_offset());
      }
    Buffer in;
    ASSERT_TRUE(dev->allocate(MemKind::kDevice, size_t(3 * M + n) * 4, device_budget, "in", &in).ok());
    int32_t* d = in.as<int32_t>();
    dev->copy(Queue::kCompute, d, ids.data(), size_t(M) * 4);
    dev->copy(Queue::kCompute, d + M, pos.data(), size_t(M) * 4);
    dev->copy(Queue::kCompute, d + 2 * M, rows.data(), size_t(M) * 4);
    dev->copy(Queue::kCompute, d + 3 * M, keys.data(), size_t(n) * 4);
    StepRows rg{n, T, d, d + M, d + 2 * M, d + 3 * M, ids.data(), pos.data(), rows.data(), keys.data(), 5};
    StepRows rc{n, T, ids.data(), pos.data(), rows.data(), keys.data(), ids.data(), pos.data(), rows.data(), keys.data(), 5};
    // Activation buffers on both devices (f16).
    auto both = [&](int64_t elems, std::vector<uint16_t>& host, Buffer& gpu) {
      host.assign(size_t(elems), 0);
      EXPECT_TRUE(dev->allocate(MemKind::kDevice, size_t(elems) * 2, device_budget, "act", &gpu).ok());
    };
    std::vector<uint16_t> h_hidden, h_q, h_k, h_v, h_attn, h_kc, h_vc;
    Buffer g_hidden, g_q, g_k, g_v, g_attn, g_kc, g_vc, g_logits;
    both(M * H, h_hidden, g_hidden), both(M * Q, h_q, g_q), both(M * KV, h_k, g_k), both(M * KV, h_v, g_v);
    both(M * Q, h_attn, g_attn), both(n * KV * cap, h_kc, g_kc), both(n * KV * cap, h_vc, g_vc);
    ASSERT_TRUE(dev->allocate(MemKind::kDevice, size_t(M * c.vocab_size) * 4, device_budget, "logits", &g_logits).ok());
    std::vector<float> c_logits(size_t(M * c.vocab_size)), g_logits_h(c_logits.size());
    auto compare = [&](const std::vector<uint16_t>& host, const Buffer& gpu, const char* what, double tol) {
      std::vector<uint16_t> back(host.size());
      dev->copy(Queue::kCompute, back.data(), gpu.data(), back.size() * 2);
      dev->synchronize();
      for (size_t i = 0; i < back.size(); ++i) {
        const float a = f16_to_f32(back[i]), b = f16_to_f32(host[i]);
        ASSERT_FALSE(std::isnan(a)) << name << " " << what << " " << i;
        ASSERT_LE(std::abs(a - b), tol * (1 + std::abs(b))) << name << " " << what << " element " << i;
      }
    };
    cpu.embed(c, w, rc, h_hidden.data());
    dev->embed(c, wd, rg, g_hidden.data());
    compare(h_hidden, g_hidden, "embed", 2e-3);
    cpu.attention_in(c, L, rc, h_hidden.data(), h_q.data(), h_k.data(), h_v.data());
    dev->attention_in(c, Ld, rg, g_hidden.data(), g_q.data(), g_k.data(), g_v.data());
    compare(h_q, g_q, "q", 2e-2), compare(h_k, g_k, "k", 2e-2), compare(h_v, g_v, "v", 2e-2);
    const KvSegment sc{h_kc.data(), h_vc.data(), DType::F16, 0, n, cap, nullptr};
    const KvSegment sg{g_kc.data(), g_vc.data(), DType::F16, 0, n, cap, nullptr};
    cpu.attend(c, rc, h_q.data(), h_k.data(), h_v.data(), {&sc, 1}, h_attn.data());
    dev->attend(c, rg, g_q.data(), g_k.data(), g_v.data(), {&sg, 1}, g_attn.data());
    compare(h_attn, g_attn, "attention", 3e-2);
    cpu.attention_out(c, L, rc, h_attn.data(), h_hidden.data());
    dev->attention_out(c, Ld, rg, g_attn.data(), g_hidden.data());
    compare(h_hidden, g_hidden, "attention_out", 3e-2);
    cpu.mlp(c, L, rc, h_hidden.data());
    dev->mlp(c, Ld, rg, g_hidden.data());
    compare(h_hidden, g_hidden, "mlp", 5e-2);
    // The last row (generation), then rows a scoring step reads: one, some, all of them.
    for (const auto& [first, count] : {std::pair{T - 1, int64_t(1)}, {int64_t(2), int64_t(1)}, {int64_t(1), T - 2},
                                       {int64_t(0), T}}) {
      const size_t elems = size_t(count * n * c.vocab_size);
      std::fill(g_logits_h.begin(), g_logits_h.end(), std::nanf(""));
      cpu.head(c, w, rc, h_hidden.data(), first, count, c_logits.data());
      dev->head(c, wd, rg, g_hidden.data(), first, count, g_logits.as<float>());
      dev->copy(Queue::kCompute, g_logits_h.data(), g_logits.data(), elems * 4);
      dev->synchronize();
      for (size_t i = 0; i < elems; ++i)
        ASSERT_LE(std::abs(g_logits_h[i] - c_logits[i]), 0.1 + 0.03 * std::abs(c_logits[i]))
            << name << " rows " << first << "+" << count << " logit " << i;
    }
  }
}

// The ops on Q4 weights (uploaded compressed: embedding, positions, head and every 2-D weight of
// layer 0) against the same ops on the decoded weights rounded to F16: embeddings bit for bit,
// linear layers within f16 rounding of the weights (decode rows: the fused kernel; prefill rows:
// the tiles, which multiply exactly the decoded F16 weights). Weights arrive compressed through
// upload(), as the engine gives them.
TEST_F(CudaDeviceTest, Q4WeightsMatchTheirDecodedF16Weights) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model m = Model::load_dir(model_dir(name));
    const ModelConfig& c = m.config();
    std::vector<Buffer> keep;
    auto put = [&](const TensorView& v, DType as, const void* bytes) {
      keep.emplace_back();
      TensorView d = v;
      d.dtype = as;
      d.data = bytes;
      EXPECT_TRUE(dev->allocate(MemKind::kDevice, as == DType::Q4 ? d.nbytes() : size_t(v.numel()) * 2, device_budget,
                                "w", &keep.back())
                      .ok());
      dev->upload(keep.back().data(), d);
      d.data = keep.back().data();
      d.dtype = dev->weight_dtype(as);
      return d;
    };
    std::vector<std::vector<uint8_t>> recs;
    std::vector<std::vector<float>> decoded;
    // (q4, f16 of the decode) views of one tensor; 1-D tensors stay as they are in both.
    auto pair = [&](const TensorView& v, TensorView* q, TensorView* f) {
      if (v.empty()) return;
      if (v.shape.ndim != 2) {
        *q = *f = put(v, v.dtype, v.data);
        return;
      }
      const int64_t rows = v.shape[0], cols = v.shape[1];
      std::vector<float> x(size_t(v.numel()));
      cpu::to_f32(v.dtype, v.data, v.numel(), x.data());
      recs.emplace_back(q4::tensor_bytes(rows, cols));
      q4::encode_rows(x.data(), cols, rows, cols, recs.back().data(), "test");
      decoded.emplace_back(x.size());
      q4::decode_rows(recs.back().data(), rows, cols, decoded.back().data(), cols);
      *q = put(v, DType::Q4, recs.back().data());
      *f = put(v, DType::F32, decoded.back().data());
      EXPECT_EQ(q->dtype, DType::Q4);
    };
    const ModelWeights& w = m.weights();
    ModelWeights wq, wf;
    pair(w.embed, &wq.embed, &wf.embed), pair(w.pos_embed, &wq.pos_embed, &wf.pos_embed);
    pair(w.final_norm_w, &wq.final_norm_w, &wf.final_norm_w), pair(w.final_norm_b, &wq.final_norm_b, &wf.final_norm_b);
    pair(w.lm_head, &wq.lm_head, &wf.lm_head);
    LayerWeights Lq, Lf;
    const LayerWeights& L = w.layers[0];
    for (auto mem : {&LayerWeights::ln1_w, &LayerWeights::ln1_b, &LayerWeights::q_w, &LayerWeights::q_b,
                     &LayerWeights::k_w, &LayerWeights::k_b, &LayerWeights::v_w, &LayerWeights::v_b,
                     &LayerWeights::o_w, &LayerWeights::o_b, &LayerWeights::ln2_w, &LayerWeights::ln2_b,
                     &LayerWeights::fc1_w, &LayerWeights::fc1_b, &LayerWeights::fc2_w, &LayerWeights::fc2_b,
                     &LayerWeights::gate_w, &LayerWeights::up_w, &LayerWeights::down_w, &LayerWeights::gate_b,
                     &LayerWeights::up_b, &LayerWeights::down_b})
      pair(L.*mem, &(Lq.*mem), &(Lf.*mem));
    const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), cap = 16;
    for (int64_t T : {int64_t(1), int64_t(6)}) {  // n*T = 3 rows (fused kernel), 18 rows (tiles)
      const int64_t n = 3, M = n * T;
      const TierCharge scratch = dev->reserve(c, M, n, device_budget);
      std::vector<int32_t> ids(static_cast<size_t>(M)), pos(ids), rows(ids), keys(static_cast<size_t>(n), static_cast<int32_t>(T));
      std::mt19937 g(5);
      for (int64_t i = 0; i < M; ++i) {
        ids[size_t(i)] = int32_t(g() % uint64_t(c.vocab_size));
        pos[size_t(i)] = int32_t(i % T);
        rows[size_t(i)] = pos[size_t(i)] + int32_t(c.position_offset());
      }
      Buffer in;
      ASSERT_TRUE(dev->allocate(MemKind::kDevice, size_t(3 * M + n) * 4, device_budget, "in", &in).ok());
      int32_t* d = in.as<int32_t>();
      dev->copy(Queue::kCompute, d, ids.data(), size_t(M) * 4);
      dev->copy(Queue::kCompute, d + M, pos.data(), size_t(M) * 4);
      dev->copy(Queue::kCompute, d + 2 * M, rows.data(), size_t(M) * 4);
      dev->copy(Queue::kCompute, d + 3 * M, keys.data(), size_t(n) * 4);
      const StepRows r{n, T, d, d + M, d + 2 * M, d + 3 * M, ids.data(), pos.data(), rows.data(), keys.data(), T};
      // One chain of the unit ops per weight set; hidden states after each op are compared.
      struct Chain {
        Buffer hidden, q, k, v, attn, kc, vc, logits;
      };
      auto alloc = [&](Buffer& b, int64_t bytes) {
        EXPECT_TRUE(dev->allocate(MemKind::kDevice, size_t(bytes), device_budget, "act", &b).ok());
      };
      Chain cq, cf;
      for (Chain* ch : {&cq, &cf}) {
        alloc(ch->hidden, M * H * 2), alloc(ch->q, M * Q * 2), alloc(ch->k, M * KV * 2), alloc(ch->v, M * KV * 2);
        alloc(ch->attn, M * Q * 2), alloc(ch->kc, n * KV * cap * 2), alloc(ch->vc, n * KV * cap * 2);
        alloc(ch->logits, n * c.vocab_size * 4);
      }
      auto f16s = [&](const Buffer& b, int64_t elems) {
        std::vector<uint16_t> h(static_cast<size_t>(elems));
        dev->copy(Queue::kCompute, h.data(), b.data(), h.size() * 2);
        dev->synchronize();
        std::vector<float> f(h.size());
        for (size_t i = 0; i < h.size(); ++i) f[i] = f16_to_f32(h[i]);
        return f;
      };
      auto compare = [&](const Buffer& a, const Buffer& b, int64_t elems, const char* what, double tol) {
        const std::vector<float> x = f16s(a, elems), y = f16s(b, elems);
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_FALSE(std::isnan(x[i])) << name << " T=" << T << " " << what << " " << i;
          ASSERT_LE(std::abs(x[i] - y[i]), tol * (1 + std::abs(y[i]))) << name << " T=" << T << " " << what << " " << i;
        }
      };
      dev->embed(c, wq, r, cq.hidden.data());
      dev->embed(c, wf, r, cf.hidden.data());
      // Token rows are bit-identical (both round the fp32 decode once); OPT's position rows add
      // the fp32 decode on one side and its f16 rounding on the other.
      compare(cq.hidden, cf.hidden, M * H, "embed", c.arch == Arch::kOpt ? 2e-3 : 0);
      for (auto [ch, lw] : {std::pair{&cq, &Lq}, std::pair{&cf, &Lf}}) {
        dev->attention_in(c, *lw, r, ch->hidden.data(), ch->q.data(), ch->k.data(), ch->v.data());
        const KvSegment seg{ch->kc.data(), ch->vc.data(), DType::F16, 0, n, cap, nullptr};
        dev->attend(c, r, ch->q.data(), ch->k.data(), ch->v.data(), {&seg, 1}, ch->attn.data());
        dev->attention_out(c, *lw, r, ch->attn.data(), ch->hidden.data());
        dev->mlp(c, *lw, r, ch->hidden.data());
      }
      compare(cq.q, cf.q, M * Q, "q", 1e-2);
      compare(cq.attn, cf.attn, M * Q, "attention", 2e-2);
      compare(cq.hidden, cf.hidden, M * H, "hidden after the layer", 3e-2);
      dev->head(c, wq, r, cq.hidden.data(), T - 1, 1, cq.logits.as<float>());
      dev->head(c, wf, r, cq.hidden.data(), T - 1, 1, cf.logits.as<float>());  // the same hidden: the head alone
      std::vector<float> lq(size_t(n * c.vocab_size)), lf(lq.size());
      dev->copy(Queue::kCompute, lq.data(), cq.logits.data(), lq.size() * 4);
      dev->copy(Queue::kCompute, lf.data(), cf.logits.data(), lf.size() * 4);
      dev->synchronize();
      for (size_t i = 0; i < lq.size(); ++i)
        ASSERT_LE(std::abs(lq[i] - lf[i]), 0.02 + 0.01 * std::abs(lf[i])) << name << " T=" << T << " logit " << i;
    }
  }
}

}  // namespace
}  // namespace flexh2o
