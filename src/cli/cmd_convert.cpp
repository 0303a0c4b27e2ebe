// `flexh2o convert --model DIR --output OUTDIR`: any checkpoint flexh2o reads (a PyTorch
// pytorch_model.bin, sharded or not, or safetensors) rewritten as one OUTDIR/model.safetensors,
// with the config and tokenizer files copied. OUTDIR appears whole or not at all: everything is
// written into a sibling staging directory that is renamed into place last, never over files.
#include <stdio.h>  // renameat2, RENAME_NOREPLACE
#include <signal.h>
#include <unistd.h>
#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "core/error.h"
#include "core/input_guard.h"
#include "loader/checkpoint.h"
#include "loader/hub.h"
#include "loader/safetensors_writer.h"
#include "model/config.h"
#include "model/weights.h"

namespace flexh2o::cli {
namespace fs = std::filesystem;

void register_convert(CLI::App& app, ConvertArgs& a) {
  auto* c = app.add_subcommand("convert",
                               "Rewrite a model's checkpoint (pytorch_model.bin, sharded or not) as model.safetensors");
  c->add_option("--model,-m", a.model, "Model directory or hub id (ORG/NAME) in the local HF cache")->required();
  c->add_option("--output,-o", a.output, "Directory to create with model.safetensors, config and tokenizer files; "
                "it must not exist or be empty")->required();
  c->footer("The checkpoint is read without running any of its code (see README, Checkpoints). Tensors are copied as "
            "they are (dtype and shape kept). A head tied to the token embedding (tie_word_embeddings, the "
            "same bytes) is written once, as the embedding, the way transformers saves it; other tensors that "
            "share storage in the .bin become separate copies. config.json, "
            "generation_config.json, tokenizer files (*.json, *.txt, tokenizer.model) are copied.");
}

namespace {

// The small files a model directory carries besides its weights.
bool is_side_file(const fs::path& p) {
  const std::string name = p.filename().string(), ext = p.extension().string();
  if (name == "pytorch_model.bin.index.json" || name == "model.safetensors.index.json") return false;
  return ext == ".json" || ext == ".txt" || name == "tokenizer.model";
}

// Removes the staging directory unless it was renamed into place.
class Staging {
 public:
  explicit Staging(fs::path p) : path_(std::move(p)) {
    std::error_code ec;
    if (!fs::create_directory(path_, ec))
      FH_FAIL("cannot create the staging directory ", path_.string(), ": ", ec ? ec.message() : "it already exists");
  }
  ~Staging() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  const fs::path& path() const { return path_; }
  void committed() { path_.clear(); }

 private:
  fs::path path_;
};

// The tensors to write: all of them, less a head that the config ties to the embedding and that
// holds the embedding's bytes. The loader takes a tied head from the embedding, so nothing is lost.
std::vector<std::pair<std::string, TensorView>> tensors_to_write(const TensorArchive& archive, const fs::path& dir,
                                                                 std::string* dropped) {
  const fs::path config = dir / "config.json";
  std::error_code ec;
  const bool tied = fs::exists(config, ec) && ModelConfig::from_file(config).tie_embeddings;
  const TensorView* embed = nullptr;
  for (const TensorEntry& t : archive.tensors())
    if (t.name.ends_with("embed_tokens.weight")) embed = &t.view;
  auto same_as_embed = [&](const TensorView& v) {
    return embed && v.dtype == embed->dtype && v.shape == embed->shape &&
           (v.data == embed->data || std::memcmp(v.data, embed->data, v.nbytes()) == 0);
  };
  std::vector<std::pair<std::string, TensorView>> out;
  for (const TensorEntry& t : archive.tensors()) {
    if (tied && t.name == "lm_head.weight" && same_as_embed(t.view)) {
      *dropped = t.name;
      continue;
    }
    out.push_back({t.name, t.view});
  }
  return out;
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) FH_FAIL("cannot fsync ", dir.string(), ": ", std::strerror(err));
}

// Staging directories of `target` (".NAME.tmp.PID") whose process is gone: a convert killed by a
// signal runs no destructor, and its partial copy (up to the model's size) would stay hidden.
void remove_stale_staging(const fs::path& parent, const fs::path& target) {
  const std::string prefix = "." + target.filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix) || !it->is_directory(ec)) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(pid_t(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    std::cerr << "flexh2o: removed " << it->path().string() << ", left by an interrupted convert (process " << pid
              << ")\n";
  }
}

}  // namespace

int run_convert(const ConvertArgs& a, const Env& env) {
  const fs::path dir = resolve_model_dir(a.model, env.hub);
  const fs::path out = fs::path(a.output).lexically_normal();
  const fs::path target = out.filename().empty() ? out.parent_path() : out;
  std::error_code ec;
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec))
      FH_FAIL("--output ", target.string(), " exists and is not a directory; convert never overwrites.");
    if (!fs::is_empty(target, ec))
      FH_FAIL("--output ", target.string(), " is not empty; convert never overwrites (choose a new directory).");
  }
  const TensorArchive archive = open_checkpoint_dir(dir);

  fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  remove_stale_staging(parent, target);
  Staging staging(parent / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid())));
  std::string dropped;
  const std::vector<std::pair<std::string, TensorView>> tensors = tensors_to_write(archive, dir, &dropped);
  {
    OutputFile f({"--output", staging.path() / "model.safetensors"}, OutputFile::Mode::kReplace);
    write_safetensors([&](std::string_view s) { f.write(s); }, (target / "model.safetensors").string(), tensors,
                      {{"format", "pt"}});
    f.commit();
  }
  size_t copied = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || !is_side_file(e.path())) continue;
    write_text_file({"--output", staging.path() / e.path().filename()}, read_input_file(e.path(), "model file"));
    ++copied;
  }
  fsync_dir(staging.path());
  // What convert wrote must be a model flexh2o loads (config.json beside it, every tensor the
  // config names, in its shape); else nothing reaches --output (the staging goes with it).
  try {
    (void)Model::load_dir(staging.path());
  } catch (const Error& e) {
    FH_FAIL("the converted checkpoint does not load as a model, so --output was not written: ", e.what());
  }

  // An empty OUTDIR is replaced; anything else is refused by the kernel (RENAME_NOREPLACE).
  if (fs::is_directory(target, ec) && ::rmdir(target.c_str()) != 0)
    FH_FAIL("cannot replace the empty --output ", target.string(), ": ", std::strerror(errno));
  if (::renameat2(AT_FDCWD, staging.path().c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0)
    FH_FAIL("cannot move the converted model into --output ", target.string(), ": ", std::strerror(errno));
  staging.committed();
  fsync_dir(parent);

  std::cout << "converted " << archive.source().string() << " (" << archive.tensors().size() << " tensors, "
            << archive.total_bytes() << " bytes) to " << (target / "model.safetensors").string() << "; copied "
            << copied << " config/tokenizer files";
  if (!dropped.empty()) std::cout << "; " << dropped << " is tied to the embedding and written once";
  std::cout << "\n";
  return 0;
}

}  // namespace flexh2o::cli
