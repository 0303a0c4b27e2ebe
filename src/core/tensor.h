// Non-owning tensor views passed by value to kernels and between modules.
// A view never owns memory: whoever hands it out (a mapped file, an arena, a store)
// keeps the bytes alive for as long as the view is used. Row-major, contiguous.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/quant4.h"
#include "core/error.h"

namespace flexh2o {

constexpr int kMaxDims = 4;

struct Shape {
  int ndim = 0;
  std::array<int64_t, kMaxDims> dims{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    FH_CHECK(d.size() <= kMaxDims, "tensor rank ", d.size(), " > ", kMaxDims);
    for (int64_t v : d) dims[ndim++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const {  // "[4096, 256]"
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

// Bytes of one row of `cols` elements of dtype t: a Q4 row record (core/quant4.h) or
// cols x dtype_size(t). The one formula for KV slot rows, weight rows and embedding rows.
inline size_t row_nbytes(DType t, int64_t cols) {
  return t == DType::Q4 ? size_t(q4::row_bytes(cols)) : size_t(cols) * dtype_size(t);
}

// Read-only view of a contiguous tensor of any dtype (weights, as loaded).
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  // Q4: rows records of the last dimension (core/quant4.h).
  size_t nbytes() const {
    if (dtype != DType::Q4) return size_t(numel()) * dtype_size(dtype);
    const int64_t cols = shape.ndim ? shape[shape.ndim - 1] : 1;
    return cols ? size_t(numel() / cols) * row_nbytes(dtype, cols) : 0;
  }
  bool empty() const { return data == nullptr; }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
};

}  // namespace flexh2o
