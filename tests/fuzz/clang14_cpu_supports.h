// Clang < 15 (Debian 12's clang 14, which builds the fuzz and sanitizer trees) rejects
// __builtin_cpu_supports("f16c"), which kernels/cpu/dispatch.cpp asks for. The top-level
// CMakeLists.txt force-includes this header into that one file with
// -D__builtin_cpu_supports=fh_cpu_supports: "f16c" is answered from CPUID (leaf 1, ECX bit 29),
// every other feature by the builtin itself. Not used by g++ builds.
#pragma once

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

#pragma push_macro("__builtin_cpu_supports")
#undef __builtin_cpu_supports
inline bool fh_cpu_supports(const char* feature) {
  auto is = [feature](const char* name) { return std::strcmp(feature, name) == 0; };
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (is("f16c")) return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  if (is("avx2")) return __builtin_cpu_supports("avx2");
  if (is("fma")) return __builtin_cpu_supports("fma");
  if (is("avx512f")) return __builtin_cpu_supports("avx512f");
  if (is("avx512bw")) return __builtin_cpu_supports("avx512bw");
  if (is("avx512vl")) return __builtin_cpu_supports("avx512vl");
  std::abort();  // a feature dispatch.cpp started to use: add it above
}
#pragma pop_macro("__builtin_cpu_supports")
