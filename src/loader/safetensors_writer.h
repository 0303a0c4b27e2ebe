// Writing a .safetensors file from in-memory tensor views: test fixtures and the convert tool.
// Every view must stay valid for the duration of the call; tensor bytes are passed on from the
// views without a copy.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace flexh2o {

// Writes `tensors` (name -> view; view.nbytes() bytes are copied from view.data, which may be
// nullptr only when the tensor has zero elements) and the "__metadata__" string map to `path`,
// replacing any existing file. Layout: u64 little-endian header length, JSON header padded
// with spaces to a multiple of 8, then the data section with no gaps. Tensors are laid out
// by decreasing element size, in the given order within one element size, so every tensor
// starts aligned to its element size and the file also loads with the Python safetensors
// library. Throws flexh2o::Error naming the file on duplicate or reserved names, or I/O errors.
// Blocking; not thread-safe for the same path.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same bytes handed to `sink` in file order (the length and header, then each tensor's
// bytes straight from its view, in pieces of at most 1 MiB), for a caller that owns the output
// (an atomic OutputFile). `name` names the output in errors; the sink's own errors propagate.
void write_safetensors(const std::function<void(std::string_view)>& sink, const std::string& name,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace flexh2o
