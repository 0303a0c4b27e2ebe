// How a copy touching page-locked host ranges is cut so that no piece spans two registrations:
// the CUDA driver refuses such a copy (cudaErrorInvalidValue). Plain C++ (host-only, in every
// build): the CUDA device plans with it, and it is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace flexh2o::gpu {

// Registered host ranges: start -> (end, references). Disjoint.
using PinRegistry = std::map<uintptr_t, std::pair<uintptr_t, int>>;

// Offsets in (0, bytes), ascending and unique, where [p, p + bytes) crosses the start or end of
// a registered range. Empty when the range touches at most one registration and no edge.
std::vector<size_t> registration_cuts(const PinRegistry& pins, uintptr_t p, size_t bytes);

// The ends of the 1-D pieces of a copy of `bytes` with the cuts of both sides (each ascending):
// ascending, unique, the last one `bytes`.
std::vector<size_t> piece_ends(const std::vector<size_t>& src_cuts, const std::vector<size_t>& dst_cuts,
                               size_t bytes);

// A 2-D copy (height rows of width bytes, pitches spitch / dpitch) in pieces: rows
// [row, row + rows) as one 2-D copy whose whole span stays inside one registration (or none) on
// each side; or, when a single row itself crosses an edge (`split_row`), that row as 1-D pieces.
// Cuts are those of each side's whole span, pitch * (height - 1) + width bytes.
struct RowPiece {
  size_t row = 0, rows = 0;
  bool split_row = false;
};
std::vector<RowPiece> plan_2d(const std::vector<size_t>& src_cuts, size_t spitch, const std::vector<size_t>& dst_cuts,
                              size_t dpitch, size_t width, size_t height);

}  // namespace flexh2o::gpu
