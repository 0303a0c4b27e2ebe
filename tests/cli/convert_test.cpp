// PyTorch checkpoints through the program: `convert` (round trip to safetensors equal to the
// safetensors twin, never overwriting, nothing left behind on failure, malicious input refused
// without its payload running) and `generate` / `info` on a pytorch_model.bin directory.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "loader/safetensors.h"
#include "loader/safetensors_writer.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::SafetensorsArchive;
using flexh2o::test::read_text;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
using nlohmann::json;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

const fs::path kTorch = flexh2o::test::data_dir() / "torch";

RunResult flexh2o(const std::string& args) { return flexh2o::test::run_flexh2o(args); }

// Same names, dtypes, shapes and bytes, except that `b_only` (if not empty) is in b and not in a.
void expect_same_tensors(const fs::path& a_file, const fs::path& b_file, const std::string& b_only = "") {
  const SafetensorsArchive a = SafetensorsArchive::open_file(a_file), b = SafetensorsArchive::open_file(b_file);
  std::vector<flexh2o::TensorEntry> want;
  for (const auto& t : b.tensors())
    if (t.name != b_only) want.push_back(t);
  if (!b_only.empty()) {
    ASSERT_EQ(want.size() + 1, b.tensors().size()) << b_only << " is not in " << b_file;
  }
  ASSERT_EQ(a.tensors().size(), want.size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const auto &x = a.tensors()[i], &y = want[i];
    SCOPED_TRACE(x.name);
    ASSERT_EQ(x.name, y.name);
    EXPECT_EQ(x.view.dtype, y.view.dtype);
    EXPECT_EQ(x.view.shape, y.view.shape);
    ASSERT_EQ(x.view.nbytes(), y.view.nbytes());
    EXPECT_EQ(0, std::memcmp(x.view.data, y.view.data, x.view.nbytes()));
  }
}

// Greedy token ids for two prompts given as ids (the fixtures have no tokenizer).
json greedy_ids(const fs::path& model, const TempDir& tmp) {
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / ("out-" + model.filename().string() + ".jsonl");
  std::ofstream(in) << json{{"prompt_ids", {2, 17, 99, 5}}} << "\n" << json{{"prompt_ids", {7, 1}}} << "\n";
  const RunResult r = flexh2o("generate --model " + model.string() + " --input " + in.string() + " --output " +
                              out.string() + " --greedy --ignore-eos -n 6 --device cpu --progress never");
  EXPECT_EQ(r.code, 0) << r.err;
  json ids = json::array();
  std::ifstream lines(out);
  for (std::string line; std::getline(lines, line);) ids.push_back(json::parse(line)["token_ids"]);
  return ids;
}

// The twin holds every tensor of the .bin; a tied head (opt-f16, llama-f32) is written once, as the
// embedding, the way transformers saves it.
TEST(Convert, RoundTripEqualsTheTwinAndGeneratesTheSame) {
  for (const auto& [name, tied] : {std::pair{"opt-f16", true}, {"llama-bf16-sharded", false}, {"llama-f32", true}}) {
    SCOPED_TRACE(name);
    const fs::path src = kTorch / name;
    TempDir tmp;
    const fs::path out = tmp.path() / "converted";
    const RunResult r = flexh2o("convert --model " + src.string() + " --output " + out.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_HAS(r.out, "to " + (out / "model.safetensors").string());
    EXPECT_EQ(r.out.find("lm_head.weight is tied to the embedding") != std::string::npos, tied) << r.out;
    expect_same_tensors(out / "model.safetensors", src / "reference.safetensors", tied ? "lm_head.weight" : "");
    EXPECT_EQ(SafetensorsArchive::open_file(out / "model.safetensors").metadata().at("format"), "pt");
    EXPECT_EQ(read_text(out / "config.json"), read_text(src / "config.json"));
    // Only the weights and config: no index, no reference, no staging directory left.
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(out)) files += e.is_regular_file();
    EXPECT_EQ(files, 2u);
    for (const auto& e : fs::directory_iterator(tmp.path())) EXPECT_EQ(e.path().filename(), "converted");

    const json from_bin = greedy_ids(src, tmp), from_st = greedy_ids(out, tmp);
    ASSERT_EQ(from_bin.size(), 2u);
    EXPECT_EQ(from_bin[0].size(), 6u);
    EXPECT_EQ(from_bin, from_st);
  }
}

// The head is left out only when both the config ties it and its bytes are the embedding's: an
// aliased head under an untied config, or a tied config over a distinct head, keeps its tensor.
TEST(Convert, HeadIsDroppedOnlyWhenTiedAndEqual) {
  struct Case {
    const char* model;
    bool tie;  // the tie_word_embeddings written into the copy's config
  };
  for (const Case c : {Case{"opt-f16", false}, Case{"llama-bf16-sharded", true}}) {
    SCOPED_TRACE(c.model);
    TempDir tmp;
    const fs::path model = tmp.path() / "model", out = tmp.path() / "out";
    fs::copy(kTorch / c.model, model);
    json config = json::parse(read_text(model / "config.json"));
    config["tie_word_embeddings"] = c.tie;
    std::ofstream(model / "config.json", std::ios::trunc) << config.dump(2);
    const RunResult r = flexh2o("convert -m " + model.string() + " -o " + out.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("tied to the embedding"), std::string::npos) << r.out;
    expect_same_tensors(out / "model.safetensors", model / "reference.safetensors");
  }
}

