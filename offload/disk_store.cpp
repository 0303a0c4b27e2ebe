// DiskStore implementation: the O_DIRECT probe, atomic tmp+fsync+rename writes under per-run
// temporary names, aligned/bounced byte-range I/O split into 1 MiB requests (so the backend's
// queue depth is used), batches of aligned ranges in one submission (read_ranges/write_ranges),
// and XXH3-64 verification. The header layout is in store_header.cpp.
#include "offload/disk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <utility>

#include "offload/aligned_buffer.h"
#include "offload/detail/fd.h"
#include "offload/detail/reserve_file.h"

namespace flexh2o {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = size_t(1) << 20;        // one IoRequest
constexpr size_t kStageBytes = size_t(16) << 20;  // staging/bounce buffer for put/verify/unaligned
constexpr const char* kSuffix = ".fhs";

using detail::Fd;

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

void check_name(std::string_view name) {
  bool ok = !name.empty() && name.size() <= kStoreMaxString && name[0] != '.';
  for (char c : name)
    ok &= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-';
  FH_CHECK(ok, "invalid store entry name '", name, "' (use 1..", kStoreMaxString,
           " of [A-Za-z0-9._-], not starting with '.')");
}

// Appends requests of at most kChunk bytes covering [off, off+len) <-> mem.
void add_requests(std::vector<IoRequest>& reqs, int fd, uint64_t off, std::byte* mem, size_t len, IoOp op) {
  for (size_t p = 0; p < len; p += kChunk)
    reqs.push_back(IoRequest{fd, off + p, mem + p, std::min(kChunk, len - p), op, 0});
}

Status wrap(const Status& st, std::string_view what, const fs::path& path) {
  return {st.code(), detail::concat(what, " '", path.string(), "': ", st.message()), st.retryable()};
}

}  // namespace

struct DiskStore::Entry {
  Fd fd;
  bool writable = true;  // false: opened read only (reuse, verify, a read-only store)
  fs::path path;
  uint64_t payload_bytes = 0;
  bool hashed = false;
  uint64_t content_hash = 0;
  DType dtype = DType::U8;
  Shape shape;
};

namespace {

// Opens dir/name.fhs and checks its header: kNotFound (missing), kInvalid (another model identity
// or name), kCorrupt (bad magic/version/header hash, incomplete, truncated), kIoError.
Status load_entry(IoBackend& io, bool direct, bool writable, const fs::path& path, std::string_view identity,
                  std::string_view name, std::atomic<uint64_t>& bytes_read,
                  std::shared_ptr<DiskStore::Entry>* out) {
  Fd fd(::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | (direct ? O_DIRECT : 0)));
  if (fd.get() < 0) {
    int e = errno;
    return {e == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
            detail::concat("cannot open store file '", path.string(), "': ", std::strerror(e))};
  }
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0)
    return {StatusCode::kIoError, detail::concat("fstat '", path.string(), "': ", std::strerror(errno))};
  auto corrupt = [&](auto&&... why) {
    return Status(StatusCode::kCorrupt, detail::concat("store file '", path.string(), "' ", why...));
  };
  if (uint64_t(sb.st_size) < kStoreHeaderBytes)
    return corrupt("is truncated: ", sb.st_size, " bytes, smaller than its ", kStoreHeaderBytes, "-byte header");
  AlignedBuffer buf(kStoreHeaderBytes);
  IoRequest r{fd.get(), 0, buf.data(), kStoreHeaderBytes, IoOp::kRead, 0};
  if (Status st = io.submit_and_wait({&r, 1}); !st.ok()) return wrap(st, "reading header of", path);
  bytes_read += kStoreHeaderBytes;
  StoreHeader h;
  if (Status st = parse_store_header({buf.data(), kStoreHeaderBytes}, &h); !st.ok()) return corrupt(st.message());
  if (!h.complete) return corrupt("is incomplete (an interrupted write)");
  if (h.identity != identity)
    return {StatusCode::kInvalid, detail::concat("store file '", path.string(), "' belongs to store identity '",
                                                 h.identity, "', not '", identity, "'")};
  if (h.name != name)
    return {StatusCode::kInvalid,
            detail::concat("store file '", path.string(), "' holds entry '", h.name, "', not '", name, "'")};
  // The writer sizes every file to the page-padded payload, which the direct reads cover.
  const uint64_t need = kStoreHeaderBytes + align_up(h.payload_bytes);
  if (uint64_t(sb.st_size) < need)
    return corrupt("is truncated: ", sb.st_size, " bytes, expected at least ", need);
  auto e = std::make_shared<DiskStore::Entry>();
  e->fd = std::move(fd);
  e->writable = writable;
  e->path = path;
  e->payload_bytes = h.payload_bytes;
  e->hashed = h.hashed;
  e->content_hash = h.content_hash;
  e->dtype = h.dtype;
  e->shape = h.shape;
  *out = std::move(e);
  return Status::Ok();
}

}  // namespace

