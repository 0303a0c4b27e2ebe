// write_safetensors: builds the JSON header with nlohmann::json and hands header and data to a
// sink (one ofstream for the path version). Layout decisions (gapless data, element-size
// alignment) are documented in the header; the reader in safetensors.cpp validates the output.
#include "loader/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace flexh2o {

void write_safetensors(const std::function<void(std::string_view)>& sink, const std::string& file,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const auto& [name, v] : tensors) {
    if (name == "__metadata__") FH_FAIL("cannot write ", file, ": __metadata__ is reserved and cannot name a tensor.");
    if (!names.insert(name).second) FH_FAIL("cannot write ", file, ": tensor ", name, " is given twice.");
    for (int i = 0; i < v.shape.ndim; ++i)
      if (v.shape[i] < 0)
        FH_FAIL("cannot write ", file, ": tensor ", name, " has a negative dimension in shape ", v.shape.str(), ".");
    if (v.data == nullptr && v.numel() != 0)
      FH_FAIL("cannot write ", file, ": tensor ", name, " has shape ", v.shape.str(), " but no data.");
  }

  // Largest elements first keeps every start aligned without padding between tensors.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype) > dtype_size(tensors[b].second.dtype);
  });

  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  for (size_t i : order) {
    const auto& [name, v] = tensors[i];
    nlohmann::json shape = nlohmann::json::array();
    for (int d = 0; d < v.shape.ndim; ++d) shape.push_back(v.shape[d]);
    h[name] = {{"dtype", std::string(dtype_name(v.dtype))}, {"shape", shape}, {"data_offsets", {off, off + v.nbytes()}}};
    off += v.nbytes();
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(uint64_t(text.size()) >> (8 * i));
  sink(std::string_view(len, 8));
  sink(text);
  constexpr size_t kPiece = size_t(1) << 20;
  for (size_t i : order) {
    const TensorView& v = tensors[i].second;
    const char* p = static_cast<const char*>(v.data);
    for (size_t done = 0; done < v.nbytes(); done += kPiece) sink(std::string_view(p + done, std::min(kPiece, v.nbytes() - done)));
  }
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  std::ofstream out;
  bool opened = false;
  // Opened on the first bytes, after the checks: a refused tensor list leaves no file behind.
  write_safetensors(
      [&](std::string_view s) {
        if (!opened) {
          out.open(path, std::ios::binary | std::ios::trunc);
          if (!out) {
            int e = errno;
            FH_FAIL("cannot create ", file, ": ", std::strerror(e), ".");
          }
          opened = true;
        }
        out.write(s.data(), std::streamsize(s.size()));
      },
      file, tensors, metadata);
  out.close();
  if (!out) FH_FAIL("cannot write ", file, ": the write failed (disk full or I/O error).");
}

}  // namespace flexh2o
