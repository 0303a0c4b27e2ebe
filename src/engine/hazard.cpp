// Vector-clock access checks for the CPU device's hazard mode.
#include "engine/hazard.h"

#include <algorithm>

#include "core/error.h"

namespace flexh2o {
namespace {
std::string agent_name(int a) { return a == kMainAgent ? std::string("main thread") : queue_name(Queue(a)); }
}  // namespace

void HazardTracker::add_buffer(const void* p, size_t bytes, std::string what) {
  if (!p || !bytes) return;
  std::lock_guard<std::mutex> lock(mu_);
  bufs_[uintptr_t(p)] = Buf{bytes, std::move(what), {}};
}

void HazardTracker::remove_buffer(const void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  bufs_.erase(uintptr_t(p));
}

void HazardTracker::set_label(int agent, std::string label) {
  std::lock_guard<std::mutex> lock(mu_);
  label_[size_t(agent)] = std::move(label);
}

void HazardTracker::access(int agent, const void* p, size_t bytes, bool write) {
  if (!p || !bytes) return;
  std::lock_guard<std::mutex> lock(mu_);
  const uintptr_t a = uintptr_t(p);
  auto it = bufs_.upper_bound(a);
  if (it == bufs_.begin()) return;
  --it;
  if (a >= it->first + it->second.bytes) return;
  Buf& b = it->second;
  const size_t lo = a - it->first, hi = std::min(b.bytes, lo + bytes);
  const Clock& vc = vc_[size_t(agent)];
  const uint64_t stamp = vc[size_t(agent)] + 1;
  for (const Rec& r : b.recs) {
    if (r.hi <= lo || hi <= r.lo || r.agent == agent || !(r.write || write)) continue;
    if (vc[size_t(r.agent)] >= r.stamp) continue;
    FH_FAIL("hazard on ", b.what, " [", lo, ", ", hi, "): ", agent_name(agent), " (", label_[size_t(agent)], ") ",
            write ? "writes" : "reads", " it while the ", r.write ? "write" : "read", " by ", agent_name(r.agent), " (",
            r.label, ") of [", r.lo, ", ", r.hi, ") is not ordered before it: a dependency is missing");
  }
  // Drop what this access supersedes: the agent's own earlier access of the same kind and range,
  // and (for a write) every access it covers that is already ordered before it.
  std::erase_if(b.recs, [&](const Rec& r) {
    if (r.agent == agent && r.lo == lo && r.hi == hi && r.write == write) return true;
    return write && r.lo >= lo && r.hi <= hi && (r.agent == agent || vc[size_t(r.agent)] >= r.stamp);
  });
  b.recs.push_back({lo, hi, agent, stamp, write, label_[size_t(agent)]});
}

HazardTracker::Clock HazardTracker::record(int agent) {
  std::lock_guard<std::mutex> lock(mu_);
  ++vc_[size_t(agent)][size_t(agent)];
  return vc_[size_t(agent)];
}

void HazardTracker::merge(int agent, const Clock& c) {
  std::lock_guard<std::mutex> lock(mu_);
  Clock& v = vc_[size_t(agent)];
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::max(v[i], c[i]);
}

void HazardTracker::barrier() {
  std::lock_guard<std::mutex> lock(mu_);
  Clock all{};
  for (int a = 0; a < kAgents; ++a) {
    ++vc_[size_t(a)][size_t(a)];  // close every agent's epoch: its accesses are before the barrier
    for (size_t i = 0; i < all.size(); ++i) all[i] = std::max(all[i], vc_[size_t(a)][i]);
  }
  vc_.fill(all);
}

}  // namespace flexh2o
