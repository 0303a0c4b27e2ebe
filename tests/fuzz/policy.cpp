// Fuzz target: a --policy FILE read by cli::make_offload_options (JSON -> policy_from_json ->
// Policy::validate), as generate/bench/eval do. An accepted policy must survive a round trip
// through policy_to_json unchanged: what the run report records is what ran.
#include "cli/offload_flags.h"
#include "engine/policy.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flexh2o;
  static const std::filesystem::path file = fuzz::scratch() / "policy.json";
  fuzz::write_file(file, fuzz::as_text(data, size));
  fuzz::expect_clean(file.string(), [&] {
    cli::OffloadArgs args;
    args.policy_file = file.string();
    const Policy p = cli::make_offload_options(args).policy;
    const nlohmann::json j = policy_to_json(p);
    if (policy_to_json(policy_from_json(j, file.string())) != j)
      fuzz::finding("an accepted policy changed in a policy_to_json/policy_from_json round trip");
  });
  return 0;
}
