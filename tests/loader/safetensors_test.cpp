// SafetensorsArchive on the real tiny models (names, shapes, dtypes and values checked against
// numpy reading the same files) and on sharded fixtures built with write_safetensors.
// Malformed inputs are in safetensors_bad_test.cpp.
#include "loader/checkpoint.h"
#include "loader/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/loader_test_util.h"
#include "loader/safetensors_writer.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;

const fs::path kData = FLEXH2O_TEST_DATA;

// Expected values computed with numpy (safetensors.numpy.load_file) on the same files:
// flat index -> raw f16 bits, plus the float64 sum of the whole tensor.
struct Probe {
  const char* name;
  Shape shape;
  int64_t idx[4];
  uint16_t bits[4];
  double sum;
};

void check_probe(const SafetensorsArchive& a, const Probe& p) {
  SCOPED_TRACE(p.name);
  const TensorEntry& t = a.get(p.name);
  EXPECT_EQ(t.view.dtype, DType::F16);
  EXPECT_EQ(t.view.shape, p.shape) << t.view.shape.str();
  const uint16_t* d = t.view.as<uint16_t>();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d[p.idx[i]], p.bits[i]) << "index " << p.idx[i];
  double sum = 0;
  for (int64_t i = 0; i < t.view.numel(); ++i) sum += f16_to_f32(d[i]);
  EXPECT_NEAR(sum, p.sum, 1e-4);
}

TEST(SafetensorsReal, TinyOpt) {
  auto a = SafetensorsArchive::open_dir(kData / "tiny-opt");
  EXPECT_EQ(a.files().size(), 1u);
  EXPECT_EQ(a.tensors().size(), 4u + 4u * 16u);  // embeddings + final norm, 16 per layer
  EXPECT_EQ(a.total_bytes(), 8941568u);
  EXPECT_EQ(a.metadata().at("format"), "pt");
  EXPECT_EQ(a.get("model.decoder.embed_positions.weight").view.shape, (Shape{1026, 256}));
  EXPECT_EQ(a.get("model.decoder.layers.2.fc1.weight").view.shape, (Shape{1024, 256}));
  EXPECT_EQ(a.find("lm_head.weight"), nullptr);  // tied to embed_tokens in OPT
  check_probe(a, {"model.decoder.embed_tokens.weight", {4096, 256}, {0, 1, 524291, 1048575},
                  {13318, 46920, 45663, 10519}, 212.832761});
  check_probe(a, {"model.decoder.layers.3.fc2.weight", {256, 1024}, {0, 1, 131075, 262143},
                  {43097, 43121, 44820, 10404}, -16.121539});
  check_probe(a, {"model.decoder.final_layer_norm.bias", {256}, {0, 1, 131, 255},
                  {40307, 42573, 8957, 10535}, -0.120992});
  // Sorted by name, all F16, each view inside the single mapping.
  const auto& ts = a.tensors();
  for (size_t i = 1; i < ts.size(); ++i) EXPECT_LT(ts[i - 1].name, ts[i].name);
  const auto* lo = a.files()[0].data();
  for (const auto& t : ts) {
    EXPECT_EQ(t.view.dtype, DType::F16) << t.name;
    EXPECT_GE(static_cast<const std::byte*>(t.view.data), lo);
    EXPECT_LE(static_cast<const std::byte*>(t.view.data) + t.view.nbytes(), lo + a.files()[0].size());
  }
}

TEST(SafetensorsReal, TinyLlama) {
  auto a = SafetensorsArchive::open_file(kData / "tiny-llama" / "model.safetensors");
  EXPECT_EQ(a.tensors().size(), 3u + 4u * 9u);
  EXPECT_EQ(a.total_bytes(), 9998848u);
  EXPECT_EQ(a.get("lm_head.weight").view.shape, (Shape{4096, 256}));
  EXPECT_EQ(a.get("model.layers.0.self_attn.k_proj.weight").view.shape, (Shape{128, 256}));  // GQA
  EXPECT_EQ(a.get("model.layers.3.mlp.gate_proj.weight").view.shape, (Shape{688, 256}));
  check_probe(a, {"model.embed_tokens.weight", {4096, 256}, {0, 1, 524291, 1048575},
                  {5833, 9999, 7301, 10169}, -175.678984});
  check_probe(a, {"model.layers.1.mlp.down_proj.weight", {256, 688}, {0, 1, 88067, 176127},
                  {43138, 7069, 44095, 9805}, 20.383945});
  check_probe(a, {"model.norm.weight", {256}, {0, 1, 131, 255}, {15369, 15494, 15441, 15424}, 278.402832});
  EXPECT_FLOAT_EQ(f16_to_f32(a.get("model.norm.weight").view.as<uint16_t>()[0]), 1.0087890625f);
}

