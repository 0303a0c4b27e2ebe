// Names the program looks up, mistyped or looked up where they are not: a model that is neither
// a directory nor a preset lists the presets it could have meant (or says the configs directory
// holds none), a hardware profile name lists the profiles there, and --offload-dir through a link
// to a directory not made yet is followed.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;

RunResult flexh2o(const std::string& args) { return flexh2o::test::run_flexh2o(args); }

TEST(Lookup, AMistypedPresetListsThePresets) {
  RunResult r = flexh2o("info opt-30bb");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("no such model directory or preset: opt-30bb (presets in "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("opt-13b, opt-175b, opt-2.7b, opt-30b, opt-6.7b"), std::string::npos) << r.err;
  TempDir empty;
  r = flexh2o("--configs " + empty.path().string() + " info opt-30b");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("models holds no presets: give --configs DIR before the command"), std::string::npos) << r.err;
  // A path is a path: not said as a preset.
  r = flexh2o("info ./opt-30bb");
  EXPECT_NE(r.err.find("no such model directory: ./opt-30bb"), std::string::npos) << r.err;
}

TEST(Lookup, AnUnknownHardwareProfileListsTheProfiles) {
  RunResult r = flexh2o("plan -m opt-125m --hardware t4 --prompt-len 8 --gen-len 2");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("hardware profile \"t4\" is neither a file nor a name in"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(names there: h200, t4-paper; or run `flexh2o profile`"), std::string::npos) << r.err;
}

TEST(Lookup, AnOffloadDirLinkedToADirectoryNotMadeYetIsFollowed) {
  TempDir tmp;
  fs::create_symlink(tmp.path() / "nvme" / "offload", tmp.path() / "off");
  RunResult r = flexh2o("generate -m " + flexh2o::test::model_dir("tiny-opt").string() +
                        " --prompt hi -n 2 --greedy --device cpu --percent 0 0 0 0 100 0 --offload-dir " +
                        (tmp.path() / "off").string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_directory(tmp.path() / "nvme" / "offload"));
}

}  // namespace
