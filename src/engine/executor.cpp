// Queue threads with per-step completion flags for the schedule executor.
#include "engine/executor.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flexh2o {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

QueueTimes run_schedule(const Schedule& s, bool overlap, const std::function<void(const Step&)>& action,
                        bool trace) {
  QueueTimes t;
  const auto t0 = Clock::now();
  if (trace) t.spans.resize(s.steps.size());
  auto span = [&](size_t i, Clock::time_point a) {
    if (trace) t.spans[i] = {int(i), std::chrono::duration<double>(a - t0).count(), since(t0)};
  };
  if (!overlap) {
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const Step& st = s.steps[i];
      auto a = Clock::now();
      action(st);
      t.busy[size_t(st.queue)] += since(a);
      span(i, a);
    }
    t.wall = since(t0);
    return t;
  }
  std::vector<char> done(s.steps.size(), 0);
  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;
  std::exception_ptr error;
  auto worker = [&](Queue q) {
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const Step& st = s.steps[i];
      if (st.queue != q) continue;
      auto w = Clock::now();
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          if (failed) return true;
          for (int d : st.deps)
            if (!done[size_t(d)]) return false;
          return true;
        });
        if (failed) return;
      }
      t.wait[size_t(q)] += since(w);
      auto a = Clock::now();
      try {
        action(st);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed) error = std::current_exception();
        failed = true;
        cv.notify_all();
        return;
      }
      t.busy[size_t(q)] += since(a);
      span(i, a);  // each worker writes only its own steps' spans
      std::lock_guard<std::mutex> lock(mu);
      done[i] = 1;
      cv.notify_all();
    }
  };
  std::array<bool, kNumQueues> used{};
  for (const Step& st : s.steps) used[size_t(st.queue)] = true;
  std::vector<std::thread> threads;
  for (int q = 0; q < kNumQueues; ++q)
    if (used[size_t(q)]) threads.emplace_back(worker, Queue(q));
  for (auto& th : threads) th.join();
  t.wall = since(t0);
  if (error) std::rethrow_exception(error);
  return t;
}

}  // namespace flexh2o
