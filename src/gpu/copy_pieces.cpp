// registration_cuts / piece_ends / plan_2d: where copies over page-locked host ranges are cut.
#include "gpu/copy_pieces.h"

#include <algorithm>

namespace flexh2o::gpu {
namespace {

bool crosses(const std::vector<size_t>& cuts, size_t lo, size_t hi) {  // a cut in (lo, hi)
  auto it = std::upper_bound(cuts.begin(), cuts.end(), lo);
  return it != cuts.end() && *it < hi;
}

}  // namespace

std::vector<size_t> registration_cuts(const PinRegistry& pins, uintptr_t p, size_t bytes) {
  std::vector<size_t> cuts;
  const uintptr_t a = p, b = p + bytes;
  auto it = pins.upper_bound(a);
  if (it != pins.begin()) --it;
  for (; it != pins.end() && it->first < b; ++it)
    for (uintptr_t edge : {it->first, it->second.first})
      if (edge > a && edge < b) cuts.push_back(size_t(edge - a));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

std::vector<size_t> piece_ends(const std::vector<size_t>& src_cuts, const std::vector<size_t>& dst_cuts,
                               size_t bytes) {
  std::vector<size_t> ends;
  std::merge(src_cuts.begin(), src_cuts.end(), dst_cuts.begin(), dst_cuts.end(), std::back_inserter(ends));
  ends.push_back(bytes);
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  return ends;
}

std::vector<RowPiece> plan_2d(const std::vector<size_t>& src_cuts, size_t spitch, const std::vector<size_t>& dst_cuts,
                              size_t dpitch, size_t width, size_t height) {
  std::vector<RowPiece> plan;
  for (size_t r = 0; r < height;) {
    if (crosses(src_cuts, r * spitch, r * spitch + width) || crosses(dst_cuts, r * dpitch, r * dpitch + width)) {
      plan.push_back({r, 1, true});
      ++r;
      continue;
    }
    size_t e = r + 1;  // grow while rows [r, e] still span no edge on either side
    while (e < height && !crosses(src_cuts, r * spitch, e * spitch + width) &&
           !crosses(dst_cuts, r * dpitch, e * dpitch + width))
      ++e;
    plan.push_back({r, e - r, false});
    r = e;
  }
  return plan;
}

}  // namespace flexh2o::gpu
