// Every malformed-input case the safetensors reader must reject, each asserting that the error
// names the file and the specific problem (and the tensor/dtype where there is one); plus the
// unusual-but-valid files it must accept (trailing padding, scalars, empty tensors, gaps).
#include <gtest/gtest.h>

#include <string>

#include "loader/loader_test_util.h"
#include "loader/safetensors.h"

namespace flexh2o {
namespace {

using test::TempDir;

class BadSafetensors : public ::testing::Test {
 protected:
  // Writes raw bytes to bad.safetensors, opens it, and returns the error message, which must
  // name the file.
  std::string error_for_bytes(const std::string& bytes) {
    test::write_bytes(file(), bytes);
    return check_names_file(test::error_of([&] { SafetensorsArchive::open_file(file()); }));
  }
  // Same with a well-formed length prefix, `header` and `data_bytes` zero bytes of data.
  std::string error_for(const std::string& header, size_t data_bytes) {
    test::write_raw_safetensors(file(), header, data_bytes);
    return check_names_file(test::error_of([&] { SafetensorsArchive::open_file(file()); }));
  }
  SafetensorsArchive open_ok(const std::string& header, size_t data_bytes) {
    test::write_raw_safetensors(file(), header, data_bytes);
    return SafetensorsArchive::open_file(file());
  }
  std::filesystem::path file() const { return dir_ / "bad.safetensors"; }
  std::string check_names_file(const std::string& msg) {
    EXPECT_NE(msg.find(file().string()), std::string::npos) << msg;
    return msg;
  }

  TempDir dir_;
};

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

TEST_F(BadSafetensors, ShorterThanEightBytes) {
  EXPECT_HAS(error_for_bytes("\x05\0\0"), "shorter than the 8-byte header length");
  EXPECT_HAS(error_for_bytes(""), "0 bytes long");
}

TEST_F(BadSafetensors, HeaderLengthPastEndOfFile) {
  const std::string msg = error_for_bytes(test::u64_le(1000) + "{}      ");
  EXPECT_HAS(msg, "header length 1000 runs past the end of the file (16 bytes)");
}

TEST_F(BadSafetensors, HeaderLengthAbsurd) {
  EXPECT_HAS(error_for_bytes(test::u64_le(uint64_t(1) << 62) + "{}      "), "absurdly large");
  EXPECT_HAS(error_for_bytes(test::u64_le(~uint64_t(0)) + "{}      "), "absurdly large");
}

TEST_F(BadSafetensors, HeaderNotJson) {
  EXPECT_HAS(error_for(R"({"a": {"dtype": "F32",)", 0), "not valid JSON");
  EXPECT_HAS(error_for_bytes(test::u64_le(0)), "not valid JSON");  // empty header
}

TEST_F(BadSafetensors, HeaderNotObject) {
  EXPECT_HAS(error_for("[1, 2, 3]", 0), "header that is a JSON array, not an object");
  EXPECT_HAS(error_for(R"({"w": [1, 2]})", 0), "tensor w");
}

class MissingField : public BadSafetensors, public ::testing::WithParamInterface<const char*> {};

TEST_P(MissingField, NamesFieldAndTensor) {
  std::string entries[3] = {R"("dtype": "F32")", R"("shape": [2])", R"("data_offsets": [0, 8])"};
  std::string body;
  for (const std::string& e : entries)
    if (e.find(GetParam()) == std::string::npos) body += (body.empty() ? "" : ", ") + e;
  const std::string msg = error_for(R"({"blk.weight": {)" + body + "}}", 8);
  EXPECT_HAS(msg, "tensor blk.weight");
  EXPECT_HAS(msg, std::string("has no \"") + GetParam() + "\" field");
}
INSTANTIATE_TEST_SUITE_P(Fields, MissingField, ::testing::Values("dtype", "shape", "data_offsets"));

TEST_F(BadSafetensors, UnknownDtypeNamesDtypeAndTensor) {
  for (const char* dt : {"F8_E4M3", "X99", "f32", "F64"}) {
    const std::string msg =
        error_for(std::string(R"({"fp8.w": {"dtype": ")") + dt + R"(", "shape": [4], "data_offsets": [0, 4]}})", 8);
    EXPECT_HAS(msg, std::string("unsupported dtype ") + dt);
    EXPECT_HAS(msg, "tensor fp8.w");
  }
  EXPECT_HAS(error_for(R"({"w": {"dtype": 3, "shape": [4], "data_offsets": [0, 4]}})", 8), "not a string");
}

TEST_F(BadSafetensors, ByteSizeMismatch) {
  const std::string msg = error_for(R"({"w": {"dtype": "BF16", "shape": [3, 5], "data_offsets": [0, 32]}})", 32);
  EXPECT_HAS(msg, "tensor w");
  EXPECT_HAS(msg, "shape [3, 5] x BF16 = 30 bytes but data_offsets span 32 bytes");
}

TEST_F(BadSafetensors, BeginAfterEnd) {
  const std::string msg = error_for(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}})", 16);
  EXPECT_HAS(msg, "tensor w");
  EXPECT_HAS(msg, "begin 8 > end 4");
}

TEST_F(BadSafetensors, EndPastDataSectionIsTruncated) {
  const std::string msg = error_for(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                         "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})",
                                    20);
  EXPECT_HAS(msg, "truncated");
  EXPECT_HAS(msg, "tensor b needs data bytes [16, 32)");
  EXPECT_HAS(msg, "holds only 20 bytes");
}

TEST_F(BadSafetensors, OverlappingRanges) {
  const std::string msg = error_for(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                         "b": {"dtype": "F16", "shape": [4], "data_offsets": [8, 16]}})",
                                    16);
  EXPECT_HAS(msg, "tensors a [0, 16) and b [8, 16) overlap");
}

