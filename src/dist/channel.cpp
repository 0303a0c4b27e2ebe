// The in-process Channel: one mailbox per rank (a mutex, a condition variable and a queue of
// messages), so tests run the pipeline protocol on threads exactly as ranks run it over MPI; and
// the stop grace both multi-rank modes share.
#include "dist/channel.h"

#include <algorithm>
#include <chrono>

namespace flexh2o::dist {

struct LocalChannels::Hub {
  struct Box {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Message> q;
  };
  std::vector<Box> boxes;
  explicit Hub(int n) : boxes(size_t(n)) {}
};

namespace {

class LocalChannel final : public Channel {
 public:
  LocalChannel(std::shared_ptr<LocalChannels::Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(hub_->boxes.size()); }
  std::string describe(int r) const override {
    return "rank " + std::to_string(r) + " of " + std::to_string(size()) + " (this process)";
  }
  void send(int dest, int tag, std::vector<std::byte> bytes) override {
    FH_CHECK(dest >= 0 && dest < size() && tag >= 0, "send to rank ", dest, " tag ", tag);
    auto& box = hub_->boxes[size_t(dest)];
    {
      std::lock_guard<std::mutex> lock(box.mu);
      box.q.push_back({rank_, tag, std::move(bytes)});
    }
    box.cv.notify_all();
  }
  Status recv(int source, int tag, double timeout_s, Message* out) override {
    auto& box = hub_->boxes[size_t(rank_)];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::unique_lock<std::mutex> lock(box.mu);
    while (true) {
      for (auto it = box.q.begin(); it != box.q.end(); ++it) {
        if ((source == kAnySource || it->source == source) && (tag == kAnyTag || it->tag == tag)) {
          *out = std::move(*it);
          box.q.erase(it);
          return Status::Ok();
        }
      }
      if (std::chrono::steady_clock::now() >= deadline)
        return Status(StatusCode::kIoError, "no message from " + who(source) + " for " +
                                                std::to_string(int64_t(timeout_s)) + " s");
      box.cv.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

 private:
  std::string who(int source) const { return source == kAnySource ? std::string("any rank") : describe(source); }
  std::shared_ptr<LocalChannels::Hub> hub_;
  int rank_;
};

}  // namespace

LocalChannels::LocalChannels(int n) : hub_(std::make_shared<Hub>(n)) {
  FH_CHECK(n >= 1, "at least one rank");
  for (int r = 0; r < n; ++r) ends_.push_back(std::make_unique<LocalChannel>(hub_, r));
}

LocalChannels::~LocalChannels() = default;

Channel& LocalChannels::channel(int r) {
  FH_CHECK(r >= 0 && r < int(ends_.size()), "rank ", r, " outside [0, ", ends_.size(), ")");
  return *ends_[size_t(r)];
}

double stop_grace_s(double longest_step_s, double timeout_s) {
  return std::min(timeout_s, std::max(0.5, 2 * longest_step_s));
}

}  // namespace flexh2o::dist
