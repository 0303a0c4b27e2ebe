// Faults around the offloading engine: a full disk while writing the store, store files
// truncated or corrupted between runs, short reads, I/O errors mid-run, an unusable offload
// directory and policy files with unknown keys. Faults come from a decorator around the real
// I/O backend (tests/offload/faulty_io.h), never from #ifdefs in production code.
#include <gtest/gtest.h>

#include <fstream>

#include "../offload/faulty_io.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;
namespace fs = std::filesystem;

std::vector<GenerationRequest> reqs() {
  std::vector<GenerationRequest> r(3);
  const std::vector<int32_t> p[] = {{2, 44, 81, 262, 2313}, {2, 36, 264}, {2, 341, 15, 271, 262, 656, 17}};
  for (int i = 0; i < 3; ++i) {
    r[size_t(i)].prompt_ids = p[i];
    r[size_t(i)].max_new_tokens = 5;
    r[size_t(i)].sampling.temperature = 0;
  }
  return r;
}

std::vector<std::vector<int32_t>> tokens(StepRunner& run) {
  std::vector<std::vector<int32_t>> t;
  for (auto& r : generate(run, reqs(), GenerateOptions{})) t.push_back(r.tokens);
  return t;
}

OffloadOptions disk_options(const fs::path& dir) {
  OffloadOptions o;
  o.policy.w_gpu_percent = 0;
  o.policy.w_cpu_percent = 0;  // all weights on disk
  o.policy.cache_gpu_percent = 0;
  o.policy.cache_cpu_percent = 50;  // half the KV on disk
  o.policy.gpu_batch_size = 2;
  o.policy.num_gpu_batches = 2;
  o.offload_dir = dir;
  return o;
}

struct Fixture : ::testing::Test {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev{2};
  test::TempDir tmp;
  std::unique_ptr<IoBackend> real = make_io_backend(IoBackendChoice::kAuto, nullptr);
  // The in-memory run's logits, which every recovered engine must give bit for bit (its tokens
  // alone would pass a subtly wrong weight or KV row: tiny-opt's greedy text loops).
  test::Run want() {
    Forward fwd(model, dev);
    InMemoryRunner r(fwd, 4);
    return test::run_greedy(r, reqs());
  }
  void expect_recovered(StepRunner& e, const std::string& what) {
    test::expect_same_logits(test::run_greedy(e, reqs()), want(), what);
  }
};

TEST_F(Fixture, DiskFullWhileWritingTheStoreLeavesItConsistent) {
  testing::FaultyIo faulty(*real);
  faulty.fail_nth_write(20, ENOSPC);
  OffloadOptions o = disk_options(tmp.path() / "store");
  o.io_backend = &faulty;
  try {
    OffloadEngine e(model, dev, o);
    FAIL() << "expected ENOSPC";
  } catch (const Error& e) {
    const std::string msg = e.what();  // the directory is named "store": find the words, not the path
    EXPECT_NE(msg.find("is out of space"), std::string::npos) << msg;
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  }
  for (const auto& f : fs::directory_iterator(tmp.path() / "store")) {  // and the directory's lock file
    if (f.path().filename() != "flexh2o.lock") {
      EXPECT_EQ(f.path().extension(), ".fhs") << "partial file left behind: " << f.path();
    }
  }
  // The next run completes the store, reusing what was written, and generates correctly.
  o.io_backend = real.get();
  OffloadEngine e(model, dev, o);
  EXPECT_GT(e.report().weights_reused, 0u);
  EXPECT_GT(e.report().weights_written, 0u);
  expect_recovered(e, "the store finished after a full disk");
}

TEST_F(Fixture, TruncatedOrCorruptedStoreFilesAreRebuilt) {
  OffloadOptions o = disk_options(tmp.path());
  { OffloadEngine first(model, dev, o); }
  const fs::path victim = tmp.path() / "w.model.decoder.layers.2.fc1.weight.F16.fhs";
  ASSERT_TRUE(fs::exists(victim));
  fs::resize_file(victim, fs::file_size(victim) - 5000);  // truncated: header check catches it
  {
    OffloadEngine e(model, dev, o);
    EXPECT_EQ(e.report().weights_written, 1u);
    expect_recovered(e, "a truncated file rebuilt");
  }
  {  // one payload byte flipped: every reuse hashes the payload, so it is caught by default
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 1000);
    char ch = 0;
    f.read(&ch, 1);
    f.seekp(4096 + 1000);
    ch = char(ch ^ 0x40);
    f.write(&ch, 1);
  }
  std::vector<std::string> notes;
  o.notice = [&](const std::string& line) { notes.push_back(line); };
  OffloadEngine e(model, dev, o);
  EXPECT_EQ(e.report().weights_written, 1u);
  ASSERT_EQ(notes.size(), 1u);  // one line naming the file and the reason
  EXPECT_NE(notes[0].find(victim.string() + "' is corrupt: payload hash"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("rebuilding 1 of"), std::string::npos) << notes[0];
  expect_recovered(e, "a corrupted file rebuilt");
}

