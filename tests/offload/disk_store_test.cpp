// Tests of IoBackend (io_uring and pread) and DiskStore, each run for both backends and, for the
// store, on a real-disk directory (O_DIRECT) and a tmpfs one (buffered fallback). Faults come from
// the FaultyIo decorator (faulty_io.h); the store fixture is in store_fixture.h.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "offload/aligned_buffer.h"
#include "offload/detail/reserve_file.h"
#include "offload/disk_store.h"
#include "offload/faulty_io.h"
#include "offload/io_backend.h"
#include "offload/store_fixture.h"

namespace flexh2o {
namespace {

using namespace testing;  // store_fixture.h; gtest is spelled ::testing here

// ============================================================================================
// IoBackend on raw descriptors
// ============================================================================================

class BackendTest : public ::testing::TestWithParam<IoBackendChoice> {
 protected:
  void SetUp() override {
    std::string why;
    io_ = backend(GetParam(), &why);
    if (!io_) GTEST_SKIP() << why;
    dir_ = unique_dir(fs::path(FLEXH2O_BINARY_DIR) / "offload_test_tmp");
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  int open_file(const char* name, int extra) {
    int fd = ::open((dir_ / name).c_str(), O_CREAT | O_RDWR | O_TRUNC | extra, 0644);
    if (fd < 0 && (extra & O_DIRECT)) fd = ::open((dir_ / name).c_str(), O_CREAT | O_RDWR | O_TRUNC, 0644);
    return fd;
  }
  std::unique_ptr<IoBackend> io_;
  fs::path dir_;
};

TEST_P(BackendTest, BatchLargerThanQueueDepth) {
  int fd = open_file("batch", O_DIRECT);
  ASSERT_GE(fd, 0);
  constexpr size_t kN = 41, kBlk = 8192;
  auto src = random_bytes(kN * kBlk, 7);
  AlignedBuffer wbuf(src.size()), rbuf(src.size());
  std::memcpy(wbuf.data(), src.data(), src.size());
  std::vector<IoRequest> reqs;
  for (size_t i = 0; i < kN; ++i) reqs.push_back({fd, i * kBlk, wbuf.data() + i * kBlk, kBlk, IoOp::kWrite, 0});
  ASSERT_TRUE(io_->submit_and_wait(reqs).ok());
  for (auto& r : reqs) {
    EXPECT_EQ(r.done, kBlk);
    r = {fd, r.offset, rbuf.data() + r.offset, kBlk, IoOp::kRead, 0};
  }
  std::reverse(reqs.begin(), reqs.end());
  ASSERT_TRUE(io_->submit_and_wait(reqs).ok());
  EXPECT_EQ(std::memcmp(rbuf.data(), src.data(), src.size()), 0);
  ::close(fd);
}

TEST_P(BackendTest, ReadPastEndIsShortIo) {
  int fd = open_file("short", 0);
  ASSERT_GE(fd, 0);
  auto src = random_bytes(5000, 3);
  ASSERT_EQ(::pwrite(fd, src.data(), src.size(), 0), ssize_t(src.size()));
  std::vector<uint8_t> dst(8192);
  IoRequest r{fd, 0, dst.data(), dst.size(), IoOp::kRead, 0};
  Status st = io_->submit_and_wait({&r, 1});
  EXPECT_EQ(st.code(), StatusCode::kShortIo) << st.message();
  EXPECT_EQ(r.done, 5000u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 5000), 0);
  ::close(fd);
}

TEST_P(BackendTest, MisalignedDirectIoThrows) {
  int fd = ::open((dir_ / "direct").c_str(), O_CREAT | O_RDWR | O_DIRECT, 0644);
  if (fd < 0) GTEST_SKIP() << "no O_DIRECT under " << dir_;
  AlignedBuffer buf(8192);
  IoRequest bad_off{fd, 100, buf.data(), 4096, IoOp::kWrite, 0};
  EXPECT_THROW((void)io_->submit_and_wait({&bad_off, 1}), Error);
  IoRequest bad_len{fd, 0, buf.data(), 100, IoOp::kWrite, 0};
  EXPECT_THROW((void)io_->submit_and_wait({&bad_len, 1}), Error);
  IoRequest bad_buf{fd, 0, buf.data() + 1, 4096, IoOp::kWrite, 0};
  EXPECT_THROW((void)io_->submit_and_wait({&bad_buf, 1}), Error);
  IoRequest bad_fd{-1, 0, buf.data(), 4096, IoOp::kWrite, 0};
  EXPECT_THROW((void)io_->submit_and_wait({&bad_fd, 1}), Error);
  ::close(fd);
}

TEST_P(BackendTest, RegisteredBuffers) {
  int fd = open_file("fixed", O_DIRECT);
  ASSERT_GE(fd, 0);
  AlignedBuffer slab(1 << 20);
  std::span<std::byte> bufs[] = {slab.span()};
  Status reg = io_->register_buffers(bufs);
  ASSERT_TRUE(reg.ok()) << reg.message();
  auto src = random_bytes(slab.size(), 11);
  std::memcpy(slab.data(), src.data(), src.size());
  std::vector<IoRequest> reqs;
  for (size_t o = 0; o < slab.size(); o += 65536) reqs.push_back({fd, o, slab.data() + o, 65536, IoOp::kWrite, 0});
  ASSERT_TRUE(io_->submit_and_wait(reqs).ok());
  std::memset(slab.data(), 0, slab.size());
  for (auto& r : reqs) r = {fd, r.offset, r.buf, r.length, IoOp::kRead, 0};
  ASSERT_TRUE(io_->submit_and_wait(reqs).ok());
  EXPECT_EQ(std::memcmp(slab.data(), src.data(), src.size()), 0);
  io_->unregister_buffers();
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendTest,
                         ::testing::Values(IoBackendChoice::kUring, IoBackendChoice::kPread),
                         [](const auto& i) { return std::string(choice_name(i.param)); });

TEST(MakeIoBackend, AutoAlwaysGivesABackendAndSaysWhich) {
  std::string why;
  auto io = make_io_backend(IoBackendChoice::kAuto, &why);
  ASSERT_NE(io, nullptr);
  EXPECT_FALSE(why.empty());
  EXPECT_NE(why.find(io->name()), std::string::npos) << why;
  auto p = make_io_backend(IoBackendChoice::kPread, nullptr);
  EXPECT_EQ(p->name(), "pread");
}

TEST(AlignedBufferTest, RoundsUpAlignsAndMoves) {
  AlignedBuffer a(1);
  EXPECT_EQ(a.size(), kIoAlign);
  EXPECT_TRUE(is_io_aligned(a.data()));
  AlignedBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.size(), kIoAlign);
  EXPECT_EQ(AlignedBuffer(0).size(), 0u);
  EXPECT_EQ(AlignedBuffer(4097).size(), 8192u);
}

// ============================================================================================
// DiskStore
// ============================================================================================

// ext4/xfs under /work take O_DIRECT; tmpfs refuses it before Linux 6.6 and accepts it since, so
// the buffered fallback is also forced explicitly (kDiskBuffered).
TEST_P(StoreTest, UsesODirectWhereTheFilesystemAcceptsIt) {
  if (GetParam().where == Where::kDisk) {
    EXPECT_TRUE(store_->direct_io()) << store_->io_note();
  }
  if (GetParam().where == Where::kDiskBuffered) {
    EXPECT_FALSE(store_->direct_io()) << store_->io_note();
  }
  EXPECT_FALSE(store_->io_note().empty());
  std::printf("[ note     ] %s: %s\n", dir_.c_str(), store_->io_note().c_str());
}

TEST_P(StoreTest, RoundTripAwkwardSizes) {
  for (size_t n : {size_t(1), size_t(4095), size_t(4096), size_t(4097), size_t(7919), size_t(65537),
                   size_t(1000003), size_t(5) * (1 << 20) + 17}) {
    SCOPED_TRACE(n);
    auto src = random_bytes(n, uint32_t(n));
    std::string name = "w" + std::to_string(n);
    Status st = store_->put(name, u8_view(src));
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(read_all(name, n), src);
    AlignedBuffer aligned(n);  // aligned destination (direct path when n is aligned)
    ASSERT_TRUE(store_->read(name, 0, n, aligned.data()).ok());
    EXPECT_EQ(std::memcmp(aligned.data(), src.data(), n), 0);
    std::vector<uint8_t> odd(n + 1);  // misaligned destination
    ASSERT_TRUE(store_->read(name, 0, n, odd.data() + 1).ok());
    EXPECT_EQ(std::memcmp(odd.data() + 1, src.data(), n), 0);
    EXPECT_TRUE(store_->verify(name).ok());
  }
  EXPECT_GT(store_->bytes_written(), 6u << 20);
  EXPECT_GT(store_->bytes_read(), 6u << 20);
  EXPECT_EQ(store_->list().size(), 8u);
}

TEST_P(StoreTest, ByteRangesCrossingPages) {
  const size_t n = 3 * (1 << 20) + 123;
  auto src = random_bytes(n, 5);
  ASSERT_TRUE(store_->put("w", u8_view(src)).ok());
  const std::pair<size_t, size_t> ranges[] = {{0, 1},        {4095, 2},   {4000, 10000},       {4096, 4096},
                                              {8191, 12289}, {1048571, 1048587}, {n - 7, 7}, {0, n}};
  for (auto [off, len] : ranges) {
    SCOPED_TRACE(::testing::Message() << off << "+" << len);
    std::vector<uint8_t> dst(len + 3);
    ASSERT_TRUE(store_->read("w", off, len, dst.data() + 3).ok());
    EXPECT_EQ(std::memcmp(dst.data() + 3, src.data() + off, len), 0);
  }
  EXPECT_THROW((void)store_->read("w", n - 1, 2, src.data()), Error);
  EXPECT_THROW((void)store_->write("w", 0, 1, src.data()), Error);  // put() entries are immutable
}

TEST_P(StoreTest, KvFileWrittenInPlace) {
  const size_t n = 300001;
  ASSERT_TRUE(store_->create("kv.l0", n).ok());
  std::vector<uint8_t> shadow(n, 0);
  EXPECT_EQ(read_all("kv.l0", n), shadow);
  std::mt19937 rng(9);
  const std::pair<size_t, size_t> ranges[] = {{0, 4096}, {4096, 8192}, {5, 3}, {4090, 20},
                                              {12000, 70001}, {n - 4097, 4097}, {100000, 1}};
  for (auto [off, len] : ranges) {
    auto data = random_bytes(len, uint32_t(rng()));
    Status st = store_->write("kv.l0", off, len, data.data());
    ASSERT_TRUE(st.ok()) << st.message();
    std::memcpy(shadow.data() + off, data.data(), len);
    EXPECT_EQ(read_all("kv.l0", n), shadow);
  }
  AlignedBuffer page(8192);  // the aligned path
  std::memset(page.data(), 0xab, page.size());
  ASSERT_TRUE(store_->write("kv.l0", 40960, 8192, page.data()).ok());
  std::memset(shadow.data() + 40960, 0xab, 8192);
  EXPECT_EQ(read_all("kv.l0", n), shadow);
  EXPECT_TRUE(store_->verify("kv.l0").ok());
  reopen();  // written data persists; the entry opens lazily
  EXPECT_EQ(read_all("kv.l0", n), shadow);
}

TEST_P(StoreTest, ReuseAfterReopen) {
  auto src = random_bytes(100000, 1);
  TensorView v{src.data(), DType::F16, Shape{250, 200}};
  ASSERT_TRUE(store_->put("layer0.fc1.weight", v).ok());
  reopen();
  Status st = store_->reuse("layer0.fc1.weight", DType::F16, Shape{250, 200});
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(read_all("layer0.fc1.weight", src.size()), src);
  st = store_->reuse("layer0.fc1.weight", DType::F32, Shape{250, 100});
  EXPECT_EQ(st.code(), StatusCode::kInvalid);
  EXPECT_NE(st.message().find("expected F32"), std::string::npos) << st.message();
  EXPECT_EQ(store_->reuse("layer0.fc1.weight", DType::F16, Shape{200, 250}).code(), StatusCode::kInvalid);
  st = store_->reuse("missing", DType::F16, Shape{1});
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("missing.fhs"), std::string::npos) << st.message();
}

