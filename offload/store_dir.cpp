// The offload directory's locks and per-run file ownership (store_dir.h): flock on a directory
// lock file and on one lease file per run, and the cleanup of files left by runs that died.
#include "offload/store_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace flexh2o {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDirLockName = "flexh2o.lock";
constexpr const char* kLeaseSuffix = ".lock";

bool is_hex(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// "run-<hex>-<16 hex>"
bool is_token(std::string_view c) {
  if (!c.starts_with("run-")) return false;
  c.remove_prefix(4);
  const size_t dash = c.find('-');
  return dash != std::string_view::npos && is_hex(c.substr(0, dash)) && c.size() - dash - 1 == 16 &&
         is_hex(c.substr(dash + 1));
}

std::string new_token() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t r = (uint64_t(rd()) << 32 | rd()) ^
                     uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                     (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
  char b[64];
  std::snprintf(b, sizeof b, "run-%lx-%016llx", static_cast<unsigned long>(::getpid()),
                static_cast<unsigned long long>(r));
  return b;
}

void unlink_logged(const fs::path& p) {
  if (::unlink(p.c_str()) != 0 && errno != ENOENT)
    std::fprintf(stderr, "flexh2o: cannot remove %s: %s\n", p.c_str(), std::strerror(errno));
}

}  // namespace

std::string_view run_token_of(std::string_view name) {
  while (!name.empty()) {
    const size_t dot = name.find('.');
    const std::string_view c = name.substr(0, dot);
    if (is_token(c)) return c;
    if (dot == std::string_view::npos) break;
    name.remove_prefix(dot + 1);
  }
  return {};
}

// ---- StoreDirLock ----------------------------------------------------------------------------

long flock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  char want[64];
  std::snprintf(want, sizeof want, "%02x:%02x:%lu", major(st.st_dev), minor(st.st_dev), (unsigned long)st.st_ino);
  std::ifstream locks("/proc/locks");
  const long self = long(::getpid());
  for (std::string line; std::getline(locks, line);) {  // "1: FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF"
    std::istringstream is(line);
    std::string id, kind, advisory, mode, file;
    long pid = 0;
    if (is >> id >> kind >> advisory >> mode >> pid >> file && kind == "FLOCK" && file == want && pid != self)
      return pid;
  }
  return 0;
}

StoreDirLock StoreDirLock::acquire(const fs::path& dir, const std::function<void(long holder)>& on_wait, Mode mode,
                                   const std::function<void()>& still_waiting) {
  const int op = mode == Mode::kShared ? LOCK_SH : LOCK_EX;
  const fs::path path = dir / kDirLockName;
  StoreDirLock l;
  l.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (l.fd_ < 0 && (errno == EROFS || errno == EACCES)) {
    // A directory this process cannot write (a read-only mount of a store built elsewhere): flock
    // works on a descriptor opened for reading. On a read-only filesystem without a lock file no
    // run can change anything there: there is nothing to lock against.
    const int first = errno;
    l.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (l.fd_ < 0 && errno == ENOENT && first == EROFS) return l;
    if (l.fd_ < 0) errno = first;
  }
  if (l.fd_ < 0)
    FH_FAIL("offload directory '", dir.string(), "' is not usable: cannot open its lock file '", path.string(),
            "': ", std::strerror(errno));
  if (::flock(l.fd_, op | LOCK_NB) == 0) return l;
  if (errno == EWOULDBLOCK) {
    if (on_wait) on_wait(flock_holder(l.fd_));
    int rc;
    if (still_waiting) {
      do {
        ::usleep(50000);
        still_waiting();  // may throw: l closes its descriptor, holding nothing
      } while ((rc = ::flock(l.fd_, op | LOCK_NB)) != 0 && (errno == EWOULDBLOCK || errno == EINTR));
    } else {
      while ((rc = ::flock(l.fd_, op)) != 0 && errno == EINTR) {
      }
    }
    if (rc == 0) return l;
  }
  FH_FAIL("cannot lock '", path.string(), "': ", std::strerror(errno));
}

StoreDirLock::StoreDirLock(StoreDirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

StoreDirLock& StoreDirLock::operator=(StoreDirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

StoreDirLock::~StoreDirLock() { release(); }

void StoreDirLock::release() noexcept {
  if (fd_ >= 0) ::close(fd_);  // closing the only descriptor drops the flock
  fd_ = -1;
}

// ---- RunLease --------------------------------------------------------------------------------

RunLease RunLease::start(const fs::path& dir) {
  RunLease r;
  r.dir_ = dir;
  r.token_ = new_token();
  const fs::path path = dir / (r.token_ + kLeaseSuffix);
  r.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (r.fd_ < 0)
    FH_FAIL("offload directory '", dir.string(), "' is not usable: cannot create '", path.string(),
            "': ", std::strerror(errno));
  if (::flock(r.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    FH_FAIL("cannot lock '", path.string(), "': ", std::strerror(e));
  }
  return r;
}

RunLease::RunLease(RunLease&& o) noexcept
    : dir_(std::move(o.dir_)), token_(std::exchange(o.token_, {})), fd_(std::exchange(o.fd_, -1)) {}

RunLease& RunLease::operator=(RunLease&& o) noexcept {
  if (this != &o) {
    RunLease old(std::move(*this));
    dir_ = std::move(o.dir_);
    token_ = std::exchange(o.token_, {});
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

RunLease::~RunLease() {
  if (fd_ < 0) return;
  const std::string lock_name = token_ + kLeaseSuffix;
  std::error_code ec;  // a destructor: a failed listing leaves files to the next run's cleanup
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string f = it->path().filename().string();
    if (f != lock_name && run_token_of(f) == token_) unlink_logged(it->path());
  }
  unlink_logged(dir_ / lock_name);  // last: until now the lease keeps cleaners off our files
  ::close(fd_);
}

// ---- cleanup ---------------------------------------------------------------------------------

size_t remove_stale_run_files(const fs::path& dir, std::string_view keep) {
  std::map<std::string, std::vector<fs::path>, std::less<>> by_token;
  std::set<std::string, std::less<>> leased;  // tokens with a lease file
  size_t removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string f = it->path().filename().string();
    const std::string_view t = run_token_of(f);
    if (t.empty()) {
      if (f.ends_with(".fhs.tmp")) {  // the fixed tmp name of store files before run tokens
        unlink_logged(it->path());
        ++removed;
      }
      continue;
    }
    if (t == keep) continue;
    if (f == std::string(t) + kLeaseSuffix) leased.emplace(t);
    else by_token[std::string(t)].push_back(it->path());
  }
  for (const std::string& t : leased) by_token.try_emplace(t);
  for (auto& [token, files] : by_token) {
    int fd = -1;
    const fs::path lease = dir / (token + kLeaseSuffix);
    if (leased.count(token)) {
      // Read-write where it may (NFS emulates flock with fcntl locks, which need it), else read
      // only (another user's 0644 lease). A lease that cannot be opened (out of descriptors) or
      // locked is taken as alive: only a lock this cleaner holds proves its run gone. One gone
      // since the listing was its run's last act, after removing its files.
      fd = ::open(lease.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS))
        fd = ::open(lease.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 && errno != ENOENT) continue;
      if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // held (or unknowable): the run is alive
        ::close(fd);
        continue;
      }
    }
    // Without a lease file (or with one nobody holds) the run is gone: its files are garbage.
    for (const fs::path& p : files) {
      unlink_logged(p);
      ++removed;
    }
    if (fd >= 0) {
      unlink_logged(lease);
      ++removed;
      ::close(fd);
    }
  }
  return removed;
}

}  // namespace flexh2o
