// The CUDA device's host side, without a GPU: the compute dtype of a checkpoint, the clear
// error make_cuda_device() gives when there is no GPU (or no CUDA in the build), and the size of
// the Q4 dequantization tile its scratch holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "engine/device.h"
#include "engine/layer_compute.h"
#include "engine/test_util.h"
#include "gpu/cuda_device.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o {
namespace {
using test::model_dir;

TEST(CudaDevice, ComputeDtypeFollowsTheCheckpoint) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) EXPECT_EQ(gpu::compute_dtype(Model::load_dir(model_dir(name))), DType::F16);
  ModelConfig c = Model::load_dir(model_dir("tiny-llama")).config();
  c.dtype = DType::BF16;
  EXPECT_EQ(gpu::compute_dtype(Model::dummy(c)), DType::BF16);  // dummy weights are stored in c.dtype
  // Gemma runs in bf16 even from an f16 checkpoint (its activations overflow f16).
  for (const char* name : {"arch/gemma", "arch/gemma2"})
    EXPECT_EQ(gpu::compute_dtype(Model::load_dir(model_dir(name))), DType::BF16) << name;
}

TEST(CudaDevice, WithoutAGpuSaysWhyAndWhatToUseInstead) {
  if (probe_cuda().available) GTEST_SKIP() << "a GPU is present (gpu_engine_test covers it)";
  try {
    gpu::make_cuda_device({});
    FAIL() << "a CUDA device was made without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (cuda_compiled_in()) {
      EXPECT_NE(msg.find(probe_cuda().reason), std::string::npos) << msg;
    }
    EXPECT_NE(msg.find("use --device cpu"), std::string::npos) << msg;
  }
}

// A model the CUDA kernels cannot run is named before any GPU work: a head_dim of 80 (the CLI's
// --device auto then picks the CPU, --device cuda refuses with this reason); Phi-3-mini's 96 runs
// (over an f16/bf16/f32 cache: the 4-bit one is refused by the device, which needs a GPU), and
// Gemma's 256.
TEST(CudaDevice, SaysWhichModelsItsKernelsCannotRun) {
  ModelConfig c = Model::load_dir(model_dir("tiny-llama")).config();
  EXPECT_EQ(gpu::cuda_unsupported(c, DType::F16), "");
  c.head_dim = 128;
  EXPECT_EQ(gpu::cuda_unsupported(c, DType::BF16), "");
  c.head_dim = 96;
  EXPECT_EQ(gpu::cuda_unsupported(c, DType::F16), "");
  c.head_dim = 256;
  EXPECT_EQ(gpu::cuda_unsupported(c, DType::BF16), "");
  c.head_dim = 80;
  c.name = "stablelm-3b";
  const std::string why = gpu::cuda_unsupported(c, DType::F16);
  if (!cuda_compiled_in()) {
    EXPECT_EQ(why, "");  // make_cuda_device() refuses on its own
    return;
  }
  EXPECT_EQ(why, "the CUDA attention kernels are built for head_dim 64, 96, 128 and 256, and stablelm-3b has 80");
}

// The tile is the largest weight a unit multiplies by (tiny-opt and tiny-llama: the 4096 x 256
// token table as lm_head), capped at 64 MiB (an OPT-175B-sized layer: tiles of 64 MiB).
TEST(CudaDevice, DequantTileIsTheLargestUnitWeightCappedAt64MiB) {
  ModelConfig c = Model::load_dir(model_dir("tiny-opt")).config();
  EXPECT_EQ(q4_dequant_tile_bytes(c, DType::F16), uint64_t(4096 * 256 * 2));
  EXPECT_EQ(q4_dequant_tile_bytes(c, DType::F32), uint64_t(4096 * 256 * 4));
  c.vocab_size = 100;  // then fc1/fc2 (1024 x 256) are the largest
  EXPECT_EQ(q4_dequant_tile_bytes(c, DType::F16), uint64_t(1024 * 256 * 2));
  c.hidden = 12288, c.ffn_dim = 49152, c.n_heads = 96, c.head_dim = 128, c.vocab_size = 50272;
  EXPECT_EQ(q4_dequant_tile_bytes(c, DType::F16), uint64_t(64) << 20);
  // The CUDA scratch grows by the tile; the CPU device decodes in its kernels and has none.
  ModelConfig t = Model::load_dir(model_dir("tiny-llama")).config();
  const uint64_t cuda = device_scratch_bytes(DeviceKind::kCuda, t, DType::F16, 64);
  t.vocab_size = 1;  // shrinks only the tile: 688 x 256 (gate/up/down) instead of 4096 x 256
  EXPECT_EQ(cuda - device_scratch_bytes(DeviceKind::kCuda, t, DType::F16, 64), uint64_t((4096 - 688) * 256 * 2));
}

// The charge and the allocation come from one layout: pieces rounded up to 256 bytes (each
// piece starts aligned), the FFN chunk capped at kMlpChunkRows rows, cuBLAS's workspace beside.
TEST(CudaDevice, ScratchLayoutIsAlignedAndSumsToTheCharge) {
  ModelConfig c = Model::load_dir(model_dir("tiny-opt")).config();
  c.hidden = 100, c.ffn_dim = 300;  // rows of 200 / 600 bytes: not multiples of 256
  for (const int64_t rows : {3, 7, 5000}) {
    const CudaScratch s = cuda_scratch(c, DType::F16, rows);
    const auto up = [](uint64_t n) { return (n + 255) / 256 * 256; };
    EXPECT_EQ(s.normed, up(uint64_t(rows) * 200)) << rows;
    EXPECT_EQ(s.ffn_chunk, up(uint64_t(std::min<int64_t>(rows, kMlpChunkRows)) * 600)) << rows;
    EXPECT_EQ(s.dequant, up(q4_dequant_tile_bytes(c, DType::F16)));
    for (uint64_t piece : {s.normed, s.ffn_chunk, s.dequant}) EXPECT_EQ(piece % 256, 0u);
    EXPECT_EQ(s.allocation(), s.normed + 2 * s.ffn_chunk + s.dequant);
    EXPECT_EQ(device_scratch_bytes(DeviceKind::kCuda, c, DType::F16, rows),
              s.allocation() + kCublasWorkspaceBytes);
  }
}

}  // namespace
}  // namespace flexh2o
