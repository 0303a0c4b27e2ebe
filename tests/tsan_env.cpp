// Linked into every test binary of a ThreadSanitizer build (-DFLEXH2O_TSAN=ON): oneTBB from
// Debian is not instrumented, so TSan cannot see TBB's own hand-offs and reports races inside
// every parallel_for. Capping TBB at one thread keeps kernel work on the calling thread, so
// what TSan checks is our own threads: the executor's queues, the I/O backends, the store.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <memory>

namespace {
class SingleThreadTbb : public ::testing::Environment {
 public:
  void SetUp() override {
    control_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, 1);
  }
  void TearDown() override { control_.reset(); }

 private:
  std::unique_ptr<tbb::global_control> control_;
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SingleThreadTbb);
}  // namespace
