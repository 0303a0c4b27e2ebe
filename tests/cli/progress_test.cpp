// Progress lines (src/cli/progress.h): the text, the modes, the rate limit, and the line the
// program prints to a log with --progress always (rates per offloading link included).
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <thread>
#include <nlohmann/json.hpp>

#include "cli/progress.h"
#include "cli/run_setup.h"
#include "engine/cpu_device.h"
#include "cli_run.h"

namespace flexh2o::cli {
namespace {

std::string drain(std::FILE* f) {
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(char(c));
  return s;
}

TEST(Progress, DurationsReadLikeAClock) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(7.4), "0:07");
  EXPECT_EQ(format_duration(205), "3:25");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(1.0 / 0.0), "?");
}

TEST(Progress, LineShowsRateEtaAndBusyLinksOnly) {
  ProgressSnapshot s{"generate", "tokens", 96, 256, 2.0};
  EXPECT_EQ(format_progress(s), "[generate] 96/256 tokens  48.0 tok/s  ETA 0:03");
  s.links = true;
  s.link_bytes_per_s = {1.21e9, 3.1e8, 0, 2.5e4};
  EXPECT_EQ(format_progress(s),
            "[generate] 96/256 tokens  48.0 tok/s  ETA 0:03  disk->host 1.21 GB/s  host->device 310 MB/s  "
            "host->disk 25 kB/s");
  s = ProgressSnapshot{"eval-choice", "items", 10, 10, 125.0};
  EXPECT_EQ(format_progress(s), "[eval-choice] 10/10 items  0.1 items/s  done in 2:05");
  s = ProgressSnapshot{"bench", "tokens", 0, 64, 0.0};  // nothing done yet: no rate, no ETA
  EXPECT_EQ(format_progress(s), "[bench] 0/64 tokens  0.0 tok/s  ETA ?");
  // A first batch done in 0.08 s (its warm-up in it) gave "ETA 11:16:24" for a 39-minute run.
  s = ProgressSnapshot{"generate", "tokens", 8, 4'000'000, 0.08};
  EXPECT_EQ(format_progress(s), "[generate] 8/4000000 tokens  100.0 tok/s  ETA ?");
}

TEST(Progress, BytesReadInGigabytesOrMegabytes) {
  ProgressSnapshot s{"place weights", "bytes", 12'300'000'000, 40'100'000'000, 5.0};
  EXPECT_EQ(format_progress(s), "[place weights] 12.3/40.1 GB  2.46 GB/s  ETA 0:11");
  s = ProgressSnapshot{"place weights", "bytes", 250'000'000, 250'000'000, 2.0};
  EXPECT_EQ(format_progress(s), "[place weights] 250.0/250.0 MB  125 MB/s  done in 0:02");
}

// Work shorter than `quiet` prints nothing, its final line included; longer work draws as usual.
TEST(Progress, QuietWorkSaysNothing) {
  for (const bool slow : {false, true}) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    {
      Progress p("place weights", "bytes", ProgressMode::kAlways, false, nullptr, f, std::chrono::milliseconds(300));
      p.update(1, 4);
      if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(350));
      p.update(2, 4);
      p.update(4, 4);
    }
    const std::string got = drain(f);
    std::fclose(f);
    if (slow)
      EXPECT_TRUE(std::regex_search(got, std::regex("^\\[place weights\\] 0.0/0.0 MB [^\n]*\n\\[place weights\\] [^\n]*done in")))
          << nlohmann::json(got).dump();
    else
      EXPECT_EQ(got, "");
  }
}

