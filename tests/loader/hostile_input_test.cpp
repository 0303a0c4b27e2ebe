// Hostile checkpoint input (issue #14 item 1): a safetensors header nested 100000 levels deep,
// a number that overflows a double, and FIFOs where checkpoint files (safetensors or torch)
// belong. Each must be a flexh2o::Error that names the file, promptly: not a stack overflow, not
// a bare nlohmann exception, not a hang.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>

#include "loader/checkpoint.h"
#include "loader/loader_test_util.h"
#include "loader/safetensors.h"

namespace flexh2o {
namespace {

using test::TempDir;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

// Runs `fn` on a thread; fails instead of hanging when it takes over 2 s, then opens `fifo` for
// writing so the blocked open() in the thread returns and the test can end.
std::string error_within_2s(const std::filesystem::path& fifo, const std::function<void()>& fn) {
  std::string msg;
  auto f = std::async(std::launch::async, [&] { msg = test::error_of(fn); });
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the FIFO " << fifo << " for more than 2 s";
    ::close(::open(fifo.c_str(), O_WRONLY));
  }
  f.get();
  return msg;
}

TEST(HostileSafetensors, DeeplyNestedHeaderValueIsAnErrorNotAStackOverflow) {
  TempDir dir;
  const auto file = dir / "deep.safetensors";
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  test::write_raw_safetensors(file, R"({"a": {"dtype": )" + deep + R"(, "shape": [1], "data_offsets": [0, 4]}})", 8);
  const std::string msg = test::error_of([&] { SafetensorsArchive::open_file(file); });
  EXPECT_HAS(msg, "the header of " + file.string() + " nests arrays/objects more than 64 levels deep");
}

TEST(HostileSafetensors, NumberOverflowNamesTheFile) {
  TempDir dir;
  const auto file = dir / "big.safetensors";
  test::write_raw_safetensors(file, R"({"a": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}})", 8);
  const std::string msg = test::error_of([&] { SafetensorsArchive::open_file(file); });
  EXPECT_HAS(msg, "the header of " + file.string() + " is not valid JSON");
  EXPECT_HAS(msg, "number overflow");
  test::write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"a": 1e999}})");
  EXPECT_HAS(test::error_of([&] { SafetensorsArchive::open_dir(dir.path()); }),
             "checkpoint index " + (dir / "model.safetensors.index.json").string() + " is not valid JSON");
}

// A NUL inside a tensor name used to cut the error message short before the file name (found
// by fuzz_safetensors); such names, and absurdly long ones, are refused, quoted and escaped.
TEST(HostileSafetensors, ControlCharactersInNamesAreRefusedAndEscaped) {
  TempDir dir;
  const auto file = dir / "nul.safetensors";
  const std::string nul_name = std::string(R"({"a\u0000b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})");
  test::write_raw_safetensors(file, nul_name, 8);
  std::string msg = test::error_of([&] { SafetensorsArchive::open_file(file); });
  EXPECT_HAS(msg, file.string() + " has a tensor name with control characters or over 1024 bytes: \"a\\x00b\"");
  const std::string meta = R"({"__metadata__": {"k\u0001": 5}})";
  test::write_raw_safetensors(file, meta, 8);
  msg = test::error_of([&] { SafetensorsArchive::open_file(file); });
  EXPECT_HAS(msg, "__metadata__ field \"k\\x01\" that is not a string");
  const std::string long_name = "{\"" + std::string(2000, 'w') + R"(": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  test::write_raw_safetensors(file, long_name, 8);
  EXPECT_HAS(test::error_of([&] { SafetensorsArchive::open_file(file); }), "(2000 bytes)");
}

