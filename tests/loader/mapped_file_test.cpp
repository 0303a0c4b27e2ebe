// MappedFile: mapping contents, empty files, move semantics, letting pages go and error messages (path + strerror).
// Lives with the loader tests: the loader maps checkpoints with it.
#include "offload/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "loader/loader_test_util.h"
#include "resident.h"

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

TEST(MappedFile, ReleaseLetsWholePagesGoAndRereadsTheFile) {
  TempDir dir;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE)), n = 64 * page;
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = char(i * 131 % 251);
  test::write_bytes(dir / "w.bin", bytes);
  MappedFile f = MappedFile::open(dir / "w.bin");
  ASSERT_EQ(f.size(), n);
  EXPECT_EQ(std::memcmp(f.data(), bytes.data(), n), 0);  // every page touched
  const int64_t touched = test::mapping_rss_bytes(f.data());
  ASSERT_EQ(touched, int64_t(n));

  // From the middle of page 3 to the middle of page 40: whole pages 4..39 go, 3 and 40 stay.
  EXPECT_TRUE(f.release(f.data() + 3 * page + 100, 37 * page));
  EXPECT_EQ(test::mapping_rss_bytes(f.data()), touched - int64_t(36 * page));
  EXPECT_EQ(std::memcmp(f.data(), bytes.data(), n), 0);  // read back from the file
  EXPECT_EQ(test::mapping_rss_bytes(f.data()), touched);

  // Outside the mapping, or running past its end: nothing is done.
  EXPECT_FALSE(f.release(f.data() + page, n));
  EXPECT_FALSE(f.release(bytes.data(), page));
  EXPECT_FALSE(MappedFile().release(bytes.data(), 0));
  EXPECT_EQ(test::mapping_rss_bytes(f.data()), touched);
  EXPECT_TRUE(f.release(f.data(), n));
  EXPECT_EQ(test::mapping_rss_bytes(f.data()), 0);
}

TEST(MappedFile, DirectoryIsRejected) {
  TempDir dir;
  const std::string msg = error_of([&] { MappedFile::open(dir.path()); });
  EXPECT_NE(msg.find(dir.path().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("directory"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flexh2o
