// One offload directory shared by several stores (runs): temporary names never shared, per-run
// files removed when their store closes, a dead run's files removed by the next open while a live
// run's are kept, the directory lock's shared/exclusive modes; the store header parser on
// corrupt input; and the store identity (digest length, ctime in shard fingerprints).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <limits>
#include <thread>

#include "offload/store_fixture.h"
#include "offload/store_identity.h"

namespace flexh2o {
namespace {

using namespace flexh2o::testing;

fs::path fresh_dir() {
  fs::path d = unique_dir(fs::path(FLEXH2O_BINARY_DIR) / "offload_test_tmp");
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> names_in(const fs::path& d) {
  std::vector<std::string> f;
  for (const auto& de : fs::directory_iterator(d)) f.push_back(de.path().filename().string());
  std::sort(f.begin(), f.end());
  return f;
}

struct DirFixture : ::testing::Test {
  fs::path dir = fresh_dir();
  std::unique_ptr<IoBackend> io = make_io_backend(IoBackendChoice::kPread, nullptr);
  ~DirFixture() override { fs::remove_all(dir); }
};

// Three stores on one directory write the same entry over and over at the same time: each
// writer has its own temporary file, so every put succeeds and the file is always whole.
// (With one fixed NAME.fhs.tmp, one writer unlinked or renamed another's half-written file.)
TEST_F(DirFixture, ConcurrentWritersOfOneNameNeverShareATemporaryFile) {
  constexpr int kStores = 3, kRounds = 40;
  std::vector<std::unique_ptr<DiskStore>> stores;
  for (int i = 0; i < kStores; ++i) stores.push_back(DiskStore::open(dir, "model@1", *io));
  std::vector<std::vector<uint8_t>> payloads;
  for (int i = 0; i < kStores; ++i) payloads.push_back(random_bytes(200000 + 4096 * size_t(i), uint32_t(i)));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStores; ++i)
    threads.emplace_back([&, i] {
      for (int r = 0; r < kRounds; ++r) {
        Status st = stores[size_t(i)]->put("w", u8_view(payloads[size_t(i)]));
        if (!st.ok()) {
          ADD_FAILURE() << st.message();
          ++failures;
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto reader = DiskStore::open(dir, "model@1", *io);
  EXPECT_TRUE(reader->verify("w").ok());
  for (const std::string& f : names_in(dir)) EXPECT_FALSE(f.ends_with(".tmp")) << f;
}

TEST_F(DirFixture, RunFilesGoWhenTheStoreClosesSharedFilesStay) {
  auto a = DiskStore::open(dir, "m", *io);
  const std::string kv = a->run_name("kv.L0.mb0");
  EXPECT_NE(kv.find(a->run_token()), std::string::npos);
  ASSERT_TRUE(a->create(kv, 8192).ok());
  auto w = random_bytes(5000, 1);
  ASSERT_TRUE(a->put("w", u8_view(w)).ok());
  auto b = DiskStore::open(dir, "m", *io);  // a second run: its token differs
  EXPECT_NE(b->run_name("kv.L0.mb0"), kv);
  ASSERT_TRUE(b->create(b->run_name("kv.L0.mb0"), 8192).ok());
  b.reset();
  EXPECT_TRUE(fs::exists(a->path_of(kv)));  // b's close left a's file alone
  a.reset();
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"flexh2o.lock", "w.fhs"}));
}

// A run killed with SIGKILL leaves its lease file unlocked (the kernel drops the flock) and its
// files behind; the next open removes them, and never the files of a run whose lease is held.
TEST_F(DirFixture, DeadRunsFilesAreRemovedByTheNextOpenLiveRunsKept) {
  auto live = DiskStore::open(dir, "m", *io);
  const std::string live_kv = live->run_name("kv.L0.mb0");
  ASSERT_TRUE(live->create(live_kv, 4096).ok());
  const std::string dead = "run-1f-0123456789abcdef", orphan = "run-2e-fedcba9876543210";
  for (const std::string& f : std::vector<std::string>{dead + ".lock", "kv.L0.mb0." + dead + ".fhs", "w.x.fhs." + dead + ".3.tmp",
                                                      "kv.L1.mb0." + orphan + ".fhs", "w.y.fhs.tmp"})
    std::ofstream(dir / f) << "left behind";
  auto next = DiskStore::open(dir, "m", *io);
  std::vector<std::string> want = {"flexh2o.lock", live_kv + ".fhs", live->run_token() + ".lock",
                                   next->run_token() + ".lock"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names_in(dir), want);
  std::vector<uint8_t> buf(4096);
  EXPECT_TRUE(live->read(live_kv, 0, 4096, buf.data()).ok());
}

// A lease the cleaner cannot open (here a symlink loop; in a shared directory, out of
// descriptors) is taken as alive, its run's files kept: they used to be removed under the live run.
TEST_F(DirFixture, ALeaseThatCannotBeOpenedKeepsItsRunsFiles) {
  const std::string other = "run-3c-00112233445566ff";
  fs::create_symlink(other + ".lock", dir / (other + ".lock"));
  std::ofstream(dir / ("kv.L0.mb0." + other + ".fhs")) << "a live run's";
  EXPECT_EQ(remove_stale_run_files(dir, ""), 0u);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"kv.L0.mb0." + other + ".fhs", other + ".lock"}));
  fs::remove(dir / (other + ".lock"));  // gone: its run ended, and what it left is garbage
  std::ofstream(dir / (other + ".lock")) << "";
  EXPECT_EQ(remove_stale_run_files(dir, ""), 2u);
  EXPECT_EQ(names_in(dir), std::vector<std::string>{});
}