// A stale file is removed before its replacement is written: the replacement is written whole
// before its rename, so on a nearly full disk the two did not fit together, the run failed at the
// first such file, and the stale file stayed to fail every later run the same way.
TEST_F(Fixture, AStaleFileGoesBeforeItsReplacementIsWritten) {
  OffloadOptions o = disk_options(tmp.path());
  { OffloadEngine first(model, dev, o); }
  const fs::path victim = tmp.path() / "w.model.decoder.layers.1.fc2.weight.F16.fhs";
  ASSERT_TRUE(fs::exists(victim));
  fs::resize_file(victim, fs::file_size(victim) - 4096);
  testing::FaultyIo faulty(*real);
  faulty.fail_nth_write(1, ENOSPC);  // the replacement's first write: the disk is full
  o.io_backend = &faulty;
  EXPECT_THROW(OffloadEngine(model, dev, o), Error);
  EXPECT_FALSE(fs::exists(victim));
  o.io_backend = real.get();
  OffloadEngine e(model, dev, o);
  EXPECT_EQ(e.report().weights_written, 1u);
  expect_recovered(e, "a stale file replaced");
}

// A batch whose KV files do not all fit leaves none behind, and the engine runs the next batch:
// files made before the failing one, kept until the store closed, would make a long-lived
// engine's retry need room for them beside its own.
TEST_F(Fixture, ABatchRefusedMidwayLeavesNoKvFiles) {
  testing::FaultyIo faulty(*real);
  OffloadOptions o = disk_options(tmp.path());
  o.io_backend = &faulty;
  OffloadEngine e(model, dev, o);
  faulty.fail_nth_write(2, ENOSPC);  // the second KV file's header: layer 0's is made
  EXPECT_THROW(tokens(e), Error);
  for (const auto& f : fs::directory_iterator(tmp.path()))
    EXPECT_FALSE(f.path().filename().string().starts_with("kv.")) << f.path();
  expect_recovered(e, "the batch after a refused one");
}

TEST_F(Fixture, ShortReadsAreResubmitted) {
  testing::FaultyIo faulty(*real);
  faulty.set_short_reads(4096);
  OffloadOptions o = disk_options(tmp.path());
  o.io_backend = &faulty;
  OffloadEngine e(model, dev, o);
  expect_recovered(e, "short reads resubmitted");
  EXPECT_GT(faulty.short_passes(), 0);
}

TEST_F(Fixture, ReadErrorMidRunSurfacesAsError) {
  testing::FaultyIo faulty(*real);
  OffloadOptions o = disk_options(tmp.path());
  o.io_backend = &faulty;
  OffloadEngine e(model, dev, o);
  faulty.fail_nth_read(30, EIO);
  try {
    generate(e, reqs(), GenerateOptions{});
    FAIL() << "expected an I/O error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("Input/output error"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find(".fhs"), std::string::npos) << err.what();
  }
  expect_recovered(e, "the run after a read error");  // a failed step leaves the engine usable
}

TEST_F(Fixture, UnusableOffloadDirIsNamed) {
  std::ofstream(tmp.path() / "file") << "x";
  OffloadOptions o = disk_options(tmp.path() / "file" / "store");
  try {
    OffloadEngine e(model, dev, o);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find((tmp.path() / "file").string()), std::string::npos) << err.what();
  }
}

TEST(PolicyFile, UnknownKeysAndBadValuesAreNamed) {
  auto msg = [](const char* text) {
    try {
      policy_from_json(nlohmann::json::parse(text), "p.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(msg(R"({"gpu_batch_size": 2, "percnt": [0,100,0,100,0,100]})").find("unknown policy key \"percnt\""),
            std::string::npos);
  EXPECT_NE(msg(R"({"percent": [50, 60, 100, 0, 100, 0]})").find("sum to 110"), std::string::npos);
  EXPECT_NE(msg(R"({"percent": [0, 100, 0, 100, 50, 50]})").find("activations"), std::string::npos);
  EXPECT_NE(msg(R"({"gpu_batch_size": "four"})").find("wrong type"), std::string::npos);
  Policy p = policy_from_json(nlohmann::json::parse(R"({"percent": [20, 80, 0, 100, 0, 100], "gpu_batch_size": 48,
                                                        "num_gpu_batches": 3, "cpu_cache_compute": true})"),
                              "p.json");
  EXPECT_EQ(p.block_size(), 144);
  EXPECT_EQ(p.str(), "--percent 20 80 0 100 0 100 --gpu-batch-size 48 --num-gpu-batches 3 --cpu-cache-compute");
}

}  // namespace
}  // namespace flexh2o
