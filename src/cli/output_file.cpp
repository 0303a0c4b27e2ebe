// OutputFile (checked, durable writes: temporary + rename, or append + fsync) and the check that
// an output is not the same file as an input. POSIX calls throughout: every return is checked.
#include "cli/output_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <optional>
#include <utility>

#include "core/error.h"
#include "offload/store_dir.h"

namespace flexh2o::cli {
namespace fs = std::filesystem;

namespace {

std::string describe(const NamedPath& p) { return (p.flag.empty() ? "" : p.flag + " ") + p.path.string(); }
std::string describe_input(const NamedPath& p) { return describe(p) + (p.path == "-" ? " (standard input)" : ""); }

// What a path names: an existing file (dev, ino; name empty) or, for a path that does not exist
// yet, the directory it would be created in plus its name. Symlinks are followed, dangling ones
// too, so "out -> in" and a later "in" compare equal.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;
  bool regular = false;  // only regular (or not yet created) files can clobber each other
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino && name == o.name; }
};

// An input "-" (standard input): the file it is redirected from, if any.
std::optional<FileId> identify_standard_input() {
  struct stat st {};
  if (::fstat(STDIN_FILENO, &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return FileId{st.st_dev, st.st_ino, "", true};
}

std::optional<FileId> identify(fs::path p) {
  for (int hops = 0; hops < 40; ++hops) {  // 40: the kernel's own symlink limit
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) return FileId{st.st_dev, st.st_ino, "", S_ISREG(st.st_mode)};
    if (errno != ENOENT) return std::nullopt;
    if (::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {  // dangling: where it would create
      std::error_code ec;
      fs::path to = fs::read_symlink(p, ec);
      if (ec) return std::nullopt;
      p = to.is_absolute() ? to : p.parent_path() / to;
      continue;
    }
    if (p.filename().empty()) return std::nullopt;
    fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (::stat(dir.c_str(), &st) != 0) return std::nullopt;
    return FileId{st.st_dev, st.st_ino, p.filename().string(), true};
  }
  return std::nullopt;
}

}  // namespace

bool names_standard_output(const std::filesystem::path& path, const char* flag) {
  if (path == "-" || path == "/dev/stdout") return true;
  struct stat out{}, p{};
  if (path.empty() || ::fstat(STDOUT_FILENO, &out) != 0 || ::stat(path.c_str(), &p) != 0 ||
      out.st_dev != p.st_dev || out.st_ino != p.st_ino)
    return false;
  if (S_ISREG(out.st_mode))
    FH_FAIL(flag, " ", path.string(), " is the file standard output is redirected to: give ", flag,
            " - to write the results there, or redirect standard output elsewhere");
  return true;
}

void check_can_write(const NamedPath& where) {
  if (where.path.empty()) return;
  const fs::path& p = where.path;
  if (p == "-") FH_FAIL(describe(where), " takes a file name: - (standard output) is not one here");
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) FH_FAIL("cannot write ", describe(where), ": it is a directory");
    if (::access(p.c_str(), W_OK) != 0) FH_FAIL("cannot write ", describe(where), ": ", std::strerror(errno));
    return;
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    FH_FAIL("cannot write ", describe(where), ": its directory ", dir.string(), " does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    FH_FAIL("cannot write ", describe(where), ": cannot create files in ", dir.string(), ": ", std::strerror(errno));
}

void check_outputs_are_not_inputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  std::vector<std::pair<const NamedPath*, FileId>> seen;
  for (const NamedPath& in : inputs) {
    if (in.path.empty()) continue;
    if (auto id = in.path == "-" ? identify_standard_input() : identify(in.path); id && id->name.empty())
      seen.emplace_back(&in, *id);
  }
  const size_t n_inputs = seen.size();
  for (const NamedPath& out : outputs) {
    if (out.path.empty()) continue;
    std::optional<FileId> id = identify(out.path);
    if (!id || !id->regular) continue;  // /dev/null twice is fine; an unreachable path fails at open
    for (size_t i = 0; i < seen.size(); ++i) {
      if (!(seen[i].second == *id)) continue;
      if (i < n_inputs)
        FH_FAIL(describe(out), " is the same file as ", describe_input(*seen[i].first),
                "; refusing to write over an input (choose another output path)");
      FH_FAIL(describe(out), " is the same file as ", describe(*seen[i].first),
              "; give each output its own path");
    }
    seen.emplace_back(&out, *id);
  }
}

std::vector<NamedPath> files_in(const std::string& flag, const fs::path& dir) {
  std::vector<NamedPath> v;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return v;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) v.push_back({flag, it->path()});
  return v;
}

OutputFile::OutputFile(NamedPath where, Mode mode) : where_(std::move(where)) {
  const fs::path& p = where_.path;
  struct stat st {};
  const bool exists = ::stat(p.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) FH_FAIL("cannot write ", describe(where_), ": it is a directory");
  const bool in_place = exists && !S_ISREG(st.st_mode);  // a device or FIFO: nothing to rename or truncate
  if (mode == Mode::kReplace && !in_place) {
    std::error_code ec;
    target_ = exists ? fs::canonical(p, ec) : p;  // through a symlink: replace its target
    if (ec) target_ = p;
    tmp_ = target_;
    tmp_ += ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      const int err = errno;
      tmp_.clear();
      fail("create a temporary file next to", err);
    }
    if (exists) (void)::fchmod(fd_, st.st_mode & 07777);  // the replacement keeps the old permissions
  } else {
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
    if (!in_place) flags |= mode == Mode::kAppend ? O_APPEND : O_TRUNC;
    fd_ = ::open(p.c_str(), flags, 0666);
    if (fd_ < 0) fail("open", errno);
  }
  struct stat opened {};
  regular_ = ::fstat(fd_, &opened) == 0 && S_ISREG(opened.st_mode);
}

