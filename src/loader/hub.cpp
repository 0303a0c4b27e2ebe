// resolve_model_dir: a local directory, or ORG/NAME[@REV] looked up in the Hugging Face hub cache
// layout (CACHE/models--ORG--NAME/{refs,snapshots}). Reads only the file system; it never
// downloads and never reads the environment (the caller passes HubEnv).
#include "loader/hub.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o {

namespace fs = std::filesystem;

namespace {

// One part of a hub id: letters, digits, '-', '_', '.'; not starting with '.' or '-'.
bool valid_id_part(const std::string& s) {
  if (s.empty() || s.front() == '.' || s.front() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

// A revision: a commit hash or a ref name such as "main", "v1.0" or "refs/pr/1" (kept inside refs/).
bool valid_revision(const std::string& r) {
  if (r.empty() || r.front() == '/' || r.find("..") != std::string::npos) return false;
  return std::none_of(r.begin(), r.end(), [](char c) { return c == '\\' || c == '\0' || std::isspace((unsigned char)c); });
}

// A ref file holds one commit hash; anything longer than a page is not a ref.
std::string read_ref(const fs::path& p) {
  std::string s = read_input_file(p, "hub ref file", 4096);
  while (!s.empty() && std::isspace((unsigned char)s.back())) s.pop_back();
  while (!s.empty() && std::isspace((unsigned char)s.front())) s.erase(s.begin());
  return s;
}

std::string fetch_hint(const std::string& id, const std::string& rev) {
  return "flexh2o never downloads models; fetch it with `huggingface-cli download " + id +
         (rev.empty() ? "" : " --revision " + rev) + "` (or pass a local model directory).";
}

}  // namespace

fs::path resolve_model_dir(const std::string& spec, const HubEnv& env) {
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return fs::path(spec);

  // ORG/NAME or ORG/NAME@REV
  const size_t at = spec.find('@');
  const std::string id = spec.substr(0, at);
  const std::string rev = at == std::string::npos ? "" : spec.substr(at + 1);
  const size_t slash = id.find('/');
  const bool is_id = slash != std::string::npos && valid_id_part(id.substr(0, slash)) &&
                     valid_id_part(id.substr(slash + 1)) && (at == std::string::npos || valid_revision(rev));
  if (!is_id) {
    if (fs::exists(spec, ec))
      FH_FAIL("no such model directory: ", spec, " is a file; pass the directory that contains it.");
    FH_FAIL("no such model directory: ", spec, " (not an existing directory, nor a hub id like ORG/NAME[@REVISION]).");
  }

  fs::path cache;
  std::string cache_from;
  if (env.hf_hub_cache) {
    cache = *env.hf_hub_cache;
    cache_from = "HF_HUB_CACHE";
  } else if (env.hf_home) {
    cache = *env.hf_home / "hub";
    cache_from = "HF_HOME/hub";
  } else if (env.home) {
    cache = *env.home / ".cache" / "huggingface" / "hub";
    cache_from = "HOME/.cache/huggingface/hub";
  } else {
    FH_FAIL("model ", id, " is not a local directory and no Hugging Face cache is known (HF_HUB_CACHE, HF_HOME ",
            "and HOME are all unset). ", fetch_hint(id, rev));
  }

  const fs::path repo = cache / ("models--" + id.substr(0, slash) + "--" + id.substr(slash + 1));
  const fs::path snapshots = repo / "snapshots";
  if (!fs::is_directory(snapshots, ec))
    FH_FAIL("model ", id, " not found: ", spec, " is not a local directory, and the hub cache (", cache_from, ") has no ",
            snapshots.string(), ". ", fetch_hint(id, rev));

  // Resolves a commit hash read from refs/NAME to its snapshot directory.
  auto snapshot_of_ref = [&](const fs::path& ref_file, const std::string& ref_name) {
    const std::string commit = read_ref(ref_file);
    const fs::path dir = snapshots / commit;
    if (commit.empty() || !fs::is_directory(dir, ec))
      FH_FAIL("model ", id, ": ", ref_file.string(), " points to revision '", commit, "' but ", dir.string(),
              " does not exist (incomplete download?). ", fetch_hint(id, ref_name));
    return dir;
  };

  if (!rev.empty()) {
    if (fs::is_directory(snapshots / rev, ec)) return snapshots / rev;  // a commit hash
    const fs::path ref = repo / "refs" / rev;
    if (fs::is_regular_file(ref, ec)) return snapshot_of_ref(ref, rev);
    FH_FAIL("revision ", rev, " of model ", id, " not found: looked for ", (snapshots / rev).string(), " and ",
            ref.string(), ". ", fetch_hint(id, rev));
  }

  const fs::path main_ref = repo / "refs" / "main";
  if (fs::is_regular_file(main_ref, ec)) return snapshot_of_ref(main_ref, "");

  std::vector<fs::path> snaps;
  for (const auto& e : fs::directory_iterator(snapshots, ec))
    if (e.is_directory(ec)) snaps.push_back(e.path());
  if (snaps.size() == 1) return snaps[0];
  if (snaps.empty())
    FH_FAIL("model ", id, " not found: ", snapshots.string(), " holds no snapshot and ", main_ref.string(),
            " does not exist. ", fetch_hint(id, rev));
  std::sort(snaps.begin(), snaps.end());
  std::string names;
  for (const auto& s : snaps) names += (names.empty() ? "" : ", ") + s.filename().string();
  FH_FAIL("model ", id, " has several snapshots in ", snapshots.string(), " (", names, ") and no ", main_ref.string(),
          "; choose one with ", id, "@REVISION.");
}

}  // namespace flexh2o
