// TorchArchive on checkpoints written by torch.save (tests/tools/make_torch_checkpoints.py):
// every tensor equal bit for bit to its safetensors twin (reference.safetensors, written by the
// safetensors library from the same tensors), tied and sliced storages viewed in place, ZIP64,
// sharded indexes, the format preference of open_checkpoint_dir, and every refused file in
// tests/data/torch/bad/ with its message checked (malicious payloads never run).
#include "loader/torch_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "loader/checkpoint.h"
#include "loader/loader_test_util.h"
#include "loader/safetensors.h"
#include "offload/store_identity.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

const fs::path kTorch = fs::path(FLEXH2O_TEST_DATA) / "torch";
// What the malicious fixtures' payloads create when torch.load runs them.
const fs::path kMarker = "/tmp/flexh2o-torch-pwned";

// Same names, dtypes, shapes and bytes as the safetensors twin.
void expect_same_as_reference(const TensorArchive& a, const fs::path& reference) {
  const SafetensorsArchive ref = SafetensorsArchive::open_file(reference);
  ASSERT_EQ(a.tensors().size(), ref.tensors().size());
  for (size_t i = 0; i < ref.tensors().size(); ++i) {
    const TensorEntry& r = ref.tensors()[i];
    const TensorEntry& t = a.tensors()[i];
    SCOPED_TRACE(r.name);
    ASSERT_EQ(t.name, r.name);
    EXPECT_EQ(t.view.dtype, r.view.dtype);
    EXPECT_EQ(t.view.shape, r.view.shape) << t.view.shape.str() << " vs " << r.view.shape.str();
    ASSERT_EQ(t.view.nbytes(), r.view.nbytes());
    EXPECT_NE(t.view.data, nullptr);
    if (r.view.nbytes() > 0) {
      EXPECT_EQ(0, std::memcmp(t.view.data, r.view.data, r.view.nbytes()));
    }
  }
}

class TorchModels : public ::testing::TestWithParam<const char*> {};

TEST_P(TorchModels, EveryTensorEqualsItsSafetensorsTwin) {
  const fs::path dir = kTorch / GetParam();
  TorchArchive a = TorchArchive::open_dir(dir);
  expect_same_as_reference(a, dir / "reference.safetensors");
  // Views lie inside their own shard's mapping.
  for (const TensorEntry& t : a.tensors()) {
    const MappedFile& f = a.files().at(t.file_index);
    const auto* p = static_cast<const std::byte*>(t.view.data);
    EXPECT_TRUE(p >= f.data() && p + t.view.nbytes() <= f.data() + f.size()) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TorchModels, ::testing::Values("opt-f16", "llama-bf16-sharded", "llama-f32"));

TEST(TorchCheckpoint, TiedWeightsShareOneStorage) {
  TorchArchive opt = TorchArchive::open_dir(kTorch / "opt-f16");
  EXPECT_EQ(opt.get("lm_head.weight").view.data, opt.get("model.decoder.embed_tokens.weight").view.data);
  EXPECT_EQ(opt.get("lm_head.weight").view.dtype, DType::F16);
  TorchArchive llama = TorchArchive::open_dir(kTorch / "llama-f32");  // nn.Parameters, pickle protocol 4
  EXPECT_EQ(llama.get("lm_head.weight").view.data, llama.get("model.embed_tokens.weight").view.data);
  EXPECT_EQ(llama.get("lm_head.weight").view.dtype, DType::F32);
}

TEST(TorchCheckpoint, ShardedIndexAndStorageOffsets) {
  TorchArchive a = TorchArchive::open_dir(kTorch / "llama-bf16-sharded");
  EXPECT_EQ(a.source(), kTorch / "llama-bf16-sharded" / "pytorch_model.bin.index.json");
  EXPECT_EQ(a.files().size(), 3u);
  // q, k and v of layer 0 are row slices of one fused [64, 32] bf16 matrix: k starts 32 rows in.
  const TensorEntry& q = a.get("model.layers.0.self_attn.q_proj.weight");
  const TensorEntry& k = a.get("model.layers.0.self_attn.k_proj.weight");
  const TensorEntry& v = a.get("model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(q.view.dtype, DType::BF16);
  ASSERT_EQ(q.file_index, k.file_index);
  ASSERT_EQ(k.file_index, v.file_index);
  EXPECT_EQ(static_cast<const std::byte*>(k.view.data), static_cast<const std::byte*>(q.view.data) + 32 * 32 * 2);
  EXPECT_EQ(static_cast<const std::byte*>(v.view.data), static_cast<const std::byte*>(k.view.data) + 16 * 32 * 2);
}

TEST(TorchCheckpoint, OddTensorsAndZip64) {
  for (const char* file : {"pytorch_model.bin", "zip64.bin"}) {
    SCOPED_TRACE(file);
    TorchArchive a = TorchArchive::open_file(kTorch / "misc" / file);
    expect_same_as_reference(a, kTorch / "misc" / "reference.safetensors");
    EXPECT_EQ(a.get("scalar").view.shape, Shape{});
    EXPECT_EQ(*a.get("scalar").view.as<float>(), 3.25f);
    EXPECT_EQ(a.get("empty").view.shape, (Shape{0, 4}));
    EXPECT_EQ(a.get("ids").view.dtype, DType::I64);
    EXPECT_EQ(a.get("ids").view.as<int64_t>()[0], -3);
    EXPECT_EQ(a.get("counts").view.as<int32_t>()[2], 65536);
    EXPECT_EQ(a.get("bytes").view.as<uint8_t>()[5], 255);
    // Slices view their storage at an offset; the alias is the same tensor.
    EXPECT_EQ(a.get("slice").view.as<float>(), a.get("big").view.as<float>() + 13);
    EXPECT_EQ(a.get("rows").view.as<uint16_t>(), a.get("mat").view.as<uint16_t>() + 2 * 5);
    EXPECT_EQ(a.get("alias").view.data, a.get("mat").view.data);
    EXPECT_EQ(a.get("bf").view.shape, (Shape{3, 2, 2, 2}));
  }
}

TEST(TorchCheckpoint, FormatPreference) {
  EXPECT_EQ(find_checkpoint(kTorch / "opt-f16"), CheckpointFormat::kTorch);
  EXPECT_EQ(find_checkpoint(kTorch / "llama-bf16-sharded"), CheckpointFormat::kTorchSharded);
  EXPECT_EQ(find_checkpoint(fs::path(FLEXH2O_TEST_DATA) / "tiny-opt"), CheckpointFormat::kSafetensors);
  EXPECT_EQ(open_checkpoint_dir(kTorch / "opt-f16").source(), kTorch / "opt-f16" / "pytorch_model.bin");

  // Both formats present: safetensors wins, even when the .bin is one flexh2o would refuse.
  TempDir both;
  fs::copy_file(kTorch / "opt-f16" / "reference.safetensors", both / "model.safetensors");
  fs::copy_file(kTorch / "bad" / "os_system.bin", both / "pytorch_model.bin");
  EXPECT_EQ(find_checkpoint(both.path()), CheckpointFormat::kSafetensors);
  TensorArchive a = open_checkpoint_dir(both.path());
  EXPECT_EQ(a.source(), both / "model.safetensors");
  expect_same_as_reference(a, kTorch / "opt-f16" / "reference.safetensors");

  TempDir none;
  const std::string msg = error_of([&] { find_checkpoint(none.path()); });
  EXPECT_HAS(msg, none.path().string());
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                           "pytorch_model.bin.index.json"})
    EXPECT_HAS(msg, name);
}

