// The AVX2 + FMA + F16C variant of the CPU kernels: instantiates the kernel templates with
// VecAvx2. Compiled with its own ISA flags (CMakeLists.txt); only kernels_avx2() has external
// linkage, and it is called only after the dispatcher checked the CPU supports the ISA.
#include "kernels/cpu/detail/vec_avx2.h"
// (traits first: the templates below are instantiated with the internal-linkage traits type)
#include "kernels/cpu/detail/attention_impl.h"
#include "kernels/cpu/detail/convert_impl.h"
#include "kernels/cpu/detail/linear_impl.h"
#include "kernels/cpu/detail/math_impl.h"

namespace flexh2o::cpu::detail {

const KernelTable& kernels_avx2() {
  static constexpr KernelTable kTable{"avx2",
                                      &linear_task<VecAvx2>,
                                      &attention_task<VecAvx2>,
                                      &silu_mul<VecAvx2>,
                                      &gelu_tanh_mul<VecAvx2>,
                                      &softcap<VecAvx2>,
                                      &to_f32<VecAvx2>,
                                      &from_f32<VecAvx2>,
                                      &q4_decode<VecAvx2>};
  return kTable;
}

}  // namespace flexh2o::cpu::detail
