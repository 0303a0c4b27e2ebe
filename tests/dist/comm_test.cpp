// dist: Writer / Reader round trips and refusals in-process; Comm through real mpirun jobs of
// comm_peer (2 and 3 ranks): send/recv both ways, any-source, ordering, a timeout that names the
// peer, and an abort that ends every rank.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>

#include "dist/comm.h"
#include "engine/test_util.h"

namespace flexh2o::dist {
namespace {

TEST(Writer, RoundTripsValuesStringsAndArrays) {
  const std::vector<float> f{1.5f, -2.f, 3.25f};
  const std::vector<int32_t> none;
  std::vector<std::byte> b = Writer()
                                 .put<int64_t>(-7)
                                 .put_string("hello \0 world")
                                 .put_string("")
                                 .put_array(std::span<const float>(f))
                                 .put_array(std::span<const int32_t>(none))
                                 .put<double>(0.125)
                                 .take();
  Reader r(b, "test message");
  EXPECT_EQ(r.get<int64_t>(), -7);
  EXPECT_EQ(r.get_string(), "hello ");
  EXPECT_EQ(r.get_string(), "");
  EXPECT_EQ(r.get_array<float>(), f);
  EXPECT_EQ(r.get_array<int32_t>(), none);
  EXPECT_FALSE(r.done());
  EXPECT_EQ(r.get<double>(), 0.125);
  EXPECT_TRUE(r.done());
}

TEST(Reader, AShortMessageIsAnErrorNamingIt) {
  std::vector<std::byte> b = Writer().put<int32_t>(5).take();
  Reader r(b, "the request of rank 1");
  try {
    (void)r.get<int64_t>();
    FAIL() << "read past the end";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the request of rank 1: the message ends after 4 bytes but 8 more"),
              std::string::npos)
        << e.what();
  }
}

TEST(Reader, ALengthPastTheEndIsAnError) {
  std::vector<std::byte> b = Writer().put<uint64_t>(1000).put<int32_t>(1).take();
  Reader r(b, "a result");
  try {
    (void)r.get_string();
    FAIL() << "a 1000-byte string in a 12-byte message";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a result: a field of 1000 bytes at byte 8 runs past the end of the 12-byte"),
              std::string::npos)
        << e.what();
  }
  std::vector<std::byte> odd = Writer().put_string("abcde").take();
  Reader r2(odd, "an array");
  EXPECT_THROW((void)r2.get_array<int32_t>(), Error);
}

struct Job {
  int code = -1;
  std::string out;
  double seconds = 0;
};

// mpirun -np N comm_peer SCENARIO (as root too: CI runs so).
Job mpirun(int n, const std::string& scenario) {
  test::TempDir tmp;
  const auto out = tmp.path() / "out";
  const std::string cmd = std::string(FLEXH2O_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " +
                          std::to_string(n) + " " + FLEXH2O_BINARY_DIR + "/comm_peer " + scenario + " >" +
                          out.string() + " 2>&1 </dev/null";
  const auto t0 = std::chrono::steady_clock::now();
  const int st = std::system(cmd.c_str());
  Job j;
  j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  j.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  j.out = test::read_text(out);
  return j;
}

bool has(const Job& j, const std::string& s) { return j.out.find(s) != std::string::npos; }

TEST(Comm, SendAndReceiveBothWaysFromAnySource) {
  for (int n : {2, 3}) {
    const Job j = mpirun(n, "pingpong");
    EXPECT_EQ(j.code, 0) << j.out;
    EXPECT_FALSE(has(j, "FAILED")) << j.out;
    for (int r = 1; r < n; ++r) {
      EXPECT_TRUE(has(j, "rank 0: ok answer of rank " + std::to_string(r) + ": " + std::to_string(r * 10))) << j.out;
      EXPECT_TRUE(has(j, "rank " + std::to_string(r) + ": ok request to rank " + std::to_string(r) + " of " +
                             std::to_string(n) + " ("))
          << j.out;
    }
    // One host: local ranks are the ranks.
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(has(j, "rank " + std::to_string(r) + ": size " + std::to_string(n) + " local " + std::to_string(r) +
                             "/" + std::to_string(n)))
          << j.out;
  }
}

TEST(Comm, KeepsTheOrderOfOnePairAndTag) {
  const Job j = mpirun(2, "ordered");
  EXPECT_EQ(j.code, 0) << j.out;
  EXPECT_TRUE(has(j, "rank 0: ok the 2 MiB message")) << j.out;
  EXPECT_TRUE(has(j, "rank 0: ok 100 of 100 in order")) << j.out;
  EXPECT_TRUE(has(j, "rank 0: ok nothing more to poll")) << j.out;
  EXPECT_FALSE(has(j, "FAILED")) << j.out;
}

TEST(Comm, ATimeoutNamesThePeer) {
  const Job j = mpirun(2, "timeout");
  EXPECT_EQ(j.code, 0) << j.out;
  EXPECT_TRUE(has(j, "rank 1: ok timed out after")) << j.out;
  EXPECT_TRUE(has(j, "rank 1 of 2 (")) << j.out;
  EXPECT_TRUE(has(j, "heard nothing from rank 0 of 2 (")) << j.out;
  EXPECT_TRUE(has(j, "(tag 7) in 0.5 s")) << j.out;
  EXPECT_FALSE(has(j, "FAILED")) << j.out;
}

TEST(Comm, AbortEndsEveryRank) {
  const Job j = mpirun(3, "abort");
  EXPECT_NE(j.code, 0) << j.out;
  EXPECT_LT(j.seconds, 30) << j.out;
  EXPECT_FALSE(has(j, "still running after the abort")) << j.out;
}

}  // namespace
}  // namespace flexh2o::dist
