// Runs a Schedule on a Device: one host thread per queue takes its steps in schedule order,
// makes its queue wait for each step's dependencies on other queues (Device::wait: a stream
// wait on CUDA, a completion wait on a host queue; of several on one queue only the latest,
// which implies the earlier ones), runs the step's action (which enqueues device ops or does
// host work) and records the step's event. No global barrier. With overlap off, one thread
// runs every step in order and waits for each to complete. The first exception from an action
// stops all queues; the device is synchronised and the exception rethrown. Blocking.
#pragma once

#include <array>
#include <functional>
#include <vector>

#include "engine/device.h"
#include "engine/schedule.h"

namespace flexh2o {

// When one step of the schedule ran: seconds since the schedule started.
struct StepSpan {
  int step = 0;
  double start = 0, end = 0;
};

struct QueueTimes {
  std::array<double, kNumQueues> busy{};  // seconds each queue spent on its steps (device time)
  std::array<double, kNumQueues> wait{};  // seconds each queue's thread blocked on dependencies
  double wall = 0;                        // seconds for the whole schedule
  std::vector<StepSpan> spans;            // one per step, in schedule order, when traced
};

// `action` is called concurrently from different queue threads (never twice at once for the
// same queue). `idle` (may be empty) is called on the calling thread about every millisecond
// while the steps run, and between steps without overlap: a pipeline stage lets MPI move its
// messages there (the only thread that may call MPI). An exception from it ends the schedule.
QueueTimes run_schedule(Device& dev, const Schedule& s, bool overlap, const std::function<void(const Step&)>& action,
                        bool trace = false, const std::function<void()>& idle = {});

}  // namespace flexh2o
