// Fixtures shared by the OpenAI Batch tests: tiny-opt's tokenizer and a Batch input line.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/test_util.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::cli::test_batch {

inline const Tokenizer& opt_tokenizer() {
  static const Tokenizer t = Tokenizer::load(flexh2o::test::model_dir("tiny-opt"));
  return t;
}

// A Batch input line of custom_id "c1" posting `body` to `url`.
inline nlohmann::json line(const std::string& url, nlohmann::json body) {
  return nlohmann::json{{"custom_id", "c1"}, {"method", "POST"}, {"url", url}, {"body", std::move(body)}};
}

}  // namespace flexh2o::cli::test_batch
