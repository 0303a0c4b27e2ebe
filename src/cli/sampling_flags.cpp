// The sampling flags of `flexh2o generate`, and the log-probabilities of its output lines.
#include "cli/sampling_flags.h"

namespace flexh2o::cli {

void add_sampling_flags(CLI::App& g, GenerateArgs& a) {
  g.add_flag("--greedy", a.greedy, "Greedy decoding (temperature 0), overrides lines' temperature");
  g.add_option("--temperature", a.temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  g.add_option("--top-k", a.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  g.add_option("--top-p", a.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  g.add_option("--min-p", a.min_p, "Keep tokens at least this fraction as likely as the most likely (0 = off)")
      ->capture_default_str();
  g.add_option("--repetition-penalty", a.repetition_penalty,
               "transformers' repetition penalty over the prompt and generated tokens: logits / p when "
               "positive, x p when negative (1 = off; greedy too)")
      ->capture_default_str();
  g.add_option("--presence-penalty", a.presence_penalty,
               "OpenAI's: minus this from each token generated so far, once (-2..2; 0 = off)")
      ->capture_default_str();
  g.add_option("--frequency-penalty", a.frequency_penalty,
               "OpenAI's: minus this times how often a token was generated so far (-2..2; 0 = off)")
      ->capture_default_str();
  g.add_option("--logprobs", a.logprobs,
               "Write each generated token's log-probability (the model's, in nats: before penalties and "
               "temperature) and the N most likely alternatives (0..20; 0 = the token's only) into "
               "flexh2o lines: \"logprobs\" and \"top_logprobs\"")
      ->check(CLI::Range(0, kMaxTopLogprobs));
  g.add_option("--seed", a.seed, "Base seed; line i uses seed+i unless it sets its own")->capture_default_str();
}

void add_logprobs(const GenerationResult& r, nlohmann::json& line) {
  if (!r.logprobs.empty()) line["logprobs"] = r.logprobs;
  if (r.top_logprobs.empty()) return;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& step : r.top_logprobs) {
    nlohmann::json alts = nlohmann::json::array();
    for (const TokenLogprob& t : step) alts.push_back({{"id", t.id}, {"logprob", t.logprob}});
    out.push_back(std::move(alts));
  }
  line["top_logprobs"] = std::move(out);
}

}  // namespace flexh2o::cli
