// The offloading engine's use of the disk store: the store identity (a digest of the checkpoint's
// shard fingerprints, the model config and the stored dtypes, compression included), opening the store, and homing the
// disk weights under the directory lock: each file is reused when its header and payload hash
// check out and (re)written otherwise, and one line says why anything was rebuilt.
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "engine/compress.h"
#include "engine/offload_impl.h"
#include "offload/store_identity.h"

namespace flexh2o {

void OffloadEngine::Impl::say(const std::string& line) const {
  if (e.opts_.notice) e.opts_.notice(line);
  else std::fprintf(stderr, "flexh2o: %s\n", line.c_str());
}

std::string offload_store_manifest(const Model& model, const Device& dev, bool compress_weight) {
  const ModelConfig& c = model.config();
  std::string m = detail::concat("store format=", kStoreFormatVersion, " payload_hash=xxh3-64\n");
  m += detail::concat("config arch=", c.model_type, " layers=", c.n_layers, " hidden=", c.hidden, " heads=", c.n_heads,
                      " kv_heads=", c.n_kv_heads, " head_dim=", c.head_dim, " ffn=", c.ffn_dim, " vocab=", c.vocab_size,
                      " max_positions=", c.max_positions, " tie=", c.tie_embeddings,
                      " attention_bias=", c.attention_bias, " o_bias=", c.o_bias, " mlp_bias=", c.mlp_bias,
                      " qk_norm=", c.qk_norm, c.qk_norm_whole ? "/whole" : "", " experts=", c.n_experts, "/",
                      c.experts_per_token, " norm_topk=", c.norm_topk_prob, " dtype=", dtype_name(c.dtype), "\n");
  m += detail::concat("weights f32=", dtype_name(dev.weight_dtype(DType::F32)), " f16=",
                      dtype_name(dev.weight_dtype(DType::F16)), " bf16=", dtype_name(dev.weight_dtype(DType::BF16)),
                      compress_weight ? " compress_weight=q4-g64-lastdim" : "", "\n");
  m += model.signature();
  if (!m.ends_with('\n')) m += '\n';
  return m;
}

void OffloadEngine::open_store(IoBackend& io) {
  impl_->store_manifest = offload_store_manifest(model_, dev_, opts_.policy.compress_weight);
  DiskStoreOptions so;
  const std::filesystem::path dir = opts_.offload_dir;
  so.on_wait = [this, dir](long holder) {
    impl_->say(detail::concat("offload store ", dir.string(), ": waiting for another run",
                              holder ? detail::concat(" (pid ", holder, ")") : std::string(), " that holds ",
                              (dir / "flexh2o.lock").string(), " (it is cleaning up or building weight files)"));
  };
  so.still_waiting = [this] {  // through opts_, which drops it once the engine is built
    if (opts_.while_waiting) opts_.while_waiting();
  };
  store_ = DiskStore::open(dir, manifest_digest(impl_->store_manifest), io, so);
}

// ---- disk weights ----------------------------------------------------------------------------

namespace {

// Writes the weight of `h` (converted to its store dtype when the checkpoint's differs).
void write_weight(DiskStore& store, const WeightHome& h) {
  if (h.source.dtype == h.dtype) {
    store.put(h.store_name, h.source).throw_if_error();
    return;
  }
  std::vector<std::byte> tmp(h.bytes);
  convert_tensor(h.source, h.dtype, tmp.data(), "weight " + h.store_name);
  TensorView v = h.source;
  v.data = tmp.data();
  v.dtype = h.dtype;
  store.put(h.store_name, v).throw_if_error();
}

// Why files were rebuilt, for one line (empty: nothing to say, e.g. a first build).
std::string rebuild_reason(const std::vector<Status>& rebuilt, size_t reused, const std::optional<std::string>& previous,
                           const std::string& now) {
  size_t missing = 0;
  const Status* corrupt = nullptr;
  const Status* other = nullptr;
  bool invalid = false;
  for (const Status& st : rebuilt) {
    if (st.code() == StatusCode::kNotFound) ++missing;
    else if (st.code() == StatusCode::kCorrupt && !corrupt) corrupt = &st;
    else if (!other) other = &st;
    invalid = invalid || st.code() == StatusCode::kInvalid;
  }
  const size_t failed = rebuilt.size() - missing;  // files that were there but could not be used
  const bool changed = previous && *previous != now;
  std::string why;
  if (failed > 0) {
    if (changed && invalid) why = explain_manifest_change(*previous, now);
    else why = (corrupt ? corrupt : other)->message();
    // Both counts, so that they add up to the files the caller says were not usable.
    if (failed > 1 || missing > 0)
      why += detail::concat(" (", failed, failed == 1 ? " file" : " files", " there could not be reused",
                            missing ? detail::concat(", ", missing, missing == 1 ? " was" : " were", " missing")
                                    : std::string(),
                            ")");
  } else if (missing > 0 && (reused > 0 || (previous && !changed))) {
    why = detail::concat(missing, " weight files were missing");
  }
  return why;
}

}  // namespace

void OffloadEngine::Impl::place_disk_weights(const std::vector<std::pair<size_t, size_t>>& homes) {
  DiskStore& store = *e.store_;
  const ReuseCheck check = e.opts_.verify_store ? ReuseCheck::kHash : ReuseCheck::kHeaderOnly;
  auto home = [&](std::pair<size_t, size_t> ui) -> WeightHome& { return units[ui.first][ui.second]; };
  auto reuse = [&](const WeightHome& h) { return store.reuse(h.store_name, h.dtype, h.source.shape, check); };
  // Checking only reads: concurrent runs hold the lock shared and check at the same time.
  std::vector<std::pair<size_t, Status>> failed;  // index into homes, why
  std::optional<std::string> previous;
  {
    StoreDirLock shared = store.lock_dir(StoreDirLock::Mode::kShared);
    previous = read_store_manifest(store.dir());
    for (size_t i = 0; i < homes.size(); ++i) {
      Status st = reuse(home(homes[i]));
      if (st.ok()) {
        ++e.reused_;
        placed(home(homes[i]).bytes);
      } else {
        failed.emplace_back(i, std::move(st));
      }
    }
  }
  if (failed.empty() && (previous == store_manifest || store.read_only())) return;
  if (store.read_only()) {  // why, as a rebuild would say it (a changed checkpoint, other flags)
    std::vector<Status> why;
    for (const auto& [i, st] : failed) why.push_back(st);
    std::string reason = rebuild_reason(why, e.reused_, previous, store_manifest);
    if (reason.empty()) reason = failed.front().second.message();
    FH_FAIL("offload directory ", store.dir().string(), " is not writable by this process (a read-only mount, or "
            "another user's) and ", failed.size(), " of the ", homes.size(), " weight files this run reads there "
            "cannot be used: ", reason, ". Build them once from a run that can write there, with the same "
            "checkpoint files, model and flags, or give a writable --offload-dir");
  }
  // Writing is exclusive; a file another run wrote while this one waited is reused, not rewritten.
  StoreDirLock exclusive = store.lock_dir(StoreDirLock::Mode::kExclusive);
  {  // Refused before the first file rather than at the one that does not fit, with the total. A
     // stale file of the same name is replaced, so its bytes come back.
    uint64_t need = 0, freed = 0;
    for (const auto& [i, why] : failed) {
      need += DiskStore::entry_bytes(home(homes[i]).bytes);
      std::error_code ec;
      const uintmax_t old = std::filesystem::file_size(store.path_of(home(homes[i]).store_name), ec);
      if (!ec) freed += old;
    }
    if (const uint64_t free = store.free_bytes() + freed; need > free)
      FH_FAIL("offload directory ", store.dir().string(), " has ", human_bytes(free), " free",
              freed ? " (the stale files it replaces counted)" : "", "; the ", failed.size(),
              " weight files to write need ", human_bytes(need), ": free space, give another --offload-dir, or home "
              "fewer weights on disk (--percent)");
  }
  std::vector<Status> rebuilt;
  for (auto& [i, why] : failed) {
    WeightHome& h = home(homes[i]);
    if (reuse(h).ok()) {
      ++e.reused_;
      placed(h.bytes);
      continue;
    }
    // The stale file goes first: the new one is written whole before its rename, so both would
    // need room at once, which the check above did not count on.
    store.remove(h.store_name).throw_if_error();
    write_weight(store, h);
    let_go(h);
    ++e.written_;
    placed(h.bytes);
    rebuilt.push_back(std::move(why));
  }
  const std::string why = rebuild_reason(rebuilt, e.reused_, previous, store_manifest);
  if (!why.empty())
    say(detail::concat("offload store ", store.dir().string(), ": ", why, "; rebuilding ", rebuilt.size(),
                                " of ", homes.size(), " weight files"));
  write_store_manifest(store.dir(), store_manifest).throw_if_error();
}

}  // namespace flexh2o