TEST_P(StoreTest, IdentityMismatchIsRebuilt) {
  auto a = random_bytes(5000, 1), b = random_bytes(5000, 2);
  ASSERT_TRUE(store_->put("w", u8_view(a)).ok());
  reopen("opt-1.3b@cfg1");
  Status st = store_->reuse("w", DType::U8, Shape{5000});
  EXPECT_EQ(st.code(), StatusCode::kInvalid);
  EXPECT_NE(st.message().find("belongs to store identity 'opt-125m@cfg1'"), std::string::npos) << st.message();
  EXPECT_EQ(store_->read("w", 0, 1, b.data()).code(), StatusCode::kInvalid);
  ASSERT_TRUE(store_->put("w", u8_view(b)).ok());
  st = store_->reuse("w", DType::U8, Shape{5000});
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(read_all("w", 5000), b);
}

TEST_P(StoreTest, TruncatedFileDetected) {
  auto src = random_bytes(20000, 4);
  ASSERT_TRUE(store_->put("w", u8_view(src)).ok());
  reopen();
  fs::resize_file(store_->path_of("w"), kStoreHeaderBytes + src.size() - 1);
  Status st = store_->reuse("w", DType::U8, Shape{20000});
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  st = store_->verify("w");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("w.fhs"), std::string::npos) << st.message();
  // Header and payload but not the page padding the direct reads cover: --trust-store took it and
  // the run failed at its first read.
  fs::resize_file(store_->path_of("w"), kStoreHeaderBytes + src.size());
  st = store_->reuse("w", DType::U8, Shape{20000}, ReuseCheck::kHeaderOnly);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  fs::resize_file(store_->path_of("w"), 100);  // shorter than the header
  st = store_->reuse("w", DType::U8, Shape{20000});
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
}

