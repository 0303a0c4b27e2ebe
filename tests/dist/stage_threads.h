// The stages after the first rank of an in-process pipeline, served on threads: rank r runs
// stage dist::rank_stage(r, S) with engine_of(stage) over LocalChannels, as mpirun's ranks would.
// join() (also at destruction) waits for every stage to return and gives each rank's result;
// the stages return when the driver ends them (PipelineDriver::finish or its destructor).
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

#include "dist/channel.h"
#include "dist/pipeline.h"

namespace flexh2o::test {

class StageThreads {
 public:
  // `net`, `bounds` and what engine_of returns outlive this object.
  template <class EngineOf>
  StageThreads(dist::LocalChannels& net, int stages, const std::vector<int64_t>& bounds,
               const dist::PipelineOptions& po, EngineOf engine_of)
      : StageThreads(net, stages, bounds, std::vector<dist::PipelineOptions>(size_t(stages), po), engine_of) {}
  // Rank r serves with by_rank[r].
  template <class EngineOf>
  StageThreads(dist::LocalChannels& net, int stages, const std::vector<int64_t>& bounds,
               const std::vector<dist::PipelineOptions>& by_rank, EngineOf engine_of)
      : served_(size_t(stages)) {
    for (int rank = 1; rank < stages; ++rank)
      threads_.emplace_back([this, &net, &bounds, po = by_rank.at(size_t(rank)), engine_of, stages, rank] {
        const int s = dist::rank_stage(rank, stages);
        served_[size_t(rank)] = dist::serve_stage(net.channel(rank), engine_of(s), stages, bounds[size_t(s)], po);
      });
  }
  StageThreads(const StageThreads&) = delete;
  StageThreads& operator=(const StageThreads&) = delete;
  ~StageThreads() { join(); }

  // Index: rank (entry 0, the driver's rank, stays empty).
  const std::vector<dist::ServeResult>& join() {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    return served_;
  }

 private:
  std::vector<dist::ServeResult> served_;
  std::vector<std::thread> threads_;
};

}  // namespace flexh2o::test
