// Policy validation, printing and JSON (de)serialisation.
#include "engine/policy.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o {
namespace {

// Sequences per micro-batch and micro-batches per block: bounded so that their product (the
// block) and the per-block buffers sized from it cannot overflow.
constexpr int64_t kMaxBatch = int64_t(1) << 20;

void check_pair(const char* what, double gpu, double cpu) {
  for (double v : {gpu, cpu})
    if (!(v >= 0 && v <= 100)) FH_FAIL(what, " percentages must be in [0, 100], got ", gpu, " and ", cpu);
  if (gpu + cpu > 100 + 1e-9) FH_FAIL(what, " percentages on device and host sum to ", gpu + cpu, " > 100");
}

}  // namespace

void Policy::set_percent(std::span<const double, 6> v) {
  w_gpu_percent = v[0], w_cpu_percent = v[1], cache_gpu_percent = v[2];
  cache_cpu_percent = v[3], act_gpu_percent = v[4], act_cpu_percent = v[5];
}

void Policy::validate() const {
  if (gpu_batch_size < 1 || gpu_batch_size > kMaxBatch)
    FH_FAIL("gpu_batch_size must be in [1, ", kMaxBatch, "], got ", gpu_batch_size);
  if (num_gpu_batches < 1 || num_gpu_batches > kMaxBatch)
    FH_FAIL("num_gpu_batches must be in [1, ", kMaxBatch, "], got ", num_gpu_batches);
  check_pair("weight", w_gpu_percent, w_cpu_percent);
  check_pair("KV cache", cache_gpu_percent, cache_cpu_percent);
  check_pair("activation", act_gpu_percent, act_cpu_percent);
  // FlexGen's disk home for activations (0 0) is not one this engine has: the last pair is 100 0 or 0 100.
  if (act_gpu_percent != 100 && act_cpu_percent != 100)
    FH_FAIL("activations must live on one tier, the device or the host (the last pair of --percent: 100 0 or 0 "
            "100), got ", act_gpu_percent, " ", act_cpu_percent,
            act_disk_percent() == 100 ? " (disk; activations cannot be homed there)" : "");
}

std::string Policy::str() const {
  std::ostringstream os;
  os << "--percent " << w_gpu_percent << " " << w_cpu_percent << " " << cache_gpu_percent << " "
     << cache_cpu_percent << " " << act_gpu_percent << " " << act_cpu_percent << " --gpu-batch-size "
     << gpu_batch_size << " --num-gpu-batches " << num_gpu_batches;
  if (cpu_cache_compute) os << " --cpu-cache-compute";
  if (compress_weight) os << " --compress-weight";
  if (compress_cache) os << " --compress-cache";
  if (!overlap) os << " --overlap false";
  if (!sep_layer) os << " --sep-layer false";
  return os.str();
}

Policy policy_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) FH_FAIL(source, ": a policy must be a JSON object");
  Policy p;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();  // named locals, not a structured binding: lambdas capture them
    const nlohmann::json& v = it.value();
    auto wrong_type = [&] { FH_FAIL(source, ": policy key \"", key, "\" has the wrong type: ", json_excerpt(v)); };
    try {
      auto count = [&] {  // range-checked: 2.5 is not 2, 1e30 is not anything
        if (!v.is_number()) wrong_type();
        return json_to_int(v, 1, kMaxBatch, source + ": \"" + key + "\"");
      };
      if (key == "gpu_batch_size") p.gpu_batch_size = count();
      else if (key == "num_gpu_batches") p.num_gpu_batches = count();
      else if (key == "w_gpu_percent") p.w_gpu_percent = v.get<double>();
      else if (key == "w_cpu_percent") p.w_cpu_percent = v.get<double>();
      else if (key == "cache_gpu_percent") p.cache_gpu_percent = v.get<double>();
      else if (key == "cache_cpu_percent") p.cache_cpu_percent = v.get<double>();
      else if (key == "act_gpu_percent") p.act_gpu_percent = v.get<double>();
      else if (key == "act_cpu_percent") p.act_cpu_percent = v.get<double>();
      else if (key == "overlap") p.overlap = v.get<bool>();
      else if (key == "sep_layer") p.sep_layer = v.get<bool>();
      else if (key == "pin_weight") p.pin_weight = v.get<bool>();
      else if (key == "cpu_cache_compute") p.cpu_cache_compute = v.get<bool>();
      else if (key == "compress_weight") p.compress_weight = v.get<bool>();
      else if (key == "compress_cache") p.compress_cache = v.get<bool>();
      else if (key == "percent") {
        auto a = v.get<std::vector<double>>();
        if (a.size() != 6) FH_FAIL(source, ": \"percent\" needs 6 numbers, got ", a.size());
        p.set_percent(std::span<const double, 6>(a.data(), 6));
      } else {
        FH_FAIL(source, ": unknown policy key \"", key, "\"");
      }
    } catch (const nlohmann::json::exception&) {
      wrong_type();
    }
  }
  p.validate();
  return p;
}

nlohmann::json policy_to_json(const Policy& p) {
  return {{"gpu_batch_size", p.gpu_batch_size},
          {"num_gpu_batches", p.num_gpu_batches},
          {"percent",
           {p.w_gpu_percent, p.w_cpu_percent, p.cache_gpu_percent, p.cache_cpu_percent, p.act_gpu_percent,
            p.act_cpu_percent}},
          {"overlap", p.overlap},
          {"sep_layer", p.sep_layer},
          {"pin_weight", p.pin_weight},
          {"cpu_cache_compute", p.cpu_cache_compute},
          {"compress_weight", p.compress_weight},
          {"compress_cache", p.compress_cache}};
}

}  // namespace flexh2o
