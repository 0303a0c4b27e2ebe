// Runs a Schedule: one worker thread per queue takes its steps in schedule order, waits on
// each step's dependencies (per-step completion flags, no global barrier), runs the action
// and marks the step done. With overlap off, one thread runs every step in order.
// The first exception from an action stops all queues and is rethrown by run(). Blocking.
#pragma once

#include <array>
#include <functional>

#include "engine/schedule.h"

namespace flexh2o {

struct QueueTimes {
  std::array<double, kNumQueues> busy{};  // seconds running actions, per queue
  std::array<double, kNumQueues> wait{};  // seconds blocked on dependencies, per queue
  double wall = 0;                        // seconds for the whole schedule
};

// Runs every step of `s` through `action`. Thread-safety: `action` is called concurrently
// from different queue threads (never twice at once for the same queue).
QueueTimes run_schedule(const Schedule& s, bool overlap, const std::function<void(const Step&)>& action);

}  // namespace flexh2o