TEST(SafetensorsReal, GetMissingNamesTensorAndCheckpoint) {
  auto a = SafetensorsArchive::open_dir(kData / "tiny-llama");
  const std::string msg = error_of([&] { a.get("model.layers.9.mlp.up_proj.weight"); });
  EXPECT_NE(msg.find("model.layers.9.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny-llama/model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(SafetensorsReal, MoveKeepsViewsValid) {
  auto a = SafetensorsArchive::open_dir(kData / "tiny-opt");
  const void* p = a.get("model.decoder.embed_tokens.weight").view.data;
  SafetensorsArchive b = std::move(a);
  EXPECT_EQ(b.get("model.decoder.embed_tokens.weight").view.data, p);
  EXPECT_EQ(b.get("model.decoder.embed_tokens.weight").view.as<uint16_t>()[0], 13318);
}

// ---------------------------------------------------------------------------------------------
// Sharded checkpoints
// ---------------------------------------------------------------------------------------------

// Three shards of F32 tensors "t0".."t8" (t_i holds i*100 + k) and an index over them.
class Sharded : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 9; ++i) {
      values_[i].resize(size_t(i + 2));
      std::iota(values_[i].begin(), values_[i].end(), float(i * 100));
    }
    index_["metadata"] = {{"total_size", 0}};
    for (int s = 0; s < 3; ++s) {
      std::vector<std::pair<std::string, TensorView>> ts;
      for (int i = s; i < 9; i += 3) {
        ts.push_back({name(i), TensorView{values_[i].data(), DType::F32, Shape{int64_t(values_[i].size())}}});
        index_["weight_map"][name(i)] = shard(s);
      }
      write_safetensors(dir_ / shard(s), ts, {{"shard", std::to_string(s)}});
    }
  }
  void write_index() {
    std::ofstream(dir_ / "model.safetensors.index.json") << index_.dump(2);
  }
  // Appends only: "lit" + to_string trips GCC 12's -Wrestrict false positive.
  static std::string name(int i) { return std::string("t").append(std::to_string(i)); }
  static std::string shard(int s) {
    return std::string("model-0000").append(std::to_string(s + 1)).append("-of-00003.safetensors");
  }

  TempDir dir_;
  std::vector<float> values_[9];
  nlohmann::json index_;
};

TEST_F(Sharded, OpensEveryShardOnceAndFindsAllTensors) {
  write_index();
  auto a = SafetensorsArchive::open_dir(dir_.path());
  EXPECT_EQ(a.source(), dir_ / "model.safetensors.index.json");
  ASSERT_EQ(a.files().size(), 3u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(a.files()[s].path(), dir_ / shard(s));
  ASSERT_EQ(a.tensors().size(), 9u);
  EXPECT_EQ(a.metadata().at("shard"), "0");  // from the first shard
  size_t bytes = 0;
  for (int i = 0; i < 9; ++i) {
    const TensorEntry& t = a.get(name(i));
    EXPECT_EQ(t.file_index, size_t(i % 3)) << name(i);
    EXPECT_EQ(t.view.shape, Shape{int64_t(i + 2)});
    for (size_t k = 0; k < values_[i].size(); ++k) EXPECT_EQ(t.view.as<float>()[k], values_[i][k]);
    bytes += values_[i].size() * 4;
  }
  EXPECT_EQ(a.total_bytes(), bytes);
}

// A whole file beside an index (a folder re-downloaded in the other layout) is what transformers
// reads, so it is what runs here too: the index used to win, and the two runs differed silently.
TEST_F(Sharded, AWholeFileBesideTheIndexIsRead) {
  write_index();
  float x = 7;
  write_safetensors(dir_ / "model.safetensors", {{"solo", TensorView{&x, DType::F32, Shape{1}}}});
  const auto a = SafetensorsArchive::open_dir(dir_.path());
  EXPECT_EQ(a.source(), dir_ / "model.safetensors");
  ASSERT_EQ(a.tensors().size(), 1u);
  EXPECT_EQ(a.get("solo").view.as<float>()[0], 7.f);
  EXPECT_EQ(detect_checkpoint(dir_.path()), CheckpointFormat::kSafetensors);
}

TEST_F(Sharded, MissingShardIsNamed) {
  write_index();
  fs::remove(dir_ / shard(1));
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir_.path()); });
  EXPECT_NE(msg.find(shard(1)), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
}

TEST_F(Sharded, TensorAbsentFromItsShard) {
  index_["weight_map"]["t_ghost"] = shard(2);
  write_index();
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir_.path()); });
  EXPECT_NE(msg.find("t_ghost"), std::string::npos) << msg;
  EXPECT_NE(msg.find("absent"), std::string::npos) << msg;
  EXPECT_NE(msg.find(shard(2)), std::string::npos) << msg;
}

TEST_F(Sharded, TensorInAnotherShardThanListed) {
  index_["weight_map"]["t4"] = shard(0);  // really in shard 1
  write_index();
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir_.path()); });
  EXPECT_NE(msg.find("t4"), std::string::npos) << msg;
  EXPECT_NE(msg.find(shard(0)), std::string::npos) << msg;
}

TEST_F(Sharded, SameTensorInTwoShards) {
  float x = 1;
  write_safetensors(dir_ / shard(2), {{"t0", TensorView{&x, DType::F32, Shape{1}}}});
  write_index();
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir_.path()); });
  EXPECT_NE(msg.find("t0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("appears in both"), std::string::npos) << msg;
}

TEST_F(Sharded, IndexWithoutWeightMap) {
  index_.erase("weight_map");
  write_index();
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir_.path()); });
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("weight_map"), std::string::npos) << msg;
}

TEST_F(Sharded, IndexNotJson) {
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"weight_map\": ";
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir_.path()); });
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

TEST_F(Sharded, ShardPathOutsideDirectoryIsRejected) {
  index_["weight_map"]["t0"] = "../elsewhere.safetensors";
  write_index();
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir_.path()); });
  EXPECT_NE(msg.find("../elsewhere.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a plain file name"), std::string::npos) << msg;
}

TEST(SafetensorsDir, EmptyDirectoryNamesBothCandidates) {
  TempDir dir;
  const std::string msg = error_of([&] { SafetensorsArchive::open_dir(dir.path()); });
  EXPECT_NE(msg.find(dir.path().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flexh2o
