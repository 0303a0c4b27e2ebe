// The base of every fixture in tests/gpu: its tests skip, with the probe's reason, where no
// CUDA device is usable (no driver, no GPU), and run in full where one is.
#pragma once

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::test {

template <class Base = ::testing::Test>
class SkipWithoutGpu : public Base {
 protected:
  void SetUp() override {
    const CudaProbe p = probe_cuda();
    if (!p.available) GTEST_SKIP() << "no CUDA device: " << p.reason;
  }
};

}  // namespace flexh2o::test
