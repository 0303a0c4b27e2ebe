// A restricted reader of the pickle torch.save writes as data.pkl: a dict (or OrderedDict) of
// tensor names to tensors rebuilt from storages. Nothing is executed: only the opcodes
// torch.save emits are interpreted, and a global is accepted only if it is one of the few
// callables torch uses to rebuild tensors (OrderedDict, torch._utils._rebuild_tensor_v2 and
// kin, torch.*Storage classes), each of which is emulated here. Anything else throws.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace flexh2o {

// A persistent id ('storage', torch.<cls>, key, location, numel): the record <archive>/data/<key>.
struct PickledStorage {
  std::string cls;             // e.g. "HalfStorage"
  std::optional<DType> dtype;  // empty: a storage type flexh2o has no dtype for (e.g. DoubleStorage)
  std::string key;
  int64_t numel = 0;  // elements of the storage's type
};

struct PickledTensor {
  std::string name;
  size_t storage = 0;  // index into PickledCheckpoint::storages
  int64_t offset = 0;  // storage offset, in elements
  Shape shape;
  std::array<int64_t, kMaxDims> stride{};  // in elements, for shape.ndim dimensions
};

struct PickledCheckpoint {
  std::vector<PickledStorage> storages;  // each key once
  std::vector<PickledTensor> tensors;    // in the dict's order; names unique
};

// Reads `pkl`; `where` names it in messages ("FILE: archive/data.pkl"). Throws flexh2o::Error
// naming `where`, the byte offset and the opcode or global at fault, for: an opcode torch.save
// does not write, a global outside the list, a call with arguments torch would not pass, a
// top level that is not a dict of string names to tensors, a rank above kMaxDims, or a limit
// exceeded (values, memo, stack, marks). Pure; thread-safe.
PickledCheckpoint read_torch_pickle(std::string_view pkl, const std::string& where);

}  // namespace flexh2o