// --------------------------------------------------------------------------------------------
// open / lifetime
// --------------------------------------------------------------------------------------------

std::unique_ptr<DiskStore> DiskStore::open(const fs::path& dir, std::string identity, IoBackend& io,
                                           const DiskStoreOptions& opts) {
  FH_CHECK(!identity.empty() && identity.size() <= kStoreMaxString, "store identity must be 1..", kStoreMaxString,
           " bytes, got ", identity.size());
  std::error_code ec;
  // A link to a directory yet to be made (offload -> /mnt/nvme/offload) is followed, as --output
  // follows one to a file: the directory is made where it points.
  fs::path made = dir;
  for (int hops = 0; hops < 40 && fs::is_symlink(made, ec) && !fs::exists(made, ec); ++hops) {
    const fs::path to = fs::read_symlink(made, ec);
    if (ec) break;
    made = to.is_absolute() ? to : made.parent_path() / to;
  }
  fs::create_directories(made, ec);
  if (ec || !fs::is_directory(dir))
    FH_FAIL("offload directory '", dir.string(), "' cannot be created: ",
            ec ? ec.message() : std::string("a non-directory is in the way"));
  if (::access(dir.c_str(), W_OK) != 0 && (errno == EROFS || errno == EACCES))
    return open_read_only(dir, std::move(identity), io, opts);
  RunLease lease;
  {
    // The lease is created under the directory lock, so a cleaner never sees it unlocked.
    StoreDirLock lock = StoreDirLock::acquire(dir, opts.on_wait, StoreDirLock::Mode::kExclusive, opts.still_waiting);
    remove_stale_run_files(dir, {});
    lease = RunLease::start(dir);
  }
  fs::path probe = dir / (lease.token() + ".probe");  // a per-run name: removed with the lease at worst
  bool direct = opts.use_direct_io;
  std::string note = direct ? "O_DIRECT (page cache bypassed)" : "buffered I/O (O_DIRECT disabled by option)";
  Fd fd(::open(probe.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600));
  if (fd.get() < 0 && direct && errno == EINVAL) {
    direct = false;
    note = "filesystem refuses O_DIRECT (e.g. tmpfs): buffered I/O through the page cache";
    fd = Fd(::open(probe.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600));
  }
  if (fd.get() < 0)
    FH_FAIL("offload directory '", dir.string(), "' is not writable: ", std::strerror(errno));
  AlignedBuffer page(kIoAlign);
  ssize_t w = ::pwrite(fd.get(), page.data(), kIoAlign, 0);
  int werr = errno;
  if (w < 0 && direct && werr == EINVAL) {  // accepted the flag at open, refuses the I/O
    direct = false;
    note = "filesystem rejects O_DIRECT writes: buffered I/O through the page cache";
    fd = Fd(::open(probe.c_str(), O_RDWR | O_CLOEXEC));
    w = fd.get() < 0 ? -1 : ::pwrite(fd.get(), page.data(), kIoAlign, 0);
    werr = errno;
  }
  fd.reset();
  ::unlink(probe.c_str());
  if (w < 0) FH_FAIL("offload directory '", dir.string(), "' is not writable: ", std::strerror(werr));
  if (w != ssize_t(kIoAlign))  // a file-size limit (ulimit -f) or a disk with less than a page free
    FH_FAIL("offload directory '", dir.string(), "' took ", w, " of a ", kIoAlign,
            "-byte test write: is its disk full, or a file-size limit (ulimit -f) set?");
  return std::unique_ptr<DiskStore>(
      new DiskStore(dir, std::move(identity), io, direct, std::move(note), std::move(lease), opts));
}