TEST_F(DirFixture, SharedLocksCoexistAnExclusiveOneWaits) {
  auto store = DiskStore::open(dir, "m", *io);
  StoreDirLock s1 = store->lock_dir(StoreDirLock::Mode::kShared);
  StoreDirLock s2 = StoreDirLock::acquire(dir, [](long) { ADD_FAILURE() << "a shared lock waited for a shared one"; },
                                          StoreDirLock::Mode::kShared);
  std::atomic<bool> waited{false}, held{false};
  std::thread writer([&] {
    StoreDirLock x = StoreDirLock::acquire(dir, [&](long) { waited = true; }, StoreDirLock::Mode::kExclusive);
    held = true;
  });
  while (!waited) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(held.load());
  s1.release();
  s2.release();
  writer.join();
  EXPECT_TRUE(held.load());
}

// A wait for another run's lock polls still_waiting, whose exception ends it (a stop signal while
// another run builds the store: the wait used to block in flock until that run let go); with it
// the lock is still taken once released.
TEST_F(DirFixture, AWaitEndsWhenStillWaitingThrows) {
  StoreDirLock other = StoreDirLock::acquire(dir);
  int waits = 0, ticks = 0;
  EXPECT_THROW(StoreDirLock::acquire(dir, [&](long) { ++waits; }, StoreDirLock::Mode::kShared,
                                     [&] {
                                       if (++ticks == 3) throw Error("stop");
                                     }),
               Error);
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(ticks, 3);
  StoreDirLock mine = StoreDirLock::acquire(dir, {}, StoreDirLock::Mode::kExclusive, [&] {
    if (++ticks == 5) other.release();  // the other run lets go while this one waits
  });
  EXPECT_TRUE(mine.held());
  EXPECT_EQ(ticks, 5);
}

TEST(RunToken, IsFoundInAnyComponent) {
  EXPECT_EQ(run_token_of("kv.L0.mb0.run-1f2e-0123456789abcdef.fhs"), "run-1f2e-0123456789abcdef");
  EXPECT_EQ(run_token_of("w.a.fhs.run-1-0123456789abcdef.7.tmp"), "run-1-0123456789abcdef");
  EXPECT_EQ(run_token_of("run-1-0123456789abcdef.lock"), "run-1-0123456789abcdef");
  EXPECT_EQ(run_token_of("w.model.run-layer.weight.fhs"), "");  // not hex
  EXPECT_EQ(run_token_of("run-1-0123456789abcde.lock"), "");    // 15 digits
  EXPECT_EQ(run_token_of("flexh2o.lock"), "");
}

// ---- the header parser --------------------------------------------------------------------

std::vector<std::byte> encoded(const StoreHeader& h) {
  std::vector<std::byte> b(kStoreHeaderBytes);
  encode_store_header(h, std::span<std::byte, kStoreHeaderBytes>(b.data(), kStoreHeaderBytes));
  return b;
}

StoreHeader sample() {
  StoreHeader h;
  h.complete = true;
  h.hashed = true;
  h.content_hash = 0x1234;
  h.dtype = DType::F16;
  h.shape = Shape{3, 5};
  h.payload_bytes = 30;
  h.identity = "0123456789abcdef0123456789abcdef";
  h.name = "w.layer.F16";
  return h;
}

