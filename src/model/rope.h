// Rotary position embedding as a checkpoint's config.json defines it, computed the way
// transformers 5 does (modeling_rope_utils.py): the rope type, the inverse frequency of each
// pair of dimensions, and the factor that multiplies cos and sin. Plain value type; the
// rotary kernels of both devices consume inv_freq and attention_factor as they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flexh2o {

struct Rope {
  std::string type = "default";        // default | linear | dynamic | llama3 | yarn | longrope
  double theta = 10000;                // rope_theta: the base wavelength
  double factor = 1;                   // the context scaling factor (1 for default)
  int64_t original_max_positions = 0;  // llama3 / yarn / longrope: the pretraining length, else 0
  // rotary_dims / 2 values: pair (i, i + rotary_dims / 2) turns by position * inv_freq[i]; the
  // rotary dimensions are the head's first ones (all of it unless partial_rotary_factor < 1).
  std::vector<double> inv_freq;
  double attention_factor = 1;         // multiplies cos and sin (yarn, longrope; 1 otherwise)

  int64_t rotary_dims() const { return 2 * int64_t(inv_freq.size()); }
};

}  // namespace flexh2o
