// ZIP central-directory reader (APPNOTE 6.3: end-of-central-directory record, the ZIP64 locator
// and record, central file headers with their ZIP64 extra field, local file headers). Every
// read is bounds-checked against the buffer before it happens; all arithmetic is in uint64_t
// on values already known to be below the buffer size, so nothing overflows.
#include "loader/zip_reader.h"

#include <array>
#include <unordered_set>

#include "core/error.h"

namespace flexh2o {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50, kZip64LocatorSig = 0x07064b50, kZip64EocdSig = 0x06064b50;
constexpr uint32_t kCentralSig = 0x02014b50, kLocalSig = 0x04034b50;
constexpr uint64_t kEocdBytes = 22, kLocatorBytes = 20, kZip64EocdBytes = 56, kCentralBytes = 46, kLocalBytes = 30;

class Bytes {
 public:
  Bytes(const std::byte* d, uint64_t n) : d_(d), n_(n) {}
  uint64_t size() const { return n_; }
  // Little-endian integer of `w` bytes at `off`; the caller has checked off + w <= size().
  uint64_t le(uint64_t off, int w) const {
    uint64_t v = 0;
    for (int i = w - 1; i >= 0; --i) v = (v << 8) | uint64_t(std::to_integer<uint8_t>(d_[off + uint64_t(i)]));
    return v;
  }
  std::string_view text(uint64_t off, uint64_t n) const { return {reinterpret_cast<const char*>(d_ + off), n}; }

 private:
  const std::byte* d_;
  uint64_t n_;
};

// Printable form of an entry name for messages (names come from the file).
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 120)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return '"' + out + (s.size() > 120 ? "...\"" : "\"");
}

const char* method_name(uint64_t m) {
  switch (m) {
    case 8: return "deflate";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "lzma";
    case 93: return "zstd";
    case 95: return "xz";
    default: return "unknown";
  }
}

struct Directory {
  uint64_t entries = 0, offset = 0, size = 0;
  uint64_t end_limit = 0;  // the directory must end at or before this (the record that describes it)
};

// Finds the end-of-central-directory record (and the ZIP64 record when present).
Directory find_directory(const Bytes& b, const std::string& file) {
  if (b.size() < kEocdBytes)
    FH_FAIL(file, " is not a zip archive: it is ", b.size(), " bytes long, shorter than an end-of-central-directory record.");
  // The record is the last thing in the file, followed only by its comment (< 64 KiB).
  uint64_t eocd = 0;
  bool found = false;
  const uint64_t lowest = b.size() > kEocdBytes + 0xffff ? b.size() - kEocdBytes - 0xffff : 0;
  for (uint64_t at = b.size() - kEocdBytes + 1; at-- > lowest;) {
    if (b.le(at, 4) == kEocdSig && at + kEocdBytes + b.le(at + 20, 2) == b.size()) {
      eocd = at;
      found = true;
      break;
    }
  }
  if (!found)
    FH_FAIL(file, " is truncated or not a zip archive: no end-of-central-directory record in its last bytes.");
  const uint64_t disk = b.le(eocd + 4, 2), cd_disk = b.le(eocd + 6, 2);
  Directory d;
  uint64_t on_disk = b.le(eocd + 8, 2);
  d.entries = b.le(eocd + 10, 2);
  d.size = b.le(eocd + 12, 4);
  d.offset = b.le(eocd + 16, 4);
  d.end_limit = eocd;
  if (eocd >= kLocatorBytes && b.le(eocd - kLocatorBytes, 4) == kZip64LocatorSig) {
    const uint64_t loc = eocd - kLocatorBytes;
    const uint64_t z64 = b.le(loc + 8, 8), disks = b.le(loc + 16, 4);
    if (b.le(loc + 4, 4) != 0 || disks > 1)
      FH_FAIL(file, " is a multi-disk (split) zip archive, which torch.save never writes.");
    if (z64 > loc || loc - z64 < kZip64EocdBytes)
      FH_FAIL(file, " is corrupt: its ZIP64 locator points at offset ", z64,
              ", which leaves no room for a ZIP64 record before the locator at ", loc, ".");
    if (b.le(z64, 4) != kZip64EocdSig)
      FH_FAIL(file, " is corrupt: no ZIP64 end-of-central-directory record at offset ", z64, ".");
    if (b.le(z64 + 16, 4) != 0 || b.le(z64 + 20, 4) != 0)
      FH_FAIL(file, " is a multi-disk (split) zip archive, which torch.save never writes.");
    on_disk = b.le(z64 + 24, 8);
    d.entries = b.le(z64 + 32, 8);
    d.size = b.le(z64 + 40, 8);
    d.offset = b.le(z64 + 48, 8);
    d.end_limit = z64;
  } else if (d.entries == 0xffff || d.size == 0xffffffff || d.offset == 0xffffffff) {
    FH_FAIL(file, " is corrupt: its end-of-central-directory record defers to a ZIP64 record that is absent.");
  } else if (disk != 0 || cd_disk != 0) {
    FH_FAIL(file, " is a multi-disk (split) zip archive, which torch.save never writes.");
  }
  if (on_disk != d.entries)
    FH_FAIL(file, " is a multi-disk (split) zip archive, which torch.save never writes.");
  if (d.offset > d.end_limit || d.size > d.end_limit - d.offset)
    FH_FAIL(file, " is truncated or corrupt: its central directory claims bytes [", d.offset, ", ", d.offset + d.size,
            ") but only ", d.end_limit, " bytes precede the end record.");
  if (d.entries > d.size / kCentralBytes)
    FH_FAIL(file, " is corrupt: its central directory claims ", d.entries, " entries in ", d.size, " bytes.");
  return d;
}

