// Store identity: a fixed-length digest of a "manifest", the text that lists everything a
// store's bytes are derived from, so files are reused only for the very same checkpoint. Each
// manifest line is one fact, "<kind> [<name>] key=value ...". shard_fingerprint() gives a
// checkpoint file's line; callers add the model config, dtypes and the store format. ctime is
// set by the kernel on every change and cannot be set back by touch or utimensat, so a shard
// rewritten with the same size and a restored mtime still changes the identity.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "offload/mapped_file.h"

namespace flexh2o {

// "shard <file name> size=<bytes> dev=<st_dev> ino=<st_ino> mtime=<ns> ctime=<ns> header=<hex>"
// where the stat is the one taken when `f` was mapped and header is the XXH3-64 of the file's
// safetensors header (the 8-byte length and the JSON it counts, clipped to the file), or for a
// zip (a torch checkpoint) of its last MiB, which holds the central directory with every
// entry's CRC-32. At most a header's bytes are read; any number of shards gives a digest of the
// same length.
std::string shard_fingerprint(const MappedFile& f);

// 32 lowercase hex digits: the XXH3-128 of `manifest`.
std::string manifest_digest(std::string_view manifest);

// Why `now` differs from `before`, in a few words for a one-line message: "checkpoint changed
// (shard model-00003.safetensors: ctime, mtime)", "checkpoint changed (shard X added)",
// "model config changed". Empty when they are equal.
std::string explain_manifest_change(std::string_view before, std::string_view now);

// DIR/store.manifest: the manifest the directory's weight files were last built or checked for,
// kept only to explain a later rebuild (the files' headers carry the digest that decides).
// Written atomically (temporary file + rename); call with the directory lock held.
std::optional<std::string> read_store_manifest(const std::filesystem::path& dir);
[[nodiscard]] Status write_store_manifest(const std::filesystem::path& dir, std::string_view manifest);

}  // namespace flexh2o
