// A Policy from FlexGen's --percent string, for the engine and planner tests.
#pragma once

#include <sstream>

#include "engine/policy.h"

namespace flexh2o::test {

// "w_g w_c c_g c_c a_g a_c" and the batch shape.
inline Policy policy_of(const char* percent, int64_t gbs, int64_t ngb, bool cpu_attention = false) {
  Policy p;
  std::istringstream is(percent);
  is >> p.w_gpu_percent >> p.w_cpu_percent >> p.cache_gpu_percent >> p.cache_cpu_percent >> p.act_gpu_percent >>
      p.act_cpu_percent;
  p.gpu_batch_size = gbs;
  p.num_gpu_batches = ngb;
  p.cpu_cache_compute = cpu_attention;
  return p;
}

}  // namespace flexh2o::test
