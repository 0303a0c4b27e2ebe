// bench_io: the NVMe tier's DiskStore against baselines measured in the same run, O_DIRECT so
// every pass reads the device (buffered I/O is flagged). Three cases:
//   seq — sequential read of one multi-GB file: io_uring (QD-deep sliding window, with and without
//         registered buffers, and DiskStore::read) vs O_DIRECT pread (1 thread; QD threads) and fio.
//   kv  — a disk-homed KV cache in decode: one read_ranges of every row block's rows [0, len) and
//         one write_ranges of one 4 KiB page per block, each vs a sequential transfer of as many
//         bytes, for io_uring at several queue depths and the 1-thread pread fallback.
//   hash — what hashing a reused weight file costs: XXH3-64 over a payload in memory vs reading
//         it from disk (DiskStore::read), and DiskStore::verify (read + hash, as every reuse does).
// Usage: bench_io [--case seq,kv,hash] [--dir DIR] [--size-gib G] [--block-kib K] [--qd N] [--reps R]
//                 [--kv SxHxDxCAPxLEN,...] [--kv-qd N,...] [--keep] [--json FILE]
#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/aligned_buffer.h"
#include "offload/disk_store.h"
#include "offload/io_backend.h"

#include <xxhash.h>

namespace {

using namespace flexh2o;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Args {
  fs::path dir = "bench_io_data";
  double size_gib = 2.0;
  size_t block = size_t(1) << 20;
  unsigned qd = 8;
  int reps = 3;
  bool keep = false;
  std::string json;
  std::vector<std::string> cases = {"seq", "kv", "hash"};
  // seqs x kv_heads x head_dim x cap x len: OPT-6.7B-like rows of 256 B; OPT-1.3B-like rows of
  // 128 B; many 4 KiB blocks (32 seqs, 32 tokens).
  std::vector<std::string> kv_shapes = {"8x32x128x2048x1024", "8x32x64x512x256", "32x32x64x256x32"};
  std::vector<unsigned> kv_qds = {16, 64, 128, 256};  // 128: the engine's default (IoOptions)
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  for (size_t p = 0;;) {
    size_t q = s.find(sep, p);
    out.push_back(s.substr(p, q - p));
    if (q == std::string::npos) return out;
    p = q + 1;
  }
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

std::string fs_type(const fs::path& p) {
  std::string out = run_capture("df -T '" + p.string() + "' 2>/dev/null | tail -1");
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// Best (max) GB/s over reps of fn(), which reads `bytes`.
double best_gbs(int reps, uint64_t bytes, const std::function<void()>& fn) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, double(bytes) / s / 1e9);
  }
  return best;
}

void check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "bench_io: %s: %s\n", what, st.message().c_str());
    std::exit(1);
  }
}

// Reads [start, start+bytes) of fd with `io`: batches of `window` blocks, qd in flight.
void read_with_backend(IoBackend& io, int fd, uint64_t start, uint64_t bytes, size_t block,
                       AlignedBuffer& window) {
  size_t nblk = window.size() / block;
  std::vector<IoRequest> reqs;
  for (uint64_t off = 0; off < bytes;) {
    reqs.clear();
    for (size_t b = 0; b < nblk && off < bytes; ++b, off += block)
      reqs.push_back({fd, start + off, window.data() + b * block, size_t(std::min<uint64_t>(block, bytes - off)),
                      IoOp::kRead, 0});
    check(io.submit_and_wait(reqs), "read");
  }
}

// ============================================================================================
// seq: one multi-GB file read sequentially
// ============================================================================================