TEST(TorchCheckpoint, ShardIndexProblemsAreNamed) {
  const fs::path src = kTorch / "llama-bf16-sharded";
  auto copy = [&](const TempDir& d) {
    for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), d / e.path().filename().string());
  };
  TempDir missing;
  copy(missing);
  fs::remove(missing / "pytorch_model-00002-of-00003.bin");
  std::string msg = error_of([&] { TorchArchive::open_dir(missing.path()); });
  EXPECT_HAS(msg, "shard pytorch_model-00002-of-00003.bin listed in");
  EXPECT_HAS(msg, "is missing");

  TempDir wrong;
  copy(wrong);
  nlohmann::json index = nlohmann::json::parse(std::ifstream(src / "pytorch_model.bin.index.json"));
  index["weight_map"]["model.norm.weight"] = "pytorch_model-00001-of-00003.bin";
  std::ofstream(wrong / "pytorch_model.bin.index.json") << index.dump();
  msg = error_of([&] { TorchArchive::open_dir(wrong.path()); });
  EXPECT_HAS(msg, "tensor model.norm.weight is listed in");
  EXPECT_HAS(msg, "but is absent from");

  TempDir dup;  // the same tensor in two shards
  copy(dup);
  fs::copy_file(kTorch / "llama-f32" / "pytorch_model.bin", dup / "pytorch_model-00002-of-00003.bin",
                fs::copy_options::overwrite_existing);
  msg = error_of([&] { TorchArchive::open_dir(dup.path()); });
  EXPECT_HAS(msg, "appears in both");
}

// ---- refused files ----------------------------------------------------------------------------

struct Refusal {
  const char* file;
  std::vector<const char*> parts;  // each must appear in the message
};
void PrintTo(const Refusal& r, std::ostream* os) { *os << r.file; }

class TorchRefused : public ::testing::TestWithParam<Refusal> {
 protected:
  static void SetUpTestSuite() { fs::remove(kMarker); }
  static void TearDownTestSuite() { EXPECT_FALSE(fs::exists(kMarker)) << "a payload ran: " << kMarker; }
};

