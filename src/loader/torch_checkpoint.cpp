// TorchArchive: a torch.save zip is <prefix>/data.pkl (the pickled state_dict), <prefix>/data/<key>
// (one record per storage, raw little-endian elements, stored uncompressed and 64-byte aligned
// by torch's writer), <prefix>/byteorder, <prefix>/version and a few small records this reader
// does not need. Views point straight into the mapping; nothing is copied.
#include "loader/torch_checkpoint.h"

#include <cstring>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include "loader/torch_pickle.h"
#include "loader/zip_reader.h"

namespace flexh2o {
namespace {

using namespace std::string_view_literals;

// data.pkl of a 1000-tensor state dict is ~100 KB; this is corruption, not a model.
constexpr uint64_t kMaxPickleBytes = uint64_t(64) << 20;

std::string strides_str(const PickledTensor& t) {
  std::string s = "(";
  for (int d = 0; d < t.shape.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.stride[size_t(d)]);
  return s + (t.shape.ndim == 1 ? ",)" : ")");
}

void refuse_other_formats(const MappedFile& f, const std::string& file) {
  const auto* d = reinterpret_cast<const char*>(f.data());
  const size_t n = f.size();
  auto starts = [&](std::string_view magic) { return n >= magic.size() && std::memcmp(d, magic.data(), magic.size()) == 0; };
  // torch's legacy format is a pickle of the magic number 0x1950a86a20f9469cfc6c (protocol 2,
  // LONG1), followed by more pickles; older still, a tar archive.
  const bool legacy = starts("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"sv) ||
                      (n >= 262 && std::memcmp(d + 257, "ustar", 5) == 0);
  if (legacy)
    FH_FAIL(file, " is in torch's legacy serialization format (torch < 1.6, or _use_new_zipfile_serialization="
            "False): a sequence of pickles whose loading runs code. flexh2o reads only the zip format; re-save it "
            "with torch >= 1.6 in an environment you trust (torch.save(torch.load(f, weights_only=True), f)), or "
            "convert it to safetensors.");
  if (!starts("PK"))
    FH_FAIL(file, " is not a torch checkpoint: it does not start with a zip signature (torch.save writes a zip "
            "archive since torch 1.6).");
}

// Appends the tensors of `f` (files()[file_index]) to `out` as views into its mapping.
void add_file_tensors(const MappedFile& f, size_t file_index, std::vector<TensorEntry>* out) {
  const std::string file = f.path().string();
  refuse_other_formats(f, file);
  const std::vector<ZipEntry> entries = read_zip_directory(f.data(), f.size(), file);
  std::unordered_map<std::string_view, const ZipEntry*> by_name;
  const ZipEntry* pkl = nullptr;
  for (const ZipEntry& e : entries) {
    by_name.emplace(e.name, &e);
    const size_t slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      if (pkl != nullptr)
        FH_FAIL(file, " holds two pickles (", pkl->name, " and ", e.name, "); torch.save writes one data.pkl.");
      pkl = &e;
    }
  }
  if (pkl == nullptr)
    FH_FAIL(file, " is a zip archive without a <name>/data.pkl record: not a checkpoint written by torch.save.");
  const std::string prefix = pkl->name.substr(0, pkl->name.size() - "data.pkl"sv.size());
  auto bytes_of = [&](const ZipEntry& e) {
    return std::string_view(reinterpret_cast<const char*>(f.data() + e.offset), size_t(e.size));
  };

  if (auto it = by_name.find(prefix + "byteorder"); it != by_name.end()) {
    const std::string_view order = bytes_of(*it->second);
    if (order == "big")
      FH_FAIL(file, " was saved on a big-endian machine (", prefix, "byteorder is \"big\"); flexh2o reads tensors "
              "in place and accepts only little-endian checkpoints.");
    if (order != "little")
      FH_FAIL(file, " is corrupt: ", prefix, "byteorder is neither \"little\" nor \"big\".");
  }

