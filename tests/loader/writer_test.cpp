// write_safetensors: round trips for every dtype over awkward shapes (1, primes, rank 0..4),
// the on-disk layout (8-byte aligned header, gapless aligned data), metadata, and its errors.
#include "loader/safetensors_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <tuple>
#include <vector>

#include "loader/loader_test_util.h"
#include "loader/safetensors.h"

namespace flexh2o {
namespace {

using test::error_of;
using test::TempDir;

constexpr DType kAllDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8};

// Deterministic, tensor-specific bytes so a swapped or shifted tensor is caught.
std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  uint32_t x = 2654435761u * (seed + 1);
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

std::string shape_name(const Shape& s) {
  std::string r = "r";  // appends only: "lit" + to_string trips GCC 12's -Wrestrict false positive
  r += std::to_string(s.ndim);
  for (int i = 0; i < s.ndim; ++i) (r += '_') += std::to_string(s[i]);
  return r;
}

class WriterRoundTrip : public ::testing::TestWithParam<std::tuple<DType, Shape>> {};

TEST_P(WriterRoundTrip, BytesShapeAndDtypeSurvive) {
  const auto [dtype, shape] = GetParam();
  TempDir dir;
  const auto bytes = pattern(size_t(shape.numel()) * dtype_size(dtype), 7);
  const TensorView v{bytes.data(), dtype, shape};
  write_safetensors(dir / "one.safetensors", {{"x", v}});

  auto a = SafetensorsArchive::open_file(dir / "one.safetensors");
  ASSERT_EQ(a.tensors().size(), 1u);
  const TensorView& r = a.get("x").view;
  EXPECT_EQ(r.dtype, dtype);
  EXPECT_EQ(r.shape, shape) << r.shape.str();
  ASSERT_EQ(r.nbytes(), bytes.size());
  if (!bytes.empty()) {
    EXPECT_EQ(std::memcmp(r.data, bytes.data(), bytes.size()), 0);
  }
  EXPECT_TRUE(a.metadata().empty());
}

INSTANTIATE_TEST_SUITE_P(
    DtypesTimesShapes, WriterRoundTrip,
    ::testing::Combine(::testing::ValuesIn(kAllDtypes),
                       ::testing::Values(Shape{}, Shape{1}, Shape{0}, Shape{7}, Shape{1, 1}, Shape{3, 5},
                                         Shape{13, 1, 2}, Shape{2, 3, 5, 7}, Shape{1031})),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) + "_" + shape_name(std::get<1>(info.param));
    });

TEST(Writer, ManyMixedTensorsAreAlignedGaplessAndIntact) {
  TempDir dir;
  std::vector<std::vector<unsigned char>> store;
  std::vector<std::pair<std::string, TensorView>> ts;
  const Shape shapes[] = {Shape{1}, Shape{3}, Shape{5, 2}, Shape{11}, Shape{2, 3, 1}};
  unsigned seed = 0;
  for (const Shape& s : shapes)
    for (DType dt : kAllDtypes) {
      store.push_back(pattern(size_t(s.numel()) * dtype_size(dt), seed));
      ts.push_back({"layer." + std::to_string(seed++) + "." + std::string(dtype_name(dt)), {nullptr, dt, s}});
    }
  for (size_t i = 0; i < ts.size(); ++i) ts[i].second.data = store[i].data();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "odd \"quotes\" and ünïcode"}};
  write_safetensors(dir / "mix.safetensors", ts, meta);

  auto a = SafetensorsArchive::open_file(dir / "mix.safetensors");
  EXPECT_EQ(a.metadata(), meta);
  ASSERT_EQ(a.tensors().size(), ts.size());
  const MappedFile& f = a.files()[0];
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);  // little-endian host
  EXPECT_EQ(n % 8, 0u);
  size_t total = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorEntry& e = a.get(ts[i].first);
    EXPECT_EQ(e.view.dtype, ts[i].second.dtype);
    EXPECT_EQ(e.view.shape, ts[i].second.shape);
    EXPECT_EQ(std::memcmp(e.view.data, store[i].data(), store[i].size()), 0) << ts[i].first;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(e.view.data) % dtype_size(e.view.dtype), 0u) << ts[i].first;
    total += store[i].size();
  }
  EXPECT_EQ(f.size(), 8 + n + total);  // no gaps, no trailing padding
  EXPECT_EQ(a.total_bytes(), total);
}

TEST(Writer, HeaderIsSpacePaddedJson) {
  TempDir dir;
  const uint8_t b[3] = {1, 2, 3};
  write_safetensors(dir / "p.safetensors", {{"abc", TensorView{b, DType::U8, Shape{3}}}});
  auto f = MappedFile::open(dir / "p.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  ASSERT_EQ(n % 8, 0u);
  std::string header(reinterpret_cast<const char*>(f.data() + 8), n);
  const auto close = header.rfind('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
  EXPECT_EQ(header.substr(0, close + 1), R"({"abc":{"data_offsets":[0,3],"dtype":"U8","shape":[3]}})");
}

TEST(Writer, EmptyTensorListWritesAValidFile) {
  TempDir dir;
  write_safetensors(dir / "e.safetensors", {});
  auto a = SafetensorsArchive::open_file(dir / "e.safetensors");
  EXPECT_TRUE(a.tensors().empty());
  EXPECT_EQ(a.files()[0].size(), 16u);  // 8 + "{}" padded to 8
}

TEST(Writer, OverwritesAnExistingFile) {
  TempDir dir;
  const float big[64] = {};
  const float one = 3.5f;
  write_safetensors(dir / "o.safetensors", {{"w", TensorView{big, DType::F32, Shape{64}}}});
  write_safetensors(dir / "o.safetensors", {{"w", TensorView{&one, DType::F32, Shape{1}}}});
  auto a = SafetensorsArchive::open_file(dir / "o.safetensors");
  EXPECT_EQ(a.get("w").view.as<float>()[0], 3.5f);
  EXPECT_EQ(a.total_bytes(), 4u);
}

TEST(Writer, Errors) {
  TempDir dir;
  const float x[2] = {1, 2};
  const TensorView v{x, DType::F32, Shape{2}};
  const std::string file = (dir / "w.safetensors").string();
  auto expect_error = [&](const std::vector<std::pair<std::string, TensorView>>& ts, const std::string& part,
                          const std::filesystem::path& p) {
    const std::string msg = error_of([&] { write_safetensors(p, ts); });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  expect_error({{"a", v}, {"a", v}}, "tensor a is given twice", file);
  expect_error({{"__metadata__", v}}, "__metadata__ is reserved", file);
  expect_error({{"n", TensorView{nullptr, DType::F32, Shape{2}}}}, "tensor n has shape [2] but no data", file);
  expect_error({{"neg", TensorView{x, DType::F32, Shape{-2}}}}, "tensor neg has a negative dimension", file);
  expect_error({{"a", v}}, "No such file or directory", dir / "no_such_dir" / "w.safetensors");
}

}  // namespace
}  // namespace flexh2o