std::unique_ptr<DiskStore> DiskStore::open_read_only(const fs::path& dir, std::string identity, IoBackend& io,
                                                     const DiskStoreOptions& opts) {
  // O_DIRECT as a read of an existing store file takes it (no file: nothing will be read).
  bool direct = false;
  std::string note = "read-only directory: buffered I/O through the page cache";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end && opts.use_direct_io; it.increment(ec)) {
    if (it->path().extension() != kSuffix) continue;
    Fd fd(::open(it->path().c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
    AlignedBuffer page(kIoAlign);
    if (fd.get() >= 0 && ::pread(fd.get(), page.data(), kIoAlign, 0) == ssize_t(kIoAlign)) {
      direct = true;
      note = "read-only directory: O_DIRECT (page cache bypassed)";
    }
    break;
  }
  auto s = std::unique_ptr<DiskStore>(new DiskStore(dir, std::move(identity), io, direct, std::move(note), RunLease(),
                                                    opts));
  s->read_only_ = true;
  return s;
}

Status DiskStore::read_only_error(std::string_view name) const {
  return {StatusCode::kIoError,
          detail::concat("offload directory '", dir_.string(), "' is not writable by this process (a read-only "
                         "mount, or another user's): cannot write '", name, "' there; build its weight files once "
                         "from a run that can write there, or give a writable --offload-dir")};
}

DiskStore::DiskStore(fs::path dir, std::string identity, IoBackend& io, bool direct, std::string note, RunLease lease,
                     const DiskStoreOptions& opts)
    : dir_(std::move(dir)),
      identity_(std::move(identity)),
      io_(io),
      direct_(direct),
      io_note_(std::move(note)),
      on_wait_(opts.on_wait),
      still_waiting_(opts.still_waiting),
      lease_(std::move(lease)) {}

DiskStore::~DiskStore() {
  std::lock_guard lk(mu_);
  entries_.clear();  // close every descriptor before lease_ removes this run's files
}

std::string DiskStore::run_name(std::string_view base) const {
  if (read_only_)
    FH_FAIL("offload directory '", dir_.string(), "' is not writable by this process (a read-only mount, or "
            "another user's): this run cannot home its KV cache there (home it on the GPU or the host with "
            "--percent, or give a writable --offload-dir)");
  std::string n = detail::concat(base, ".", lease_.token());
  check_name(n);
  return n;
}

StoreDirLock DiskStore::lock_dir(StoreDirLock::Mode mode) const {
  return StoreDirLock::acquire(dir_, on_wait_, mode, still_waiting_);
}

fs::path DiskStore::path_of(std::string_view name) const {
  check_name(name);
  return dir_ / (std::string(name) + kSuffix);
}

std::vector<std::string> DiskStore::list() const {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string f = it->path().filename().string();
    if (f.size() > 4 && f.ends_with(kSuffix)) names.push_back(f.substr(0, f.size() - 4));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::shared_ptr<DiskStore::Entry> DiskStore::entry(std::string_view name, Status* st) {
  fs::path path = path_of(name);
  std::lock_guard lk(mu_);
  if (auto it = entries_.find(name); it != entries_.end()) return it->second;
  std::shared_ptr<Entry> e;
  *st = load_entry(io_, direct_, !read_only_, path, identity_, name, bytes_read_, &e);
  if (st->ok()) entries_.emplace(std::string(name), e);
  return e;
}

// --------------------------------------------------------------------------------------------
// byte-range I/O
// --------------------------------------------------------------------------------------------

Status DiskStore::io(std::vector<IoRequest>& reqs, const Entry& e) {
  Status st = io_.submit_and_wait(reqs);
  uint64_t n[2] = {0, 0};
  for (const IoRequest& r : reqs) n[r.op == IoOp::kWrite] += r.done;
  bytes_read_ += n[0];
  bytes_written_ += n[1];
  if (!st.ok()) return wrap(st, reqs.front().op == IoOp::kRead ? "reading" : "writing", e.path);
  return st;
}

// [off, off+len) of the payload (may extend into the page padding). Aligned ranges go straight
// through; others bounce window by window (at most kStageBytes each).
Status DiskStore::rw(Entry& e, IoOp op, uint64_t off, size_t len, std::byte* mem) {
  std::vector<IoRequest> reqs;
  uint64_t fo = kStoreHeaderBytes + off;
  if (!direct_ || (is_io_aligned(fo) && is_io_aligned(uint64_t(len)) && is_io_aligned(mem))) {
    add_requests(reqs, e.fd.get(), fo, mem, len, op);
    return io(reqs, e);
  }
  AlignedBuffer bounce(std::min<uint64_t>(kStageBytes, align_up(fo + len) - align_down(fo)));
  for (uint64_t s = fo, end = fo + len; s < end;) {
    uint64_t a0 = align_down(s);
    uint64_t stop = std::min<uint64_t>(end, a0 + bounce.size());
    uint64_t a1 = align_up(stop);
    std::byte* user = mem + (s - fo);
    reqs.clear();
    if (op == IoOp::kRead) {
      add_requests(reqs, e.fd.get(), a0, bounce.data(), a1 - a0, IoOp::kRead);
      if (Status st = io(reqs, e); !st.ok()) return st;
      std::memcpy(user, bounce.data() + (s - a0), stop - s);
    } else {
      // Read-modify-write of partially covered edge pages.
      if (s != a0) add_requests(reqs, e.fd.get(), a0, bounce.data(), kIoAlign, IoOp::kRead);
      if (stop != a1 && (a1 - kIoAlign != a0 || s == a0))
        add_requests(reqs, e.fd.get(), a1 - kIoAlign, bounce.data() + (a1 - kIoAlign - a0), kIoAlign, IoOp::kRead);
      if (!reqs.empty())
        if (Status st = io(reqs, e); !st.ok()) return st;
      std::memcpy(bounce.data() + (s - a0), user, stop - s);
      reqs.clear();
      add_requests(reqs, e.fd.get(), a0, bounce.data(), a1 - a0, IoOp::kWrite);
      if (Status st = io(reqs, e); !st.ok()) return st;
    }
    s = stop;
  }
  return Status::Ok();
}

Status DiskStore::read(std::string_view name, uint64_t byte_offset, size_t length, void* dst) {
  Status st;
  auto e = entry(name, &st);
  if (!e) return st;
  FH_CHECK(byte_offset <= e->payload_bytes && length <= e->payload_bytes - byte_offset, "read of [",
           byte_offset, ", +", length, ") is outside entry '", name, "' of ", e->payload_bytes, " bytes");
  FH_CHECK(dst != nullptr || length == 0, "read into a null buffer");
  if (length == 0) return Status::Ok();
  return rw(*e, IoOp::kRead, byte_offset, length, static_cast<std::byte*>(dst));
}

Status DiskStore::write(std::string_view name, uint64_t byte_offset, size_t length, const void* src) {
  Status st;
  auto e = entry(name, &st);
  if (!e) return st;
  FH_CHECK(!e->hashed, "write() to '", name, "': entries made by put() are immutable");
  FH_CHECK(e->writable, "write() to '", name, "': the entry was opened read only (reuse())");
  FH_CHECK(byte_offset <= e->payload_bytes && length <= e->payload_bytes - byte_offset, "write of [",
           byte_offset, ", +", length, ") is outside entry '", name, "' of ", e->payload_bytes, " bytes");
  FH_CHECK(src != nullptr || length == 0, "write from a null buffer");
  if (length == 0) return Status::Ok();
  // The aligned path never writes through `src`; the bounce path only reads it.
  return rw(*e, IoOp::kWrite, byte_offset, length, static_cast<std::byte*>(const_cast<void*>(src)));
}

Status DiskStore::read_ranges(std::string_view name, std::span<const StoreRange> ranges) {
  return rw_ranges(name, IoOp::kRead, ranges);
}

Status DiskStore::write_ranges(std::string_view name, std::span<const StoreRange> ranges) {
  return rw_ranges(name, IoOp::kWrite, ranges);
}

// All checks (alignment, bounds, put() entries, overlapping writes) come before the one
// submit_and_wait; only the lazy open of the entry (a header read) may precede them.
Status DiskStore::rw_ranges(std::string_view name, IoOp op, std::span<const StoreRange> ranges) {
  const char* what = op == IoOp::kRead ? "read_ranges" : "write_ranges";
  for (size_t i = 0; i < ranges.size(); ++i) {
    const StoreRange& r = ranges[i];
    FH_CHECK(is_io_aligned(r.offset) && is_io_aligned(uint64_t(r.length)) && is_io_aligned(r.buf), what,
             " on '", name, "': range ", i, " is not ", kIoAlign, "-byte aligned: offset ", r.offset,
             ", length ", r.length, ", buffer ", r.buf);
    FH_CHECK(r.buf != nullptr || r.length == 0, what, " on '", name, "': range ", i, " has a null buffer");
  }
  Status st;
  auto e = entry(name, &st);
  if (!e) return st;
  FH_CHECK(op == IoOp::kRead || !e->hashed, "write_ranges() to '", name, "': entries made by put() are immutable");
  FH_CHECK(op == IoOp::kRead || e->writable, "write_ranges() to '", name, "': the entry was opened read only");
  const uint64_t padded = align_up(e->payload_bytes);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const StoreRange& r = ranges[i];
    FH_CHECK(r.offset <= padded && r.length <= padded - r.offset, what, " on '", name, "': range ", i, " [",
             r.offset, ", +", r.length, ") is outside the entry's ", padded, " padded payload bytes");
  }
  if (op == IoOp::kWrite) {
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) of non-empty ranges
    spans.reserve(ranges.size());
    for (const StoreRange& r : ranges)
      if (r.length > 0) spans.emplace_back(r.offset, r.offset + r.length);
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      FH_CHECK(spans[i - 1].second <= spans[i].first, "write_ranges on '", name, "': ranges [",
               spans[i - 1].first, ", ", spans[i - 1].second, ") and [", spans[i].first, ", ", spans[i].second,
               ") overlap");
  }
  std::vector<IoRequest> reqs;
  reqs.reserve(ranges.size());
  for (const StoreRange& r : ranges)
    add_requests(reqs, e->fd.get(), kStoreHeaderBytes + r.offset, static_cast<std::byte*>(r.buf), r.length, op);
  if (reqs.empty()) return Status::Ok();
  return io(reqs, *e);
}

