// Runs a Schedule: one worker thread per queue takes its steps in schedule order, waits on
// each step's dependencies (per-step completion flags, no global barrier), runs the action
// and marks the step done. With overlap off, one thread runs every step in order.
// The first exception from an action stops all queues and is rethrown by run(). Blocking.
#pragma once

#include <array>
#include <functional>
#include <vector>

#include "engine/schedule.h"

namespace flexh2o {

// When one step of the schedule ran: seconds since run_schedule() started.
struct StepSpan {
  int step = 0;
  double start = 0, end = 0;
};

struct QueueTimes {
  std::array<double, kNumQueues> busy{};  // seconds running actions, per queue
  std::array<double, kNumQueues> wait{};  // seconds blocked on dependencies, per queue
  double wall = 0;                        // seconds for the whole schedule
  std::vector<StepSpan> spans;            // one per step, in schedule order, when traced
};

// Runs every step of `s` through `action`. Thread-safety: `action` is called concurrently
// from different queue threads (never twice at once for the same queue). `trace` records
// each step's span (QueueTimes::spans).
QueueTimes run_schedule(const Schedule& s, bool overlap, const std::function<void(const Step&)>& action,
                        bool trace = false);

}  // namespace flexh2o
