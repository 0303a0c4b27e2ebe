// Hostile config.json (issue #14 item 1): deep nesting quoted in an error, a FIFO, a layer count
// far beyond what the checkpoint holds (must fail before gigabytes of per-layer bookkeeping),
// and token ids beyond int32 (must not wrap).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "model/weights.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

const fs::path kTinyOpt = fs::path(FLEXH2O_TEST_DATA) / "tiny-opt";

// tiny-opt's weights with an edited config.json, in a directory removed on destruction.
class EditedModel {
 public:
  explicit EditedModel(const std::function<void(json&)>& edit) {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("flexh2o-model-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(dir_);
    fs::create_symlink(kTinyOpt / "model.safetensors", dir_ / "model.safetensors");
    json j = json::parse(std::ifstream(kTinyOpt / "config.json"));
    edit(j);
    std::ofstream(dir_ / "config.json") << j.dump();
  }
  ~EditedModel() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected flexh2o::Error, got " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected flexh2o::Error";
  return "";
}

long peak_rss_kib() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

TEST(ConfigLimits, DeeplyNestedValueIsAnErrorNotAStackOverflow) {
  // The "must be a positive integer, got <dump()>" message must not recurse per level.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string text = json::parse(std::ifstream(kTinyOpt / "config.json")).dump();
  text.insert(text.size() - 1, ", \"num_hidden_layers\": " + deep);
  EXPECT_HAS(error_of([&] { ModelConfig::from_json_text(text, "m/config.json"); }),
             "m/config.json nests arrays/objects more than 64 levels deep");
}

TEST(ConfigLimits, FifoConfigIsRefusedWithoutBlocking) {
  EditedModel m([](json&) {});
  const fs::path cfg = m.dir() / "config.json";
  fs::remove(cfg);
  ASSERT_EQ(::mkfifo(cfg.c_str(), 0600), 0);
  std::string msg;
  auto f = std::async(std::launch::async, [&] { msg = error_of([&] { Model::load_dir(m.dir()); }); });
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on a FIFO config.json for more than 2 s";
    ::close(::open(cfg.c_str(), O_WRONLY));
  }
  f.get();
  EXPECT_HAS(msg, "model config " + cfg.string() + " is a FIFO");
}

// A million layers over tiny files must be refused before ~16 million specs and a million layer
// slots (gigabytes) are built for them.
TEST(ConfigLimits, LayerCountBeyondTheCheckpointFailsBeforeAllocating) {
  const long before = peak_rss_kib();
  EditedModel huge([](json& j) { j["num_hidden_layers"] = 1000000; });
  EXPECT_HAS(error_of([&] { Model::load_dir(huge.dir()); }), "\"num_hidden_layers\" must be an integer in [1, 65536]");
  EditedModel many([](json& j) { j["num_hidden_layers"] = 60000; });
  const std::string msg = error_of([&] { Model::load_dir(many.dir()); });
  EXPECT_HAS(msg, "config.json says num_hidden_layers = 60000 (960000 layer tensors) but the checkpoint holds");
  EXPECT_HAS(msg, "tensor \"model.decoder.layers.59999.self_attn_layer_norm.weight\" is missing");
  EXPECT_LT(peak_rss_kib() - before, 32 * 1024) << "KiB of peak RSS growth";
}

