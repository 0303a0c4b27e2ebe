// The checkpoint's pages leave the resident set once the engine has copied them elsewhere (the
// device, the offload store, a 4-bit copy) and stay where host homes read them in place, so a
// run's RSS is what its budgets hold rather than the budgets plus the checkpoint.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/compress.h"
#include "engine/cpu_device.h"
#include "engine/offload_engine.h"
#include "policy_of.h"
#include "resident.h"
#include "test_util.h"

namespace flexh2o {
namespace {

// Reads a byte of every page of every weight, so that the whole checkpoint is resident, and
// returns the checkpoint mapping's resident bytes.
int64_t touch_all(const Model& m) {
  unsigned sum = 0;
  for (const BoundTensor& t : m.tensors()) {
    const auto* b = static_cast<const volatile unsigned char*>(t.view.data);
    for (size_t i = 0; i < t.view.nbytes(); i += 512) sum += b[i];
  }
  (void)sum;  // the reads are volatile: they happen
  return test::mapping_rss_bytes(m.tensors().front().view.data);
}

struct Case {
  const char* percent;
  bool compress;
  bool kept;  // host homes read the checkpoint in place
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "[" << c.percent << "]" << (c.compress ? " compressed" : "");
}

class Resident : public ::testing::TestWithParam<Case> {};

TEST_P(Resident, CopiedWeightsLeaveTheResidentSet) {
  const Case& c = GetParam();
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    SCOPED_TRACE(name);
    Model model = Model::load_dir(test::model_dir(name));
    const auto file = int64_t(std::filesystem::file_size(test::model_dir(name) / "model.safetensors"));
    const int64_t touched = touch_all(model);
    ASSERT_GT(touched, file * 9 / 10);
    CpuDevice dev(2);
    test::TempDir dir;
    OffloadOptions o;
    o.policy = test::policy_of(c.percent, 2, 1);
    o.policy.compress_weight = c.compress;
    o.offload_dir = dir.path() / "store";
    OffloadEngine eng(model, dev, o);
    const int64_t after = test::mapping_rss_bytes(model.tensors().front().view.data);
    // Pages a copied tensor shares with its neighbours, and tensors under a page, stay.
    if (c.kept) EXPECT_GT(after, touched * 9 / 10);
    else EXPECT_LT(after, touched / 5);
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, Resident,
                         ::testing::Values(Case{"100 0 100 0 100 0", false, false},
                                           Case{"0 0 100 0 100 0", false, false},
                                           Case{"0 100 100 0 100 0", false, true},
                                           Case{"100 0 100 0 100 0", true, false},
                                           Case{"0 100 100 0 100 0", true, false}));

TEST(Resident, InMemoryCompressionLetsTheCheckpointGo) {
  Model model = Model::load_dir(test::model_dir("tiny-llama"));
  const int64_t touched = touch_all(model);
  const CompressedWeights q(model);
  EXPECT_GT(q.bytes(), 0u);
  EXPECT_LT(test::mapping_rss_bytes(model.tensors().front().view.data), touched / 5);
}

}  // namespace
}  // namespace flexh2o
