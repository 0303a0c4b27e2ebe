// The CUDA device's host side, without a GPU: the compute dtype of a checkpoint, and the clear
// error make_cuda_device() gives when there is no GPU (or no CUDA in the build).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace flexh2o
