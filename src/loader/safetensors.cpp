// Safetensors reader: maps each file once, validates its JSON header strictly and builds views
// into the mapping. Layout: u64 little-endian header length N, N bytes of JSON, data section.
// Sharded checkpoints are read through model.safetensors.index.json ("weight_map"). This file
// never copies tensor bytes and never writes; see safetensors_writer.cpp for the writer.
#include "loader/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o {

namespace {

using nlohmann::json;

// Same bound as the reference implementation: a header above this is corruption, not a model.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kMaxNameBytes = 1024;  // real names are < 100 bytes

// One tensor as parsed from a header, before it is turned into a view.
struct RawEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the data section
};

// ---------------------------------------------------------------------------------------------
// Header parsing
// ---------------------------------------------------------------------------------------------

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint64_t(std::to_integer<uint8_t>(p[i]));
  return v;
}

// Reads a non-negative JSON integer; `what` names it in the error.
uint64_t get_uint(const json& v, const std::string& file, const std::string& tensor, const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer())  // signed and negative (nlohmann stores non-negatives as unsigned)
    FH_FAIL("tensor ", tensor, " in ", file, " has a negative ", what, " (", json_excerpt(v), ").");
  FH_FAIL("tensor ", tensor, " in ", file, " has a non-integer ", what, " (", json_excerpt(v), ").");
}

RawEntry parse_entry(const std::string& file, const std::string& name, const json& v) {
  if (!v.is_object()) FH_FAIL("tensor ", name, " in ", file, " is not a JSON object (", json_excerpt(v), ").");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) FH_FAIL("tensor ", name, " in ", file, " has no \"", field, "\" field.");
  RawEntry e;
  e.name = name;

  const json& dt = v["dtype"];
  if (!dt.is_string())
    FH_FAIL("tensor ", name, " in ", file, " has a dtype that is not a string (", json_excerpt(dt), ").");
  if (!parse_dtype(dt.get<std::string>(), &e.dtype))
    FH_FAIL("tensor ", name, " in ", file, " has unsupported dtype ", dt.get<std::string>().substr(0, 40),
            " (supported: F32, F16, BF16, I32, I64, U8).");

  const json& sh = v["shape"];
  if (!sh.is_array())
    FH_FAIL("tensor ", name, " in ", file, " has a shape that is not an array (", json_excerpt(sh), ").");
  if (sh.size() > size_t(kMaxDims))
    FH_FAIL("tensor ", name, " in ", file, " has rank ", sh.size(), "; at most ", kMaxDims, " dimensions are supported.");
  // numel * element size must fit: each step is checked against overflow.
  uint64_t bytes = dtype_size(e.dtype);
  for (const json& d : sh) {
    uint64_t n = get_uint(d, file, name, "shape dimension");
    if (n > uint64_t(std::numeric_limits<int64_t>::max()) ||
        (n != 0 && bytes > std::numeric_limits<uint64_t>::max() / n))
      FH_FAIL("tensor ", name, " in ", file, " has a shape whose byte size overflows (", json_excerpt(sh), ").");
    bytes *= n;
    e.shape.dims[e.shape.ndim++] = int64_t(n);
  }

  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    FH_FAIL("tensor ", name, " in ", file, " has data_offsets that are not a [begin, end] pair (", json_excerpt(off),
            ").");
  e.begin = get_uint(off[0], file, name, "data_offsets begin");
  e.end = get_uint(off[1], file, name, "data_offsets end");
  if (e.begin > e.end)
    FH_FAIL("tensor ", name, " in ", file, " has data_offsets with begin ", e.begin, " > end ", e.end, ".");
  if (e.end - e.begin != bytes)
    FH_FAIL("tensor ", name, " in ", file, " has shape ", e.shape.str(), " x ", dtype_name(e.dtype), " = ", bytes,
            " bytes but data_offsets span ", e.end - e.begin, " bytes [", e.begin, ", ", e.end, ").");
  return e;
}

