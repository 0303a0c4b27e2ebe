// The portable (baseline ISA) variant of the CPU kernels: instantiates the kernel templates with
// VecScalar. Compiled with its own ISA flags (CMakeLists.txt); only kernels_scalar() has external
// linkage, and it is called only after the dispatcher checked the CPU supports the ISA.
#include "kernels/cpu/detail/vec_scalar.h"
// (traits first: the templates below are instantiated with the internal-linkage traits type)
#include "kernels/cpu/detail/attention_impl.h"
#include "kernels/cpu/detail/convert_impl.h"
#include "kernels/cpu/detail/linear_impl.h"
#include "kernels/cpu/detail/math_impl.h"

namespace flexh2o::cpu::detail {

const KernelTable& kernels_scalar() {
  static constexpr KernelTable kTable{"scalar",
                                      &linear_task<VecScalar>,
                                      &attention_task<VecScalar>,
                                      &silu_mul<VecScalar>,
                                      &gelu_tanh_mul<VecScalar>,
                                      &softcap<VecScalar>,
                                      &to_f32<VecScalar>,
                                      &from_f32<VecScalar>,
                                      &q4_decode<VecScalar>};
  return kTable;
}

}  // namespace flexh2o::cpu::detail