// --------------------------------------------------------------------------------------------
// put / create / reuse / verify / remove
// --------------------------------------------------------------------------------------------

Status DiskStore::put(std::string_view name, TensorView payload) {
  FH_CHECK(payload.data != nullptr || payload.nbytes() == 0, "put('", name, "') with null data");
  if (read_only_) return read_only_error(name);
  return write_new(name, &payload, payload.nbytes());
}

Status DiskStore::create(std::string_view name, uint64_t payload_bytes) {
  if (read_only_) return read_only_error(name);
  return write_new(name, nullptr, payload_bytes);
}

// Writes NAME.fhs.<run token>.<n>.tmp (payload, then the header with the complete flag), fsyncs,
// renames, fsyncs the directory. Any failure removes the tmp file; a killed run's tmp files carry
// its token and are removed by the next open(). The name is never shared with another writer.
uint64_t DiskStore::entry_bytes(uint64_t payload_bytes) { return kStoreHeaderBytes + align_up(payload_bytes); }

uint64_t DiskStore::free_bytes() const {
  struct statvfs vs {};
  return ::statvfs(dir_.c_str(), &vs) == 0 ? uint64_t(vs.f_bavail) * vs.f_frsize : 0;
}

Status DiskStore::write_new(std::string_view name, const TensorView* payload, uint64_t bytes) {
  const fs::path final_path = path_of(name);
  fs::path tmp = final_path;
  tmp += detail::concat(".", lease_.token(), ".", tmp_seq_.fetch_add(1), ".tmp");
  const uint64_t total = entry_bytes(bytes);
  auto e = std::make_shared<Entry>();
  e->path = tmp;
  e->fd = Fd(::open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | (direct_ ? O_DIRECT : 0), 0644));
  if (e->fd.get() < 0)
    return {StatusCode::kIoError, detail::concat("cannot create '", tmp.string(), "': ", std::strerror(errno))};

  auto fail = [&](Status st) {
    e->fd.reset();
    ::unlink(tmp.c_str());
    if (st.code() != StatusCode::kNoSpace) return st;
    const uint64_t avail = free_bytes();
    return Status(StatusCode::kNoSpace,
                  detail::concat("offload directory '", dir_.string(), "' is out of space: entry '", name,
                                 "' needs ", total, " bytes, ", avail, " bytes free (", st.message(), ")"));
  };

  if (int rc = detail::reserve_file(e->fd.get(), total); rc != 0) {
    Status st(rc == ENOSPC || rc == EDQUOT ? StatusCode::kNoSpace : StatusCode::kIoError,
              detail::concat("fallocate of '", tmp.string(), "': ", std::strerror(rc)));
    return fail(st);
  }

  StoreHeader h;
  h.complete = true;
  h.payload_bytes = bytes;
  h.identity = identity_;
  h.name = std::string(name);
  if (payload) {
    h.dtype = payload->dtype;
    h.shape = payload->shape;
    h.hashed = true;
    // Stage, hash and write the payload 16 MiB at a time (16 requests: fills the queue).
    XXH3_state_t* xs = XXH3_createState();
    FH_CHECK(xs != nullptr, "XXH3_createState failed");
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(xs, &XXH3_freeState);
    XXH3_64bits_reset(xs);
    AlignedBuffer stage(std::min<uint64_t>(kStageBytes, align_up(bytes)));
    auto* src = static_cast<const std::byte*>(payload->data);
    std::vector<IoRequest> reqs;
    for (uint64_t p = 0; p < bytes; p += stage.size()) {
      size_t c = size_t(std::min<uint64_t>(stage.size(), bytes - p));
      std::memcpy(stage.data(), src + p, c);
      std::memset(stage.data() + c, 0, align_up(c) - c);
      XXH3_64bits_update(xs, src + p, c);
      reqs.clear();
      add_requests(reqs, e->fd.get(), kStoreHeaderBytes + p, stage.data(), align_up(c), IoOp::kWrite);
      if (Status st = io(reqs, *e); !st.ok()) return fail(st);
    }
    h.content_hash = XXH3_64bits_digest(xs);
  } else {
    h.dtype = DType::U8;
    h.shape = Shape{int64_t(bytes)};  // payload is the fallocated zeros
  }
  {
    AlignedBuffer hb(kStoreHeaderBytes);
    encode_store_header(h, std::span<std::byte, kStoreHeaderBytes>(hb.data(), kStoreHeaderBytes));
    std::vector<IoRequest> reqs{IoRequest{e->fd.get(), 0, hb.data(), kStoreHeaderBytes, IoOp::kWrite, 0}};
    if (Status st = io(reqs, *e); !st.ok()) return fail(st);
  }
  if (::fdatasync(e->fd.get()) != 0) {
    int err = errno;
    return fail({err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIoError,
                 detail::concat("fdatasync '", tmp.string(), "': ", std::strerror(err))});
  }
  {
    std::lock_guard lk(mu_);  // no reader may see the old entry's fd once the name is replaced
    if (::rename(tmp.c_str(), final_path.c_str()) != 0)
      return fail({StatusCode::kIoError, detail::concat("rename '", tmp.string(), "' -> '",
                                                        final_path.string(), "': ", std::strerror(errno))});
    e->path = final_path;
    e->payload_bytes = bytes;
    e->hashed = h.hashed;
    e->content_hash = h.content_hash;
    e->dtype = h.dtype;
    e->shape = h.shape;
    entries_.insert_or_assign(std::string(name), e);
  }
  Fd dfd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0 || ::fsync(dfd.get()) != 0)
    return {StatusCode::kIoError, detail::concat("fsync of directory '", dir_.string(), "': ", std::strerror(errno))};
  return Status::Ok();
}

