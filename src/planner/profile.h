// Measures this machine into a HardwareProfile (`flexh2o profile`): tier capacities (RAM,
// free space at the offload directory), host<->device copies (on the CPU device: memcpy
// between buffers), NVMe reads/writes through DiskStore + IoBackend (large sequential, and
// KV-sized chunks), GEMM / attention rates of kernels/cpu at prefill and decode shapes, and
// the extra cost of a GEMV over Q4 weights (dequant_gbps, device and host alike), and the KV
// policy's decisions (host_kv_policy: decode and prefill rates on one thread, what a grouped
// query head adds, and what all the device's threads gain over one).
// Blocking; takes a few seconds; writes and removes a scratch store under offload_dir; its GEMV
// probe holds twice the last-level cache (at most 1 GiB, and with fit_memory at most a quarter of
// the memory the process can take) while it runs.
#pragma once

#include <filesystem>

#include "engine/cpu_device.h"
#include "planner/hardware.h"

namespace flexh2o {

struct ProfileOptions {
  std::filesystem::path offload_dir;    // empty: disk fields measured under the temp dir
  size_t copy_bytes = size_t(64) << 20;  // per host<->device copy
  size_t disk_bytes = size_t(128) << 20; // per sequential disk pass
  size_t kv_chunk_bytes = 16 << 10;     // KV-style disk ranges (one row block of one head), 4 KiB multiple
  int64_t weight_read_rows = 49152;     // GEMV probe matrix rows (x gemm_dim f16: 96 MB, like an lm_head)
  bool past_last_cache = true;          // more rows where the last-level cache would hold them (2x it, at most 1 GiB)
  int64_t gemm_dim = 1024;              // K = N of the GEMM probe (f16 weights)
  double min_seconds = 0.15;            // repeat each probe at least this long
  size_t max_probe_bytes = 0;           // the GEMV probe matrix at most this (0: no cap)
  // Each probe within a quarter of the memory the process can take (the GEMV matrix; the two
  // disk buffers and the two copy buffers, half each), so that a small container is measured
  // rather than killed; smaller probes may overstate rates. false: the sizes above as given.
  bool fit_memory = true;
};

HardwareProfile measure_profile(CpuDevice& dev, const ProfileOptions& opts = {});

// A measured profile's memory: both tiers (the CPU device's share RAM) set to what this process
// can take now (available_host_memory(): MemAvailable within its memory cgroup). measure_profile
// does this; a profile measured earlier and reused takes it again, since memory changes.
void set_measured_memory(HardwareProfile& h);

}  // namespace flexh2o