// Returns the case's results (the top-level keys of --json, as before the kv case existed).
nlohmann::json run_seq(const Args& a) {
  const uint64_t bytes = align_down(uint64_t(a.size_gib * double(1ull << 30)), a.block);

  std::string why;
  IoBackendOptions uo;
  uo.queue_depth = a.qd;
  auto uring = make_io_backend(IoBackendChoice::kUring, &why, uo);
  std::printf("== seq ==\nbackend: %s\n", why.c_str());
  IoBackendOptions po;
  po.pread_threads = a.qd;
  auto pool = make_io_backend(IoBackendChoice::kPread, nullptr, po);
  IoBackend& io = uring ? *uring : *pool;

  auto store = DiskStore::open(a.dir, "bench_io", io);
  const std::string disk = fs_type(fs::absolute(a.dir));
  std::printf("dir: %s (%s)\nfile I/O: %s\n", fs::absolute(a.dir).c_str(), disk.c_str(), store->io_note().c_str());
  if (!store->direct_io()) std::printf("warning: buffered I/O: numbers include the page cache\n");

  // Create the file once (reused with --keep).
  const std::string name = "seq";
  const std::string fio_bin = run_capture("command -v fio 2>/dev/null");
  double write_gbs = 0;
  std::vector<std::string> entries = store->list();
  bool have = std::find(entries.begin(), entries.end(), name) != entries.end();
  AlignedBuffer window(std::max<size_t>(a.block * 64, size_t(64) << 20));
  if (have) {
    // Reuse only if the size matches (KV-style entries carry U8 [bytes]).
    have = store->reuse(name, DType::U8, Shape{int64_t(bytes)}).ok();
  }
  if (!have) {
    std::printf("creating %.2f GiB store file...\n", double(bytes) / double(1ull << 30));
    check(store->create(name, bytes), "create");
    for (size_t i = 0; i < window.size(); i += 8) std::memcpy(window.data() + i, &i, 8);
    auto t0 = Clock::now();
    for (uint64_t off = 0; off < bytes; off += window.size())
      check(store->write(name, off, size_t(std::min<uint64_t>(window.size(), bytes - off)), window.data()), "write");
    ::sync();
    write_gbs = double(bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
    std::printf("  written at %.2f GB/s (store write path, then sync)\n", write_gbs);
  }
  const fs::path file = store->path_of(name);
  int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) fd = ::open(file.c_str(), O_RDONLY);
  const uint64_t start = kStoreHeaderBytes;

  std::printf("\nsequential read of %.2f GiB, %zu KiB blocks, QD %u, best of %d interleaved rounds:\n",
              double(bytes) / double(1ull << 30), a.block >> 10, a.qd, a.reps);
  nlohmann::json res;
  auto report = [&](const std::string& key, const std::string& label, double gbs) {
    std::printf("  %-40s %7.3f GB/s\n", label.c_str(), gbs);
    res[key] = gbs;
  };

  // Each variant reads the whole range once per round; rounds interleave the variants so that
  // noise from other tenants of the disk spreads over all of them.
  struct Variant {
    std::string key, label;
    std::function<void()> run;
    double best = 0;
  };
  std::vector<Variant> vs;
  const std::string qd = std::to_string(a.qd);
  // Baseline 1: plain O_DIRECT pread, one thread, one block at a time.
  vs.push_back({"pread_1thread_gbs", "pread O_DIRECT, 1 thread", [&] {
                  for (uint64_t off = 0; off < bytes; off += a.block) {
                    for (size_t done = 0; done < a.block;) {
                      ssize_t r = ::pread(fd, window.data() + done, a.block - done, off_t(start + off + done));
                      if (r <= 0) {
                        std::perror("pread");
                        std::exit(1);
                      }
                      done += size_t(r);
                    }
                  }
                }});
  // Baseline 2: the pread backend with QD threads (same batches as io_uring).
  vs.push_back({"pread_pool_gbs", "pread O_DIRECT, " + qd + " threads",
                [&] { read_with_backend(*pool, fd, start, bytes, a.block, window); }});
  if (uring) {
    vs.push_back({"uring_gbs", "io_uring QD" + qd,
                  [&] { read_with_backend(*uring, fd, start, bytes, a.block, window); }});
    // Registered (fixed) buffers: registered for this variant only.
    vs.push_back({"uring_fixed_gbs", "io_uring QD" + qd + " registered buffers", [&] {
                    std::span<std::byte> reg[] = {window.span()};
                    check(uring->register_buffers(reg), "register_buffers");
                    read_with_backend(*uring, fd, start, bytes, a.block, window);
                    uring->unregister_buffers();
                  }});
    // DiskStore::read of 64 MiB ranges (split into 1 MiB requests internally), same ring.
    vs.push_back({"store_read_gbs", "DiskStore::read (io_uring, 1 MiB reqs)", [&] {
                    for (uint64_t off = 0; off < bytes; off += window.size())
                      check(store->read(name, off, size_t(std::min<uint64_t>(window.size(), bytes - off)),
                                        window.data()),
                            "read");
                  }});
  }
  for (int r = 0; r < a.reps; ++r)
    for (Variant& v : vs) v.best = std::max(v.best, best_gbs(1, bytes, v.run));
  double pread1 = 0, pool_gbs = 0, uring_gbs = 0, uring_fixed_gbs = 0;
  for (const Variant& v : vs) {
    report(v.key, v.label, v.best);
    if (v.key == "pread_1thread_gbs") pread1 = v.best;
    if (v.key == "pread_pool_gbs") pool_gbs = v.best;
    if (v.key == "uring_gbs") uring_gbs = v.best;
    if (v.key == "uring_fixed_gbs") uring_fixed_gbs = v.best;
  }

  // Baseline 3: fio with io_uring, same block size and depth, if installed.
  double fio_gbs = 0;
  if (!fio_bin.empty()) {
    std::string cmd = "fio --name=seq --readonly --filename='" + file.string() + "' --rw=read --bs=" +
                      std::to_string(a.block) + " --iodepth=" + std::to_string(a.qd) +
                      " --ioengine=io_uring --direct=1 --offset=" + std::to_string(start) +
                      " --size=" + std::to_string(bytes) + " --output-format=json 2>/dev/null";
    try {
      auto j = nlohmann::json::parse(run_capture(cmd));
      fio_gbs = j["jobs"][0]["read"]["bw_bytes"].get<double>() / 1e9;
      report("fio_gbs", "fio io_uring (same bs/QD)", fio_gbs);
    } catch (const std::exception& e) {
      std::printf("  fio failed: %s\n", e.what());
    }
  } else {
    std::printf("  fio: not installed (skipped)\n");
  }
  ::close(fd);

  double best_base = std::max({pread1, pool_gbs, fio_gbs});
  double ratio = best_base > 0 ? std::max(uring_gbs, uring_fixed_gbs) / best_base : 0;
  std::printf("\nio_uring / best baseline = %.3f (target >= 0.90)%s\n", ratio,
              uring ? "" : "  [io_uring unavailable]");

  nlohmann::json out = {{"dir", fs::absolute(a.dir).string()},
                        {"filesystem", disk},
                        {"file_io", store->io_note()},
                        {"direct_io", store->direct_io()},
                        {"bytes", bytes},
                        {"block_bytes", a.block},
                        {"queue_depth", a.qd},
                        {"reps", a.reps},
                        {"backend_note", why},
                        {"fio_installed", !fio_bin.empty()},
                        {"write_gbs", write_gbs},
                        {"results_gbs", res},
                        {"best_baseline_gbs", best_base},
                        {"uring_over_best_baseline", ratio}};
  if (!a.keep) (void)store->remove(name);
  return out;
}

