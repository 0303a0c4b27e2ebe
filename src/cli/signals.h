// SIGINT/SIGTERM/SIGHUP (SIGHUP unless it is ignored: nohup) for the commands that poll
// Env::stop. Signal dispositions belong to the process, so this is one process-wide object:
// install() blocks them in the calling thread (call it before any thread starts, so the engine's
// threads inherit the mask and never see EINTR) and starts one detached thread that takes them
// with sigwait(). The first sets the stop flag; a second, 100 ms or more after it, ends the
// process at once by the signal's default action (sooner, it is the first delivered twice:
// timeout(1) signals the process and its group).
#pragma once

#include <atomic>

namespace flexh2o::cli {

class StopSignals {
 public:
  // The process's instance; the first call installs it (later calls only return it). Throws
  // flexh2o::Error when the signals cannot be blocked. Thread-safe.
  static StopSignals& install();
  const std::atomic<bool>& stop() const { return stop_; }
  int signal() const { return signal_.load(); }  // the first signal taken, 0 if none
  const std::atomic<int>& signal_flag() const { return signal_; }  // set before stop()

 private:
  StopSignals() = default;
  std::atomic<bool> stop_{false};
  std::atomic<int> signal_{0};
};

}  // namespace flexh2o::cli
