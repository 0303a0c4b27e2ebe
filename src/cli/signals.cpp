// The process-wide SIGINT/SIGTERM/SIGHUP taker (signals.h).
#include "cli/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace flexh2o::cli {
namespace {
// Signals this close to the first are that one delivered again, not a user's second Ctrl-C.
constexpr std::chrono::milliseconds kSameSignal{100};
}  // namespace

StopSignals& StopSignals::install() {
  // Never destroyed: the detached thread below may touch it until the process ends.
  static StopSignals* self = new StopSignals();
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    // SIGINT even where it came ignored (a script's `cmd &`), so that `kill -INT` stops such a
    // run, as `serve` takes it too.
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    // A closed terminal (ssh without nohup) stops the run as SIGTERM does, report written; under
    // nohup SIGHUP is ignored and stays so (a blocked signal would be taken by sigwait even then).
    struct sigaction hup {};
    if (::sigaction(SIGHUP, nullptr, &hup) != 0 || hup.sa_handler != SIG_IGN) sigaddset(&set, SIGHUP);
    if (int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0)
      FH_FAIL("cannot block SIGINT/SIGTERM/SIGHUP: ", std::strerror(rc));
    std::thread([set, s = self] {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) return;
      s->signal_.store(sig);
      s->stop_.store(true);
      // One signal can arrive twice at once: timeout(1) and kill -- -PGID send it to the process
      // and again to its group. Only a second signal later than kSameSignal ends the process.
      const auto first = std::chrono::steady_clock::now();
      do {
        if (sigwait(&set, &sig) != 0) return;
      } while (std::chrono::steady_clock::now() - first < kSameSignal);
      // Said, as the process ends without its report: what a run wrote stays, and how to go on.
      static constexpr char kSaid[] =
          "flexh2o: a second stop signal: ending at once, without a report; the results written so far stay "
          "(generate --resume finishes the run)\n";
      (void)!::write(STDERR_FILENO, kSaid, sizeof kSaid - 1);
      ::signal(sig, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      raise(sig);
    }).detach();
  });
  return *self;
}

}  // namespace flexh2o::cli