// ============================================================================================
// hash: the cost of checking a reused weight file
// ============================================================================================

// One hashed entry of --size-gib (at most 4 GiB) written with put(); then, interleaved over
// --reps rounds: XXH3-64 of the payload in memory (64 MiB at a time, past any cache), the
// payload read from disk in 64 MiB DiskStore::read calls, and DiskStore::verify.
nlohmann::json run_hash(const Args& a) {
  const uint64_t bytes = align_down(uint64_t(std::min(a.size_gib, 4.0) * double(1ull << 30)), kIoAlign);
  std::string why;
  IoBackendOptions uo;
  uo.queue_depth = a.qd;
  auto io = make_io_backend(IoBackendChoice::kAuto, &why, uo);
  auto store = DiskStore::open(a.dir, "bench_io", *io);
  std::printf("== hash ==\nbackend: %s\nfile I/O: %s\n", why.c_str(), store->io_note().c_str());
  if (!store->direct_io()) std::printf("warning: buffered I/O: disk numbers include the page cache\n");
  const std::string name = "hashed";
  const size_t window = size_t(64) << 20;
  AlignedBuffer buf(window);
  {
    std::vector<std::byte> payload(bytes);
    for (uint64_t i = 0; i + 8 <= bytes; i += 8) std::memcpy(payload.data() + i, &i, 8);
    std::printf("writing a %.2f GiB hashed entry...\n", double(bytes) / double(1ull << 30));
    check(store->put(name, TensorView{payload.data(), DType::U8, Shape{int64_t(bytes)}}), "put");
    for (size_t i = 0; i < window; ++i) buf.data()[i] = payload[i % bytes];
  }
  ::sync();
  // In memory: one 64 MiB window hashed bytes/window times (the same bytes as the file).
  uint64_t sink = 0;
  double mem = 0, disk = 0, verify = 0;
  for (int r = 0; r < a.reps; ++r) {
    mem = std::max(mem, best_gbs(1, bytes, [&] {
                     for (uint64_t off = 0; off < bytes; off += window)
                       sink ^= XXH3_64bits(buf.data(), size_t(std::min<uint64_t>(window, bytes - off)));
                   }));
    disk = std::max(disk, best_gbs(1, bytes, [&] {
                      for (uint64_t off = 0; off < bytes; off += window)
                        check(store->read(name, off, size_t(std::min<uint64_t>(window, bytes - off)), buf.data()),
                              "read");
                    }));
    verify = std::max(verify, best_gbs(1, bytes, [&] { check(store->verify(name), "verify"); }));
  }
  std::printf("\n%.2f GiB payload, best of %d interleaved rounds (1 thread hashing):\n",
              double(bytes) / double(1ull << 30), a.reps);
  std::printf("  %-44s %7.3f GB/s\n", "XXH3-64 in memory", mem);
  std::printf("  %-44s %7.3f GB/s\n", "DiskStore::read from disk", disk);
  std::printf("  %-44s %7.3f GB/s\n", "DiskStore::verify (read + hash, each reuse)", verify);
  // Reading, then hashing each window in turn would run at 1 / (1/read + 1/hash); verify
  // overlaps them (it hashes window k while reading k+1), so it can reach min(read, hash).
  const double serial = mem > 0 && disk > 0 ? 1 / (1 / mem + 1 / disk) : 0;
  std::printf("  %-44s %7.3f GB/s\n", "(read, then hash, not overlapped: computed)", serial);
  std::printf("hash / disk = %.1fx; verify takes %.2f s per GB of reused weights (reading alone: %.2f s)\n",
              disk > 0 ? mem / disk : 0, verify > 0 ? 1 / verify : 0, disk > 0 ? 1 / disk : 0);
  if (!a.keep) (void)store->remove(name);
  return {{"bytes", bytes},           {"file_io", store->io_note()}, {"direct_io", store->direct_io()},
          {"xxh3_memory_gbs", mem},   {"store_read_gbs", disk},      {"store_verify_gbs", verify},
          {"serial_read_then_hash_gbs", serial}, {"hash_over_disk", disk > 0 ? mem / disk : 0},
          {"checksum", sink & 1}};
}

