// convert_tensor and CompressedWeights (compress.h).
#include "engine/compress.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "core/error.h"
#include "engine/placement.h"
#include "kernels/cpu/ops.h"

namespace flexh2o {

void convert_tensor(const TensorView& src, DType dt, void* dst, const std::string& what) {
  if (src.dtype == dt) {
    std::memcpy(dst, src.data, src.nbytes());
    return;
  }
  if (dt == DType::Q4) {
    FH_CHECK(src.shape.ndim >= 1, "cannot compress scalar ", what);
    const int64_t cols = src.shape[src.shape.ndim - 1], rows = cols ? src.numel() / cols : 0;
    if (rows == 0) return;
    FH_CHECK(src.dtype == DType::F32 || src.dtype == DType::F16 || src.dtype == DType::BF16, "cannot compress ",
             what, " of dtype ", dtype_name(src.dtype), " to Q4");
    // The reference's encoding (q4::encode_rows*), in parallel over blocks of rows.
    return cpu::encode_q4(src.dtype, src.data, cols, rows, cols, dst, what);
  }
  FH_CHECK(src.dtype != DType::Q4, "cannot convert the compressed ", what, " to ", dtype_name(dt));
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<float> tmp(size_t(std::min<int64_t>(kChunk, src.numel())));
  const size_t si = dtype_size(src.dtype), di = dtype_size(dt);
  for (int64_t off = 0, n = src.numel(); off < n; off += kChunk) {
    const int64_t m = std::min(kChunk, n - off);
    cpu::to_f32(src.dtype, static_cast<const std::byte*>(src.data) + size_t(off) * si, m, tmp.data());
    cpu::from_f32(tmp.data(), m, dt, static_cast<std::byte*>(dst) + size_t(off) * di);
  }
}

CompressedWeights::CompressedWeights(const Model& model) : weights_(model.weights()) {
  std::map<const void*, std::string> names;
  for (const BoundTensor& t : model.tensors()) names[t.view.data] = t.spec.name;
  auto compress = [&](TensorView& v) {
    if (v.empty() || held_dtype(v, true, std::nullopt) != DType::Q4) return;
    auto [it, fresh] = held_.try_emplace(v.data);
    if (fresh) {
      it->second.resize(held_bytes(v, DType::Q4));
      convert_tensor(v, DType::Q4, it->second.data(), "weight " + names[v.data]);
    }
    v.data = it->second.data();
    v.dtype = DType::Q4;
  };
  ModelWeights& w = weights_;
  std::vector<TensorView*> all{&w.embed, &w.pos_embed, &w.final_norm_w, &w.final_norm_b, &w.lm_head};
  for (LayerWeights& L : w.layers)
    for (TensorView* v : L.all()) all.push_back(v);
  for (TensorView* v : all) compress(*v);
  // The checkpoint pages of what is now held compressed, unless a plain view still reads them
  // (a tied token table beside its compressed head), may leave the resident set.
  std::set<const void*> plain;
  for (const TensorView* v : all) plain.insert(v->data);
  for (const BoundTensor& t : model.tensors())
    if (held_.contains(t.view.data) && !plain.contains(t.view.data)) model.release_pages(t.view.data, t.view.nbytes());
}

size_t CompressedWeights::bytes() const {
  size_t n = 0;
  for (const auto& [src, b] : held_) n += b.size();
  return n;
}

}  // namespace flexh2o
