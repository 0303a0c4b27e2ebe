// Reads config.json values with checks: each getter validates type and range and throws
// flexh2o::Error naming the source and the key. Internal to flexh2o::model (config.cpp,
// rope.cpp); a Reader borrows the JSON object it reads and must not outlive it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::model_detail {

using nlohmann::json;

// Upper bounds far above any published model (LLaMA-3 405B: hidden 16384, 126 layers, 128
// heads), chosen so that every product the engine forms from them (vocab x hidden, layers x
// kv_dim x bytes, ...) fits in int64 and every layer or token index fits in int32.
constexpr int64_t kMaxDim = int64_t(1) << 20;      // hidden, ffn, head_dim
constexpr int64_t kMaxCount = int64_t(1) << 16;    // layers, heads
constexpr int64_t kMaxIndex = INT32_MAX;           // vocabulary size, positions, token ids

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  // A required integer in [1, hi].
  int64_t positive_int(const char* key, int64_t hi) const {
    if (!has(key)) FH_FAIL(source_, ": required key \"", key, "\" is missing");
    return json_to_int(j_[key], 1, hi, name(key));
  }
  int64_t positive_int_or(const char* key, int64_t hi, int64_t dflt) const {
    return has(key) ? positive_int(key, hi) : dflt;
  }
  // An optional integer in [0, hi].
  int64_t count_or(const char* key, int64_t hi, int64_t dflt) const {
    return has(key) ? json_to_int(j_[key], 0, hi, name(key)) : dflt;
  }
  double number_or(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_[key];
    // float(x) of a double beyond float's range is undefined: refuse it here.
    if (!v.is_number() || !(std::fabs(v.get<double>()) <= double(std::numeric_limits<float>::max())))
      FH_FAIL(source_, ": \"", key, "\" must be a finite number, got ", json_excerpt(v));
    return v.get<double>();
  }
  bool bool_or(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_boolean()) FH_FAIL(source_, ": \"", key, "\" must be true or false, got ", json_excerpt(j_[key]));
    return j_[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_string()) FH_FAIL(source_, ": \"", key, "\" must be a string, got ", json_excerpt(j_[key]));
    return j_[key].get<std::string>();
  }
  // A token id, or the first of a list of them (LLaMA-3.1 and Gemma list several eos ids).
  std::optional<int32_t> token_id(const char* key) const {
    const std::vector<int32_t> ids = token_ids(key);
    if (ids.empty()) return std::nullopt;
    return ids[0];
  }
  // Every id of a token id or a non-empty list of them; none where the key is absent.
  std::vector<int32_t> token_ids(const char* key) const {
    if (!has(key)) return {};
    const json& v = j_[key];
    if (!v.is_array()) return {int32_t(json_to_int(v, 0, kMaxIndex, name(key)))};
    if (v.empty()) FH_FAIL(source_, ": \"", key, "\" is an empty list, not a token id");
    std::vector<int32_t> ids;
    for (const json& id : v) ids.push_back(int32_t(json_to_int(id, 0, kMaxIndex, name(key))));
    return ids;
  }
  const std::string& source() const { return source_; }
  const json& object() const { return j_; }

 private:
  std::string name(const char* key) const { return source_ + ": \"" + key + "\""; }

  const json& j_;
  std::string source_;
};

}  // namespace flexh2o::model_detail
