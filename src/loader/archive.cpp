// TensorArchive: lookup by name, and the parts every format shares: the uniqueness check and
// the sharded-checkpoint index (*.index.json with a "weight_map"), whose shards are mapped here
// and parsed by the format reader through a callback.
#include "loader/archive.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o {

void TensorArchive::sort_and_check_unique() {
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  for (size_t i = 1; i < tensors_.size(); ++i)
    if (tensors_[i].name == tensors_[i - 1].name)
      FH_FAIL("tensor ", tensors_[i].name, " appears in both ", files_[tensors_[i - 1].file_index].path().string(),
              " and ", files_[tensors_[i].file_index].path().string(), ".");
}

void TensorArchive::open_single(const std::filesystem::path& file, const std::function<void(size_t)>& add_file) {
  source_ = file;
  files_.push_back(map_checkpoint_file(file));
  add_file(0);
  sort_and_check_unique();
}

void TensorArchive::open_in_dir(const std::filesystem::path& dir, const std::string& file_name,
                                const std::string& index_name, const std::function<void(size_t)>& add_file) {
  std::error_code ec;  // the whole file first, as detect_checkpoint
  if (std::filesystem::exists(dir / file_name, ec)) return open_single(dir / file_name, add_file);
  if (!std::filesystem::exists(dir / index_name, ec))
    FH_FAIL("no checkpoint in ", dir.string(), ": neither ", file_name, " nor ", index_name, " exists.");
  open_sharded(dir / index_name, add_file);
}

void TensorArchive::refuse_download_leftovers(const MappedFile& f) {
  std::string head(reinterpret_cast<const char*>(f.data()), std::min<size_t>(f.size(), 512));
  const size_t start = std::min(head.find_first_not_of(" \t\r\n"), head.size());
  std::string lower = head.substr(start);
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  const std::string file = f.path().string();
  if (lower.starts_with("version https://git-lfs"))
    FH_FAIL(file, " is a Git LFS pointer (", f.size(), " bytes of text), not the weights: the repository was cloned "
            "without its LFS files. Fetch them (git lfs install && git lfs pull in that clone) or download the "
            "model with huggingface-cli / huggingface_hub.");
  if (lower.starts_with("<!doctype html") || lower.starts_with("<html"))
    FH_FAIL(file, " is an HTML page (", f.size(), " bytes), not the weights: the download got a web page (a login, "
            "a gated model's licence page, or an error) instead of the file. Download it again with "
            "huggingface-cli / huggingface_hub, logged in if the model is gated.");
  if (lower.starts_with("{\"error\"") || lower.starts_with("{ \"error\""))
    FH_FAIL(file, " is a JSON error response (", f.size(), " bytes: ", head.substr(start, 160),
            "), not the weights: download it again.");
}

MappedFile TensorArchive::map_checkpoint_file(const std::filesystem::path& p) {
  check_regular_file(p, "checkpoint file").throw_if_error();
  MappedFile f = MappedFile::open(p);
  refuse_download_leftovers(f);
  return f;
}

void TensorArchive::open_sharded(const std::filesystem::path& index_path,
                                 const std::function<void(size_t)>& add_shard) {
  using nlohmann::json;
  const std::string index = index_path.string();
  const std::filesystem::path dir = index_path.parent_path();
  const json j = read_json_file(index_path, "checkpoint index");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    FH_FAIL(index, " has no \"weight_map\" object mapping tensor names to shard files.");

  // Shard name -> file index; each shard is opened once, in name order.
  std::map<std::string, size_t> shard_index;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) FH_FAIL(index, " maps tensor ", tensor, " to ", json_excerpt(shard), ", not a file name.");
    const std::filesystem::path sp(shard.get<std::string>());
    if (sp.empty() || sp.is_absolute() || sp.filename() != sp)
      FH_FAIL(index, " maps tensor ", tensor, " to shard \"", sp.string(),
              "\", which is not a plain file name in the checkpoint directory.");
    shard_index.emplace(sp.string(), 0);
  }
  if (shard_index.empty()) FH_FAIL(index, " has an empty weight_map.");

  source_ = index_path;
  std::error_code ec;
  for (auto& [shard, idx] : shard_index) {
    const auto p = dir / shard;
    if (!std::filesystem::exists(p, ec))
      FH_FAIL("shard ", shard, " listed in ", index, " is missing (looked for ", p.string(), ").");
    idx = files_.size();
    files_.push_back(map_checkpoint_file(p));
  }
  for (size_t i = 0; i < files_.size(); ++i) add_shard(i);
  sort_and_check_unique();

  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    const size_t want = shard_index.at(shard.get<std::string>());
    const TensorEntry* t = find(tensor);
    if (t == nullptr || t->file_index != want)
      FH_FAIL("tensor ", tensor, " is listed in ", index, " under shard ", shard.get<std::string>(),
              " but is absent from ", files_[want].path().string(), ".");
  }
}

const TensorEntry* TensorArchive::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorEntry& t, std::string_view n) { return t.name < n; });
  return (it != tensors_.end() && it->name == name) ? &*it : nullptr;
}

const TensorEntry& TensorArchive::get(std::string_view name) const {
  const TensorEntry* t = find(name);
  if (t == nullptr) FH_FAIL("tensor ", name, " missing from ", source_.string(), ".");
  return *t;
}

size_t TensorArchive::total_bytes() const {
  size_t n = 0;
  for (const TensorEntry& t : tensors_) n += t.view.nbytes();
  return n;
}

}  // namespace flexh2o
