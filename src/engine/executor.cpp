// Queue threads with per-step events for the schedule executor.
#include "engine/executor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

namespace flexh2o {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

QueueTimes run_schedule(Device& dev, const Schedule& s, bool overlap, const std::function<void(const Step&)>& action,
                        bool trace, const std::function<void()>& idle) {
  const size_t n = s.steps.size();
  // A dependency on a later step (only a hand-edited schedule has one) can close a cycle: two
  // queue threads each waiting for the other's step, forever. Refused before any thread starts.
  for (size_t i = 0; i < n; ++i)
    for (int d : s.steps[i].deps)
      FH_CHECK(d >= 0 && size_t(d) < i, "schedule step ", i, " (", s.label(int(i)), ") depends on step ", d,
               ", which is not an earlier one");
  std::vector<Event> start(n), end(n);
  QueueTimes t;
  const auto t0 = Clock::now();
  const Event origin = dev.record(Queue::kCompute);
  auto run_step = [&](size_t i) {
    const Step& st = s.steps[i];
    if (dev.checking()) dev.annotate(int(st.queue), s.label(int(i)));
    start[i] = dev.record(st.queue);
    action(st);
    end[i] = dev.record(st.queue);
  };
  std::exception_ptr error;
  if (!overlap) {
    try {
      for (size_t i = 0; i < n; ++i) {
        for (int d : s.steps[i].deps) dev.wait(s.steps[i].queue, end[size_t(d)]);
        run_step(i);
        dev.host_wait(end[i]);
        if (idle) idle();
      }
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    std::vector<char> recorded(n, 0);
    std::mutex mu;
    std::condition_variable cv;
    bool failed = false;
    size_t exited = 0;  // workers that returned
    auto worker = [&](Queue q) {
      struct Exit {
        std::mutex& mu;
        std::condition_variable& cv;
        size_t& exited;
        ~Exit() {
          std::lock_guard<std::mutex> lock(mu);
          ++exited;
          cv.notify_all();
        }
      } on_exit{mu, cv, exited};
      for (size_t i = 0; i < n; ++i) {
        const Step& st = s.steps[i];
        if (st.queue != q) continue;
        std::array<int, kNumQueues> last;
        last.fill(-1);
        for (int d : st.deps) {
          const size_t dq = size_t(s.steps[size_t(d)].queue);
          if (Queue(dq) != q) last[dq] = std::max(last[dq], d);
        }
        const auto w = Clock::now();
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] {
            if (failed) return true;
            for (int d : last)
              if (d >= 0 && !recorded[size_t(d)]) return false;
            return true;
          });
          if (failed) return;
        }
        t.wait[size_t(q)] += since(w);
        try {
          for (int d : last)
            if (d >= 0) dev.wait(q, end[size_t(d)]);
          run_step(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!failed) error = std::current_exception();
          failed = true;
          cv.notify_all();
          return;
        }
        std::lock_guard<std::mutex> lock(mu);
        recorded[i] = 1;
        cv.notify_all();
      }
    };
    std::array<bool, kNumQueues> used{};
    for (const Step& st : s.steps) used[size_t(st.queue)] = true;
    std::vector<std::thread> threads;
    bool started = true;
    try {
      for (int q = 0; q < kNumQueues; ++q)
        if (used[size_t(q)]) threads.emplace_back(worker, Queue(q));
    } catch (...) {  // a thread the system refused: the started ones stop and are joined, not destroyed
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed) error = std::current_exception();
        failed = true;
        cv.notify_all();
      }
      started = false;
    }
    while (idle && started) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (cv.wait_for(lock, std::chrono::milliseconds(1), [&] { return exited == threads.size(); })) break;
      }
      try {
        idle();
      } catch (...) {  // the workers stop at their next step; the error is the schedule's
        std::lock_guard<std::mutex> lock(mu);
        if (!failed) error = std::current_exception();
        failed = true;
        cv.notify_all();
        break;
      }
    }
    for (auto& th : threads) th.join();
  }
  try {
    dev.synchronize();  // device work of the steps (or of what ran before a failure)
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  if (error) std::rethrow_exception(error);
  t.wall = since(t0);
  if (trace) t.spans.resize(n);
  for (size_t i = 0; i < n; ++i) {
    t.busy[size_t(s.steps[i].queue)] += dev.seconds_between(start[i], end[i]);
    if (trace) t.spans[i] = {int(i), dev.seconds_between(origin, start[i]), dev.seconds_between(origin, end[i])};
  }
  return t;
}

}  // namespace flexh2o
