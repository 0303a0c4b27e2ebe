// Read-only memory mapping of a whole file (model checkpoints are mapped, never copied).
// Move-only RAII owner: the mapping lives until the MappedFile is destroyed; views into it
// must not outlive it. Thread-safe for concurrent reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace flexh2o {

// Which file was mapped, from fstat of the descriptor that was mapped (so it names the bytes
// in memory even if the path is replaced afterwards). Times in nanoseconds since the epoch.
struct FileStamp {
  uint64_t dev = 0, ino = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
};

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. Throws flexh2o::Error naming the path if it cannot be opened or
  // mapped. An empty file maps to size() == 0 and data() == nullptr.
  static MappedFile open(const std::filesystem::path& path);

  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  const FileStamp& stamp() const { return stamp_; }

  // Drops this process's page-table entries for the whole pages inside [p, p + bytes) (the
  // partial pages at either end stay), so they leave its resident set: for bytes that were copied
  // elsewhere and will not be read here soon. The next read faults them in from the file again;
  // the page cache is the kernel's to keep or reclaim. Content-safe, as the mapping is read-only:
  // no page ever differs from the file. Returns false, doing nothing, when the range is not inside
  // this mapping. Thread-safe; a concurrent reader of the range only faults again.
  bool release(const void* p, size_t bytes) const noexcept;

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
  FileStamp stamp_;
};

}  // namespace flexh2o
