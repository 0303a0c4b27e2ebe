// Sharing one offload directory between runs (processes or threads). Two kinds of flock:
// the directory lock (DIR/flexh2o.lock, held while a run checks or builds its weight files and
// while stale files are cleaned), and a run lease (DIR/<token>.lock, held for the life of a
// DiskStore) that marks the per-run files named with its token (KV files, temporary files) as
// in use. A killed run loses its flocks with its process; the next store opened on the
// directory removes its files. Not for directories shared across machines without flock.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace flexh2o {

// The pid /proc/locks names as holding an flock on the file open at `fd`, other than this
// process; 0 when it names none (no /proc, a holder in another pid namespace, a lock since
// released). For messages: a run waiting on a lock says whose.
long flock_holder(int fd);

// flock on DIR/flexh2o.lock (created if absent, never removed: removing a lock file races with
// its next locker): exclusive to build or clean, shared to only read and check weight files. In a
// directory this process cannot write, an existing lock file is locked through a read-only
// descriptor, and on a read-only filesystem without one nothing is locked (held() false).
// Move-only; released on destruction.
class StoreDirLock {
 public:
  enum class Mode { kShared, kExclusive };
  StoreDirLock() = default;
  // Blocks until held. When another holder makes it wait, calls on_wait (may be empty) with that
  // holder's pid (flock_holder(): 0 when unknown) once before waiting, then still_waiting() (when
  // given) about every 50 ms until held: what it throws ends the wait. Throws flexh2o::Error
  // naming the lock file when it cannot be opened/locked.
  static StoreDirLock acquire(const std::filesystem::path& dir, const std::function<void(long holder)>& on_wait = {},
                              Mode mode = Mode::kExclusive, const std::function<void()>& still_waiting = {});
  StoreDirLock(StoreDirLock&& o) noexcept;
  StoreDirLock& operator=(StoreDirLock&& o) noexcept;
  StoreDirLock(const StoreDirLock&) = delete;
  StoreDirLock& operator=(const StoreDirLock&) = delete;
  ~StoreDirLock();
  bool held() const { return fd_ >= 0; }
  void release() noexcept;

 private:
  int fd_ = -1;
};

// A run's claim on its per-run files. The token, "run-<pid hex>-<16 hex digits>", is unique
// across processes and threads; files carrying it as one dot-separated name component belong to
// the run. Move-only.
class RunLease {
 public:
  RunLease() = default;
  // Creates and flocks DIR/<token>.lock. The caller must hold the directory lock (so no cleaner
  // sees the lock file before it is locked). Throws flexh2o::Error naming the file on failure.
  static RunLease start(const std::filesystem::path& dir);
  RunLease(RunLease&& o) noexcept;
  RunLease& operator=(RunLease&& o) noexcept;
  RunLease(const RunLease&) = delete;
  RunLease& operator=(const RunLease&) = delete;
  // Removes every file carrying the token, then the lock file (errors are logged, not thrown).
  ~RunLease();
  const std::string& token() const { return token_; }

 private:
  std::filesystem::path dir_;
  std::string token_;
  int fd_ = -1;
};

// The run token carried by a file name ("kv.L0.mb0.run-1f2e-0123456789abcdef.fhs",
// "w.x.fhs.run-1f2e-0123456789abcdef.tmp", "run-1f2e-0123456789abcdef.lock"), or empty.
std::string_view run_token_of(std::string_view file_name);

// Removes the files of every run whose lease is not held (crashed or killed runs), and
// temporary files of the fixed-name format before run tokens ("NAME.fhs.tmp"). `keep` is the
// caller's own token. Requires the directory lock. Returns the number of files removed.
size_t remove_stale_run_files(const std::filesystem::path& dir, std::string_view keep);

}  // namespace flexh2o
