// The offloading engine over a disk store it can trust: a checkpoint rewritten in place with the
// same size and a restored mtime is detected (ctime) and the store rebuilt, saying why; a
// 40-shard checkpoint uses the disk tier (the identity is a fixed-length digest); three runs at
// once over one --offload-dir build each weight file once and all match the in-memory run; KV
// files on disk go when a run ends, also when it fails; --trust-store skips the payload hash.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <latch>
#include <thread>

#include "../offload/faulty_io.h"
#include "bible_requests.h"
#include "engine/cpu_device.h"
#include "engine/offload_engine.h"
#include "loader/safetensors_writer.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {

using test::model_dir;
namespace fs = std::filesystem;

// Every weight on disk, half of the KV cache too, 2 micro-batches of 2.
OffloadOptions disk_options(const fs::path& dir) {
  OffloadOptions o;
  o.policy.w_gpu_percent = 0;
  o.policy.w_cpu_percent = 0;
  o.policy.cache_gpu_percent = 0;
  o.policy.cache_cpu_percent = 50;
  o.policy.gpu_batch_size = 2;
  o.policy.num_gpu_batches = 2;
  o.offload_dir = dir;
  return o;
}

// Writes `m`'s tensors as a checkpoint in `dst` (config and tokenizer copied from tiny-opt) in
// `shards` files; with `negate`, every fc2 bias changes sign (same names, shapes and size).
void write_checkpoint(const Model& m, const fs::path& dst, int shards, bool negate) {
  fs::create_directories(dst);
  test::copy_model_files(model_dir("tiny-opt"), dst);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::pair<std::string, TensorView>> all;
  for (const BoundTensor& t : m.tensors()) {
    const auto* p = static_cast<const std::byte*>(t.view.data);
    bufs.emplace_back(p, p + t.view.nbytes());
    if (negate && t.spec.name.find("fc2.bias") != std::string::npos)
      for (size_t i = 1; i < bufs.back().size(); i += 2) bufs.back()[i] ^= std::byte{0x80};  // f16 sign bits
    TensorView v = t.view;
    v.data = bufs.back().data();
    all.emplace_back(t.spec.name, v);
  }
  if (shards == 1) {
    write_safetensors(dst / "model.safetensors", all);
    return;
  }
  nlohmann::json index{{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (int s = 0; s < shards; ++s) {
    std::vector<std::pair<std::string, TensorView>> part;
    for (size_t i = size_t(s); i < all.size(); i += size_t(shards)) part.push_back(all[i]);
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    write_safetensors(dst / name, part);
    for (const auto& [n, v] : part) index["weight_map"][n] = name;
  }
  std::ofstream(dst / "model.safetensors.index.json") << index.dump(1);
}

std::vector<GenerationRequest> reqs() { return test::bible_requests("tiny-opt", 4); }

test::Run in_memory(const Model& m) {
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner r(fwd, 4);
  return test::run_greedy(r, reqs());
}

std::vector<std::string> files_in(const fs::path& d) {
  std::vector<std::string> f;
  for (const auto& de : fs::directory_iterator(d)) f.push_back(de.path().filename().string());
  return f;
}

// Only shared files remain: weight files, the manifest and the directory lock (no KV, no lease,
// no temporary file).
void expect_only_shared_files(const fs::path& d) {
  for (const std::string& f : files_in(d))
    EXPECT_TRUE((f.starts_with("w.") && f.ends_with(".fhs")) || f == "store.manifest" || f == "flexh2o.lock") << f;
}

TEST(OffloadStore, CheckpointRewrittenWithSameSizeAndMtimeIsRebuilt) {
  test::TempDir tmp;
  const Model original = Model::load_dir(model_dir("tiny-opt"));
  const fs::path dir = tmp.path() / "m", file = dir / "model.safetensors";
  write_checkpoint(original, dir, 1, false);
  const OffloadOptions o = disk_options(tmp.path() / "store");
  {
    Model a = Model::load_dir(dir);
    CpuDevice dev(2);
    OffloadEngine e(a, dev, o);
    EXPECT_EQ(e.report().weights_reused, 0u);
  }
  struct stat before {};
  ASSERT_EQ(::stat(file.c_str(), &before), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the kernel's coarse clock tick
  write_checkpoint(original, tmp.path() / "b", 1, true);
  fs::copy_file(tmp.path() / "b" / "model.safetensors", file, fs::copy_options::overwrite_existing);  // in place
  const timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  struct stat after {};
  ASSERT_EQ(::stat(file.c_str(), &after), 0);
  ASSERT_EQ(after.st_size, before.st_size);
  ASSERT_EQ(after.st_ino, before.st_ino);
  ASSERT_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);

  Model b = Model::load_dir(dir);
  CpuDevice dev(2);
  OffloadOptions ob = o;
  std::vector<std::string> notes;
  ob.notice = [&](const std::string& line) { notes.push_back(line); };
  OffloadEngine e(b, dev, ob);
  EXPECT_EQ(e.report().weights_reused, 0u);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("checkpoint changed (shard model.safetensors: ctime)"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("rebuilding"), std::string::npos) << notes[0];
  test::expect_same_logits(test::run_greedy(e, reqs()), in_memory(b), "rewritten checkpoint");
}

TEST(OffloadStore, FortyShardCheckpointUsesTheDiskTier) {
  test::TempDir tmp;
  const Model original = Model::load_dir(model_dir("tiny-opt"));
  write_checkpoint(original, tmp.path() / "m", 40, false);
  Model m = Model::load_dir(tmp.path() / "m");
  CpuDevice dev(2);
  const OffloadOptions o = disk_options(tmp.path() / "store");
  const test::Run want = in_memory(original);
  {
    OffloadEngine e(m, dev, o);
    test::expect_same_logits(test::run_greedy(e, reqs()), want, "40 shards, first run");
  }
  OffloadEngine e(m, dev, o);  // and the store is reused
  EXPECT_GT(e.report().weights_reused, 0u);
  EXPECT_EQ(e.report().weights_written, 0u);
  test::expect_same_logits(test::run_greedy(e, reqs()), want, "40 shards, reused store");
}

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

// Three runs start together on one empty --offload-dir (weights and KV on disk): the first to
// take the directory lock builds the weight files, the others reuse them, every run gives the
// in-memory logits, and only shared files remain afterwards.
TEST(OffloadStore, ThreeConcurrentRunsShareOneOffloadDir) {
  // Debian's oneTBB is not instrumented: three engines' kernels in three task arenas at once
  // make TSan report races inside TBB's own task allocator. The store's concurrency is checked
  // under TSan by tests/offload (store_share_test.cpp: writers, leases, locks).
  if (kThreadSanitizer) GTEST_SKIP() << "three concurrent TBB arenas: reports inside uninstrumented oneTBB";
  test::TempDir tmp;
  const Model model = Model::load_dir(model_dir("tiny-opt"));
  const test::Run want = in_memory(model);
  const fs::path dir = tmp.path() / "store";
  constexpr int kRuns = 3;
  std::latch start(kRuns);
  std::vector<test::Run> got(kRuns);
  std::vector<size_t> written(kRuns), reused(kRuns);
  std::vector<std::string> errors(kRuns);
  std::vector<std::thread> runs;
  for (int i = 0; i < kRuns; ++i)
    runs.emplace_back([&, i] {
      try {
        CpuDevice dev(1);
        OffloadOptions o = disk_options(dir);
        o.notice = [](const std::string&) {};  // "waiting for another run" is expected here
        start.arrive_and_wait();
        OffloadEngine e(model, dev, o);
        got[size_t(i)] = test::run_greedy(e, reqs());
        written[size_t(i)] = e.report().weights_written;
        reused[size_t(i)] = e.report().weights_reused;
      } catch (const std::exception& ex) {
        errors[size_t(i)] = ex.what();
      }
    });
  for (auto& t : runs) t.join();
  size_t total_written = 0;
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_EQ(errors[size_t(i)], "") << "run " << i;
    test::expect_same_logits(got[size_t(i)], want, "concurrent run " + std::to_string(i));
    total_written += written[size_t(i)];
  }
  EXPECT_EQ(total_written, written[0] + reused[0]);  // each weight file written once in all
  expect_only_shared_files(dir);
}

TEST(OffloadStore, KvFilesGoWhenARunEndsAlsoWhenItFails) {
  test::TempDir tmp;
  const Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  const fs::path dir = tmp.path() / "store";
  auto real = make_io_backend(IoBackendChoice::kAuto, nullptr);
  testing::FaultyIo faulty(*real);
  OffloadOptions o = disk_options(dir);
  o.io_backend = &faulty;
  {
    OffloadEngine e(model, dev, o);
    (void)test::run_greedy(e, reqs());
    size_t kv = 0;
    for (const std::string& f : files_in(dir)) kv += f.starts_with("kv.");
    EXPECT_GT(kv, 0u);  // the run had KV files on disk
  }
  expect_only_shared_files(dir);
  try {
    OffloadEngine e(model, dev, o);
    faulty.fail_nth_read(40, EIO);
    (void)generate(e, reqs(), GenerateOptions{});
    FAIL() << "expected an I/O error";
  } catch (const Error&) {
  }
  expect_only_shared_files(dir);
}

TEST(OffloadStore, TrustStoreSkipsThePayloadHash) {
  test::TempDir tmp;
  const Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  OffloadOptions o = disk_options(tmp.path());
  { OffloadEngine first(model, dev, o); }
  const fs::path victim = tmp.path() / "w.model.decoder.layers.1.fc2.bias.F16.fhs";
  ASSERT_TRUE(fs::exists(victim));
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096 + 10);
    const char ch = char(f.get() ^ 0x40);
    f.seekp(4096 + 10);
    f.put(ch);
  }
  o.verify_store = false;
  {
    OffloadEngine trusting(model, dev, o);
    EXPECT_EQ(trusting.report().weights_written, 0u);  // the flipped byte goes unnoticed
  }
  o.verify_store = true;  // the default catches it
  OffloadEngine checking(model, dev, o);
  EXPECT_EQ(checking.report().weights_written, 1u);
}

