// MappedFile: mapping contents, empty files, move semantics and error messages (path + strerror).
// Lives with the loader tests because the loader is MappedFile's only user so far.
#include "offload/mapped_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>

#include "loader/loader_test_util.h"

namespace flexh2o {
namespace {

using test::error_of;
using test::TempDir;

TEST(MappedFile, MapsContents) {
  TempDir dir;
  test::write_bytes(dir / "a.bin", "hello, mapping");
  MappedFile f = MappedFile::open(dir / "a.bin");
  ASSERT_EQ(f.size(), 14u);
  ASSERT_NE(f.data(), nullptr);
  EXPECT_EQ(std::memcmp(f.data(), "hello, mapping", 14), 0);
  EXPECT_EQ(f.path(), dir / "a.bin");
}

TEST(MappedFile, EmptyFileMapsToNull) {
  TempDir dir;
  test::write_bytes(dir / "empty", "");
  MappedFile f = MappedFile::open(dir / "empty");
  EXPECT_EQ(f.size(), 0u);
  EXPECT_EQ(f.data(), nullptr);
}

TEST(MappedFile, MoveTransfersOwnership) {
  TempDir dir;
  test::write_bytes(dir / "a", "aaaa");
  test::write_bytes(dir / "b", "bbbbbbbb");
  MappedFile a = MappedFile::open(dir / "a");
  const std::byte* pa = a.data();
  MappedFile m(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(m.data(), pa);
  EXPECT_EQ(m.size(), 4u);

  MappedFile b = MappedFile::open(dir / "b");
  m = std::move(b);  // unmaps "a"
  EXPECT_EQ(m.size(), 8u);
  EXPECT_EQ(std::memcmp(m.data(), "bbbbbbbb", 8), 0);
  EXPECT_EQ(b.data(), nullptr);
  m = MappedFile();
  EXPECT_EQ(m.data(), nullptr);
}

TEST(MappedFile, MissingFileNamesPathAndReason) {
  TempDir dir;
  const std::string msg = error_of([&] { MappedFile::open(dir / "nope.safetensors"); });
  EXPECT_NE(msg.find((dir / "nope.safetensors").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST(MappedFile, DirectoryIsRejected) {
  TempDir dir;
  const std::string msg = error_of([&] { MappedFile::open(dir.path()); });
  EXPECT_NE(msg.find(dir.path().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("directory"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flexh2o