TEST_P(StoreTest, CorruptedPayloadByteFailsVerify) {
  auto src = random_bytes(1 << 20, 6);
  ASSERT_TRUE(store_->put("emb", u8_view(src)).ok());
  EXPECT_TRUE(store_->verify("emb").ok());
  int fd = ::open(store_->path_of("emb").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t flipped = uint8_t(src[777] ^ 0x10);
  ASSERT_EQ(::pwrite(fd, &flipped, 1, kStoreHeaderBytes + 777), 1);
  ::fsync(fd);
  ::close(fd);
  Status st = store_->verify("emb");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find(store_->path_of("emb").string()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("hash"), std::string::npos) << st.message();
  // A corrupted header is caught without hashing the payload.
  fd = ::open(store_->path_of("emb").c_str(), O_RDWR);
  ASSERT_EQ(::pwrite(fd, "X", 1, 30), 1);
  ::close(fd);
  st = store_->reuse("emb", DType::U8, Shape{1 << 20}, ReuseCheck::kHeaderOnly);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("header"), std::string::npos) << st.message();
}

// Reuse trusts a file only once its payload hashes to its header (it used to check the header
// alone, so a flipped payload byte was served unless --verify-store was given).
TEST_P(StoreTest, ReuseHashesThePayloadByDefault) {
  auto src = random_bytes((1 << 20) + 100, 7);
  ASSERT_TRUE(store_->put("emb", u8_view(src)).ok());
  int fd = ::open(store_->path_of("emb").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t flipped = uint8_t(src[src.size() - 1] ^ 0x01);  // the last byte: the tail of the last window
  ASSERT_EQ(::pwrite(fd, &flipped, 1, off_t(kStoreHeaderBytes + src.size() - 1)), 1);
  ::close(fd);
  reopen();
  Status st = store_->reuse("emb", DType::U8, Shape{int64_t(src.size())});
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find(store_->path_of("emb").string() + "' is corrupt: payload hash"), std::string::npos)
      << st.message();
  // --trust-store: header and size only.
  EXPECT_TRUE(store_->reuse("emb", DType::U8, Shape{int64_t(src.size())}, ReuseCheck::kHeaderOnly).ok());
}