// ============================================================================================
// kv: a disk-homed KV cache in decode
// ============================================================================================

// One KV file: seqs * heads * 2 (K, V) row blocks of `cap` rows of head_dim f16 values, each block
// starting on a 4096-byte boundary (in the file and in the host buffer, which mirrors the file).
struct KvShape {
  uint64_t seqs = 0, heads = 0, head_dim = 0, cap = 0, len = 0;
  std::string spec;
  uint64_t row_bytes() const { return head_dim * 2; }
  uint64_t block_bytes() const { return align_up(cap * row_bytes()); }
  uint64_t blocks() const { return seqs * heads * 2; }
  uint64_t file_bytes() const { return blocks() * block_bytes(); }
  uint64_t read_bytes() const { return align_up(len * row_bytes()); }      // rows [0, len) per block
  uint64_t write_page() const { return align_down(len * row_bytes()); }    // page of row `len`
};

KvShape parse_kv(const std::string& spec) {
  auto f = split(spec, 'x');
  KvShape k;
  k.spec = spec;
  if (f.size() == 5) {
    k.seqs = std::stoull(f[0]), k.heads = std::stoull(f[1]), k.head_dim = std::stoull(f[2]);
    k.cap = std::stoull(f[3]), k.len = std::stoull(f[4]);
  }
  if (f.size() != 5 || k.seqs * k.heads * k.head_dim == 0 || k.len == 0 || k.len >= k.cap) {
    std::fprintf(stderr, "bench_io: --kv wants SEQSxHEADSxHEAD_DIMxCAPxLEN with 0 < LEN < CAP, got '%s'\n",
                 spec.c_str());
    std::exit(2);
  }
  return k;
}

