// Fuzz target: an offload store file (4096-byte header + payload) met by DiskStore when a run
// reuses its --offload-dir: verify() opens it, checks the header and hashes the payload, and a
// failure must be a Status naming the file; where the tree has parse_store_header (the header
// parser alone), it gets the raw bytes too. `-write_seeds=DIR` writes the seed corpus.
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>

#include "fuzz_util.h"
#include "offload/disk_store.h"
#if __has_include("offload/store_header.h")
#include "offload/store_header.h"
#endif

namespace {

using namespace flexh2o;

constexpr std::string_view kIdentity = "fuzz-model";
constexpr std::string_view kEntry = "e";  // the seeds' entry name

// Buffered I/O: the fuzzer writes the file through the page cache an instant before.
std::unique_ptr<DiskStore> open_store(const std::filesystem::path& dir, IoBackend& io) {
  DiskStoreOptions opts;
  opts.use_direct_io = false;
  return DiskStore::open(dir, std::string(kIdentity), io, opts);
}

struct Harness {
  std::unique_ptr<IoBackend> io = make_io_backend(IoBackendChoice::kPread, nullptr);
  std::unique_ptr<DiskStore> store = open_store(fuzz::scratch() / "store", *io);
  size_t hash_at = find_header_hash();

  // The header ends with an XXH3-64 of the bytes before it, which no mutation would get right,
  // so each input's hash is fixed up and the fields it covers are what gets fuzzed. Its offset
  // k (XXH3_64bits(file[0, k)) == file[k, k + 8)) is found in a file put() wrote, not copied
  // from disk_store.cpp's private layout.
  size_t find_header_hash() {
    const uint16_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    TensorView v{payload, DType::F16, Shape{8}};
    store->put("probe", v).throw_if_error();
    std::ifstream in(store->path_of("probe"), std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), {}};
    store->remove("probe").throw_if_error();
    for (size_t k = 8; k + 8 <= std::min(bytes.size(), kStoreHeaderBytes); k += 8) {
      uint64_t stored;
      std::memcpy(&stored, bytes.data() + k, 8);
      if (XXH3_64bits(bytes.data(), k) == stored) return k;
    }
    fuzz::finding("no XXH3-64 header hash found in a store file DiskStore::put wrote: "
                  "the header format changed, update tests/fuzz/store_header.cpp");
  }
};

// Seeds: entry "e" as put() writes it (F16 [8], hashed) and as create() makes a KV file.
void write_seeds(const std::filesystem::path& out) {
  std::unique_ptr<IoBackend> io = make_io_backend(IoBackendChoice::kPread, nullptr);
  std::unique_ptr<DiskStore> store = open_store(fuzz::scratch() / "seeds", *io);
  namespace fs = std::filesystem;
  fs::create_directories(out);
  const uint16_t payload[8] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x3555, 0};
  store->put(kEntry, TensorView{payload, DType::F16, Shape{8}}).throw_if_error();
  fs::copy_file(store->path_of(kEntry), out / "put_f16_8", fs::copy_options::overwrite_existing);
  store->create(kEntry, 16).throw_if_error();
  fs::copy_file(store->path_of(kEntry), out / "create_16_bytes", fs::copy_options::overwrite_existing);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  constexpr std::string_view kFlag = "-write_seeds=";
  for (int i = 1; i < *argc; ++i)
    if (std::string_view arg = (*argv)[i]; arg.starts_with(kFlag)) {
      write_seeds(std::string(arg.substr(kFlag.size())));
      std::exit(0);
    }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness h;
#if __has_include("offload/store_header.h")
  // The bytes exactly as given: the parser must stay inside them and say why it refuses.
  if (Status st = parse_store_header(std::as_bytes(std::span(data, size)), nullptr); !st.ok() && st.message().empty())
    fuzz::finding("parse_store_header refused a header without saying why");
#endif
  std::string bytes(fuzz::as_text(data, size));
  if (bytes.size() >= h.hash_at + 8) {
    const uint64_t hash = XXH3_64bits(bytes.data(), h.hash_at);
    std::memcpy(bytes.data() + h.hash_at, &hash, 8);
  }
  const std::string path = h.store->path_of(kEntry).string();
  fuzz::write_file(path, bytes);
  fuzz::expect_clean(path, [&] {
    if (Status st = h.store->verify(kEntry); !st.ok() && st.message().find(path) == std::string::npos)
      fuzz::finding("a store failure does not name the store file");
  });
  h.store->remove(kEntry).throw_if_error();
  return 0;
}
