// Hardware ceilings the benchmarks report against: an OpenBLAS sgemm GFLOP/s (the GEMM
// ceiling) and a multi-threaded streaming-read GB/s (the memory-bandwidth ceiling).
// Both are blocking, take seconds, allocate their own buffers and are not thread-safe
// with each other (run one at a time on an otherwise idle machine).
#pragma once

#include <string>

namespace flexh2o::bench {

// OpenBLAS (DYNAMIC_ARCH) picks its kernels from CPUID when it is loaded; in VMs with an
// unrecognised CPU model it falls back to "Prescott" (SSE3), which is no ceiling at all. Call
// first thing in main(): if that happened, re-executes the program with OPENBLAS_CORETYPE set
// to the best core type the CPU supports (SkylakeX / Haswell). Returns only if no re-exec
// was needed (or it failed).
void ensure_openblas_coretype(char** argv);
// OpenBLAS's kernel set, e.g. "SkylakeX".
std::string openblas_core();

// Best of several cblas_sgemm runs on 2048^3 fp32, with OpenBLAS limited to `threads`.
// Units: GFLOP/s (2*M*N*K per run).
double measure_sgemm_gflops(int threads);

// Best of several passes summing a 1 GiB buffer (AVX2 where available), split across
// `threads` std::threads (0 = hardware concurrency). Units: GB/s (1e9 bytes).
double measure_read_bandwidth_gbs(int threads = 0);

// One line describing the machine: CPU kernel ISA, hardware threads, model name.
std::string machine_info();

}  // namespace flexh2o::bench
