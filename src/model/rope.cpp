// Rotary frequencies per rope type, as transformers 5's ROPE_INIT_FUNCTIONS compute them (in
// double where transformers uses float32), and the positions over which each is exact.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "model/detail/rope_parse.h"

namespace flexh2o::model_detail {
namespace {

double positive(const Reader& p, const char* key, double value) {
  if (!(value > 0)) FH_FAIL(p.source(), ": \"", key, "\" must be positive, got ", value);
  return value;
}

// A required key holding a positive number.
double positive_number(const Reader& p, const char* key) {
  if (!p.has(key)) FH_FAIL(p.source(), ": required key \"", key, "\" is missing");
  return positive(p, key, p.number_or(key, 0));
}

// Python's `x or default` for an optional number: absent, null and 0 all give the default.
double number_or_default(const Reader& p, const char* key, double dflt) {
  const double v = p.number_or(key, 0);
  return v != 0 ? v : dflt;
}

std::vector<double> default_inv_freq(double theta, int64_t dim) {
  std::vector<double> f(size_t(dim / 2));
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(theta, -2.0 * double(i) / double(dim));
  return f;
}

// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
void llama3(const Reader& p, Rope& rope) {
  const double low = positive_number(p, "low_freq_factor");
  const double high = positive_number(p, "high_freq_factor");
  if (!(high > low))
    FH_FAIL(p.source(), ": \"high_freq_factor\" (", high, ") must be greater than \"low_freq_factor\" (", low, ")");
  const double old_len = double(rope.original_max_positions);
  const double low_wavelen = old_len / low, high_wavelen = old_len / high;
  for (double& f : rope.inv_freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= rope.factor;
    } else if (!(wavelen < high_wavelen)) {
      const double smooth = (old_len / wavelen - low) / (high - low);
      f = (1 - smooth) * f / rope.factor + smooth * f;
    }
  }
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// YaRN: interpolation (divided by factor) below a ramp of dimensions, extrapolation above.
void yarn(const Reader& p, int64_t dim, Rope& rope) {
  const double beta_fast = positive(p, "beta_fast", number_or_default(p, "beta_fast", 32));
  const double beta_slow = positive(p, "beta_slow", number_or_default(p, "beta_slow", 1));
  if (!(rope.theta > 1)) FH_FAIL(p.source(), ": yarn needs \"rope_theta\" above 1, got ", rope.theta);
  const bool truncate = p.bool_or("truncate", true);
  auto correction_dim = [&](double rotations) {
    return double(dim) * std::log(double(rope.original_max_positions) / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(rope.theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  for (size_t i = 0; i < rope.inv_freq.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = rope.inv_freq[i], interpolation = extrapolation / rope.factor;
    rope.inv_freq[i] = interpolation * ramp + extrapolation * (1 - ramp);
  }
  if (p.has("attention_factor")) {
    rope.attention_factor = positive_number(p, "attention_factor");
  } else {
    const double mscale = p.number_or("mscale", 0), mscale_all_dim = p.number_or("mscale_all_dim", 0);
    rope.attention_factor = mscale != 0 && mscale_all_dim != 0
                                ? yarn_mscale(rope.factor, mscale) / yarn_mscale(rope.factor, mscale_all_dim)
                                : yarn_mscale(rope.factor, 1);
  }
}

std::vector<double> factor_list(const Reader& p, const char* key, size_t n) {
  if (!p.has(key)) FH_FAIL(p.source(), ": required key \"", key, "\" is missing");
  const json& v = p.object()[key];
  if (!v.is_array() || v.size() != n)
    FH_FAIL(p.source(), ": \"", key, "\" must be a list of ", n, " numbers (half the rotary dimensions), got ",
            json_excerpt(v));
  std::vector<double> out;
  for (const json& e : v) {
    if (!e.is_number() || !(e.get<double>() > 0) || !std::isfinite(e.get<double>()))
      FH_FAIL(p.source(), ": \"", key, "\" must hold positive finite numbers, got ", json_excerpt(e));
    out.push_back(e.get<double>());
  }
  return out;
}

// LongRoPE (Phi-3): per-pair divisors; within the pretraining length transformers uses the short ones.
void longrope(const Reader& p, Rope& rope) {
  if (rope.original_max_positions < 2)
    FH_FAIL(p.source(), ": longrope needs \"original_max_position_embeddings\" of 2 or more, got ",
            rope.original_max_positions);
  const std::vector<double> shorts = factor_list(p, "short_factor", rope.inv_freq.size());
  (void)factor_list(p, "long_factor", rope.inv_freq.size());
  for (size_t i = 0; i < shorts.size(); ++i) rope.inv_freq[i] /= shorts[i];
  if (p.has("attention_factor"))
    rope.attention_factor = positive_number(p, "attention_factor");
  else if (rope.factor > 1)
    rope.attention_factor = std::sqrt(1 + std::log(rope.factor) / std::log(double(rope.original_max_positions)));
}

int64_t scaled_positions(double positions, int64_t limit) {
  return positions >= double(limit) ? limit : std::max<int64_t>(1, int64_t(positions));
}

// Settings far outside any published model can still make a frequency or the factor overflow or
// vanish; they are refused rather than run as NaN.
void check_finite(const std::string& source, const Rope& rope) {
  for (const double f : rope.inv_freq)
    if (!(f > 0) || !std::isfinite(f))
      FH_FAIL(source, ": these ", rope.type, " rope settings give a rotary frequency of ", f);
  if (!(rope.attention_factor > 0) || !std::isfinite(rope.attention_factor))
    FH_FAIL(source, ": these ", rope.type, " rope settings give an attention factor of ", rope.attention_factor);
}

Rope parse_types(const Reader& r, int64_t head_dim, int64_t max_positions, bool phi3, int64_t* positions) {
  const json& j = r.object();
  // transformers: `rope_scaling or rope_parameters` (an empty rope_scaling counts as absent).
  const char* key = r.has("rope_scaling") && !(j["rope_scaling"].is_object() && j["rope_scaling"].empty())
                        ? "rope_scaling"
                    : r.has("rope_parameters") ? "rope_parameters"
                                               : nullptr;
  static const json kEmpty = json::object();
  if (key && !j[key].is_object()) FH_FAIL(r.source(), ": \"", key, "\" must be an object, got ", json_excerpt(j[key]));
  const json& rp = key ? j[key] : kEmpty;
  for (const auto& [name, value] : rp.items())
    if (value.is_object())
      FH_FAIL(r.source(), ": per-layer rope parameters (\"", key, "\" entry \"", name, "\") are not supported");
  const Reader p(rp, r.source() + (key ? std::string(" ") + key : std::string()));

  Rope rope;
  rope.type = p.string_or("rope_type", p.string_or("type", "default"));
  if (phi3 && (rope.type == "su" || rope.type == "yarn")) rope.type = "longrope";  // Phi3Config's renaming
  rope.theta = positive(p, "rope_theta", p.number_or("rope_theta", r.number_or("rope_theta", 10000.0)));
  // Phi-3's attention rotates the first int(head_dim * partial_rotary_factor) dimensions and
  // passes the rest; LLaMA's, Mistral's and Qwen2's rotate the whole head.
  const double partial = p.number_or("partial_rotary_factor", r.number_or("partial_rotary_factor", 1.0));
  if (partial != 1.0 && !phi3)
    FH_FAIL(r.source(), ": partial_rotary_factor ", partial, " is not supported (phi3 only; this model's attention",
            " rotates the whole head)");
  if (!(partial > 0 && partial <= 1)) FH_FAIL(r.source(), ": partial_rotary_factor must be in (0, 1], got ", partial);
  const int64_t dim = int64_t(double(head_dim) * partial);
  if (dim < 2 || dim % 2 != 0)
    FH_FAIL(r.source(), ": the rotary dimensions (head_dim ", head_dim, " x partial_rotary_factor ", partial, " = ",
            dim, ") must be even and at least 2");
  rope.inv_freq = default_inv_freq(rope.theta, dim);
  *positions = max_positions;
  const int64_t limit = kMaxIndex - 2;

  const std::string& t = rope.type;
  if (t == "default") return rope;
  if (t != "linear" && t != "dynamic" && t != "llama3" && t != "yarn" && t != "longrope")
    FH_FAIL(r.source(), ": ", key, " ", json_excerpt(rp), " is not supported (rope_type \"", t,
            "\"; supported: default, linear, dynamic, llama3, yarn, longrope)");
  if (t == "linear" || t == "dynamic" || t == "llama3" || p.has("factor"))
    rope.factor = positive_number(p, "factor");
  if (t == "linear") {
    for (double& f : rope.inv_freq) f /= rope.factor;
    *positions = scaled_positions(double(max_positions) * std::max(rope.factor, 1.0), limit);
    return rope;
  }
  if (t == "dynamic") return rope;  // within max_position_embeddings dynamic NTK is the default rope
  // Phi-3 keeps the pretraining length beside the rope settings; transformers prefers it there.
  rope.original_max_positions = r.has("original_max_position_embeddings")
                                    ? r.positive_int("original_max_position_embeddings", limit)
                                : phi3 ? 4096  // Phi3Config's default
                                       : p.positive_int_or("original_max_position_embeddings", limit, max_positions);
  // yarn and longrope without a factor take the ratio of the two lengths, as transformers does.
  if (!p.has("factor")) rope.factor = double(max_positions) / double(rope.original_max_positions);
  if (t == "llama3") {
    llama3(p, rope);
  } else if (t == "yarn") {
    yarn(p, dim, rope);
    *positions = std::max(max_positions, scaled_positions(double(rope.original_max_positions) * rope.factor, limit));
  } else {
    longrope(p, rope);
    *positions = std::min(max_positions, rope.original_max_positions);
  }
  return rope;
}

}  // namespace

Rope parse_rope(const Reader& r, int64_t head_dim, int64_t max_positions, bool phi3, int64_t* positions) {
  Rope rope = parse_types(r, head_dim, max_positions, phi3, positions);
  check_finite(r.source(), rope);
  return rope;
}

}  // namespace flexh2o::model_detail
