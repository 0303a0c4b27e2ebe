// A profile measured in milliseconds for tests: tiny probes, no disk-sized or cache-sized
// buffers. Its rates are noise; tests use it for what a measured profile sets, not how fast.
#pragma once

#include "planner/profile.h"

namespace flexh2o::test {

inline ProfileOptions quick_profile_options() {
  ProfileOptions o;
  o.copy_bytes = 1 << 20;
  o.disk_bytes = 4 << 20;
  o.weight_read_rows = 1024;
  o.past_last_cache = false;
  o.gemm_dim = 64;
  o.min_seconds = 0.001;
  return o;
}

}  // namespace flexh2o::test
