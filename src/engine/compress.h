// Weights in the dtype they are held in: convert_tensor (between f32/f16/bf16, or into Q4
// records, core/quant4.h), and CompressedWeights, the in-memory reference's copy of a model with
// every 2-D weight Q4, encoded by the same function the offloading engine encodes its homes with,
// so a compressed in-memory run and a compressed offloaded run compute on the same bytes.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "model/weights.h"

namespace flexh2o {

// src (f32/f16/bf16) converted to dt into dst (held_bytes(src, dt) bytes). dt Q4: src's last
// dimension is the row; throws naming `what`, the row and the group on NaN/Inf (quant4.h).
void convert_tensor(const TensorView& src, DType dt, void* dst, const std::string& what);

// A model's weights with every 2-D tensor compressed to Q4 (held_dtype with compress on); 1-D
// tensors are the model's own views. A tied lm_head stays the (compressed) embedding. The
// checkpoint pages of what it compressed leave the resident set (Model::release_pages).
// The model must outlive this object. Move-only.
class CompressedWeights {
 public:
  explicit CompressedWeights(const Model& model);
  CompressedWeights(CompressedWeights&&) = default;
  CompressedWeights& operator=(CompressedWeights&&) = default;
  CompressedWeights(const CompressedWeights&) = delete;
  CompressedWeights& operator=(const CompressedWeights&) = delete;

  const ModelWeights& weights() const { return weights_; }
  size_t bytes() const;  // held bytes of the compressed tensors

 private:
  std::map<const void*, std::vector<std::byte>> held_;  // by the model's data pointer
  ModelWeights weights_;
};

}  // namespace flexh2o