// OffloadOptions::on_place: every weight counted once as it is placed (device and host homes,
// disk files written on the first run and checked on the second), rising to the total.
TEST(OffloadStore, PlacingReportsBytesUpToTheTotal) {
  test::TempDir tmp;
  const Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  OffloadOptions o = disk_options(tmp.path());
  o.policy.w_gpu_percent = 30;  // the rest split over host and disk
  o.policy.w_cpu_percent = 30;
  for (const char* run : {"writes", "reuses"}) {
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    o.on_place = [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };
    OffloadEngine e(model, dev, o);
    uint64_t total = 0;
    for (const UnitPlacement& u : e.placement().units)
      for (const PlacedTensor& t : u.tensors) total += t.bytes;
    ASSERT_GE(calls.size(), 3u) << run;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].second, total) << run;
      if (i) {
        EXPECT_GT(calls[i].first, calls[i - 1].first) << run << " call " << i;
      }
    }
    EXPECT_EQ(calls.back().first, total) << run;
    for (int t = 0; t < 3; ++t) EXPECT_GT(e.placement().bytes[size_t(t)], 0u) << run << " tier " << t;
    EXPECT_FALSE(e.options().on_place) << "the engine keeps no reference to the caller's progress";
  }
  // All on the host: the tied lm_head shares the embedding's home, so the total is the model's
  // bytes with the table counted once.
  OffloadOptions host = disk_options(tmp.path());
  host.policy.w_cpu_percent = 100;
  host.policy.cache_cpu_percent = 100;
  host.offload_dir.clear();
  uint64_t last = 0, total = 0;
  host.on_place = [&](uint64_t done, uint64_t t) { last = done, total = t; };
  OffloadEngine e(model, dev, host);
  EXPECT_TRUE(model.config().tie_embeddings);
  EXPECT_EQ(total, model.weight_bytes());
  EXPECT_EQ(last, total);
  // All on disk: the tied lm_head reads the embedding's file; no second copy is written or counted.
  OffloadOptions disk = disk_options(tmp.path() / "all_disk");
  disk.on_place = [&](uint64_t done, uint64_t t) { last = done, total = t; };
  OffloadEngine d(model, dev, disk);
  EXPECT_EQ(total, model.weight_bytes());
  EXPECT_EQ(last, total);
  EXPECT_EQ(d.placement().bytes[2], model.weight_bytes());
  EXPECT_EQ(d.report().weights_written, model.tensors().size());
  // The store written is placement I/O, not the token steps' (none ran yet).
  EXPECT_EQ(d.report().disk_written, 0u);
  EXPECT_EQ(d.report().disk_read, 0u);
  EXPECT_GE(d.report().placement_disk_written, model.weight_bytes());
  size_t files = 0;
  for (const auto& f : fs::recursive_directory_iterator(tmp.path() / "all_disk"))
    files += f.is_regular_file() && f.path().filename().string().rfind("w.", 0) == 0;
  EXPECT_EQ(files, model.tensors().size());
}

}  // namespace
}  // namespace flexh2o
