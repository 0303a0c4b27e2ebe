// The sampling flags of `flexh2o generate`, the model's generation_config.json defaults, and the
// log-probabilities of its output lines.
#include "cli/sampling_flags.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::cli {

void add_sampling_flags(CLI::App& g, GenerateArgs& a) {
  // A flag given on the command line wins over generation_config.json.
  auto given = [&a](const char* name) { return [&a, name](const std::string&) { a.sampling_given.insert(name); }; };
  g.add_flag("--greedy", a.greedy, "Greedy decoding (temperature 0), overrides lines' temperature");
  g.add_option("--temperature", a.temperature, "Sampling temperature (0 = greedy)")
      ->capture_default_str()
      ->each(given("temperature"));
  g.add_option("--top-k", a.top_k, "Keep the k most likely tokens (0 or -1 = off)")
      ->capture_default_str()
      ->each(given("top_k"));
  g.add_option("--top-p", a.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str()->each(given("top_p"));
  g.add_option("--min-p", a.min_p, "Keep tokens at least this fraction as likely as the most likely (0 = off)")
      ->capture_default_str()
      ->each(given("min_p"));
  g.add_option("--repetition-penalty", a.repetition_penalty,
               "transformers' repetition penalty: the logit of each token already in the prompt or the "
               "output is divided by it when positive, multiplied when negative (> 0; 1 = off; greedy too)")
      ->capture_default_str()
      ->each(given("repetition_penalty"));
  g.add_option("--presence-penalty", a.presence_penalty,
               "OpenAI's: minus this from each token generated so far, once (-2..2; 0 = off)")
      ->capture_default_str();
  g.add_option("--frequency-penalty", a.frequency_penalty,
               "OpenAI's: minus this times how often a token was generated so far (-2..2; 0 = off)")
      ->capture_default_str();
  g.add_option("--generation-config", a.generation_config,
               "auto: the model directory's generation_config.json sets the defaults of --temperature, --top-k, "
               "--top-p, --min-p and --repetition-penalty where it has them and the flag is not given (as vLLM "
               "does; the run says which); none: the flags' own defaults. Either way every eos_token_id of "
               "that file and of config.json ends a sequence, beside the tokenizer's EOS (as in transformers)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none"}));
  g.add_option("--logprobs", a.logprobs,
               "Write each generated token's log-probability (the model's, in nats: before penalties and "
               "temperature) and the N most likely alternatives (0..20; 0 = the token's only) into "
               "flexh2o lines: \"logprobs\" and \"top_logprobs\"")
      ->check(CLI::Range(0, kMaxTopLogprobs));
  g.add_option("--seed", a.seed, "Base seed; line i uses seed+i unless it sets its own")
      ->capture_default_str()
      ->check(seed_check());
}

CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& s) {
        const char* end = s.data() + s.size();
        uint64_t u = 0;
        int64_t i = 0;
        if (const auto r = std::from_chars(s.data(), end, u); r.ec == std::errc() && r.ptr == end) return std::string();
        if (const auto r = std::from_chars(s.data(), end, i); r.ec == std::errc() && r.ptr == end) return std::string();
        return "must be an integer in [-9223372036854775808, 18446744073709551615] (taken modulo 2**64), got " + s;
      },
      "INT");
}

std::optional<double> GenerationConfig::value(const std::string& key) const {
  for (const auto& [k, v] : values)
    if (k == key) return v;
  return std::nullopt;
}

GenerationConfig read_generation_config(const std::filesystem::path& model_dir, const std::string& turn_off) {
  GenerationConfig g;
  if (model_dir.empty()) return g;
  const std::filesystem::path file = model_dir / "generation_config.json";
  std::ifstream in(file);
  if (!in) return g;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    FH_FAIL(file.string(), ": not valid JSON (", json_error_text(e), "); fix it or pass ", turn_off);
  }
  if (!j.is_object()) FH_FAIL(file.string(), ": not a JSON object; fix it or pass ", turn_off);
  g.file = file;
  for (const char* key : kGenerationConfigKeys) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_number())
      FH_FAIL(file.string(), ": \"", key, "\" must be a number, got ", j[key].dump(), "; fix it or pass ", turn_off);
    if (std::string_view(key) == "top_k") {  // a count: 1.5 is no top_k (and 1e12 no int)
      try {
        g.values.emplace_back(key, double(json_to_int(j[key], -1, INT32_MAX, "\"top_k\"")));
      } catch (const Error& e) {
        std::string why = e.what();
        if (!why.empty() && why.back() == '.') why.pop_back();
        FH_FAIL(file.string(), ": ", why, "; fix it or pass ", turn_off);
      }
      continue;
    }
    g.values.emplace_back(key, j[key].get<double>());
  }
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const nlohmann::json& e = j["eos_token_id"];
    const bool list = e.is_array() && !e.empty();
    for (size_t i = 0; i < (list ? e.size() : 1); ++i) {
      const nlohmann::json& id = list ? e[i] : e;
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        FH_FAIL(file.string(), ": \"eos_token_id\" must be a token id or a non-empty list of them, got ", e.dump(),
                "; fix it or pass ", turn_off);
      g.eos_ids.push_back(id.get<int32_t>());
    }
  }
  return g;
}

