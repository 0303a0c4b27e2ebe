// DiskStore: the NVMe tier's offload directory. One file per entry (a weight tensor or a KV file):
// a 4096-byte header (store_header.h: magic, version, store identity, entry name, dtype, shape,
// payload size, XXH3-64 content hash, complete flag) followed by the payload padded to 4096 bytes.
// Several runs may share a directory (store_dir.h): weight files appear atomically and are never
// changed in place, and per-run files carry the run's token and go when the run does.
// Not a cache policy: which tensors live here is the planner's decision; this only stores bytes.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "offload/aligned_buffer.h"
#include "offload/io_backend.h"
#include "offload/store_dir.h"
#include "offload/store_header.h"

namespace flexh2o {

// One page-aligned range of an entry's payload for read_ranges()/write_ranges().
struct StoreRange {
  uint64_t offset = 0;   // byte offset in the payload; a multiple of kIoAlign
  size_t length = 0;     // bytes; a multiple of kIoAlign (0: nothing to do)
  void* buf = nullptr;   // caller-owned host memory, kIoAlign-aligned, `length` bytes; only read by
                         // write_ranges(); must stay valid until the call returns
};

struct DiskStoreOptions {
  // Try O_DIRECT (kept only if the filesystem accepts it). false forces buffered I/O through the
  // page cache (debugging, tests of the fallback; tmpfs accepts O_DIRECT since Linux 6.6).
  bool use_direct_io = true;
  // Called once (may be empty) when open() or lock_dir() has to wait for another run that holds
  // the directory lock, before blocking, with that run's pid (0: unknown): a caller can say why
  // nothing seems to happen.
  std::function<void(long holder)> on_wait;
  // Called about every 50 ms while waiting (empty: the wait blocks in flock); it may throw to
  // give up waiting (a stop signal), and the exception leaves open() or lock_dir().
  std::function<void()> still_waiting;
};

// How much of a reused entry to check before trusting it.
enum class ReuseCheck : uint8_t {
  kHash,        // header, size, and the payload's XXH3-64 against the header (the default)
  kHeaderOnly,  // header and size only: a flipped payload byte goes unnoticed (--trust-store)
};

class DiskStore {
 public:
  // Creates `dir` if needed and probes it: throws flexh2o::Error naming the directory when it cannot
  // be created or written. O_DIRECT is used when the filesystem accepts it (tmpfs does not: then
  // buffered I/O, see io_note()). `identity` (1..kStoreMaxString bytes; the engine passes a
  // fixed-length digest, store_identity.h) is stamped into every header; files with another
  // identity are never reused. Under the directory lock it starts this store's run lease and
  // removes the files of runs that died (store_dir.h). A directory this process cannot write
  // (EROFS, EACCES: a read-only mount of a store built elsewhere) opens read-only: its files are
  // read as they are, nothing is cleaned or leased, and put/create/remove return kIoError
  // naming the directory (run_name throws). `io` must outlive the store.
  static std::unique_ptr<DiskStore> open(const std::filesystem::path& dir, std::string identity,
                                         IoBackend& io, const DiskStoreOptions& opts = {});
  // Closes every entry and removes this run's per-run files (run_name()) and its lease.
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Entry names: 1..kStoreMaxString of [A-Za-z0-9._-], not starting with '.'; anything else throws.
  // File of an entry: dir / (name + ".fhs").
  std::filesystem::path path_of(std::string_view name) const;

  // `base` + "." + this run's token: a valid entry name no other run uses, removed when this store
  // closes (also after an exception; a killed run's are removed by the next open()). For KV files.
  std::string run_name(std::string_view base) const;
  const std::string& run_token() const { return lease_.token(); }

  // The directory lock (store_dir.h), for a caller that checks and builds many entries as one
  // step: shared while it only reuses (concurrent runs check at the same time), exclusive while
  // it writes (so concurrent runs build each file once). Blocks; calls
  // DiskStoreOptions::on_wait first when another run holds it in a conflicting mode.
  StoreDirLock lock_dir(StoreDirLock::Mode mode) const;

  // Writes a weight file once, atomically: NAME.fhs.<run token>.<n>.tmp is written, fsynced, renamed,
  // so a crash or ENOSPC never leaves a partial file under the real name and concurrent writers of
  // one name never share a temporary file (an existing file is replaced; readers that opened it
  // keep reading the old, unchanged bytes).
  // The payload may have any alignment (it is bounced through aligned buffers).
  // Errors: kNoSpace (tmp removed; the message names the directory and bytes needed), kIoError.
  [[nodiscard]] Status put(std::string_view name, TensorView payload);

  // Ok when NAME.fhs exists, is complete, its header matches this store's identity and the
  // expected dtype/shape (payload size = numel * dtype size), the file is not truncated, and (with
  // ReuseCheck::kHash, for entries made by put()) the payload hashes to the header's XXH3-64. The
  // entry is then open and ready for read(). Otherwise the reason, naming the file: kNotFound
  // (missing), kInvalid (another identity, name, dtype or shape), kCorrupt (bad header,
  // incomplete, truncated, payload hash mismatch), kIoError: the caller rebuilds it with put().
  // Hashing reads the whole payload once (bench_io measures the cost).
  [[nodiscard]] Status reuse(std::string_view name, DType dtype, const Shape& shape,
                             ReuseCheck check = ReuseCheck::kHash);