TEST(Progress, ModesDecideWhetherAndHowLinesAreDrawn) {
  EXPECT_EQ(parse_progress_mode("always"), ProgressMode::kAlways);
  EXPECT_THROW(parse_progress_mode("sometimes"), Error);
  struct Case {
    ProgressMode mode;
    bool tty;
    const char* want;  // regex of everything written
  } cases[] = {
      {ProgressMode::kNever, true, ""},
      {ProgressMode::kAuto, false, ""},
      // Terminal: redrawn in place (\r, erase to end of line), one newline at the end.
      {ProgressMode::kAuto, true, "^\r\\[t\\] 1/3 tokens .*\x1b\\[K\r\\[t\\] 3/3 tokens .*done in .*\x1b\\[K\n$"},
      // Log: the first and the final line (the rest fall inside the 10 s limit), each whole.
      {ProgressMode::kAlways, false, "^\\[t\\] 1/3 tokens [^\r\n]*ETA[^\r\n]*\n\\[t\\] 3/3 tokens [^\r\n]*done in[^\r\n]*\n$"},
  };
  for (const auto& c : cases) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    {
      Progress p("t", "tokens", c.mode, c.tty, nullptr, f);
      p.update(1, 3);
      p.update(2, 3);  // within the rate limit: not drawn
      p.update(3, 3);  // the last one always is
      p.finish();
      p.finish();      // idempotent: no second newline
    }
    const std::string got = drain(f);
    std::fclose(f);
    EXPECT_TRUE(std::regex_search(got, std::regex(c.want))) << "mode " << int(c.mode) << " tty " << c.tty << ": "
                                                           << nlohmann::json(got).dump();
  }
}

TEST(Progress, GenerateLogsRatesPerLinkAndTheReportHasThem) {
  test::TempDir tmp;
  const std::string model = test::model_dir("tiny-opt").string();
  const auto report = tmp.path() / "r.json";
  auto r = test::run_flexh2o("generate -m " + model + " -p 'In the beginning' -n 8 --greedy --progress always" +
                             " --percent 0 0 100 0 100 0 --offload-dir " + (tmp.path() / "off").string() +
                             " --report " + report.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("\\[generate\\] 8/8 tokens  [0-9.]+ tok/s  done in [0-9:]+"
                                                     "  disk->host [0-9.]+ [kMG]B/s  host->device [0-9.]+ [kMG]B/s")))
      << r.err;
  const auto j = nlohmann::json::parse(test::read_text(report));
  // Reading and tokenizing the requests is timed (apart from the run's tokens/s).
  EXPECT_GT(j.at("input_seconds").get<double>(), 0) << j.dump();
  // So is writing the store's weights, between the load and the first step.
  EXPECT_GT(j.at("setup_seconds").get<double>(), 0) << j.dump();
  EXPECT_GT(j.at("offload").at("placement_disk_io_bytes").at("written").get<double>(), 0) << j.dump();
  const auto& rates = j.at("offload").at("bytes_per_second");
  for (const char* link : {"disk_to_host", "host_to_device"}) {
    const double bytes = j["offload"]["bytes_moved"][link].get<double>(), wall = j["offload"]["schedule_wall_seconds"];
    ASSERT_GT(bytes, 0) << link;
    EXPECT_NEAR(rates.at(link).get<double>(), bytes / wall, 1e-9 * bytes / wall) << link;
  }
  auto bad = test::run_flexh2o("generate -m " + model + " -p hi --progress sometimes");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--progress"), std::string::npos) << bad.err;
  // Not a terminal and auto (the default): nothing but the summary.
  auto quiet = test::run_flexh2o("generate -m " + model + " -p hi -n 2");
  EXPECT_EQ(quiet.err.find("[generate]"), std::string::npos) << quiet.err;
}

// A stop signal while the weights are placed ends the placement at the next weight (writing a
// large store takes minutes); the next placement completes over the files left.
TEST(Progress, PlacingTheWeightsEndsOnAStopSignal) {
  test::TempDir tmp;
  const Model model = Model::load_dir(test::model_dir("tiny-opt"));
  CpuDevice dev(1);
  OffloadOptions o;
  o.policy.w_gpu_percent = 0;
  o.policy.w_cpu_percent = 0;  // every weight in the store on disk
  o.offload_dir = tmp.path() / "off";
  std::atomic<bool> stop{true};
  try {
    place_engine(model, dev, o, "never", false, &stop);
    FAIL() << "expected the placement to stop";
  } catch (const PlacementStopped& e) {
    EXPECT_NE(std::string(e.what()).find("stopped while placing the weights"), std::string::npos) << e.what();
  }
  stop = false;
  const std::unique_ptr<OffloadEngine> eng = place_engine(model, dev, o, "never", false, &stop);
  const OffloadReport r = eng->report();
  EXPECT_GT(r.weights_reused + r.weights_written, 0u);
}

}  // namespace
}  // namespace flexh2o::cli
