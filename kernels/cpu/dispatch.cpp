// Run-time ISA selection for the CPU kernels: probes the CPU once with
// __builtin_cpu_supports and maps a variant to its function table. Holds no mutable state
// (the detected variant is a function-local constant); never reads the environment.
#include "core/error.h"
#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/isa.h"

namespace flexh2o::cpu {
namespace detail {

bool isa_supported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
  }
  return false;
}

Isa best_isa() {
  static const Isa kBest = isa_supported(Isa::kAvx512) ? Isa::kAvx512
                           : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                                       : Isa::kScalar;
  return kBest;
}

const KernelTable& kernels(Isa isa) {
  FH_CHECK(isa_supported(isa), "CPU kernel variant ", int(isa), " is not supported by this CPU");
  switch (isa) {
    case Isa::kAvx512: return kernels_avx512();
    case Isa::kAvx2: return kernels_avx2();
    case Isa::kScalar: break;
  }
  return kernels_scalar();
}

}  // namespace detail

const char* cpu_isa_name() { return detail::kernels(detail::best_isa()).name; }

}  // namespace flexh2o::cpu
