// Four greedy requests of different lengths (the batch is left-padded), shared by the tests
// that compare runners (CPU KV policies, GPU runners) on the tiny models.
#pragma once

#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/test_util.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::test {

inline std::vector<GenerationRequest> bible_requests(const std::string& model, int64_t gen) {
  Tokenizer tok = Tokenizer::load(model_dir(model));
  std::vector<GenerationRequest> reqs;
  for (const char* p : {"In the beginning God created the heaven and the earth. And the earth was without form",
                        "And", "The LORD is my shepherd; I shall not want. He maketh me to lie down", "Jesus wept."}) {
    GenerationRequest r;
    r.prompt_ids = tok.encode(p, true);
    r.max_new_tokens = gen;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace flexh2o::test