TEST_P(StoreTest, NoSpaceLeavesNoFileUnderTheRealName) {
  auto v1 = random_bytes(3 << 20, 1), v2 = random_bytes(5 << 20, 2);
  ASSERT_TRUE(store_->put("big", u8_view(v1)).ok());
  faulty_->fail_nth_write(2, ENOSPC);
  Status st = store_->put("big", u8_view(v2));
  EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.message();
  EXPECT_NE(st.message().find(dir_.string()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(std::to_string(kStoreHeaderBytes + align_up(v2.size()))), std::string::npos)
      << st.message();
  EXPECT_EQ(files(), std::vector<std::string>{"big.fhs"});  // no tmp file; old version intact
  EXPECT_TRUE(store_->reuse("big", DType::U8, Shape{int64_t(v1.size())}).ok());
  EXPECT_EQ(read_all("big", v1.size()), v1);
  faulty_->fail_nth_write(1, ENOSPC);
  EXPECT_EQ(store_->put("fresh", u8_view(v1)).code(), StatusCode::kNoSpace);
  faulty_->fail_nth_write(1, ENOSPC);  // create() writes only the header
  EXPECT_EQ(store_->create("kv", 1 << 20).code(), StatusCode::kNoSpace);
  EXPECT_EQ(files(), std::vector<std::string>{"big.fhs"});
  ASSERT_TRUE(store_->create("kv", 1 << 20).ok());
  EXPECT_EQ(files(), (std::vector<std::string>{"big.fhs", "kv.fhs"}));
  ASSERT_TRUE(store_->put("fresh", u8_view(v1)).ok());  // works again once space is back
  EXPECT_TRUE(store_->verify("fresh").ok());
}

TEST_P(StoreTest, ShortReadsAreResubmitted) {
  auto src = random_bytes((1 << 20) + 5, 8);
  ASSERT_TRUE(store_->put("w", u8_view(src)).ok());
  faulty_->set_short_reads(3 * kIoAlign);
  EXPECT_EQ(read_all("w", src.size()), src);
  std::vector<uint8_t> part(70000);
  ASSERT_TRUE(store_->read("w", 4001, part.size(), part.data()).ok());
  EXPECT_EQ(std::memcmp(part.data(), src.data() + 4001, part.size()), 0);
  EXPECT_TRUE(store_->verify("w").ok());
  EXPECT_GT(faulty_->short_passes(), 100);
}

TEST_P(StoreTest, EioIsSurfacedAsStatus) {
  auto src = random_bytes(100000, 9);
  ASSERT_TRUE(store_->put("w", u8_view(src)).ok());
  faulty_->fail_nth_read(1, EIO);
  std::vector<uint8_t> dst(src.size());
  Status st = store_->read("w", 0, dst.size(), dst.data());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("w.fhs"), std::string::npos) << st.message();
  ASSERT_TRUE(store_->read("w", 0, dst.size(), dst.data()).ok());  // the next read works
  EXPECT_EQ(dst, src);
  faulty_->fail_nth_write(1, EIO);
  EXPECT_EQ(store_->put("w2", u8_view(src)).code(), StatusCode::kIoError);
  EXPECT_FALSE(fs::exists(store_->path_of("w2")));
  faulty_->set_latency(std::chrono::microseconds(500));
  ASSERT_TRUE(store_->read("w", 0, dst.size(), dst.data()).ok());
  EXPECT_EQ(dst, src);
}

