// Base of the GPU runner tests, parametrised by tiny model name: skips (with the probe's
// reason) when no CUDA device is usable.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::test {

class GpuModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const CudaProbe p = probe_cuda();
    if (!p.available) GTEST_SKIP() << "no CUDA device: " << p.reason;
  }
};

}  // namespace flexh2o::test