TEST_F(BadSafetensors, NegativeDimension) {
  const std::string msg = error_for(R"({"neg": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}})", 16);
  EXPECT_HAS(msg, "tensor neg");
  EXPECT_HAS(msg, "negative shape dimension (-1)");
}

TEST_F(BadSafetensors, OtherShapeAndOffsetErrors) {
  EXPECT_HAS(error_for(R"({"w": {"dtype": "U8", "shape": [1, 1, 1, 1, 1], "data_offsets": [0, 1]}})", 8),
             "tensor w in " + file().string() + " has rank 5");
  EXPECT_HAS(error_for(R"({"w": {"dtype": "U8", "shape": [2.5], "data_offsets": [0, 2]}})", 8),
             "non-integer shape dimension");
  EXPECT_HAS(error_for(R"({"w": {"dtype": "U8", "shape": "2", "data_offsets": [0, 2]}})", 8),
             "shape that is not an array");
  EXPECT_HAS(error_for(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0]}})", 8),
             "not a [begin, end] pair");
  EXPECT_HAS(error_for(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [-2, 0]}})", 8),
             "negative data_offsets begin");
  EXPECT_HAS(error_for(R"({"w": {"dtype": "I64", "shape": [4294967296, 4294967296, 4294967296],
                               "data_offsets": [0, 8]}})", 8),
             "overflows");
  EXPECT_HAS(error_for(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})", 8),
             "not aligned to its F32 element size");
}

TEST_F(BadSafetensors, MetadataMustBeStringMap) {
  EXPECT_HAS(error_for(R"({"__metadata__": {"format": "pt", "n": 3}})", 0), "__metadata__ field \"n\" that is not a string");
  EXPECT_HAS(error_for(R"({"__metadata__": ["pt"]})", 0), "__metadata__ entry that is not a JSON object");
}

// ---------------------------------------------------------------------------------------------
// Unusual but valid
// ---------------------------------------------------------------------------------------------

TEST_F(BadSafetensors, TrailingPaddingGapsScalarsAndEmptyTensorsAreAccepted) {
  auto a = open_ok(R"({"__metadata__": {"format": "pt"},
                       "scalar": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},
                       "empty": {"dtype": "F32", "shape": [0, 7], "data_offsets": [8, 8]},
                       "after_gap": {"dtype": "U8", "shape": [3], "data_offsets": [12, 15]}})",
                   64);
  ASSERT_EQ(a.tensors().size(), 3u);
  EXPECT_EQ(a.metadata().at("format"), "pt");
  EXPECT_EQ(a.get("scalar").view.shape.ndim, 0);
  EXPECT_EQ(a.get("scalar").view.numel(), 1);
  EXPECT_EQ(a.get("empty").view.nbytes(), 0u);
  EXPECT_EQ(a.get("after_gap").view.nbytes(), 3u);
  EXPECT_EQ(a.total_bytes(), 11u);
}

TEST_F(BadSafetensors, EmptyHeaderObjectIsAnEmptyCheckpoint) {
  auto a = open_ok("{}", 0);
  EXPECT_TRUE(a.tensors().empty());
  EXPECT_EQ(a.find("x"), nullptr);
  EXPECT_EQ(a.total_bytes(), 0u);
}

}  // namespace
}  // namespace flexh2o
