// What the pipeline protocol needs of a transport between ranks: ordered byte messages with
// bounded waits. Two implementations: MPI (CommChannel in comm_channel.h, one process a rank) and
// an in-process one (LocalChannels: one thread a rank, for tests of the protocol without mpirun).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/comm.h"  // Message, Status, Writer / Reader

namespace flexh2o::dist {

class Channel {
 public:
  virtual ~Channel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe(int rank) const = 0;
  // As Comm::send / Comm::recv.
  virtual void send(int dest, int tag, std::vector<std::byte> bytes) = 0;
  [[nodiscard]] virtual Status recv(int source, int tag, double timeout_s, Message* out) = 0;
  // As Comm::progress (in-process: nothing to do).
  virtual void progress() {}
};

// `n` ranks in one process: channel(r) is rank r's end, to be used by one thread. Thread-safe
// between ranks.
class LocalChannels {
 public:
  explicit LocalChannels(int n);
  ~LocalChannels();
  Channel& channel(int r);

  struct Hub;

 private:
  std::shared_ptr<Hub> hub_;
  std::vector<std::unique_ptr<Channel>> ends_;
};

// After a stop (a signal), how long a job waits for the steps still in flight, in seconds:
// twice the longest step it saw, at least 0.5 s, at most `timeout_s` (--rank-timeout). A rank
// not heard from by then is taken as gone. Used by the pipeline driver and data parallel.
double stop_grace_s(double longest_step_s, double timeout_s);

}  // namespace flexh2o::dist
