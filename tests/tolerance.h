// The one closeness rule of the numeric tests: |got - want| <= atol + rtol * |want| for finite
// values; a NaN on either side fails, and an infinite `want` needs the same infinity (rtol * inf
// would accept anything, and inf - inf is NaN).
#pragma once

#include <cmath>

namespace flexh2o::test {

inline bool within_tolerance(double got, double want, double atol, double rtol) {
  if (!std::isfinite(want)) return !std::isnan(want) && got == want;
  return std::isfinite(got) && std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

}  // namespace flexh2o::test
