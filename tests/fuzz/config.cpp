// Fuzz target: a config.json read by ModelConfig::from_file, then, when it parses, bound by
// Model::load_dir to the tiny test checkpoint of its family (copied into the scratch directory),
// the path every model load takes. Sizes from config.json must be checked against what the
// checkpoint holds before anything is allocated (libFuzzer's -malloc_limit_mb catches the rest).
#include "fuzz_util.h"
#include "model/config.h"
#include "model/weights.h"

namespace {

// scratch/NAME holding a copy of tests/data/NAME/model.safetensors.
std::filesystem::path checkpoint_dir(const char* name) {
  const std::filesystem::path dir = flexh2o::fuzz::scratch() / name;
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::filesystem::path(FLEXH2O_TEST_DATA) / name / "model.safetensors",
                             dir / "model.safetensors", std::filesystem::copy_options::overwrite_existing);
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flexh2o;
  static const std::filesystem::path opt = checkpoint_dir("tiny-opt"), llama = checkpoint_dir("tiny-llama");
  const std::string_view text = fuzz::as_text(data, size);
  fuzz::write_file(opt / "config.json", text);
  fuzz::expect_clean(fuzz::scratch().string(), [&] {
    const ModelConfig c = ModelConfig::from_file(opt / "config.json");
    const std::filesystem::path dir = c.arch == Arch::kLlama ? llama : opt;
    if (dir != opt) fuzz::write_file(dir / "config.json", text);
    const Model m = Model::load_dir(dir);
    (void)m.tensors().size();
  });
  return 0;
}