TEST(Convert, NeverOverwrites) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out";
  ASSERT_EQ(flexh2o("convert -m " + (kTorch / "opt-f16").string() + " -o " + out.string()).code, 0);
  const std::string before = read_text(out / "model.safetensors");
  std::ofstream(out / "config.json") << "{\"mine\": true}";
  RunResult again = flexh2o("convert -m " + (kTorch / "llama-f32").string() + " -o " + out.string());
  EXPECT_EQ(again.code, 1);
  EXPECT_HAS(again.err, "--output " + out.string() + " is not empty; convert never overwrites");
  EXPECT_EQ(read_text(out / "model.safetensors"), before);
  EXPECT_EQ(read_text(out / "config.json"), "{\"mine\": true}");

  std::ofstream(tmp.path() / "file") << "x";
  RunResult file = flexh2o("convert -m " + (kTorch / "opt-f16").string() + " -o " + (tmp.path() / "file").string());
  EXPECT_EQ(file.code, 1);
  EXPECT_HAS(file.err, "exists and is not a directory");
  EXPECT_EQ(read_text(tmp.path() / "file"), "x");

  fs::create_directory(tmp.path() / "empty");  // an empty directory is filled
  ASSERT_EQ(flexh2o("convert -m " + (kTorch / "opt-f16").string() + " -o " + (tmp.path() / "empty").string()).code, 0);
  EXPECT_EQ(read_text(tmp.path() / "empty" / "model.safetensors"), before);
}

