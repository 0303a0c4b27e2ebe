// The AVX-512 (F/BW/VL) + FMA + F16C variant of the CPU kernels: instantiates the kernel templates with
// VecAvx512. Compiled with its own ISA flags (CMakeLists.txt); only kernels_avx512() has external
// linkage, and it is called only after the dispatcher checked the CPU supports the ISA.
#include "kernels/cpu/detail/vec_avx512.h"
// (traits first: the templates below are instantiated with the internal-linkage traits type)
#include "kernels/cpu/detail/attention_impl.h"
#include "kernels/cpu/detail/convert_impl.h"
#include "kernels/cpu/detail/linear_impl.h"
#include "kernels/cpu/detail/math_impl.h"

namespace flexh2o::cpu::detail {

const KernelTable& kernels_avx512() {
  static constexpr KernelTable kTable{"avx512",
                                      &linear_task<VecAvx512>,
                                      &attention_task<VecAvx512>,
                                      &silu_mul<VecAvx512>,
                                      &gelu_tanh_mul<VecAvx512>,
                                      &softcap<VecAvx512>,
                                      &to_f32<VecAvx512>,
                                      &from_f32<VecAvx512>,
                                      &q4_decode<VecAvx512>};
  return kTable;
}

}  // namespace flexh2o::cpu::detail