Status DiskStore::reuse(std::string_view name, DType dtype, const Shape& shape, ReuseCheck check) {
  fs::path path = path_of(name);
  std::shared_ptr<Entry> e;
  // Read only: a reused entry is never written, and another user's file in a shared directory
  // may be readable but not writable.
  if (Status st = load_entry(io_, direct_, false, path, identity_, name, bytes_read_, &e); !st.ok()) return st;
  const uint64_t expect = TensorView{nullptr, dtype, shape}.nbytes();
  if (e->dtype != dtype || e->shape != shape || e->payload_bytes != expect)
    return {StatusCode::kInvalid,
            detail::concat("store file '", path.string(), "' holds ", dtype_name(e->dtype), " ", e->shape.str(), " (",
                           e->payload_bytes, " bytes), expected ", dtype_name(dtype), " ", shape.str(), " (", expect,
                           " bytes)")};
  if (check == ReuseCheck::kHash)
    if (Status st = hash_payload(*e); !st.ok()) return st;
  std::lock_guard lk(mu_);
  entries_.insert_or_assign(std::string(name), std::move(e));
  return Status::Ok();
}

Status DiskStore::verify(std::string_view name) {
  fs::path path = path_of(name);
  std::shared_ptr<Entry> e;
  if (Status st = load_entry(io_, direct_, false, path, identity_, name, bytes_read_, &e); !st.ok()) {
    if (st.code() == StatusCode::kInvalid) return {StatusCode::kCorrupt, st.message()};
    return st;
  }
  return hash_payload(*e);
}