TEST(HostileSafetensors, FifoCheckpointFilesAreRefusedWithoutBlocking) {
  TempDir dir;
  const auto single = dir / "model.safetensors";
  ASSERT_EQ(::mkfifo(single.c_str(), 0600), 0);
  EXPECT_HAS(error_within_2s(single, [&] { SafetensorsArchive::open_dir(dir.path()); }),
             "checkpoint file " + single.string() + " is a FIFO (named pipe), not a regular file");

  TempDir sharded;
  const auto shard = sharded / "model-00001-of-00001.safetensors";
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  test::write_bytes(sharded / "model.safetensors.index.json",
                    R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}})");
  EXPECT_HAS(error_within_2s(shard, [&] { SafetensorsArchive::open_dir(sharded.path()); }), "is a FIFO");

  TempDir idx;
  const auto index = idx / "model.safetensors.index.json";
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  EXPECT_HAS(error_within_2s(index, [&] { SafetensorsArchive::open_dir(idx.path()); }),
             "checkpoint index " + index.string() + " is a FIFO");
}

TEST(HostileTorch, FifoCheckpointFilesAreRefusedWithoutBlocking) {
  TempDir dir;
  const auto single = dir / "pytorch_model.bin";
  ASSERT_EQ(::mkfifo(single.c_str(), 0600), 0);
  EXPECT_HAS(error_within_2s(single, [&] { open_checkpoint_dir(dir.path()); }),
             "checkpoint file " + single.string() + " is a FIFO (named pipe), not a regular file");

  TempDir sharded;
  const auto shard = sharded / "pytorch_model-00001-of-00001.bin";
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  test::write_bytes(sharded / "pytorch_model.bin.index.json", R"({"weight_map": {"a": "pytorch_model-00001-of-00001.bin"}})");
  EXPECT_HAS(error_within_2s(shard, [&] { open_checkpoint_dir(sharded.path()); }), "is a FIFO");
}

// What a failed download leaves in a checkpoint's place is named as what it is, in both formats
// and in a shard; it read as a damaged file with "a header length ... absurdly large".
TEST(HostileCheckpoints, DownloadLeftoversAreNamedAsSuch) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 2400000\n",
                             "is a Git LFS pointer (72 bytes of text), not the weights"},
                        Case{"\n<!DOCTYPE html>\n<html><head><title>Login</title></head></html>\n",
                             "is an HTML page (64 bytes), not the weights"},
                        Case{"{\"error\":\"Access to model x/y is restricted.\"}",
                             "is a JSON error response (46 bytes: {\"error\":\"Access to model x/y is restricted.\"})"}}) {
    for (const char* name : {"model.safetensors", "pytorch_model.bin"}) {
      TempDir dir;
      test::write_bytes(dir / name, c.text);
      EXPECT_HAS(test::error_of([&] { open_checkpoint_dir(dir.path()); }), (dir / name).string() + " " + c.says);
    }
    TempDir sharded;
    test::write_bytes(sharded / "model-00001-of-00001.safetensors", c.text);
    test::write_bytes(sharded / "model.safetensors.index.json",
                      R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}})");
    EXPECT_HAS(test::error_of([&] { open_checkpoint_dir(sharded.path()); }), c.says);
  }
}

// A checkpoint name that is a symbolic link going nowhere (a Hugging Face cache whose blob was
// removed) or in a loop is named; it read as "none of model.safetensors, ... exists".
TEST(HostileCheckpoints, LinksThatDoNotResolveAreNamed) {
  TempDir dangling;
  std::filesystem::create_symlink("../../blobs/4d7a", dangling / "model.safetensors");
  EXPECT_HAS(test::error_of([&] { open_checkpoint_dir(dangling.path()); }),
             (dangling / "model.safetensors").string() + " is a symbolic link to ../../blobs/4d7a, which cannot be "
             "opened (it does not exist)");
  TempDir loop;
  std::filesystem::create_symlink("pytorch_model.bin", loop / "pytorch_model.bin");
  EXPECT_HAS(test::error_of([&] { (void)detect_checkpoint(loop.path()); }),
             "pytorch_model.bin is a symbolic link to pytorch_model.bin, which cannot be opened (");
  // A later name that exists is read, as transformers skips what is not a file.
  test::write_bytes(dangling / "model.safetensors.index.json", "{}");
  EXPECT_EQ(detect_checkpoint(dangling.path()), CheckpointFormat::kSafetensorsSharded);
}

}  // namespace
}  // namespace flexh2o
