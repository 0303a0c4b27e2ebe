// The one writer behind every file flexh2o writes (results, reports, traces), and the check that
// no output is the same file as an input or another output. Every write, flush, fsync, close
// and rename is checked; a failure throws flexh2o::Error naming the flag, the path and errno.
// Not here: what is written (the commands) or standard output (main() checks it at the end).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace flexh2o::cli {

// A file the command was told about: the flag that named it ("--input") and its path.
struct NamedPath {
  std::string flag;
  std::filesystem::path path;
};

// Throws (before anything is opened for writing) when an output is the same file as an input
// or as another output: same st_dev/st_ino, so a symlink, a hard link or a different spelling
// is caught; an output that does not exist yet is compared by its directory's identity and its
// name. Empty paths are skipped; inputs that do not exist are skipped (reading them fails later).
// An input "-" is standard input: the file it is redirected from, if it is one.
void check_outputs_are_not_inputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// Throws unless `where` looks writable now: an existing file that is not a directory and that
// this process may write, or an absent one in an existing directory it may write. Checked
// before long work, so that a typo in a path does not cost the run whose result it names.
void check_can_write(const NamedPath& where);

// Whether `path` names this process's standard output: "-", /dev/stdout, or the pipe, terminal
// or device fd 1 is (same st_dev/st_ino). Such an output is written through std::cout, so that
// no second writer with its own offset overwrites what std::cout prints. Throws when `path` is
// the regular file stdout is redirected to under another name: appending results there would
// skip the checks an output file gets (existing results, --resume, --overwrite).
bool names_standard_output(const std::filesystem::path& path, const char* flag);

// The regular files directly inside `dir` (a model or tokenizer directory), each named `flag`,
// for check_outputs_are_not_inputs. Not a directory: nothing.
std::vector<NamedPath> files_in(const std::string& flag, const std::filesystem::path& dir);

// An output file. Not thread-safe; move-only; the destructor never throws.
//  * kReplace: a regular (or absent) PATH is written as PATH.tmp.PID in the same directory (a
//    symlink's target is the one replaced) and commit() fsyncs it and renames it over PATH, so
//    readers see the old file or the whole new one, never a part. Destroyed without commit():
//    the temporary is removed and PATH is as it was.
//  * kAppend / kTruncate: PATH is opened for appending (kTruncate empties it first); sync()
//    writes what is buffered and fsyncs, so every line written before it survives a crash, and
//    throws when PATH no longer names the file (removed or replaced while the run wrote it).
// Outputs that are not regular files (/dev/null, /dev/full, a FIFO, a terminal) are written in
// place in every mode, and fsync is skipped for them (it means nothing there).
class OutputFile {
 public:
  enum class Mode { kReplace, kAppend, kTruncate };
  OutputFile(NamedPath where, Mode mode);
  OutputFile(OutputFile&& o) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Buffers `s`; large buffers are written out at once.
  void write(std::string_view s);
  // Writes the buffer to the file (no fsync).
  void flush();
  // flush() and fsync.
  void sync();
  // sync(), close and, for kReplace, the rename (and an fsync of the directory). Once only.
  void commit();

  const std::filesystem::path& path() const { return where_.path; }
  // A write, fsync, close or rename failed: what is buffered may be in the file in part, so the
  // caller writes nothing more (a retried line would be there twice).
  bool failed() const { return failed_; }
  // Complete lines of this object's that the file at path() holds: those written (a failed
  // write's torn line not among them); for kReplace, none until commit() has renamed the file.
  size_t lines_written() const { return tmp_.empty() ? lines_ : 0; }

 private:
  [[noreturn]] void fail(const char* what, int err) const;

  NamedPath where_;
  std::filesystem::path target_, tmp_;  // tmp_ empty: written in place
  int fd_ = -1;
  bool regular_ = false;
  std::string buf_;
  size_t lines_ = 0;
  mutable bool failed_ = false;
};

// An exclusive flock(2) on a results file, held for a whole run and taken before the file's
// prior results are read: a second run writing the same file (a requeued job, --overwrite beside
// a live run) is refused instead of interleaving lines with this one. The kernel drops the lock
// when the process ends, however it ends. An absent file is created to be locked, and removed
// again on destruction while it is still empty, unless keep() was called (the run opened it as
// its output); a path that is not a regular file (a FIFO, /dev/null) is not locked. Move-only;
// the destructor never throws.
class OutputLock {
 public:
  // Throws Error naming the flag, the path and (from /proc/locks, when it says) the holder's pid
  // when another process holds the lock, or when the file cannot be opened.
  explicit OutputLock(const NamedPath& where);
  OutputLock(OutputLock&& o) noexcept;
  OutputLock& operator=(OutputLock&&) = delete;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  ~OutputLock();
  void keep() { created_ = false; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool created_ = false;
};

// Writes `text` to `where` as one kReplace OutputFile.
void write_text_file(const NamedPath& where, std::string_view text);

}  // namespace flexh2o::cli
