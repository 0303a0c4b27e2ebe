// Models loaded from PyTorch checkpoints (tests/data/torch, written by torch.save) against the
// same tensors as safetensors: every bound weight and the logits of a forward pass are equal
// bit for bit, for OPT f16 with a tied head, sharded LLaMA bf16 and tied LLaMA f32.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/generate.h"
#include "test_util.h"

namespace flexh2o {
namespace {
namespace fs = std::filesystem;

std::vector<float> all_logits(const Model& model, const std::vector<int32_t>& ids) {
  static CpuDevice dev(2);
  Forward fwd(model, dev);
  KvCache cache(model.config(), 1, int64_t(ids.size()));
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  std::vector<float> logits;
  fwd.step(ids.data(), pos.data(), int64_t(ids.size()), nullptr, cache, LogitsRows::kAll, logits);
  return logits;
}

class TorchModel : public ::testing::TestWithParam<const char*> {};

TEST_P(TorchModel, SameWeightsAndLogitsAsSafetensors) {
  const fs::path bin_dir = test::data_dir() / "torch" / GetParam();
  test::TempDir st;
  fs::copy_file(bin_dir / "config.json", st.path() / "config.json");
  fs::copy_file(bin_dir / "reference.safetensors", st.path() / "model.safetensors");
  const Model a = Model::load_dir(bin_dir), b = Model::load_dir(st.path());
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorView &x = a.tensors()[i].view, &y = b.tensors()[i].view;
    SCOPED_TRACE(a.tensors()[i].spec.name);
    ASSERT_EQ(x.dtype, y.dtype);
    ASSERT_EQ(x.shape, y.shape);
    EXPECT_EQ(0, std::memcmp(x.data, y.data, x.nbytes()));
  }
  EXPECT_NE(a.signature(), b.signature());  // an offload store of one is never reused for the other
  const int32_t V = int32_t(a.config().vocab_size);
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{2, 17, 99, 5, 64, 3}, std::vector<int32_t>{V - 1, 0, 42}}) {
    const std::vector<float> la = all_logits(a, ids), lb = all_logits(b, ids);
    ASSERT_EQ(la.size(), ids.size() * size_t(V));
    EXPECT_EQ(la, lb);
    float lo = la[0], hi = la[0];
    for (float v : la) lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_LT(lo, hi);  // the random weights give varied logits, not a constant
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TorchModel, ::testing::Values("opt-f16", "llama-bf16-sharded", "llama-f32"));

}  // namespace
}  // namespace flexh2o