OutputFile::OutputFile(OutputFile&& o) noexcept
    : where_(std::move(o.where_)), target_(std::move(o.target_)), tmp_(std::move(o.tmp_)), fd_(o.fd_),
      regular_(o.regular_), buf_(std::move(o.buf_)), lines_(o.lines_), failed_(o.failed_) {
  o.fd_ = -1;
  o.tmp_.clear();
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::fail(const char* what, int err) const {
  failed_ = true;
  FH_FAIL("cannot ", what, " ", describe(where_), ": ", std::strerror(err));
}

void OutputFile::write(std::string_view s) {
  FH_CHECK(fd_ >= 0, "write after commit to ", describe(where_));
  buf_.append(s);
  if (buf_.size() >= (size_t(1) << 16)) flush();
}

void OutputFile::flush() {
  FH_CHECK(fd_ >= 0, "flush after commit to ", describe(where_));
  size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      buf_.erase(0, done);
      fail("write", err);
    }
    lines_ += size_t(std::count(buf_.begin() + std::ptrdiff_t(done), buf_.begin() + std::ptrdiff_t(done + size_t(n)), '\n'));
    done += size_t(n);
  }
  buf_.clear();
}

void OutputFile::sync() {
  flush();
  if (!regular_) return;
  if (::fsync(fd_) != 0) fail("fsync", errno);
  if (!tmp_.empty()) return;
  // Written in place: the path must still name this file. Removed or replaced (rm, mv), every
  // later result would go where nobody looks for it.
  struct stat mine {}, named {};
  if (::fstat(fd_, &mine) != 0) fail("stat", errno);
  if (::stat(where_.path.c_str(), &named) != 0) {
    if (errno != ENOENT) fail("stat", errno);  // unreachable, not gone: say why
  } else if (named.st_dev == mine.st_dev && named.st_ino == mine.st_ino) {
    return;
  }
  failed_ = true;
  FH_FAIL(describe(where_), " no longer names the file this run writes: it was ",
          mine.st_nlink == 0 ? "removed, with the results written to it"
                             : "moved or replaced (the results written so far are in the file it was moved to)",
          "; stopping so that no more results go there");
}

void OutputFile::commit() {
  sync();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", errno);
  if (tmp_.empty()) return;
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail("rename the temporary file onto", errno);
  tmp_.clear();
  // The rename is durable once the directory is: fsync it (EINVAL: a filesystem without it).
  fs::path dir = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  const int rc = ::fsync(dfd), err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL) fail("fsync the directory of", err);
}

void write_text_file(const NamedPath& where, std::string_view text) {
  OutputFile f(where, OutputFile::Mode::kReplace);
  f.write(text);
  f.commit();
}

OutputLock::OutputLock(const NamedPath& where) : path_(where.path) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return;  // a FIFO, /dev/null: no lock
  check_can_write(where);  // a missing directory, no permission: said as for any output
  for (int attempt = 0;; ++attempt) {
    struct stat before {};
    const bool existed = ::stat(path_.c_str(), &before) == 0;
    // Read-write where it may (NFS emulates flock with fcntl locks, and an exclusive one needs a
    // writable descriptor); created as OutputFile creates it (0666 less the umask, through a
    // symlink to a file that does not exist yet).
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0 && (errno == EACCES || errno == EROFS)) fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      FH_FAIL("cannot open ", describe(where), ": ", std::strerror(e));
    }
    fd_ = fd;
    created_ = !existed;
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      const long pid = e == EWOULDBLOCK ? flock_holder(fd_) : 0;
      ::close(std::exchange(fd_, -1));  // never removed here: the file is the holder's
      created_ = false;
      if (e == EWOULDBLOCK)
        FH_FAIL("another run is writing ", describe(where), pid ? detail::concat(" (pid ", pid, ")") : std::string(),
                ": two runs appending to one file would interleave or repeat results. Wait for it to end (then "
                "--resume finishes what is left), or give another --output");
      // A filesystem without flock (NFS mounted nolock, some FUSE and cluster filesystems).
      std::cerr << "flexh2o: note: " << describe(where) << " cannot be locked (" << std::strerror(e)
                << "): nothing keeps a second run from writing it at the same time\n";
      return;
    }
    // Locked, and the path must still name the locked file: a run that removed its empty output
    // between this open and this lock leaves the lock on a file no longer there.
    struct stat mine {}, named {};
    if (::fstat(fd_, &mine) == 0 && ::stat(path_.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
        mine.st_ino == named.st_ino)
      return;
    ::close(std::exchange(fd_, -1));
    created_ = false;
    if (attempt == 8) FH_FAIL("cannot lock ", describe(where), ": it is replaced as often as it is opened");
  }
}

OutputLock::OutputLock(OutputLock&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), created_(std::exchange(o.created_, false)) {}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  struct stat st {};
  // Still empty, of this run's making and never opened as its output (the run failed before): absent, as it was.
  if (created_ && ::fstat(fd_, &st) == 0 && st.st_size == 0) ::unlink(path_.c_str());
  ::close(fd_);  // drops the lock
}

}  // namespace flexh2o::cli
