// Memory tiers and their byte budgets. Every buffer the offloading runtime allocates is
// charged to a TierBudget, which refuses to exceed its capacity and records the peak.
// TierBudget is thread-safe; TierCharge is a move-only RAII hold on a budget's bytes (the CPU
// device's "device memory" is host memory charged to the device tier).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/error.h"

namespace flexh2o {

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kDisk = 2 };
inline const char* tier_name(Tier t) {
  return t == Tier::kDevice ? "device" : t == Tier::kHost ? "host" : "disk";
}

class TierBudget {
 public:
  // capacity 0 means unlimited.
  TierBudget(Tier tier, uint64_t capacity) : tier_(tier), capacity_(capacity) {}
  TierBudget(const TierBudget&) = delete;
  TierBudget& operator=(const TierBudget&) = delete;

  // Charges `bytes`; fails (kOutOfBudget, naming `what`, the tier and the numbers) when the
  // budget would be exceeded.
  [[nodiscard]] Status reserve(uint64_t bytes, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (capacity_ && used_ + bytes > capacity_)
      return Status(StatusCode::kOutOfBudget,
                    detail::concat(tier_name(tier_), " budget exceeded: ", what, " needs ", bytes, " bytes, ",
                                   capacity_ - used_, " of ", capacity_, " left"));
    used_ += bytes;
    if (used_ > peak_) peak_ = used_;
    return Status::Ok();
  }
  void release(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= bytes < used_ ? bytes : used_;
  }
  Tier tier() const { return tier_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  uint64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 private:
  Tier tier_;
  uint64_t capacity_;
  mutable std::mutex mu_;
  uint64_t used_ = 0, peak_ = 0;
};

// A reservation without memory (bytes held elsewhere, e.g. files or scratch vectors),
// released when the object dies. Move-only.
class TierCharge {
 public:
  TierCharge() = default;
  [[nodiscard]] static Status reserve(TierBudget& budget, uint64_t bytes, const std::string& what, TierCharge* out) {
    Status s = budget.reserve(bytes, what);
    if (!s.ok()) return s;
    *out = TierCharge();
    out->budget_ = &budget;
    out->bytes_ = bytes;
    return Status::Ok();
  }
  TierCharge(TierCharge&& o) noexcept { *this = std::move(o); }
  TierCharge& operator=(TierCharge&& o) noexcept {
    if (this != &o) {
      if (budget_) budget_->release(bytes_);
      budget_ = o.budget_, bytes_ = o.bytes_;
      o.budget_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  TierCharge(const TierCharge&) = delete;
  TierCharge& operator=(const TierCharge&) = delete;
  ~TierCharge() {
    if (budget_) budget_->release(bytes_);
  }

 private:
  TierBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace flexh2o