GenerationConfig read_generation_config(const std::string& mode, const std::filesystem::path& model_dir,
                                        const std::string& turn_off) {
  if (mode == "auto") return read_generation_config(model_dir, turn_off);
  try {
    GenerationConfig g = read_generation_config(model_dir, turn_off);
    g.values.clear();
    return g;
  } catch (const Error&) {
    return {};
  }
}

std::vector<int32_t> end_of_sequence_ids(const ModelConfig& c, std::optional<int32_t> tokenizer_eos,
                                         const GenerationConfig& g, std::ostream& log) {
  std::vector<int32_t> ids;
  auto add = [&](int32_t id, const std::string& from) {
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) return;
    if (id >= c.vocab_size) {
      log << "flexh2o: warning: " << from << " names end-of-sequence id " << id << ", outside the model's "
          << c.vocab_size << " ids: the model never samples it, so no sequence ends there\n";
      return;
    }
    ids.push_back(id);
  };
  if (tokenizer_eos) add(*tokenizer_eos, "the tokenizer");
  for (int32_t id : c.eos_ids) add(id, "config.json");
  if (c.eos_ids.empty() && c.eos_id) add(*c.eos_id, "the model's config");
  for (int32_t id : g.eos_ids) add(id, g.file.string());
  return ids;
}

GenerationConfig apply_generation_config(GenerateArgs& a, const std::filesystem::path& model_dir,
                                         std::ostream& log) {
  GenerationConfig g = read_generation_config(a.generation_config, model_dir, "--generation-config none");
  std::ostringstream used;
  auto take = [&](const char* key, auto& field) {
    const std::optional<double> v = g.value(key);
    if (!v || a.sampling_given.count(key)) return;
    field = static_cast<std::remove_reference_t<decltype(field)>>(*v);
    used << (used.tellp() > 0 ? ", " : "") << key << " " << field;
  };
  take("temperature", a.temperature);
  take("top_k", a.top_k);
  take("top_p", a.top_p);
  take("min_p", a.min_p);
  take("repetition_penalty", a.repetition_penalty);
  if (used.tellp() > 0)
    log << "flexh2o: sampling defaults from " << g.file.string() << ": " << used.str()
        << " (flags and line fields override them; --generation-config none ignores the file)\n";
  return g;
}

void check_sampling_defaults(const GenerateArgs& a) {
  if (a.greedy && a.sampling_given.count("temperature") && a.temperature != 0)
    FH_FAIL("--greedy is temperature 0 and --temperature is ", a.temperature, ": give one of them");
  SamplingParams s;
  s.temperature = a.greedy ? 0.f : a.temperature;
  s.top_k = a.top_k;
  s.top_p = a.top_p;
  s.min_p = a.min_p;
  s.repetition_penalty = a.repetition_penalty;
  s.presence_penalty = a.presence_penalty;
  s.frequency_penalty = a.frequency_penalty;
  try {
    validate(s);
  } catch (const Error& e) {
    const std::string msg = e.what(), key = msg.substr(0, msg.find(' '));
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const bool from_file = a.sampling_given.count(key) == 0 && a.generation_config == "auto" &&
                           std::find(std::begin(kGenerationConfigKeys), std::end(kGenerationConfigKeys), key) !=
                               std::end(kGenerationConfigKeys);
    FH_FAIL(msg, from_file ? " (the model's generation_config.json; --generation-config none ignores it)"
                           : " (" + flag + ")");
  }
}

void add_logprobs(const GenerationRequest& q, const GenerationResult& r, nlohmann::json& line) {
  if (q.top_logprobs < 0) return;
  line["logprobs"] = r.logprobs;  // [] for a request that generated nothing
  if (q.top_logprobs == 0) return;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& step : r.top_logprobs) {
    nlohmann::json alts = nlohmann::json::array();
    for (const TokenLogprob& t : step) alts.push_back({{"id", t.id}, {"logprob", t.logprob}});
    out.push_back(std::move(alts));
  }
  line["top_logprobs"] = std::move(out);
}

}  // namespace flexh2o::cli
