// Comm on the MPI C API: errors returned (MPI_ERRORS_RETURN) and turned into Error / Status
// naming the peer; sends are MPI_Isend kept here until MPI_Test says done; receives poll
// MPI_Improbe (then MPI_Mrecv) with short sleeps, so every wait can watch its clock. Writer /
// Reader: the byte layout of messages.
#include "dist/comm.h"

// The C API only (Open MPI would also pull in its deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <thread>

namespace flexh2o::dist {

namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, size_t(len));
}

using Clock = std::chrono::steady_clock;

// Polls `ready` (true: done) until it is or `timeout_s` passed. The first polls
// spin (a message in flight arrives within microseconds); after that, sleeps of 100 us keep an
// idle wait off the CPU without adding more than that to a step.
enum class Wait { kDone, kTimedOut };
template <class F>
Wait wait_for(F&& ready, double timeout_s) {
  const auto start = Clock::now();
  for (int spins = 0;; ++spins) {
    if (ready()) return Wait::kDone;
    if (std::chrono::duration<double>(Clock::now() - start).count() >= timeout_s) return Wait::kTimedOut;
    if (spins < 200) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

}  // namespace

struct Comm::Impl {
  bool initialized = false;  // by us: finalize when done
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::vector<std::string> hosts;  // of every rank
  struct Pending {
    int dest;
    std::vector<std::byte> bytes;  // MPI reads it until the request completes
    MPI_Request req;
  };
  std::vector<Pending> pending;

  ~Impl() {
    if (!initialized) return;
    // Sends still queued would make MPI_Finalize wait for their peer: give them a bounded time,
    // then let them go.
    (void)wait_for([&] { return progress(); }, 10.0);
    for (Pending& p : pending) MPI_Request_free(&p.req);
    pending.clear();
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    MPI_Finalize();
  }

  void check(int rc, const std::string& what) const {
    if (rc != MPI_SUCCESS) FH_FAIL("MPI: ", what, ": ", mpi_error(rc));
  }

  // Completes what it can of the queued sends; true when none is left.
  bool progress() {
    for (size_t i = 0; i < pending.size();) {
      int done = 0;
      MPI_Status st;
      const int rc = MPI_Test(&pending[i].req, &done, &st);
      if (rc != MPI_SUCCESS)
        FH_FAIL("MPI: sending ", pending[i].bytes.size(), " bytes to ", describe(pending[i].dest), ": ",
                mpi_error(rc));
      if (done) {
        pending[i] = std::move(pending.back());
        pending.pop_back();
      } else {
        ++i;
      }
    }
    return pending.empty();
  }

  std::string describe(int r) const {
    if (r == kAnySource) return "any rank";
    if (r < 0 || r >= size) return "rank " + std::to_string(r) + " (not in this job of " + std::to_string(size) + ")";
    return "rank " + std::to_string(r) + " of " + std::to_string(size) + " (" + hosts[size_t(r)] + ")";
  }

  bool try_recv(int source, int tag, Message* out) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    check(MPI_Improbe(source == kAnySource ? MPI_ANY_SOURCE : source, tag == kAnyTag ? MPI_ANY_TAG : tag, comm, &flag,
                      &msg, &st),
          "probing for a message from " + describe(source));
    if (!flag) return false;
    int count = 0;
    check(MPI_Get_count(&st, MPI_BYTE, &count), "the size of a message from " + describe(st.MPI_SOURCE));
    out->source = st.MPI_SOURCE;
    out->tag = st.MPI_TAG;
    out->bytes.resize(size_t(count));
    check(MPI_Mrecv(out->bytes.data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE),
          "receiving " + std::to_string(count) + " bytes from " + describe(st.MPI_SOURCE));
    return true;
  }
};