// Bytes per second of fn() (moving `bytes` per call), called until `min_s` seconds have passed.
double rate_gbs(uint64_t bytes, double min_s, const std::function<void()>& fn) {
  auto t0 = Clock::now();
  int calls = 0;
  double s = 0;
  do {
    fn();
    ++calls;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (s < min_s);
  return double(bytes) * calls / s / 1e9;
}

// "256 KiB", "128 MiB".
std::string size_str(uint64_t b) {
  const bool big = b >= (uint64_t(1) << 20);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f %s", double(b) / double(big ? 1 << 20 : 1 << 10), big ? "MiB" : "KiB");
  return buf;
}

nlohmann::json run_kv(const Args& a) {
  // One store per backend, all on the same directory: io_uring at each queue depth, and the pread
  // fallback as the engine makes it by default (one thread, synchronous).
  struct Io {
    std::string label;
    std::unique_ptr<IoBackend> backend;
    std::unique_ptr<DiskStore> store;
  };
  std::vector<Io> ios;
  std::string why, qds;
  for (unsigned qd : a.kv_qds) {
    IoBackendOptions o;
    o.queue_depth = qd;
    auto b = make_io_backend(IoBackendChoice::kUring, &why, o);
    if (!b) break;
    if (!qds.empty()) qds += ',';
    qds += std::to_string(qd);
    ios.push_back({"io_uring QD" + std::to_string(qd), std::move(b), nullptr});
  }
  std::printf("\n== kv ==\nbackend: %s\n", ios.empty() ? why.c_str() : ("io_uring at queue depths " + qds).c_str());
  ios.push_back({"pread, 1 thread", make_io_backend(IoBackendChoice::kPread, nullptr), nullptr});
  for (Io& io : ios) io.store = DiskStore::open(a.dir, "bench_io", *io.backend);
  DiskStore& first = *ios.front().store;
  const std::string disk = fs_type(fs::absolute(a.dir));
  std::printf("dir: %s (%s)\nfile I/O: %s\n", fs::absolute(a.dir).c_str(), disk.c_str(), first.io_note().c_str());
  if (!first.direct_io()) std::printf("warning: buffered I/O: numbers include the page cache\n");
  constexpr double kMinSeconds = 0.1;  // per measurement; best of --reps interleaved rounds

  nlohmann::json out = {{"dir", fs::absolute(a.dir).string()}, {"filesystem", disk},
                        {"file_io", first.io_note()},         {"direct_io", first.direct_io()},
                        {"reps", a.reps},                     {"cases", nlohmann::json::array()}};
  for (size_t c = 0; c < a.kv_shapes.size(); ++c) {
    const KvShape k = parse_kv(a.kv_shapes[c]);
    const std::string name = "kv" + std::to_string(c);
    const uint64_t nb = k.blocks(), rd = k.read_bytes() * nb, wr = kIoAlign * nb;
    std::printf("\nkv %s: %llu seqs x %llu heads x 2 (K,V) = %llu row blocks of %llu slots x %llu f16 "
                "(%s each, file %s), len %llu\n",
                k.spec.c_str(), (unsigned long long)k.seqs, (unsigned long long)k.heads, (unsigned long long)nb,
                (unsigned long long)k.cap, (unsigned long long)k.head_dim, size_str(k.block_bytes()).c_str(),
                size_str(k.file_bytes()).c_str(), (unsigned long long)k.len);
    std::printf("  read : %llu ranges of %s (%s) vs one sequential read of as many bytes\n",
                (unsigned long long)nb, size_str(k.read_bytes()).c_str(), size_str(rd).c_str());
    std::printf("  write: %llu pages of 4 KiB (%s) vs one sequential write of as many bytes\n",
                (unsigned long long)nb, size_str(wr).c_str());

    // The file is written once in full first, so decode writes overwrite allocated blocks (as after
    // prefill) rather than converting fallocated extents.
    AlignedBuffer host(k.file_bytes());
    for (size_t i = 0; i + 8 <= host.size(); i += 8) std::memcpy(host.data() + i, &i, 8);
    check(first.create(name, k.file_bytes()), "create");
    check(first.write(name, 0, k.file_bytes(), host.data()), "write");
    std::vector<StoreRange> reads, writes;
    for (uint64_t b = 0; b < nb; ++b) {
      uint64_t base = b * k.block_bytes();
      reads.push_back({base, k.read_bytes(), host.data() + base});
      writes.push_back({base + k.write_page(), kIoAlign, host.data() + base + k.write_page()});
    }

    struct Row {
      double read_ranges = 0, seq_read = 0, write_ranges = 0, seq_write = 0;
    };
    std::vector<Row> rows(ios.size());
    for (int r = 0; r < a.reps; ++r) {
      for (size_t i = 0; i < ios.size(); ++i) {
        DiskStore& st = *ios[i].store;
        Row& row = rows[i];
        row.read_ranges = std::max(row.read_ranges, rate_gbs(rd, kMinSeconds, [&] {
          check(st.read_ranges(name, reads), "read_ranges");
        }));
        row.seq_read = std::max(row.seq_read, rate_gbs(rd, kMinSeconds, [&] {
          check(st.read(name, 0, rd, host.data()), "read");
        }));
        row.write_ranges = std::max(row.write_ranges, rate_gbs(wr, kMinSeconds, [&] {
          check(st.write_ranges(name, writes), "write_ranges");
        }));
        row.seq_write = std::max(row.seq_write, rate_gbs(wr, kMinSeconds, [&] {
          check(st.write(name, 0, wr, host.data()), "write");
        }));
      }
    }
    std::printf("  %-17s %12s %9s %6s %8s | %12s %9s %6s %8s\n", "GB/s", "read_ranges", "seq read", "ratio",
                "ms/call", "write_ranges", "seq write", "ratio", "ms/call");
    nlohmann::json jc = {{"shape", k.spec},          {"blocks", nb},   {"read_range_bytes", k.read_bytes()},
                         {"read_bytes", rd},         {"write_bytes", wr}, {"results", nlohmann::json::object()}};
    for (size_t i = 0; i < ios.size(); ++i) {
      const Row& row = rows[i];
      double rr = row.read_ranges / row.seq_read, wrr = row.write_ranges / row.seq_write;
      double rms = double(rd) / row.read_ranges / 1e6, wms = double(wr) / row.write_ranges / 1e6;
      std::printf("  %-17s %12.3f %9.3f %6.2f %8.2f | %12.3f %9.3f %6.2f %8.2f\n", ios[i].label.c_str(),
                  row.read_ranges, row.seq_read, rr, rms, row.write_ranges, row.seq_write, wrr, wms);
      jc["results"][ios[i].label] = {{"read_ranges_gbs", row.read_ranges}, {"seq_read_gbs", row.seq_read},
                                     {"read_ratio", rr},                   {"read_ranges_ms", rms},
                                     {"write_ranges_gbs", row.write_ranges}, {"seq_write_gbs", row.seq_write},
                                     {"write_ratio", wrr},                 {"write_ranges_ms", wms}};
    }
    out["cases"].push_back(jc);
    if (!a.keep) (void)first.remove(name);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_io: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--dir") a.dir = val();
    else if (k == "--size-gib") a.size_gib = std::stod(val());
    else if (k == "--block-kib") a.block = size_t(std::stoul(val())) << 10;
    else if (k == "--qd") a.qd = unsigned(std::stoul(val()));
    else if (k == "--reps") a.reps = std::stoi(val());
    else if (k == "--keep") a.keep = true;
    else if (k == "--case") a.cases = split(val(), ',');
    else if (k == "--kv") a.kv_shapes = split(val(), ',');
    else if (k == "--kv-qd") {
      a.kv_qds.clear();
      for (const std::string& q : split(val(), ',')) a.kv_qds.push_back(unsigned(std::stoul(q)));
    }
    else if (k == "--json") a.json = val();
    else {
      std::fprintf(stderr, "usage: bench_io [--case seq,kv,hash] [--dir DIR] [--size-gib G] [--block-kib K] [--qd N] "
                           "[--reps R] [--kv SxHxDxCAPxLEN,...] [--kv-qd N,...] [--keep] [--json FILE]\n");
      return 2;
    }
  }
  if (a.block == 0 || a.block % kIoAlign != 0) {
    std::fprintf(stderr, "bench_io: --block-kib must be a multiple of 4\n");
    return 2;
  }
  for (const std::string& c : a.cases) {
    if (c != "seq" && c != "kv" && c != "hash") {
      std::fprintf(stderr, "bench_io: unknown --case '%s' (seq, kv, hash)\n", c.c_str());
      return 2;
    }
  }
  for (const std::string& k : a.kv_shapes) (void)parse_kv(k);  // exits on a bad shape before any I/O
  auto has = [&](const char* c) { return std::find(a.cases.begin(), a.cases.end(), c) != a.cases.end(); };

  nlohmann::json out = {{"bench", "bench_io"}};
  if (has("seq")) out.update(run_seq(a));
  if (has("kv")) out["kv"] = run_kv(a);
  if (has("hash")) out["hash"] = run_hash(a);
  if (!a.json.empty()) {
    std::ofstream(a.json) << out.dump(2) << "\n";
    std::printf("wrote %s\n", a.json.c_str());
  }
  if (!a.keep) {
    std::error_code ec;
    fs::remove(a.dir / "flexh2o.lock", ec);  // the store's directory lock; no other run uses this dir
    fs::remove(a.dir, ec);                   // only if empty
  }
  return 0;
}