  // Re-reads the payload and compares its XXH3-64 with the header. kCorrupt naming the file on
  // mismatch, truncation or a bad header; kNotFound if missing. Entries made by create() carry no
  // hash (their content changes) and only get the header and size checks.
  [[nodiscard]] Status verify(std::string_view name);

  // Creates (or replaces) a zero-filled entry of `payload_bytes` for data written in place (KV
  // cache files), its blocks allocated now where the filesystem has fallocate; elsewhere (ext2,
  // some network and FUSE filesystems) it is sparse and a full disk shows at a later write, as
  // kNoSpace. Not hashed. Errors: kNoSpace (nothing left behind), kIoError.
  [[nodiscard]] Status create(std::string_view name, uint64_t payload_bytes);

  // Byte-range I/O on an entry's payload; blocks until done. Any offset/length/address works:
  // ranges that are 4096-aligned (offset, length and buffer) go straight to the device, others
  // bounce through an aligned buffer (writes then read-modify-write the edge pages, so concurrent
  // unaligned writes must not share a 4096-byte page). Out-of-range is misuse (throws); so is
  // write() to an entry made by put() or opened by reuse() (read only). Opens entries written by
  // an earlier run on first use.
  // Thread-safe: concurrent reads and writes of disjoint ranges/entries; put/create/remove of a
  // name must not race with I/O on that name.
  [[nodiscard]] Status read(std::string_view name, uint64_t byte_offset, size_t length, void* dst);
  [[nodiscard]] Status write(std::string_view name, uint64_t byte_offset, size_t length,
                             const void* src);

  // Many aligned ranges of one entry moved in ONE IoBackend::submit_and_wait (ranges over 1 MiB
  // are split into 1 MiB requests), for a KV step's row blocks. Blocks until all are done.
  // Every offset, length and buffer address must be a multiple of kIoAlign (4096), and every range
  // must lie within the padded payload [0, align_up(payload bytes)) (the last page's padding may
  // be covered); otherwise flexh2o::Error is thrown before any payload I/O (only an entry's lazy
  // open, a header read, can come first: the bounds need its size). write_ranges() also
  // throws for an entry made by put() and for ranges that overlap each other (the order of writes
  // within one submission is unspecified); whole pages are written, with no read-modify-write.
  // Errors as read()/write(): kIoError, kNoSpace, kShortIo, and the entry's open errors; on failure
  // some ranges may be partly transferred. Works with O_DIRECT and buffered files alike.
  // Bytes are counted in bytes_read()/bytes_written(). Thread-safety as read()/write().
  [[nodiscard]] Status read_ranges(std::string_view name, std::span<const StoreRange> ranges);
  [[nodiscard]] Status write_ranges(std::string_view name, std::span<const StoreRange> ranges);

  // Deletes the entry's file (no error if absent).
  [[nodiscard]] Status remove(std::string_view name);
  // Names of all *.fhs files in the directory (other runs' too), sorted.
  std::vector<std::string> list() const;

  const std::filesystem::path& dir() const { return dir_; }
  // The bytes an entry of `payload_bytes` takes on disk (header and page padding included).
  static uint64_t entry_bytes(uint64_t payload_bytes);
  // Bytes the directory's filesystem has free for this process now (statvfs; 0 if unknown).
  uint64_t free_bytes() const;
  bool direct_io() const { return direct_; }
  bool read_only() const { return read_only_; }
  const std::string& io_note() const { return io_note_; }  // "O_DIRECT" or why buffered
  // Bytes moved to/from the files (headers and page padding included), for the run report.
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }

  struct Entry;  // open file + header fields (disk_store.cpp)

 private:
  DiskStore(std::filesystem::path dir, std::string identity, IoBackend& io, bool direct, std::string note,
            RunLease lease, const DiskStoreOptions& opts);
  static std::unique_ptr<DiskStore> open_read_only(const std::filesystem::path& dir, std::string identity,
                                                   IoBackend& io, const DiskStoreOptions& opts);
  [[nodiscard]] Status read_only_error(std::string_view name) const;
  std::shared_ptr<Entry> entry(std::string_view name, Status* st);
  [[nodiscard]] Status io(std::vector<IoRequest>& reqs, const Entry& e);
  [[nodiscard]] Status rw(Entry& e, IoOp op, uint64_t off, size_t len, std::byte* mem);
  [[nodiscard]] Status rw_ranges(std::string_view name, IoOp op, std::span<const StoreRange> ranges);
  [[nodiscard]] Status write_new(std::string_view name, const TensorView* payload, uint64_t bytes);
  [[nodiscard]] Status hash_payload(const Entry& e);

  std::filesystem::path dir_;
  std::string identity_;
  IoBackend& io_;
  bool direct_;
  bool read_only_ = false;
  std::string io_note_;
  std::function<void(long holder)> on_wait_;
  std::function<void()> still_waiting_;
  std::mutex mu_;  // guards entries_
  std::map<std::string, std::shared_ptr<Entry>, std::less<>> entries_;
  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0};
  std::atomic<uint64_t> tmp_seq_{0};  // makes temporary names unique within the run
  RunLease lease_;  // ~DiskStore() closes entries_ first; then this removes the run's files
};

}  // namespace flexh2o