Comm::Comm() : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) FH_FAIL("MPI is already initialised in this process: one Comm per process");
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    FH_FAIL("MPI: cannot start (MPI_Init_thread failed); run the job with mpirun");
  m.initialized = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_FUNNELED) FH_FAIL("MPI: this MPI library does not support MPI_THREAD_FUNNELED");
  m.check(MPI_Comm_dup(MPI_COMM_WORLD, &m.comm), "MPI_Comm_dup");
  m.check(MPI_Comm_set_errhandler(m.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  m.check(MPI_Comm_rank(m.comm, &m.rank), "MPI_Comm_rank");
  m.check(MPI_Comm_size(m.comm, &m.size), "MPI_Comm_size");

  // Every rank's host name (for messages and the local rank), gathered without blocking so a
  // signal still ends the wait.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  m.check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name");
  std::vector<char> all(size_t(m.size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Request req;
  m.check(MPI_Iallgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, m.comm,
                         &req),
          "gathering the host names");
  int rc = MPI_SUCCESS;
  const Wait w = wait_for(
      [&] {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        return done || rc != MPI_SUCCESS;
      },
      1e9);
  m.check(rc, "gathering the host names");
  if (w != Wait::kDone) FH_FAIL("MPI: the ranks did not gather their host names");
  for (int r = 0; r < m.size; ++r) {
    const char* p = all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    m.hosts.emplace_back(p, strnlen(p, MPI_MAX_PROCESSOR_NAME));
  }
  m.local_rank = m.local_size = 0;
  for (int r = 0; r < m.size; ++r)
    if (m.hosts[size_t(r)] == m.hosts[size_t(m.rank)]) {
      m.local_rank += r < m.rank;
      ++m.local_size;
    }
}

Comm::~Comm() = default;

int Comm::rank() const { return impl_->rank; }
int Comm::size() const { return impl_->size; }
int Comm::local_rank() const { return impl_->local_rank; }
int Comm::local_size() const { return impl_->local_size; }
const std::string& Comm::host() const { return impl_->hosts[size_t(impl_->rank)]; }
std::string Comm::describe(int rank) const { return impl_->describe(rank); }

void Comm::send(int dest, int tag, std::vector<std::byte> bytes) {
  Impl& m = *impl_;
  FH_CHECK(dest >= 0 && dest < m.size, "send to ", m.describe(dest));
  FH_CHECK(tag >= 0, "send with tag ", tag);
  if (bytes.size() > size_t(INT_MAX))
    FH_FAIL("MPI: a message of ", bytes.size(), " bytes to ", m.describe(dest), " is over the 2 GiB one send takes");
  m.pending.push_back({dest, std::move(bytes), MPI_REQUEST_NULL});
  Impl::Pending& p = m.pending.back();
  const int rc = MPI_Isend(p.bytes.data(), int(p.bytes.size()), MPI_BYTE, dest, tag, m.comm, &p.req);
  if (rc != MPI_SUCCESS) {
    m.pending.pop_back();
    FH_FAIL("MPI: sending to ", m.describe(dest), ": ", mpi_error(rc));
  }
  m.progress();
}

Status Comm::recv(int source, int tag, double timeout_s, Message* out) {
  Impl& m = *impl_;
  const std::string from = source == kAnySource ? std::string("any rank") : m.describe(source);
  const std::string tag_text = tag == kAnyTag ? std::string() : " (tag " + std::to_string(tag) + ")";
  const Wait w = wait_for(
      [&] {
        m.progress();
        return m.try_recv(source, tag, out);
      },
      timeout_s);
  if (w == Wait::kDone) return Status::Ok();
  return {StatusCode::kIoError, m.describe(m.rank) + " heard nothing from " + from + tag_text + " in " +
                                    seconds_text(timeout_s)};
}

void Comm::progress() {
  impl_->progress();
  int flag = 0;  // a probe drives Open MPI's progress engine for receives too
  (void)MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, impl_->comm, &flag, MPI_STATUS_IGNORE);
}

bool Comm::poll(int source, int tag, Message* out) {
  impl_->progress();
  return impl_->try_recv(source, tag, out);
}

Status Comm::flush(double timeout_s) {
  Impl& m = *impl_;
  const Wait w = wait_for([&] { return m.progress(); }, timeout_s);
  if (w == Wait::kDone) return Status::Ok();
  std::string peers;
  for (const Impl::Pending& p : m.pending)
    if (peers.find(m.describe(p.dest)) == std::string::npos) peers += (peers.empty() ? "" : ", ") + m.describe(p.dest);
  const std::string what = std::to_string(m.pending.size()) + " message(s) to " + peers;
  return {StatusCode::kIoError, what + " not taken in " + seconds_text(timeout_s)};
}

void Comm::abort(int code) {
  MPI_Abort(impl_->comm != MPI_COMM_NULL ? impl_->comm : MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; should it, the process still ends
}

Writer& Writer::put_bytes(std::span<const std::byte> b) {
  put<uint64_t>(b.size());
  bytes_.insert(bytes_.end(), b.begin(), b.end());
  return *this;
}

Writer& Writer::put_string(const std::string& s) { return put_bytes(std::as_bytes(std::span(s.data(), s.size()))); }

const std::byte* Reader::take(size_t n) {
  if (n > b_.size() - pos_)
    FH_FAIL(what_, ": the message ends after ", b_.size(), " bytes but ", n, " more are read at byte ", pos_,
            " (a rank of another flexh2o version?)");
  const std::byte* p = b_.data() + pos_;
  pos_ += n;
  return p;
}

std::span<const std::byte> Reader::get_bytes() {
  const auto n = get<uint64_t>();
  if (n > b_.size() - pos_)
    FH_FAIL(what_, ": a field of ", n, " bytes at byte ", pos_, " runs past the end of the ", b_.size(),
            "-byte message (a rank of another flexh2o version?)");
  return {take(size_t(n)), size_t(n)};
}

std::string Reader::get_string() {
  const std::span<const std::byte> b = get_bytes();
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

}  // namespace flexh2o::dist
