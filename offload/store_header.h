// The 4096-byte header at the front of every offload store file: what it holds, how it is
// written (encode_store_header) and how it is checked (parse_store_header). Pure functions over
// bytes, no I/O: DiskStore reads and writes the header, the fuzz target feeds it garbage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace flexh2o {

inline constexpr size_t kStoreHeaderBytes = 4096;
inline constexpr uint32_t kStoreFormatVersion = 1;
inline constexpr size_t kStoreMaxString = 1000;  // max bytes of identity and entry name

// The fields of a store file header.
struct StoreHeader {
  uint64_t payload_bytes = 0;
  bool complete = false;  // set only once the payload is fully written
  bool hashed = false;    // content_hash is the XXH3-64 of the payload (entries made by put())
  uint64_t content_hash = 0;
  DType dtype = DType::U8;
  Shape shape;            // numel * dtype size (Q4: rows * row_nbytes) == payload_bytes
  std::string identity;   // the store identity it was written for (<= kStoreMaxString bytes)
  std::string name;       // the entry name (<= kStoreMaxString bytes)
};

// Parses and checks the first kStoreHeaderBytes of `bytes`: magic, format version, header hash,
// string lengths, dtype, rank, dims (non-negative) and the shape's byte size == payload_bytes without
// overflow. Never reads outside `bytes`. kCorrupt whose message says what is wrong (without the
// file: callers add it) on any violation, including fewer than kStoreHeaderBytes bytes; on Ok
// *out (may be null) receives the fields. Does not require `complete` (callers decide).
[[nodiscard]] Status parse_store_header(std::span<const std::byte> bytes, StoreHeader* out);

// Serialises `h` into kStoreHeaderBytes bytes at `out` (zero-padded, header hash set). Throws
// flexh2o::Error when a string is longer than kStoreMaxString or the rank exceeds kMaxDims.
void encode_store_header(const StoreHeader& h, std::span<std::byte, kStoreHeaderBytes> out);

}  // namespace flexh2o
