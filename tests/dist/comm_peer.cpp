// One rank of a test job for dist::Comm (tests/dist/comm_test.cpp runs it under mpirun):
// `comm_peer SCENARIO` runs the scenario and prints "rank R: ..." lines, exiting 0 when every
// check it makes holds and 1 (with the reason) when one does not.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dist/comm.h"

namespace {
using flexh2o::dist::Comm;
using flexh2o::dist::Message;
using flexh2o::dist::Reader;
using flexh2o::dist::Writer;

int failures = 0;
void expect(bool ok, int rank, const std::string& what) {
  if (!ok) ++failures;
  std::printf("rank %d: %s %s\n", rank, ok ? "ok" : "FAILED", what.c_str());
  std::fflush(stdout);
}

// Rank 0 sends each rank its number and a string; each answers with both; rank 0 takes the
// answers from any source, in whatever order they come.
void pingpong(Comm& c) {
  const int me = c.rank();
  if (me == 0) {
    for (int r = 1; r < c.size(); ++r) c.send(r, 1, Writer().put<int32_t>(r).put_string("to " + c.describe(r)).take());
    std::vector<bool> seen(size_t(c.size()), false);
    for (int k = 1; k < c.size(); ++k) {
      Message m;
      const flexh2o::Status st = c.recv(flexh2o::dist::kAnySource, 2, 20, &m);
      expect(st.ok(), me, "answer " + std::to_string(k) + " " + st.message());
      if (!st.ok()) return;
      Reader rd(m.bytes, "answer");
      const auto v = rd.get<int32_t>();
      const std::string s = rd.get_string();
      expect(m.tag == 2 && v == m.source * 10 && s == "from " + std::to_string(m.source) && rd.done() &&
                 !seen[size_t(m.source)],
             me, "answer of rank " + std::to_string(m.source) + ": " + std::to_string(v) + " " + s);
      seen[size_t(m.source)] = true;
    }
  } else {
    Message m;
    const flexh2o::Status st = c.recv(0, 1, 20, &m);
    expect(st.ok(), me, "request " + st.message());
    if (!st.ok()) return;
    Reader rd(m.bytes, "request");
    const auto v = rd.get<int32_t>();
    const std::string s = rd.get_string();
    expect(m.source == 0 && m.tag == 1 && v == me && s == "to " + c.describe(me) && rd.done(), me, "request " + s);
    c.send(0, 2, Writer().put<int32_t>(me * 10).put_string("from " + std::to_string(me)).take());
    expect(c.flush(20).ok(), me, "flush");
  }
}

// Messages on one pair and tag arrive in order; a large one and many small ones.
void ordered(Comm& c) {
  const int me = c.rank();
  constexpr int kCount = 100;
  if (me == 1) {
    std::vector<int64_t> big(1 << 18);
    for (size_t i = 0; i < big.size(); ++i) big[i] = int64_t(i) * 3;
    c.send(0, 5, Writer().put_array(std::span<const int64_t>(big)).take());
    for (int i = 0; i < kCount; ++i) c.send(0, 5, Writer().put<int32_t>(i).take());
    expect(c.flush(20).ok(), me, "flush");
  } else if (me == 0) {
    Message m;
    bool ok = c.recv(1, 5, 20, &m).ok();
    std::vector<int64_t> big = Reader(m.bytes, "big").get_array<int64_t>();
    ok = ok && big.size() == size_t(1 << 18);
    for (size_t i = 0; ok && i < big.size(); ++i) ok = big[i] == int64_t(i) * 3;
    expect(ok, me, "the 2 MiB message");
    int in_order = 0;
    for (int i = 0; i < kCount; ++i)
      in_order += c.recv(1, 5, 20, &m).ok() && Reader(m.bytes, "small").get<int32_t>() == i;
    expect(in_order == kCount, me, std::to_string(in_order) + " of 100 in order");
    expect(!c.poll(1, 5, &m), me, "nothing more to poll");
  }
}

// Rank 1 waits for a message rank 0 never sends: the wait ends after its timeout and names rank 0.
void timeout(Comm& c) {
  const int me = c.rank();
  if (me == 1) {
    Message m;
    const auto t0 = std::chrono::steady_clock::now();
    const flexh2o::Status st = c.recv(0, 7, 0.5, &m);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    expect(!st.ok() && s >= 0.5 && s < 5, me, "timed out after " + std::to_string(s) + " s: " + st.message());
    c.send(0, 8, {});
    expect(c.flush(20).ok(), me, "flush");
  } else if (me == 0) {
    Message m;
    const flexh2o::Status st = c.recv(1, 8, 20, &m);
    expect(st.ok() && m.bytes.empty(), me, "empty message " + st.message());
  }
}

// Rank 1 ends the job; rank 0 would wait 60 s for it.
void abort_job(Comm& c) {
  if (c.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    c.abort(3);
  }
  Message m;
  const flexh2o::Status st = c.recv(1, 9, 60, &m);
  expect(false, c.rank(), "still running after the abort: " + st.message());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  try {
    Comm c;
    std::printf("rank %d: size %d local %d/%d host %s is %s\n", c.rank(), c.size(), c.local_rank(), c.local_size(),
                c.host().c_str(), c.describe(c.rank()).c_str());
    std::fflush(stdout);
    if (scenario == "pingpong") pingpong(c);
    else if (scenario == "ordered") ordered(c);
    else if (scenario == "timeout") timeout(c);
    else if (scenario == "abort") abort_job(c);
    else expect(false, c.rank(), "unknown scenario " + scenario);
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
}
