// Progress of a long command on stderr: done/total, rate, ETA and, when the offloading engine
// runs, the bytes per second on each link. On a terminal one line redrawn in place (at most
// 5 times a second); elsewhere (a log file) with --progress always, a full line every 10 s.
// Not thread-safe: update() is called from the one thread that drives the run.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/offload_engine.h"

namespace flexh2o::cli {

// What a progress line shows, in plain numbers (format_progress() is tested on these).
struct ProgressSnapshot {
  std::string label;          // "generate", "eval-ppl", ...
  std::string unit;           // "tokens", "items", ...
  int64_t done = 0, total = 0;
  double seconds = 0;         // since the work began
  bool links = false;         // show the link rates below
  std::array<double, kNumLinks> link_bytes_per_s{};
};

// "[generate] 96/256 tokens  41.3 tok/s  ETA 0:04  disk->host 1.21 GB/s  host->device 310 MB/s":
// the rate is done/seconds; the ETA assumes it holds (an upper bound when sequences stop early at
// EOS), "?" before a second of work; links with no traffic are left out. Unit "bytes":
// "[place weights] 12.3/40.1 GB  2.10 GB/s".
std::string format_progress(const ProgressSnapshot& s);
// 0:07, 3:25, 1:02:03.
std::string format_duration(double seconds);

enum class ProgressMode { kAuto, kAlways, kNever };
// --progress auto|always|never (auto: only when stderr is a terminal).
void add_progress_flag(CLI::App& app, std::string& value);
ProgressMode parse_progress_mode(const std::string& value);  // throws flexh2o::Error on anything else

class Progress {
 public:
  // `engine` (may be null) must outlive this object; `out` is where lines go (stderr). Nothing is
  // drawn before the work has run for `quiet` (work that ends sooner prints nothing).
  Progress(std::string label, std::string unit, ProgressMode mode, bool is_tty, const OffloadEngine* engine = nullptr,
           std::FILE* out = stderr, std::chrono::milliseconds quiet = std::chrono::milliseconds(0));
  ~Progress();  // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }
  // Draws when due (rate-limited) or when done == total.
  void update(int64_t done, int64_t total);
  // Ends a redrawn line with a newline, so that what is printed next starts on its own line.
  void finish();

 private:
  ProgressSnapshot snapshot(int64_t done, int64_t total) const;
  std::string label_, unit_;
  bool enabled_ = false, redraw_ = false, drawn_ = false;
  const OffloadEngine* engine_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_, last_;
  std::chrono::milliseconds quiet_;
  std::array<uint64_t, kNumLinks> start_bytes_{};
};

// A "[label] 1.2/4.0 GB" line of startup work (placing weights, making dummy ones) under
// --progress `mode`, drawn only once the work has taken a second.
Progress startup_progress(std::string label, const std::string& mode, bool is_tty);

}  // namespace flexh2o::cli
