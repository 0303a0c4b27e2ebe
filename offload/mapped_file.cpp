// MappedFile: open + fstat + mmap(PROT_READ, MAP_PRIVATE) of a whole file, unmapped on destruction.
// The descriptor is closed right after mapping (the mapping keeps the file alive). This is not
// the NVMe read path (that is BlockDevice/io_uring); it serves checkpoints read in place.
#include "offload/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "offload/detail/fd.h"

namespace flexh2o {

MappedFile MappedFile::open(const std::filesystem::path& path) {
  const detail::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));  // the mapping outlives it
  if (fd.get() < 0) {
    int e = errno;
    FH_FAIL("cannot open ", path.string(), ": ", std::strerror(e), ".");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    int e = errno;
    FH_FAIL("cannot stat ", path.string(), ": ", std::strerror(e), ".");
  }
  if (!S_ISREG(st.st_mode))
    FH_FAIL("cannot map ", path.string(), ": ", S_ISDIR(st.st_mode) ? "it is a directory" : "it is not a regular file",
            ".");

  MappedFile f;
  f.path_ = path;
  f.size_ = size_t(st.st_size);
  f.stamp_ = FileStamp{uint64_t(st.st_dev), uint64_t(st.st_ino),
                       int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                       int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
  if (f.size_ == 0) return f;  // mmap rejects length 0; an empty file maps to nullptr

  void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED) {
    int e = errno;
    FH_FAIL("cannot map ", path.string(), " (", f.size_, " bytes): ", std::strerror(e), ".");
  }
  // Checkpoints are read front to back once, then served from the tiers: a hint, never an error.
  (void)::madvise(p, f.size_, MADV_SEQUENTIAL);
  f.data_ = static_cast<const std::byte*>(p);
  return f;
}

bool MappedFile::release(const void* p, size_t bytes) const noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  if (data_ == nullptr || b < data_ || bytes > size_ || size_t(b - data_) > size_ - bytes) return false;
  const auto page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (uintptr_t(b) + page - 1) / page * page, hi = (uintptr_t(b) + bytes) / page * page;
  // MADV_DONTNEED drops the page table entries; on a read-only private file mapping (never
  // written, so never copied on write) the next touch maps the file's page again. A failure
  // leaves the pages resident, which costs memory, never correctness.
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  return true;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      path_(std::move(o.path_)),
      stamp_(o.stamp_) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    MappedFile old(std::move(*this));  // unmaps our current mapping when it goes out of scope
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
    stamp_ = o.stamp_;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  if (::munmap(const_cast<std::byte*>(data_), size_) != 0) {
    int e = errno;
    std::fprintf(stderr, "flexh2o: munmap of %s failed: %s\n", path_.c_str(), std::strerror(e));
  }
}

}  // namespace flexh2o
