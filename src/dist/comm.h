// The ranks of one job started by mpirun (Open MPI) and byte messages between them. Every wait
// is bounded: a peer that died or hangs turns into a Status naming it, never a hang. One Comm per
// process, used only from the thread that made it (MPI_THREAD_FUNNELED); sends never block (the
// Comm owns each message until MPI is done with it). Messages between one pair with one tag
// arrive in the order sent (MPI's ordering).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace flexh2o::dist {

inline constexpr int kAnySource = -1;
inline constexpr int kAnyTag = -1;

struct Message {
  int source = -1;
  int tag = 0;
  std::vector<std::byte> bytes;
};

class Comm {
 public:
  // MPI_Init_thread (funneled) with errors returned, not fatal; MPI_Finalize when destroyed.
  // Throws Error when MPI cannot start. Waits watch only their clocks: a caller that must
  // notice a signal waits in short slices.
  Comm();
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const;
  int size() const;
  // Among the ranks on this host (MPI_COMM_TYPE_SHARED): picks the GPU of a rank.
  int local_rank() const;
  int local_size() const;
  const std::string& host() const;  // MPI_Get_processor_name
  // "rank 2 of 3 (host)" for messages.
  std::string describe(int rank) const;

  // Queues `bytes` for `dest` under `tag` (>= 0) and returns at once; the Comm keeps the bytes
  // until the send completes (progressed by every later call).
  void send(int dest, int tag, std::vector<std::byte> bytes);
  // Waits up to `timeout_s` seconds for a message from `source` (or kAnySource) with `tag` (or
  // kAnyTag). Fails (kIoError) naming the peer and the wait when the time passes.
  [[nodiscard]] Status recv(int source, int tag, double timeout_s, Message* out);
  // A message that has already arrived, without waiting: true and *out filled, else false.
  bool poll(int source, int tag, Message* out);
  // Lets MPI move what is in flight (queued sends, arriving messages) without waiting: called
  // while this rank computes, so a large message does not wait for its next send or receive.
  void progress();
  // Waits up to `timeout_s` seconds until every queued send completed.
  [[nodiscard]] Status flush(double timeout_s);
  // Ends every rank of the job now (MPI_Abort with `code`): after a failure this rank cannot
  // recover from, so no peer waits for it. Prints nothing; say why before calling it.
  [[noreturn]] void abort(int code);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Builds a message: plain values in host byte order (every rank of a job runs the same binary on
// the same architecture), length-prefixed strings and arrays.
class Writer {
 public:
  template <class T>
  Writer& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  Writer& put_bytes(std::span<const std::byte> b);   // length-prefixed
  Writer& put_string(const std::string& s);          // length-prefixed
  template <class T>
  Writer& put_array(std::span<const T> a) {
    put_bytes(std::as_bytes(a));
    return *this;
  }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// Reads what a Writer built, in the same order. Throws Error when the message is shorter than
// what is read (a peer of another version, a bug), naming `what`.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, std::string what) : b_(bytes), what_(std::move(what)) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  std::span<const std::byte> get_bytes();
  std::string get_string();
  template <class T>
  std::vector<T> get_array() {
    const std::span<const std::byte> b = get_bytes();
    if (b.size() % sizeof(T)) FH_FAIL(what_, ": an array of ", b.size(), " bytes is not whole elements");
    std::vector<T> v(b.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  const std::byte* take(size_t n);
  std::span<const std::byte> b_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace flexh2o::dist