TEST_P(TorchRefused, WithItsReason) {
  const fs::path file = kTorch / "bad" / GetParam().file;
  const std::string msg = error_of([&] { TorchArchive::open_file(file); });
  EXPECT_HAS(msg, file.string());
  for (const char* part : GetParam().parts) EXPECT_HAS(msg, std::string(part));
  EXPECT_FALSE(fs::exists(kMarker)) << "the payload of " << file << " ran";
  // Also through a model directory (the path every command takes).
  TempDir dir;
  fs::copy_file(file, dir / "pytorch_model.bin");
  EXPECT_HAS(error_of([&] { open_checkpoint_dir(dir.path()); }), (dir / "pytorch_model.bin").string());
}

INSTANTIATE_TEST_SUITE_P(
    Bad, TorchRefused,
    ::testing::Values(
        Refusal{"os_system.bin", {"data.pkl", "the global posix.system", "not one torch uses to rebuild tensors"}},
        Refusal{"eval.bin", {"data.pkl", "the global __builtin__.eval"}},
        Refusal{"dotted_import.bin", {"the global torch._utils._import_dotted_name"}},
        Refusal{"unknown_opcode.bin", {"data.pkl, byte 5", "opcode 0xff (unknown) is not one torch.save writes"}},
        Refusal{"inst_opcode.bin", {"data.pkl, byte 3", "opcode 0x69 'i' (INST)"}},
        Refusal{"legacy.bin", {"legacy serialization format", "torch < 1.6"}},
        Refusal{"compressed.bin", {"is compressed (method 8, deflate)", "only stored entries"}},
        Refusal{"encrypted.bin", {"is encrypted"}},
        Refusal{"bigendian.bin", {"big-endian", "byteorder is \"big\""}},
        Refusal{"truncated.bin", {"truncated or not a zip archive"}},
        Refusal{"past_eof.bin", {"entry \"good/data/0\" has its local header at offset"}},
        Refusal{"huge_size.bin", {"entry \"good/data/0\" claims 4294967294 bytes", "past the start of the central directory"}},
        Refusal{"huge_numel.bin", {"storage 0 is declared as 1099511627776 elements of HalfStorage", "holds 8 bytes"}},
        Refusal{"past_storage.bin", {"tensor w in", "reaches past its storage 0: offset 2 + 3 elements > 4"}},
        Refusal{"noncontiguous.bin", {"tensor w in", "is not contiguous (shape [3, 2], stride (1, 3))"}},
        Refusal{"double.bin", {"tensor w in", "torch.DoubleStorage", "no dtype for"}}),
    [](const ::testing::TestParamInfo<Refusal>& i) {
      std::string n = i.param.file;
      return n.substr(0, n.find('.'));
    });

TEST(TorchCheckpoint, HandMadeStoragesWithinBoundsAreRead) {
  // The fixture the refused huge_numel/past_storage ones are variations of.
  TorchArchive a = TorchArchive::open_file(kTorch / "bad" / "fake_ok.bin");
  const TensorEntry& w = a.get("w");
  EXPECT_EQ(w.view.shape, Shape{3});
  EXPECT_EQ(w.view.as<uint16_t>()[0], 2);
  EXPECT_EQ(w.view.as<uint16_t>()[2], 4);
}

TEST(TorchCheckpoint, NotAZipIsNamed) {
  TempDir d;
  test::write_bytes(d / "x.bin", "hello, this is not a checkpoint");
  EXPECT_HAS(error_of([&] { TorchArchive::open_file(d / "x.bin"); }), "does not start with a zip signature");
  test::write_bytes(d / "empty.bin", "");
  EXPECT_HAS(error_of([&] { TorchArchive::open_file(d / "empty.bin"); }), (d / "empty.bin").string());
  // A zip without data.pkl.
  std::string eocd("PK\x05\x06", 4);
  eocd += std::string(18, '\0');
  test::write_bytes(d / "z.bin", eocd);
  EXPECT_HAS(error_of([&] { TorchArchive::open_file(d / "z.bin"); }), "without a <name>/data.pkl record");
}

// The offload store's identity of a zip shard hashes its tail (the central directory, with each
// entry's CRC-32), not the whole file as the safetensors rule (8-byte length, then that many
// bytes) would if applied to a zip.
TEST(TorchCheckpoint, FingerprintHashesTheZipDirectoryOnly) {
  TempDir d;
  auto header_of = [&](const std::string& bytes) {
    test::write_bytes(d / "pytorch_model.bin", bytes);
    const std::string fp = shard_fingerprint(MappedFile::open(d / "pytorch_model.bin"));
    return fp.substr(fp.find(" header="));
  };
  std::string zip = std::string("PK\x03\x04", 4) + std::string(size_t(3) << 20, 'x');
  const std::string base = header_of(zip);
  zip[100] = 'y';  // more than 1 MiB before the end: not part of the directory
  EXPECT_EQ(header_of(zip), base);
  zip[zip.size() - 10] = 'y';
  EXPECT_NE(header_of(zip), base);
}

}  // namespace
}  // namespace flexh2o