TEST(Convert, RefusedCheckpointLeavesNothing) {
  const fs::path marker = "/tmp/flexh2o-torch-pwned";
  fs::remove(marker);
  TempDir tmp;
  const fs::path model = tmp.path() / "model";
  fs::create_directory(model);
  fs::copy_file(kTorch / "opt-f16" / "config.json", model / "config.json");
  fs::copy_file(kTorch / "bad" / "os_system.bin", model / "pytorch_model.bin");
  const RunResult r = flexh2o("convert -m " + model.string() + " -o " + (tmp.path() / "out").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_HAS(r.err, (model / "pytorch_model.bin").string());
  EXPECT_HAS(r.err, "the global posix.system");
  EXPECT_FALSE(fs::exists(marker));
  for (const auto& e : fs::directory_iterator(tmp.path())) EXPECT_EQ(e.path().filename(), "model");
  // generate takes the same path.
  const RunResult g = flexh2o("generate -m " + model.string() + " --prompt hi --device cpu");
  EXPECT_EQ(g.code, 1);
  EXPECT_HAS(g.err, "the global posix.system");
  EXPECT_FALSE(fs::exists(marker));
}

// A checkpoint that does not load as a model (weights of another architecture than config.json
// says; no config.json at all) is refused before --output is written (info and generate refuse it).
TEST(Convert, ACheckpointThatIsNoModelIsRefusedAndLeavesNothing) {
  for (const bool with_config : {true, false}) {
    TempDir tmp;
    const fs::path model = tmp.path() / "model";
    fs::create_directory(model);
    if (with_config) fs::copy_file(kTorch / "opt-f16" / "config.json", model / "config.json");
    fs::copy_file(kTorch / "llama-f32" / "pytorch_model.bin", model / "pytorch_model.bin");
    const RunResult r = flexh2o("convert -m " + model.string() + " -o " + (tmp.path() / "out").string());
    EXPECT_EQ(r.code, 1) << with_config;
    EXPECT_HAS(r.err, "the converted checkpoint does not load as a model, so --output was not written");
    for (const auto& e : fs::directory_iterator(tmp.path())) EXPECT_EQ(e.path().filename(), "model");
  }
}

// A convert killed by a signal leaves its staging directory (no destructor runs): the next
// convert to the same output removes those whose process is gone, and only those.
TEST(Convert, StagingLeftByAKilledConvertIsRemoved) {
  TempDir tmp;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // gone: its pid names a dead process
  const fs::path dead = tmp.path() / (".out.tmp." + std::to_string(child));
  const fs::path alive = tmp.path() / ".out.tmp.1";  // init: running
  const fs::path other = tmp.path() / (".other.tmp." + std::to_string(child));  // another output's
  for (const fs::path& d : {dead, alive, other}) {
    fs::create_directory(d);
    std::ofstream(d / "model.safetensors") << "partial";
  }
  const RunResult r = flexh2o("convert -m " + (kTorch / "opt-f16").string() + " -o " + (tmp.path() / "out").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_HAS(r.err, "removed " + dead.string() + ", left by an interrupted convert");
  EXPECT_TRUE(fs::exists(alive / "model.safetensors"));
  EXPECT_TRUE(fs::exists(other / "model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp.path() / "out" / "model.safetensors"));
}

TEST(Convert, InfoNamesTheCheckpointFormat) {
  RunResult r = flexh2o("info " + (kTorch / "opt-f16").string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["checkpoint"], "pytorch");
  r = flexh2o("info " + (kTorch / "llama-bf16-sharded").string());
  EXPECT_HAS(r.out, "checkpoint   pytorch (sharded)");
  r = flexh2o("info opt-125m --json");
  EXPECT_EQ(json::parse(r.out)["checkpoint"], "none");
}

// A checkpoint holding a tensor its config does not read (a variant the config does not
// describe): generate warns with its name and info lists it; rotary frequency buffers, which
// old checkpoints save, are not counted. A truncated checkpoint: info says it cannot be loaded.
TEST(Checkpoint, TensorsTheConfigDoesNotReadAreNamedAndABrokenOneIsRefused) {
  TempDir tmp;
  const fs::path src = flexh2o::test::model_dir("tiny-llama"), dir = tmp.path() / "extra";
  fs::create_directory(dir);
  for (const auto& f : fs::directory_iterator(src))
    if (f.path().filename() != "model.safetensors" && f.is_regular_file()) fs::copy_file(f.path(), dir / f.path().filename());
  const SafetensorsArchive a = SafetensorsArchive::open_dir(src);
  std::vector<std::pair<std::string, flexh2o::TensorView>> t;
  for (const auto& e : a.tensors()) t.push_back({e.name, e.view});
  const flexh2o::TensorView norm = a.get("model.layers.0.input_layernorm.weight").view;
  t.push_back({"model.layers.0.self_attn.q_norm.weight", norm});
  t.push_back({"model.layers.1.self_attn.rotary_emb.inv_freq", norm});
  flexh2o::write_safetensors(dir / "model.safetensors", t);

  const RunResult gen = flexh2o("generate -m " + dir.string() + " --prompt hi -n 1 --device cpu --progress never");
  EXPECT_EQ(gen.code, 0) << gen.err;
  EXPECT_HAS(gen.err, "warning: 1 tensor(s) of the checkpoint are not read by its config (model_type llama): "
                      "model.layers.0.self_attn.q_norm.weight; ");
  EXPECT_EQ(flexh2o("generate -m " + src.string() + " --prompt hi -n 1 --device cpu").err.find("warning"),
            std::string::npos);
  RunResult info = flexh2o("info " + dir.string() + " --json");
  EXPECT_EQ(info.code, 0) << info.err;
  EXPECT_EQ(json::parse(info.out)["unused_tensors"], json::array({"model.layers.0.self_attn.q_norm.weight"}));
  info = flexh2o("info " + src.string());
  EXPECT_EQ(info.code, 0) << info.err;
  EXPECT_EQ(info.out.find("not read"), std::string::npos) << info.out;

  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
  info = flexh2o("info " + dir.string());
  EXPECT_EQ(info.code, 1) << info.err;
  EXPECT_HAS(info.out, "model ");  // what the config says is still shown
  EXPECT_HAS(info.err, "flexh2o: error: the checkpoint cannot be loaded: ");
}

// info loads the tokenizer as a run does: a damaged one fails every run of the directory, and
// info said nothing of it (exit 0).
TEST(Checkpoint, InfoLoadsTheTokenizer) {
  TempDir tmp;
  const fs::path src = flexh2o::test::model_dir("tiny-llama"), dir = tmp.path() / "m";
  fs::create_directory(dir);
  for (const auto& f : fs::directory_iterator(src))
    if (f.is_regular_file()) fs::create_symlink(f.path(), dir / f.path().filename());
  RunResult info = flexh2o("info " + dir.string() + " --json");
  EXPECT_EQ(info.code, 0) << info.err;
  EXPECT_EQ(json::parse(info.out)["tokenizer"], "4096 tokens");
  fs::remove(dir / "merges.txt");
  info = flexh2o("info " + dir.string());
  EXPECT_EQ(info.code, 1) << info.err;
  EXPECT_HAS(info.out, "tokenizer    cannot be loaded");
  EXPECT_HAS(info.err, "flexh2o: error: the tokenizer cannot be loaded: no tokenizer found in ");
  // A checkpoint link going nowhere: still the config's description, and the error in the JSON.
  fs::remove(dir / "model.safetensors");
  fs::create_symlink("../blobs/gone", dir / "model.safetensors");
  info = flexh2o("info " + dir.string() + " --json");
  EXPECT_EQ(info.code, 1) << info.err;
  const json j = json::parse(info.out);
  EXPECT_EQ(j["checkpoint"], "cannot be opened");
  EXPECT_HAS(j["checkpoint_error"].get<std::string>(), "is a symbolic link to ../blobs/gone");
}

}  // namespace