// The ZIP64 extra field (id 1) holds, in this order, the 8-byte values whose 32-bit fields
// are 0xffffffff: uncompressed size, compressed size, local header offset.
void apply_zip64_extra(const Bytes& b, uint64_t at, uint64_t len, uint64_t* usize, uint64_t* csize, uint64_t* lho,
                       const std::string& file, const std::string& name) {
  const uint64_t end = at + len;
  while (end - at >= 4) {
    const uint64_t id = b.le(at, 2), n = b.le(at + 2, 2);
    at += 4;
    if (n > end - at) FH_FAIL(file, " is corrupt: entry ", name, " has an extra field running past its header.");
    if (id == 1) {
      uint64_t p = at;
      for (uint64_t* v : {usize, csize, lho}) {
        if (*v != 0xffffffff) continue;
        if (at + n - p < 8) FH_FAIL(file, " is corrupt: entry ", name, " has a ZIP64 extra field too short for its sizes.");
        *v = b.le(p, 8);
        p += 8;
      }
      return;
    }
    at += n;
  }
  if (*usize == 0xffffffff || *csize == 0xffffffff || *lho == 0xffffffff)
    FH_FAIL(file, " is corrupt: entry ", name, " defers its size or offset to a ZIP64 extra field that is absent.");
}

}  // namespace

std::vector<ZipEntry> read_zip_directory(const std::byte* data, size_t size, const std::string& file) {
  const Bytes b(data, size);
  const Directory d = find_directory(b, file);
  const uint64_t cd_end = d.offset + d.size;
  std::vector<ZipEntry> out;
  out.reserve(size_t(d.entries));
  std::unordered_set<std::string_view> names;
  uint64_t p = d.offset;
  for (uint64_t i = 0; i < d.entries; ++i) {
    if (cd_end - p < kCentralBytes || b.le(p, 4) != kCentralSig)
      FH_FAIL(file, " is corrupt: central directory entry ", i, " of ", d.entries, " (at offset ", p,
              ") is missing or malformed.");
    const uint64_t flags = b.le(p + 8, 2), method = b.le(p + 10, 2);
    const uint64_t nlen = b.le(p + 28, 2), xlen = b.le(p + 30, 2), clen = b.le(p + 32, 2);
    if (cd_end - p - kCentralBytes < nlen + xlen + clen)
      FH_FAIL(file, " is corrupt: central directory entry ", i, " runs past the end of the directory.");
    ZipEntry e;
    e.name = std::string(b.text(p + kCentralBytes, nlen));
    const std::string shown = printable(e.name);
    e.crc32 = uint32_t(b.le(p + 16, 4));
    uint64_t csize = b.le(p + 20, 4), usize = b.le(p + 24, 4), lho = b.le(p + 42, 4);
    if (csize == 0xffffffff || usize == 0xffffffff || lho == 0xffffffff)
      apply_zip64_extra(b, p + kCentralBytes + nlen, xlen, &usize, &csize, &lho, file, shown);
    if (flags & 0x41)
      FH_FAIL(file, ": entry ", shown, " is encrypted; torch checkpoints never are, and flexh2o reads no encrypted zip.");
    if (method != 0)
      FH_FAIL(file, ": entry ", shown, " is compressed (method ", method, ", ", method_name(method),
              "); torch.save stores every record uncompressed, and flexh2o reads tensors in place, so it accepts "
              "only stored entries (re-save the checkpoint with torch.save, or convert it to safetensors).");
    if (csize != usize)
      FH_FAIL(file, " is corrupt: stored entry ", shown, " has compressed size ", csize, " != size ", usize, ".");
    if (b.le(p + 34, 2) != 0) FH_FAIL(file, " is a multi-disk (split) zip archive, which torch.save never writes.");
    // The local header repeats the name; its extra field (torch pads it to align the data) may differ.
    if (lho > d.offset || d.offset - lho < kLocalBytes || b.le(lho, 4) != kLocalSig)
      FH_FAIL(file, " is truncated or corrupt: entry ", shown, " has its local header at offset ", lho,
              ", which is not a local header before the central directory (at ", d.offset, ").");
    const uint64_t lflags = b.le(lho + 6, 2), lnlen = b.le(lho + 26, 2), lxlen = b.le(lho + 28, 2);
    if (d.offset - lho - kLocalBytes < lnlen + lxlen || b.text(lho + kLocalBytes, lnlen) != e.name)
      FH_FAIL(file, " is corrupt: the local header of entry ", shown, " does not repeat its name.");
    if (lflags & 0x41)
      FH_FAIL(file, ": entry ", shown, " is encrypted; torch checkpoints never are, and flexh2o reads no encrypted zip.");
    e.offset = lho + kLocalBytes + lnlen + lxlen;
    e.size = usize;
    if (e.size > d.offset - e.offset)
      FH_FAIL(file, " is truncated or corrupt: entry ", shown, " claims ", e.size, " bytes from offset ", e.offset,
              ", past the start of the central directory at ", d.offset, " (the file is ", size, " bytes).");
    p += kCentralBytes + nlen + xlen + clen;
    out.push_back(std::move(e));
  }
  for (const ZipEntry& e : out)
    if (!names.insert(e.name).second) FH_FAIL(file, " is corrupt: entry ", printable(e.name), " appears twice.");
  return out;
}

uint32_t crc32(const std::byte* p, size_t n) {
  static constexpr std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ std::to_integer<uint8_t>(p[i])) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

}  // namespace flexh2o
