// The sampling flags of `flexh2o generate` (--greedy, --temperature, --top-k, --top-p, --min-p,
// the penalties, --seed): the defaults of flexh2o input lines (engine/sampler.h says what each does).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace flexh2o::cli {

// Binds the flags to `a`'s fields; `a` must outlive parsing.
void add_sampling_flags(CLI::App& g, GenerateArgs& a);

}  // namespace flexh2o::cli
