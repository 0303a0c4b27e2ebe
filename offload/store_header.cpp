// Store file header: the on-disk layout (native-endian, little-endian on our targets), its
// encoding and its validation. Every field read from disk is checked before it is trusted.
#include "offload/store_header.h"

#include <xxhash.h>

#include <cstddef>
#include <cstring>

namespace flexh2o {

namespace {

constexpr char kMagic[8] = {'F', 'H', '2', 'O', 'S', 'T', 'O', 'R'};
constexpr uint32_t kFlagComplete = 1, kFlagHashed = 2;

// On-disk header, serialised into the first 4096 bytes of every store file.
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t flags;
  uint64_t payload_bytes;
  uint64_t content_hash;  // XXH3_64bits of the payload (kFlagHashed)
  uint32_t dtype;
  uint32_t ndim;
  int64_t dims[kMaxDims];
  uint32_t identity_len;
  uint32_t name_len;
  char identity[1024];
  char name[1024];
  uint64_t header_hash;  // XXH3_64bits of all bytes above
};
static_assert(sizeof(Header) <= kStoreHeaderBytes);
static_assert(kStoreMaxString <= sizeof(Header::name) && kStoreMaxString <= sizeof(Header::identity));

uint64_t header_hash(const Header& h) { return XXH3_64bits(&h, offsetof(Header, header_hash)); }

Status corrupt(std::string why) { return {StatusCode::kCorrupt, std::move(why)}; }

}  // namespace

Status parse_store_header(std::span<const std::byte> bytes, StoreHeader* out) {
  if (bytes.size() < kStoreHeaderBytes)
    return corrupt(detail::concat("is truncated: ", bytes.size(), " bytes, smaller than its ", kStoreHeaderBytes,
                                  "-byte header"));
  Header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return corrupt("is not a flexh2o store file (bad magic)");
  if (h.version != kStoreFormatVersion)
    return corrupt(detail::concat("has format version ", h.version, ", expected ", kStoreFormatVersion));
  if (h.header_hash != header_hash(h)) return corrupt("has a corrupt header (header hash mismatch)");
  if (h.identity_len > kStoreMaxString || h.name_len > kStoreMaxString)
    return corrupt(detail::concat("has a corrupt header (string lengths ", h.identity_len, " and ", h.name_len,
                                  ", at most ", kStoreMaxString, ")"));
  if (h.ndim > uint32_t(kMaxDims) || h.dtype > uint32_t(DType::Q4) || (h.dtype == uint32_t(DType::Q4) && h.ndim == 0))
    return corrupt(detail::concat("has an invalid dtype/shape (dtype code ", h.dtype, ", rank ", h.ndim, ")"));
  // The shape's byte size (numel * element size; Q4: rows * row_nbytes of the last dimension)
  // must equal the payload: checked in unsigned 64-bit without overflow.
  for (uint32_t i = 0; i < h.ndim; ++i)
    if (h.dims[i] < 0) return corrupt(detail::concat("has a negative dimension ", h.dims[i]));
  const bool q4 = h.dtype == uint32_t(DType::Q4);
  if (q4 && h.dims[h.ndim - 1] > (int64_t(1) << 40)) return corrupt("has a Q4 row too long to size");
  uint64_t n = q4 ? row_nbytes(DType::Q4, h.dims[h.ndim - 1]) : dtype_size(DType(h.dtype));
  for (uint32_t i = 0; i + (q4 ? 1 : 0) < h.ndim; ++i) {
    const uint64_t d = uint64_t(h.dims[i]);
    if (d != 0 && n > UINT64_MAX / d) return corrupt("has a shape whose byte size overflows 64 bits");
    n *= d;
  }
  if (n != h.payload_bytes)
    return corrupt(detail::concat("has a shape of ", n, " bytes but a payload of ", h.payload_bytes, " bytes"));
  // A file holds the header and the payload padded to pages, a sum that wraps 64 bits near 2^64;
  // no file holds 2^62 bytes, so that is the bound.
  if (h.payload_bytes > (uint64_t(1) << 62))
    return corrupt(detail::concat("has a payload of ", h.payload_bytes, " bytes, more than any file holds"));
  if (out) {
    out->payload_bytes = h.payload_bytes;
    out->complete = (h.flags & kFlagComplete) != 0;
    out->hashed = (h.flags & kFlagHashed) != 0;
    out->content_hash = h.content_hash;
    out->dtype = DType(h.dtype);
    out->shape = Shape();
    out->shape.ndim = int(h.ndim);
    for (uint32_t i = 0; i < h.ndim; ++i) out->shape.dims[i] = h.dims[i];
    out->identity.assign(h.identity, h.identity_len);
    out->name.assign(h.name, h.name_len);
  }
  return Status::Ok();
}

void encode_store_header(const StoreHeader& s, std::span<std::byte, kStoreHeaderBytes> out) {
  FH_CHECK(s.identity.size() <= kStoreMaxString && s.name.size() <= kStoreMaxString,
           "store header strings must be at most ", kStoreMaxString, " bytes");
  FH_CHECK(s.shape.ndim >= 0 && s.shape.ndim <= kMaxDims, "store header rank ", s.shape.ndim);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kStoreFormatVersion;
  h.flags = (s.complete ? kFlagComplete : 0) | (s.hashed ? kFlagHashed : 0);
  h.payload_bytes = s.payload_bytes;
  h.content_hash = s.content_hash;
  h.dtype = uint32_t(s.dtype);
  h.ndim = uint32_t(s.shape.ndim);
  for (int i = 0; i < s.shape.ndim; ++i) h.dims[i] = s.shape.dims[i];
  h.identity_len = uint32_t(s.identity.size());
  std::memcpy(h.identity, s.identity.data(), s.identity.size());
  h.name_len = uint32_t(s.name.size());
  std::memcpy(h.name, s.name.data(), s.name.size());
  h.header_hash = header_hash(h);
  std::memset(out.data(), 0, out.size());
  std::memcpy(out.data(), &h, sizeof h);
}

}  // namespace flexh2o
