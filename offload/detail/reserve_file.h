// Private to offload/: reserving the bytes of a new store file before its payload is written,
// on filesystems with and without fallocate(2).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace flexh2o::detail {

using FallocateFn = int (*)(int fd, int mode, off_t offset, off_t len);

// Sizes the file at `fd` to `bytes`, allocating its blocks where the filesystem can, so a full disk
// shows here rather than mid-write. Where it cannot (EOPNOTSUPP: ext2, some network and FUSE
// filesystems) the file is only sized, its blocks taken as the writes land: glibc's
// posix_fallocate would emulate with one-byte writes, which an O_DIRECT descriptor refuses.
// Returns 0 or the errno. `fallocate_fn` is for tests.
inline int reserve_file(int fd, uint64_t bytes, FallocateFn fallocate_fn = &::fallocate) {
  int rc;
  while ((rc = fallocate_fn(fd, 0, 0, off_t(bytes))) != 0 && errno == EINTR) {
  }
  if (rc == 0) return 0;
  const int e = errno;
  if (e != EOPNOTSUPP && e != ENOSYS) return e;
  return ::ftruncate(fd, off_t(bytes)) == 0 ? 0 : errno;
}

}  // namespace flexh2o::detail