// Reads the payload 16 MiB at a time through the entry's own descriptor and compares its XXH3-64
// with the header (nothing to do for entries made by create()). Window k is hashed on a helper
// thread while window k+1 is read into the other buffer, so a check costs about max(read, hash)
// rather than their sum (bench_io --case hash measures both).
Status DiskStore::hash_payload(const Entry& e) {
  if (!e.hashed) return Status::Ok();
  XXH3_state_t* xs = XXH3_createState();
  FH_CHECK(xs != nullptr, "XXH3_createState failed");
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(xs, &XXH3_freeState);
  XXH3_64bits_reset(xs);
  const size_t window = size_t(std::min<uint64_t>(kStageBytes, align_up(e.payload_bytes)));
  AlignedBuffer stage[2] = {AlignedBuffer(window), AlignedBuffer(e.payload_bytes > window ? window : 0)};
  std::future<void> hashing;  // of the window before the one being read; joined before returning
  std::vector<IoRequest> reqs;
  Status st;
  for (uint64_t p = 0, k = 0; p < e.payload_bytes; p += window, ++k) {
    const size_t c = size_t(std::min<uint64_t>(window, e.payload_bytes - p));
    std::byte* buf = stage[k % 2].data();
    reqs.clear();
    add_requests(reqs, e.fd.get(), kStoreHeaderBytes + p, buf, align_up(c), IoOp::kRead);
    st = io(reqs, e);
    if (hashing.valid()) hashing.get();
    if (!st.ok()) return st;
    hashing = std::async(std::launch::async, [xs, buf, c] { XXH3_64bits_update(xs, buf, c); });
  }
  if (hashing.valid()) hashing.get();
  const uint64_t got = XXH3_64bits_digest(xs);
  if (got != e.content_hash)
    return {StatusCode::kCorrupt,
            detail::concat("store file '", e.path.string(), "' is corrupt: payload hash ", hex(got),
                           " does not match its header's ", hex(e.content_hash))};
  return Status::Ok();
}

Status DiskStore::remove(std::string_view name) {
  fs::path path = path_of(name);
  if (read_only_) return read_only_error(name);
  std::lock_guard lk(mu_);
  if (auto it = entries_.find(name); it != entries_.end()) entries_.erase(it);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return {StatusCode::kIoError, detail::concat("cannot remove '", path.string(), "': ", std::strerror(errno))};
  return Status::Ok();
}

}  // namespace flexh2o