TEST(ConfigLimits, TokenIdsAndSizesAreRangeChecked) {
  auto with = [](const char* key, const json& v) {
    json j = json::parse(std::ifstream(kTinyOpt / "config.json"));
    j[key] = v;
    return error_of([&] { ModelConfig::from_json_text(j.dump(), "c.json"); });
  };
  EXPECT_HAS(with("eos_token_id", 4294967298ull),
             "c.json: \"eos_token_id\" must be an integer in [0, 2147483647], got 4294967298");
  EXPECT_HAS(with("bos_token_id", json::array({4294967298ull})), "got 4294967298");
  EXPECT_HAS(with("eos_token_id", json::array({2, -1})), "c.json: \"eos_token_id\" must be an integer in");
  json listed = json::parse(std::ifstream(kTinyOpt / "config.json"));
  listed["eos_token_id"] = {2, 7, 2};  // LLaMA-3.1-Instruct lists three
  const ModelConfig c = ModelConfig::from_json_text(listed.dump(), "c.json");
  EXPECT_EQ(c.eos_id, 2);
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{2, 7, 2}));
  EXPECT_HAS(with("hidden_size", 256.5), "\"hidden_size\" must be an integer in [1, 1048576], got 256.5");
  EXPECT_HAS(with("vocab_size", 1e30), "\"vocab_size\" must be an integer");
  json llama = json::parse(std::ifstream(fs::path(FLEXH2O_TEST_DATA) / "tiny-llama" / "config.json"));
  llama["rope_theta"] = 1e300;  // float(1e300) is undefined behaviour
  EXPECT_HAS(error_of([&] { ModelConfig::from_json_text(llama.dump(), "l.json"); }),
             "l.json: \"rope_theta\" must be a finite number, got 1e+300");
  llama["rope_theta"] = 10000;
  for (const double eps : {-1.0, 0.0, 2.0}) {  // -1 ran, every logit NaN
    llama["rms_norm_eps"] = eps;
    EXPECT_HAS(error_of([&] { ModelConfig::from_json_text(llama.dump(), "l.json"); }),
               "l.json: \"rms_norm_eps\" must be a positive number up to 1, got ");
  }
}

// A model in the Hugging Face cache is named by its repository: it was named by the snapshot's
// hash in logs, eval JSON and the server's /v1/models. A name in config.json still wins.
TEST(ConfigLimits, AHubSnapshotIsNamedByItsRepository) {
  EditedModel m([](json& j) { j.erase("_name_or_path"); });
  const fs::path snap = m.dir() / "models--facebook--opt-125m" / "snapshots" / "0123456789abcdef";
  fs::create_directories(snap);
  fs::copy_file(m.dir() / "config.json", snap / "config.json");
  EXPECT_EQ(ModelConfig::from_file(snap / "config.json").name, "facebook/opt-125m");
  EXPECT_EQ(ModelConfig::from_file(m.dir() / "config.json").name, m.dir().filename().string());
  json j = json::parse(std::ifstream(snap / "config.json"));
  j["_name_or_path"] = "my/name";
  std::ofstream(snap / "config.json") << j.dump();
  EXPECT_EQ(ModelConfig::from_file(snap / "config.json").name, "my/name");
}

// A quantized checkpoint (GPTQ, AWQ, bitsandbytes, FP8) is named as one: its packed tensors used
// to surface as "config.json says N layers but tensor ... is missing", or to run as plain weights.
TEST(ConfigLimits, AQuantizedCheckpointIsNamedAsOne) {
  json j = json::parse(std::ifstream(fs::path(FLEXH2O_TEST_DATA) / "tiny-llama" / "config.json"));
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
  EXPECT_HAS(error_of([&] { ModelConfig::from_json_text(j.dump(), "q/config.json"); }),
             "q/config.json: a quantized checkpoint (quantization_config.quant_method \"gptq\"): flexh2o reads "
             "f16, bf16 and f32 weights");
  j["quantization_config"] = json::object();
  EXPECT_HAS(error_of([&] { ModelConfig::from_json_text(j.dump(), "q/config.json"); }), "quant_method \"unnamed\"");
  j["quantization_config"] = nullptr;  // written as null by some tools: not quantized
  EXPECT_NO_THROW(ModelConfig::from_json_text(j.dump(), "q/config.json"));
  // Gemma 3's multimodal config: its text part is read from text_config, the key stays at the top.
  json mm = json::parse(std::ifstream(fs::path(FLEXH2O_TEST_DATA) / "arch" / "gemma3_text_mm" / "config.json"));
  mm["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_HAS(error_of([&] { ModelConfig::from_json_text(mm.dump(), "g/config.json"); }),
             "quantization_config.quant_method \"awq\"");
  mm.erase("quantization_config");  // or inside its text part only
  mm["text_config"]["quantization_config"] = {{"quant_method", "bitsandbytes"}};
  EXPECT_HAS(error_of([&] { ModelConfig::from_json_text(mm.dump(), "g/config.json"); }),
             "quantization_config.quant_method \"bitsandbytes\"");
}

}  // namespace
}  // namespace flexh2o
