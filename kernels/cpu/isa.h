// Which instruction-set variant the CPU kernels run with on this machine.
// The variant is detected once (first call) with __builtin_cpu_supports and never changes;
// it does not read the environment. Thread-safe.
#pragma once

namespace flexh2o::cpu {

// "avx512" (AVX-512F/BW/VL + F16C + FMA), "avx2" (AVX2 + FMA + F16C) or "scalar"
// (portable fallback). The returned string is static.
const char* cpu_isa_name();

}  // namespace flexh2o::cpu
