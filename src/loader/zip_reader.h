// The entry list of a ZIP archive held in memory (a memory-mapped torch checkpoint), read from
// its central directory, ZIP64 records included. Only what torch.save writes is accepted:
// single-disk archives of STORED (uncompressed), unencrypted entries, whose bytes are then
// used in place. Not a general unzip: nothing is inflated, copied or written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flexh2o {

struct ZipEntry {
  std::string name;
  uint64_t offset = 0;  // of the entry's data (past its local header), from the start of the file
  uint64_t size = 0;    // bytes of data
  uint32_t crc32 = 0;   // as recorded in the central directory
};

// Reads the directory of the `size` bytes at `data`; `file` names the archive in messages.
// Every offset and size is checked against `size` (each entry's data lies inside the file,
// before the central directory); a compressed or encrypted entry, a multi-disk archive, a
// repeated name or a local header that disagrees with the central one throws flexh2o::Error
// naming `file` and the entry. Entries come back in directory order. Pure; thread-safe.
std::vector<ZipEntry> read_zip_directory(const std::byte* data, size_t size, const std::string& file);

// CRC-32 (the ZIP/zlib polynomial) of `n` bytes.
uint32_t crc32(const std::byte* p, size_t n);

}  // namespace flexh2o
