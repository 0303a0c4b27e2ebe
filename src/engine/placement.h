// Placement plan: which tier homes each weight tensor and each sequence's KV cache, as a
// plain value the executor consumes and tests inspect.
// Weights are grouped in units (schedule.h unit_kinds: embeddings, then per layer one unit or,
// with sep_layer as FlexGen, an attention unit and an MLP unit, then the head) and each unit's
// tensors are placed whole by FlexGen's midpoint rule (PAPERS.md §3.3): a tensor goes to the
// tier where the midpoint of its bytes falls on the cumulative axis of its attention or MLP
// block (a whole layer's unit holds two axes), ordered [disk, host, device]. The KV cache of a
// micro-batch is split by whole sequences.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/policy.h"
#include "engine/schedule.h"
#include "model/weights.h"
#include "offload/tier.h"

namespace flexh2o {

struct PlacedTensor {
  std::string name;   // HF name; the head's tied lm_head is "lm_head.weight (tied)"
  TensorView source;  // where the loaded model holds the bytes
  Tier tier = Tier::kDevice;
  DType dtype = DType::F16;  // as every tier holds it: held_dtype()
  size_t bytes = 0;          // at `dtype` (TensorView::nbytes of the held tensor)
};

// The dtype a weight is held in on every tier (device, host and disk homes, the links): Q4 for
// a 2-D tensor when `compress` (Policy::compress_weight: matrices, embeddings and lm_head, as
// FlexGen; biases and norms stay), else `as` (the device's dtype) or the checkpoint's.
DType held_dtype(const TensorView& v, bool compress, std::optional<DType> as);
// Bytes of v held at dt (the one formula: TensorView::nbytes, Q4 records by row_nbytes).
size_t held_bytes(const TensorView& v, DType dt);

// A streamed tensor's offset in the device weight slot is aligned to kSlotAlign, a disk-homed
// one's in the host staging slot to kStageAlign (direct I/O).
inline constexpr size_t kSlotAlign = 256, kStageAlign = 4096;

// Bytes of one unit under a policy: per tier, and the slot / staging space its streamed /
// disk-homed tensors take (aligned as above).
struct UnitBytes {
  std::array<uint64_t, 3> tier{};
  uint64_t slot = 0, stage = 0;
};
// Tensors given by their bytes in place_weights' order (the planner's path to the same numbers).
std::vector<Tier> unit_tiers(const std::vector<size_t>& tensor_bytes, const Policy& p);
UnitBytes unit_bytes(const std::vector<size_t>& tensor_bytes, const Policy& p);
// A whole layer's unit (sep_layer false) as FlexGen places it: its attention and its MLP each by
// the midpoint rule over their own bytes (TransformerLayer.init_weight places the two modules
// apart), so a policy places the same bytes with either sep_layer; they stream together.
UnitBytes whole_layer_bytes(const std::vector<size_t>& attn_bytes, const std::vector<size_t>& mlp_bytes,
                            const Policy& p);

struct UnitPlacement {
  UnitKind kind = UnitKind::kLayer;
  int layer = -1;  // transformer layer of a kLayer / kAttention / kMlp unit
  std::vector<PlacedTensor> tensors;
  std::array<size_t, 3> bytes{};  // per tier
  size_t slot_bytes = 0, stage_bytes = 0;  // UnitBytes::slot / stage
  size_t streamed_bytes() const { return bytes[1] + bytes[2]; }  // cross to the device each step
};

struct WeightPlacement {
  std::vector<UnitPlacement> units;  // unit_kinds(n_layers, sep_layer)
  std::array<size_t, 3> bytes{};     // per tier, the homes of all units
  size_t max_streamed = 0;           // largest unit's slot bytes (one of the device double buffer)
  size_t max_disk = 0;               // largest unit's staging bytes (one of the host double buffer)
};

// Tier chosen by the midpoint rule for a tensor whose byte midpoint sits at `mid_percent`.
Tier midpoint_tier(double mid_percent, double w_gpu_percent, double w_cpu_percent);

// The bytes a tied lm_head (the embedding's table, `bytes` as held) adds to the homes of the
// head's tier: none where the table is homed on the same tier (the engine uses that home, on
// disk its file), all of them otherwise.
size_t tied_head_home_bytes(Tier embed, Tier head, size_t bytes);

// Units per p.sep_layer. `as`: the dtype the device holds weights in, or the checkpoint's dtype
// per tensor when unset; p.compress_weight makes every 2-D tensor Q4 (held_dtype). bytes: what
// every tier's homes hold (a tied head counted by tied_head_home_bytes()).
WeightPlacement place_weights(const Model& m, const Policy& p, std::optional<DType> as = std::nullopt);
// unit_bytes(...).tier
std::array<uint64_t, 3> place_unit(const std::vector<size_t>& tensor_bytes, const Policy& p);

// Sequences of one micro-batch per tier: the first n_device on the device, the next n_host
// on the host, the rest on disk (FlexGen: floor of the percentages, remainder to the last).
struct KvSplit {
  int64_t n_device = 0, n_host = 0, n_disk = 0;
};
KvSplit split_kv(int64_t gpu_batch_size, const Policy& p);

}  // namespace flexh2o
