// resolve_model_dir over fake Hugging Face cache trees built in a temp dir: cache location
// precedence, refs/main, explicit commit and ref revisions, single snapshot, and the errors.
#include "loader/hub.h"

#include <gtest/gtest.h>

#include <fstream>

#include "loader/loader_test_util.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;

constexpr const char* kMain = "0123456789abcdef0123456789abcdef01234567";
constexpr const char* kOld = "fedcba9876543210fedcba9876543210fedcba98";

// A cache directory holding models--ORG--NAME with the given snapshots and refs.
fs::path make_repo(const fs::path& cache, const std::string& org, const std::string& name,
                   const std::vector<std::string>& snapshots, const std::map<std::string, std::string>& refs) {
  const fs::path repo = cache / ("models--" + org + "--" + name);
  fs::create_directories(repo / "snapshots");
  for (const auto& s : snapshots) {
    fs::create_directories(repo / "snapshots" / s);
    std::ofstream(repo / "snapshots" / s / "config.json") << "{}";
  }
  for (const auto& [ref, commit] : refs) {
    fs::create_directories((repo / "refs" / ref).parent_path());
    std::ofstream(repo / "refs" / ref) << commit;  // hub writes no trailing newline; we accept one
  }
  return repo;
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "missing \"" << part << "\" in: " << msg;
}

TEST(Hub, ExistingDirectoryIsReturnedAsIs) {
  TempDir dir;
  EXPECT_EQ(resolve_model_dir(dir.path().string(), HubEnv{}), dir.path());
  EXPECT_EQ(resolve_model_dir(FLEXH2O_TEST_DATA "/tiny-opt", HubEnv{}), fs::path(FLEXH2O_TEST_DATA "/tiny-opt"));
}

TEST(Hub, RefsMainWins) {
  TempDir dir;
  const auto repo = make_repo(dir / "hc", "facebook", "opt-125m", {kMain, kOld}, {{"main", kMain}});
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  EXPECT_EQ(resolve_model_dir("facebook/opt-125m", env), repo / "snapshots" / kMain);
}

TEST(Hub, RefFileWithTrailingNewline) {
  TempDir dir;
  const auto repo = make_repo(dir / "hc", "o", "m", {kMain, kOld}, {{"main", std::string(kOld) + "\n"}});
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  EXPECT_EQ(resolve_model_dir("o/m", env), repo / "snapshots" / kOld);
}

TEST(Hub, CacheLocationPrecedence) {
  TempDir dir;
  const auto a = make_repo(dir / "hub_cache", "o", "m", {kMain}, {});
  const auto b = make_repo(dir / "hf_home" / "hub", "o", "m", {kMain}, {});
  const auto c = make_repo(dir / "home" / ".cache" / "huggingface" / "hub", "o", "m", {kMain}, {});
  HubEnv env;
  env.home = dir / "home";
  EXPECT_EQ(resolve_model_dir("o/m", env), c / "snapshots" / kMain);
  env.hf_home = dir / "hf_home";
  EXPECT_EQ(resolve_model_dir("o/m", env), b / "snapshots" / kMain);
  env.hf_hub_cache = dir / "hub_cache";
  EXPECT_EQ(resolve_model_dir("o/m", env), a / "snapshots" / kMain);
}

TEST(Hub, ExplicitCommitAndRefRevisions) {
  TempDir dir;
  const auto repo = make_repo(dir / "hc", "meta-llama", "Llama-2-7b-hf", {kMain, kOld},
                              {{"main", kMain}, {"v1.0", kOld}, {"pr/3", kOld}});
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  EXPECT_EQ(resolve_model_dir(std::string("meta-llama/Llama-2-7b-hf@") + kOld, env), repo / "snapshots" / kOld);
  EXPECT_EQ(resolve_model_dir("meta-llama/Llama-2-7b-hf@v1.0", env), repo / "snapshots" / kOld);
  EXPECT_EQ(resolve_model_dir("meta-llama/Llama-2-7b-hf@pr/3", env), repo / "snapshots" / kOld);
  EXPECT_EQ(resolve_model_dir("meta-llama/Llama-2-7b-hf@main", env), repo / "snapshots" / kMain);
}

TEST(Hub, SingleSnapshotWithoutRefs) {
  TempDir dir;
  const auto repo = make_repo(dir / "hc", "o", "m", {kOld}, {});
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  EXPECT_EQ(resolve_model_dir("o/m", env), repo / "snapshots" / kOld);
}

TEST(Hub, ModelNotInCacheSaysWhereAndHowToFetch) {
  TempDir dir;
  fs::create_directories(dir / "hc");
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  const std::string msg = error_of([&] { resolve_model_dir("facebook/opt-1.3b", env); });
  expect_has(msg, "facebook/opt-1.3b");
  expect_has(msg, (dir / "hc" / "models--facebook--opt-1.3b" / "snapshots").string());
  expect_has(msg, "huggingface-cli download facebook/opt-1.3b");
  expect_has(msg, "never downloads");
}

TEST(Hub, UnknownRevision) {
  TempDir dir;
  const auto repo = make_repo(dir / "hc", "o", "m", {kMain}, {{"main", kMain}});
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  const std::string msg = error_of([&] { resolve_model_dir("o/m@v9", env); });
  expect_has(msg, "revision v9 of model o/m not found");
  expect_has(msg, (repo / "refs" / "v9").string());
  expect_has(msg, (repo / "snapshots" / "v9").string());
  expect_has(msg, "huggingface-cli download o/m --revision v9");
}

TEST(Hub, RefPointsToMissingSnapshot) {
  TempDir dir;
  make_repo(dir / "hc", "o", "m", {kOld}, {{"main", kMain}});
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  const std::string msg = error_of([&] { resolve_model_dir("o/m", env); });
  expect_has(msg, kMain);
  expect_has(msg, "does not exist");
  expect_has(msg, "huggingface-cli download o/m");
}

TEST(Hub, NoSnapshotsOrSeveralWithoutMain) {
  TempDir dir;
  HubEnv env;
  env.hf_hub_cache = dir / "hc";
  make_repo(dir / "hc", "o", "empty", {}, {});
  expect_has(error_of([&] { resolve_model_dir("o/empty", env); }), "holds no snapshot");
  make_repo(dir / "hc", "o", "two", {kMain, kOld}, {});
  const std::string msg = error_of([&] { resolve_model_dir("o/two", env); });
  expect_has(msg, "several snapshots");
  expect_has(msg, kMain);
  expect_has(msg, "o/two@REVISION");
}

TEST(Hub, NoCacheKnown) {
  const std::string msg = error_of([&] { resolve_model_dir("o/m", HubEnv{}); });
  expect_has(msg, "HF_HUB_CACHE, HF_HOME and HOME are all unset");
  expect_has(msg, "huggingface-cli download o/m");
}

TEST(Hub, NeitherDirectoryNorHubId) {
  TempDir dir;
  for (const std::string& spec : {(dir / "nope").string(), std::string("just-a-name"), std::string("a/b/c"),
                                 std::string("./rel"), std::string("o/m@../../etc"), std::string("")}) {
    const std::string msg = error_of([&] { resolve_model_dir(spec, HubEnv{}); });
    expect_has(msg, "no such model directory: " + spec);
  }
  test::write_bytes(dir / "model.safetensors", "x");
  expect_has(error_of([&] { resolve_model_dir((dir / "model.safetensors").string(), HubEnv{}); }), "is a file");
}

}  // namespace
}  // namespace flexh2o