// Parses and validates the header of `f`; entries come back with offsets checked against the
// data section and against each other.
std::vector<RawEntry> parse_header(const MappedFile& f, uint64_t* data_start,
                                   std::map<std::string, std::string>* metadata) {
  const std::string file = f.path().string();
  if (f.size() < 8)
    FH_FAIL(file, " is not a safetensors file: it is ", f.size(),
            " bytes long, shorter than the 8-byte header length field.");
  const uint64_t n = read_u64_le(f.data());
  if (n > kMaxHeaderBytes)
    FH_FAIL(file, " is not a valid safetensors file: header length ", n, " is absurdly large (limit ",
            kMaxHeaderBytes, " bytes).");
  if (n > f.size() - 8)
    FH_FAIL(file, " is truncated or corrupt: header length ", n, " runs past the end of the file (",
            f.size(), " bytes).");

  // parse_json bounds the nesting (error messages below print values) and names the file in
  // every parse failure, number overflow included.
  const json h =
      parse_json(std::string_view(reinterpret_cast<const char*>(f.data() + 8), n), "the header of " + file);
  if (!h.is_object()) FH_FAIL(file, " has a header that is a JSON ", h.type_name(), ", not an object.");

  const uint64_t data_size = f.size() - 8 - n;
  std::vector<RawEntry> out;
  out.reserve(h.size());
  for (const auto& [key, v] : h.items()) {
    // Names are printed in errors and used as map keys: control bytes (a NUL would cut the
    // message short) and absurd lengths are refused before anything else.
    const bool odd = key.size() > kMaxNameBytes ||
                     std::any_of(key.begin(), key.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
    if (odd) FH_FAIL(file, " has a tensor name with control characters or over ", kMaxNameBytes, " bytes: ", quote_prefix(key), ".");
    if (key == "__metadata__") {
      if (!v.is_object()) FH_FAIL(file, " has a __metadata__ entry that is not a JSON object.");
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string())
          FH_FAIL(file, " has __metadata__ field ", quote_prefix(mk), " that is not a string (", json_excerpt(mv), ").");
        if (metadata) (*metadata)[mk] = mv.get<std::string>();
      }
      continue;
    }
    RawEntry e = parse_entry(file, key, v);
    if (e.end > data_size)
      FH_FAIL(file, " is truncated: tensor ", key, " needs data bytes [", e.begin, ", ", e.end,
              ") but the data section holds only ", data_size, " bytes.");
    if ((8 + n + e.begin) % dtype_size(e.dtype) != 0)
      FH_FAIL("tensor ", key, " in ", file, " starts at file offset ", 8 + n + e.begin,
              ", which is not aligned to its ", dtype_name(e.dtype), " element size.");
    out.push_back(std::move(e));
  }

  // Overlap check: sorted by begin, every non-empty range must start at or after the previous end.
  std::vector<const RawEntry*> by_off;
  for (const RawEntry& e : out)
    if (e.end > e.begin) by_off.push_back(&e);
  std::sort(by_off.begin(), by_off.end(), [](const RawEntry* a, const RawEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_off.size(); ++i)
    if (by_off[i]->begin < by_off[i - 1]->end)
      FH_FAIL(file, " is corrupt: tensors ", by_off[i - 1]->name, " [", by_off[i - 1]->begin, ", ",
              by_off[i - 1]->end, ") and ", by_off[i]->name, " [", by_off[i]->begin, ", ", by_off[i]->end,
              ") overlap.");
  *data_start = 8 + n;
  return out;
}

// Appends the tensors of files[file_index] to `out` as views into its mapping.
void add_file_tensors(const MappedFile& f, size_t file_index, std::vector<TensorEntry>* out,
                      std::map<std::string, std::string>* metadata) {
  uint64_t data_start = 0;
  std::vector<RawEntry> raw = parse_header(f, &data_start, metadata);
  for (RawEntry& r : raw) {
    TensorEntry t;
    t.name = std::move(r.name);
    t.view.data = f.data() + data_start + r.begin;
    t.view.dtype = r.dtype;
    t.view.shape = r.shape;
    t.file_index = file_index;
    out->push_back(std::move(t));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsArchive
// ---------------------------------------------------------------------------------------------

// The metadata is the first file's (a sharded checkpoint repeats it in every shard).
void SafetensorsArchive::add_file(size_t i) {
  add_file_tensors(files_[i], i, &tensors_, i == 0 ? &metadata_ : nullptr);
}

SafetensorsArchive SafetensorsArchive::open_file(const std::filesystem::path& file) {
  SafetensorsArchive a;
  a.open_single(file, [&](size_t i) { a.add_file(i); });
  return a;
}

SafetensorsArchive SafetensorsArchive::open_dir(const std::filesystem::path& dir) {
  SafetensorsArchive a;
  a.open_in_dir(dir, "model.safetensors", "model.safetensors.index.json", [&](size_t i) { a.add_file(i); });
  return a;
}

}  // namespace flexh2o
