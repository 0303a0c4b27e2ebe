// `flexh2o profile`: measures this machine (tiers, links, disk, GEMM and attention rates of
// the CPU device) into a hardware profile JSON for `flexh2o plan --hardware FILE`.
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "planner/profile.h"

namespace flexh2o::cli {

void register_profile(CLI::App& app, ProfileArgs& a) {
  CLI::App* s = app.add_subcommand("profile", "Measure this machine into a hardware profile JSON");
  s->add_option("--offload-dir", a.offload_dir, "Directory on the disk tier to probe (default: temp dir)");
  s->add_option("-o,--output", a.output, "Write the profile here (default, - or /dev/stdout: standard output)");
  add_threads_flag(s, a.threads);
  s->add_option("--name", a.name, "Profile name");
}

int run_profile(const ProfileArgs& args, const Env&) {
  ProfileArgs a = args;
  if (names_standard_output(a.output, "--output")) a.output.clear();
  check_can_write({"--output", a.output});
  CpuDevice dev(a.threads);
  ProfileOptions o;
  o.offload_dir = a.offload_dir;
  HardwareProfile h = measure_profile(dev, o);
  if (!a.name.empty()) h.name = a.name;
  if (a.output.empty()) std::cout << h.to_json().dump(2) << "\n";
  else write_json_file(a.output, h.to_json());
  return 0;
}

}  // namespace flexh2o::cli