TEST(StoreHeaderParse, RoundTripsAndRefusesEveryInconsistency) {
  StoreHeader got;
  ASSERT_TRUE(parse_store_header(encoded(sample()), &got).ok());
  EXPECT_EQ(got.identity, sample().identity);
  EXPECT_EQ(got.name, sample().name);
  EXPECT_EQ(got.shape, sample().shape);
  EXPECT_TRUE(got.complete && got.hashed);
  auto code = [](std::vector<std::byte> b) { return parse_store_header(b, nullptr).code(); };
  StoreHeader h = sample();
  h.payload_bytes = 31;  // shape says 30
  EXPECT_EQ(code(encoded(h)), StatusCode::kCorrupt);
  h = sample();
  h.shape = Shape{int64_t(1) << 62, 8};  // byte size overflows
  EXPECT_EQ(code(encoded(h)), StatusCode::kCorrupt);
  h.shape = Shape{-2, -15};  // negative dims whose product is right
  EXPECT_EQ(code(encoded(h)), StatusCode::kCorrupt);
  // A consistent size whose page padding wraps 64 bits (a check over it then looped forever).
  h.dtype = DType::U8;
  h.shape = Shape{std::numeric_limits<int64_t>::max(), 2};
  h.payload_bytes = UINT64_MAX - 1;
  EXPECT_EQ(code(encoded(h)), StatusCode::kCorrupt);
  std::vector<std::byte> b = encoded(sample());
  b[100] ^= std::byte{1};  // any flipped byte: header hash mismatch
  EXPECT_EQ(code(b), StatusCode::kCorrupt);
  EXPECT_EQ(parse_store_header(std::span<const std::byte>(encoded(sample())).first(4095), nullptr).code(),
            StatusCode::kCorrupt);
  std::vector<std::byte> noise(kStoreHeaderBytes);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = std::byte(i * 131 + 7);
  EXPECT_EQ(code(noise), StatusCode::kCorrupt);
}

// ---- identity -------------------------------------------------------------------------------

TEST(StoreIdentity, DigestHasOneLengthForAnyNumberOfShards) {
  std::string m;
  for (int i = 0; i < 2000; ++i) m += detail::concat("shard model-", i, ".safetensors size=1 ctime=2\n");
  EXPECT_EQ(manifest_digest(m).size(), 32u);
  EXPECT_EQ(manifest_digest("x").size(), 32u);
  EXPECT_NE(manifest_digest(m), manifest_digest(m + "shard extra size=1\n"));
}

TEST(StoreIdentity, ExplainsWhatChanged) {
  const std::string a = "config layers=2 hidden=8\nshard a.st size=1 ctime=5 mtime=3\nshard b.st size=1 ctime=5\n";
  EXPECT_EQ(explain_manifest_change(a, a), "");
  EXPECT_EQ(explain_manifest_change(a, "config layers=2 hidden=8\nshard a.st size=1 ctime=6 mtime=3\nshard b.st "
                                       "size=1 ctime=5\n"),
            "checkpoint changed (shard a.st: ctime)");
  EXPECT_EQ(explain_manifest_change(a, "config layers=3 hidden=8\nshard a.st size=1 ctime=5 mtime=3\nshard b.st "
                                       "size=1 ctime=5\n"),
            "model config changed (config: layers)");
  EXPECT_EQ(explain_manifest_change(a, "config layers=2 hidden=8\nshard a.st size=1 ctime=5 mtime=3\n"),
            "checkpoint changed (shard b.st removed)");
}

// A file rewritten in place with the same size and its mtime put back still changes its
// fingerprint: ctime cannot be set back.
TEST_F(DirFixture, ShardFingerprintSeesAnInPlaceRewriteWithRestoredMtime) {
  const fs::path f = dir / "model.safetensors";
  // A safetensors-shaped file: 8-byte little-endian header length, the JSON header, the data.
  auto file = [](const char* data) {
    const std::string json = R"({"t":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})";
    std::string s(8, '\0');
    s[0] = char(json.size());
    return s + json + data;
  };
  std::ofstream(f, std::ios::binary) << file("payload A");
  struct stat before {};
  ASSERT_EQ(::stat(f.c_str(), &before), 0);
  const std::string fp = shard_fingerprint(MappedFile::open(f));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the coarse clock tick
  std::ofstream(f, std::ios::binary | std::ios::trunc) << file("payload B");
  const timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, f.c_str(), times, 0), 0);
  struct stat after {};
  ASSERT_EQ(::stat(f.c_str(), &after), 0);
  ASSERT_EQ(after.st_size, before.st_size);
  ASSERT_EQ(after.st_ino, before.st_ino);
  ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  const std::string now = shard_fingerprint(MappedFile::open(f));
  EXPECT_NE(now, fp);
  EXPECT_EQ(explain_manifest_change(fp, now), "checkpoint changed (shard model.safetensors: ctime)");
}

}  // namespace
}  // namespace flexh2o