  if (pkl->size > kMaxPickleBytes)
    FH_FAIL(file, ": ", pkl->name, " is ", pkl->size, " bytes, above the ", kMaxPickleBytes,
            "-byte limit for a state_dict pickle (a checkpoint's is well under a megabyte).");
  if (crc32(f.data() + pkl->offset, size_t(pkl->size)) != pkl->crc32)
    FH_FAIL(file, " is corrupt: ", pkl->name, " does not match the CRC-32 its zip directory records.");
  const PickledCheckpoint ck = read_torch_pickle(bytes_of(*pkl), file + ": " + pkl->name);

  // Each storage: its record, size and alignment.
  std::vector<const std::byte*> base(ck.storages.size(), nullptr);
  for (size_t k = 0; k < ck.storages.size(); ++k) {
    const PickledStorage& s = ck.storages[k];
    const std::string rec = prefix + "data/" + s.key;
    auto it = by_name.find(rec);
    if (it == by_name.end())
      FH_FAIL(file, " is corrupt: the pickle refers to storage ", s.key, " but the archive has no record ", rec, ".");
    const ZipEntry& e = *it->second;
    base[k] = f.data() + e.offset;
    if (!s.dtype) continue;  // refused below if a tensor uses it
    const uint64_t esz = dtype_size(*s.dtype);
    if (uint64_t(s.numel) > std::numeric_limits<uint64_t>::max() / esz || uint64_t(s.numel) * esz != e.size)
      FH_FAIL(file, " is corrupt: storage ", s.key, " is declared as ", s.numel, " elements of ", s.cls,
              " but its record ", rec, " holds ", e.size, " bytes.");
    if (e.offset % esz != 0)
      FH_FAIL(file, ": storage record ", rec, " starts at file offset ", e.offset, ", which is not aligned to its ",
              dtype_name(*s.dtype), " element size.");
  }

  for (const PickledTensor& t : ck.tensors) {
    const PickledStorage& s = ck.storages[t.storage];
    if (!s.dtype)
      FH_FAIL("tensor ", t.name, " in ", file, " is stored as torch.", s.cls,
              ", a type flexh2o has no dtype for (supported: F32, F16, BF16, I32, I64, U8).");
    // Element count, with every step kept within the storage (so nothing overflows).
    uint64_t numel = 1;
    bool zero = false;
    for (int d = 0; d < t.shape.ndim; ++d) zero |= t.shape[d] == 0;
    if (!zero) {
      for (int d = 0; d < t.shape.ndim; ++d) {
        numel *= uint64_t(t.shape[d]);
        if (numel > uint64_t(s.numel))
          FH_FAIL("tensor ", t.name, " in ", file, " has shape ", t.shape.str(), ", more elements than its storage ",
                  s.key, " holds (", s.numel, ").");
      }
    } else {
      numel = 0;
    }
    if (uint64_t(t.offset) > uint64_t(s.numel) - numel)
      FH_FAIL("tensor ", t.name, " in ", file, " reaches past its storage ", s.key, ": offset ", t.offset, " + ", numel,
              " elements > ", s.numel, ".");
    uint64_t expect = 1;
    for (int d = t.shape.ndim - 1; d >= 0 && numel > 0; --d) {
      if (t.shape[d] != 1 && uint64_t(t.stride[size_t(d)]) != expect)
        FH_FAIL("tensor ", t.name, " in ", file, " is not contiguous (shape ", t.shape.str(), ", stride ",
                strides_str(t), "); flexh2o maps tensors in place and needs row-major ones (save t.contiguous()).");
      expect *= uint64_t(t.shape[d]);
    }
    TensorEntry e;
    e.name = t.name;
    e.view.data = base[t.storage] + uint64_t(t.offset) * dtype_size(*s.dtype);
    e.view.dtype = *s.dtype;
    e.view.shape = t.shape;
    e.file_index = file_index;
    out->push_back(std::move(e));
  }
}

}  // namespace

TorchArchive TorchArchive::open_file(const std::filesystem::path& file) {
  TorchArchive a;
  a.open_single(file, [&](size_t i) { add_file_tensors(a.files_[i], i, &a.tensors_); });
  return a;
}

TorchArchive TorchArchive::open_dir(const std::filesystem::path& dir) {
  TorchArchive a;
  a.open_in_dir(dir, "pytorch_model.bin", "pytorch_model.bin.index.json",
                [&](size_t i) { add_file_tensors(a.files_[i], i, &a.tensors_); });
  return a;
}

}  // namespace flexh2o
