// The pipeline's Channel over an MPI Comm (a header of its own: only code that runs under MPI
// includes it, so the protocol and its in-process tests link without MPI).
#pragma once

#include "dist/channel.h"
#include "dist/comm.h"

namespace flexh2o::dist {

// A Channel over an MPI Comm (which must outlive it).
class CommChannel final : public Channel {
 public:
  explicit CommChannel(Comm& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string describe(int rank) const override { return c_.describe(rank); }
  void send(int dest, int tag, std::vector<std::byte> bytes) override { c_.send(dest, tag, std::move(bytes)); }
  Status recv(int source, int tag, double timeout_s, Message* out) override {
    return c_.recv(source, tag, timeout_s, out);
  }
  void progress() override { c_.progress(); }

 private:
  Comm& c_;
};

}  // namespace flexh2o::dist