TEST_P(StoreTest, ConcurrentReadsOfDifferentFiles) {
  constexpr int kFiles = 4;
  std::vector<std::vector<uint8_t>> data;
  const std::string names[kFiles] = {"f0", "f1", "f2", "f3"};
  for (int i = 0; i < kFiles; ++i) {
    data.push_back(random_bytes((2 << 20) + 1000 * i, 100 + i));
    ASSERT_TRUE(store_->put(names[i], u8_view(data.back())).ok());
  }
  reopen();
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kFiles; ++i) {
    threads.emplace_back([&, i] {
      const auto& src = data[i];
      const std::string name = names[i];
      std::vector<uint8_t> dst(src.size());
      for (int rep = 0; rep < 5; ++rep) {
        size_t off = size_t(rep) * 4093;
        if (!store_->read(name, off, src.size() - off, dst.data()).ok() ||
            std::memcmp(dst.data(), src.data() + off, src.size() - off) != 0)
          ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(StoreTest, StaleTmpFileIsIgnoredAndRemovedOnOpen) {
  { std::ofstream(store_->path_of("w").string() + ".tmp") << "half a file"; }  // the pre-token tmp name
  EXPECT_EQ(store_->reuse("w", DType::U8, Shape{10}).code(), StatusCode::kNotFound);
  auto src = random_bytes(10, 1);
  ASSERT_TRUE(store_->put("w", u8_view(src)).ok());
  reopen();
  EXPECT_EQ(files(), std::vector<std::string>{"w.fhs"});
  EXPECT_TRUE(store_->remove("w").ok());
  EXPECT_TRUE(store_->remove("w").ok());
  EXPECT_TRUE(store_->list().empty());
}

TEST_P(StoreTest, BadNamesThrow) {
  auto src = random_bytes(10, 1);
  EXPECT_THROW((void)store_->put("../escape", u8_view(src)), Error);
  EXPECT_THROW((void)store_->put("", u8_view(src)), Error);
  EXPECT_THROW((void)store_->put(".hidden", u8_view(src)), Error);
  EXPECT_THROW((void)store_->put("a/b", u8_view(src)), Error);
}

INSTANTIATE_TEST_SUITE_P(All, StoreTest, ::testing::ValuesIn(store_params()), store_param_name);

// Where the filesystem has no fallocate (ext2, some network and FUSE ones) the file is sized
// instead, and direct writes land in it: glibc's one-byte emulation failed every store write
// there (O_DIRECT refuses it). Other errors pass through; an interrupted call is retried.
TEST(ReserveFile, WithoutFallocateTheFileIsSizedAndWritable) {
  const fs::path base = unique_dir(fs::path(FLEXH2O_BINARY_DIR) / "offload_test_tmp");
  fs::create_directories(base);
  const uint64_t bytes = 3 * kIoAlign + kStoreHeaderBytes;
  const auto size_after = [&](const char* name, detail::FallocateFn fn, int* rc) {
    const fs::path f = base / name;
    int fd = ::open(f.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_DIRECT, 0644);
    if (fd < 0) fd = ::open(f.c_str(), O_RDWR | O_CLOEXEC);  // a filesystem without O_DIRECT
    EXPECT_GE(fd, 0) << f;
    *rc = detail::reserve_file(fd, bytes, fn);
    if (*rc == 0) {  // an aligned write to the last page, as the store's first payload write
      AlignedBuffer page(kIoAlign);
      std::memset(page.data(), 5, kIoAlign);
      EXPECT_EQ(::pwrite(fd, page.data(), kIoAlign, off_t(bytes - kIoAlign)), ssize_t(kIoAlign)) << std::strerror(errno);
    }
    ::close(fd);
    return fs::file_size(f);
  };
  int rc = -1;
  EXPECT_EQ(size_after("unsupported", +[](int, int, off_t, off_t) { errno = EOPNOTSUPP; return -1; }, &rc), bytes);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(size_after("full", +[](int, int, off_t, off_t) { errno = ENOSPC; return -1; }, &rc), 0u);
  EXPECT_EQ(rc, ENOSPC);
  static int calls;  // a captureless function reads it; reset for --gtest_repeat
  calls = 0;
  EXPECT_EQ(size_after("interrupted", +[](int fd, int mode, off_t off, off_t len) {
              if (calls++ == 0) return errno = EINTR, -1;
              return ::fallocate(fd, mode, off, len);
            }, &rc), bytes);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(calls, 2);
  fs::remove_all(base);
}

// We run as root, so chmod 0500 does not stop writes: use paths that cannot be directories.
TEST(DiskStoreOpen, UnwritableDirectoryIsNamed) {
  auto io = make_io_backend(IoBackendChoice::kPread, nullptr);
  fs::path base = unique_dir(fs::path(FLEXH2O_BINARY_DIR) / "offload_test_tmp");
  fs::create_directories(base);
  fs::path file = base / "a_file";
  { std::ofstream(file.string()) << "x"; }
  for (const fs::path& bad : {file, file / "sub", fs::path("/proc/flexh2o_offload_test")}) {
    try {
      (void)DiskStore::open(bad, "m", *io);
      ADD_FAILURE() << "opened " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
    }
  }
  if (::geteuid() != 0) {
    fs::path ro = base / "ro";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW((void)DiskStore::open(ro, "m", *io), Error);
    fs::permissions(ro, fs::perms::owner_all);
  }
  fs::remove_all(base);
}

// A link to a directory not made yet (offload -> the NVMe mount's folder) is followed and the
// directory made there, through a relative link and a chain of two; before, "cannot be created:
// File exists".
TEST(DiskStoreOpen, DanglingLinkIsFollowed) {
  auto io = make_io_backend(IoBackendChoice::kPread, nullptr);
  const fs::path base = unique_dir(fs::path(FLEXH2O_BINARY_DIR) / "offload_test_tmp");
  fs::create_directories(base);
  fs::create_symlink(base / "nvme" / "offload", base / "abs");
  fs::create_symlink("deep/store", base / "rel");
  fs::create_symlink("rel", base / "chain");
  for (const char* link : {"abs", "rel", "chain"}) {
    auto store = DiskStore::open(base / link, "m", *io);
    EXPECT_TRUE(fs::is_directory(base / link)) << link;
  }
  EXPECT_TRUE(fs::is_directory(base / "nvme" / "offload"));
  EXPECT_TRUE(fs::is_directory(base / "deep" / "store"));
  fs::remove_all(base);
}

}  // namespace
}  // namespace flexh2o
