// HazardTracker: the CPU device's check that every pair of conflicting accesses to a buffer
// (a write and any other access, by different agents) is ordered by the events the agents
// waited on. Vector clocks make it exact and independent of timing: agent A's access at its
// epoch e is ordered before agent B's later access iff B's clock has seen A's epoch e (B
// waited, directly or transitively, on an event A recorded after the access). Agents are the
// queues and the engine's main thread. Thread-safe (one mutex); for tests, not for speed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/device.h"

namespace flexh2o {

class HazardTracker {
 public:
  static constexpr int kAgents = kNumQueues + 1;
  using Clock = std::array<uint64_t, kAgents>;

  void add_buffer(const void* p, size_t bytes, std::string what);
  void remove_buffer(const void* p);
  void set_label(int agent, std::string label);  // the step an agent runs (for messages)

  // Agent `agent` accesses [p, p + bytes). Memory outside registered buffers is not tracked.
  // Throws Error naming both accesses when a conflicting earlier one is not ordered before it.
  void access(int agent, const void* p, size_t bytes, bool write);
  // Ends the agent's current epoch and returns its clock (the event's).
  Clock record(int agent);
  // The agent has waited for an event carrying `c`.
  void merge(int agent, const Clock& c);
  // Every agent has seen everything (a full synchronisation).
  void barrier();

 private:
  struct Rec {
    size_t lo, hi;
    int agent;
    uint64_t stamp;
    bool write;
    std::string label;
  };
  struct Buf {
    size_t bytes;
    std::string what;
    std::vector<Rec> recs;
  };
  std::mutex mu_;
  std::map<uintptr_t, Buf> bufs_;
  std::array<Clock, kAgents> vc_{};
  std::array<std::string, kAgents> label_;
};

}  // namespace flexh2o
