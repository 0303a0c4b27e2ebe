// generate's --input and --output as --resume reads them: the input's format, a request's key,
// what an earlier run left in --output, and how --output is to be opened. Plain functions of
// files and flags, run before any output is opened; errors throw flexh2o::Error.
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "model/weights.h"

namespace flexh2o::cli {

// The two input (and output) formats; one file holds one.
enum class Format { kFlexh2o, kBatch };
const char* format_name(Format f);

// The format of --input, from a first pass over it (before any output is opened): a file that
// mixes Batch lines with flexh2o lines is refused. Lines that are not JSON objects say nothing.
Format input_format(std::istream& in, const std::string& path);

// A request's key for --resume: its id as JSON text. Only strings and numbers are accepted as
// ids there (compared exactly: "3" and 3 differ); anything else cannot be matched reliably.
std::optional<std::string> resume_key(const nlohmann::json& id);

// What an earlier run left in --output: the line of each id with a complete result.
struct PriorResults {
  std::map<std::string, int64_t> line_of;  // resume_key(id) or custom_id_key -> line number
  int64_t failed = 0;                      // lines that carry an error
  // Batch error lines of input lines with no usable custom_id (not JSON, none, not a non-empty
  // string): results are written in input order, so they are those of the first such lines.
  int64_t unkeyed = 0;
  std::optional<Format> format;            // of the lines (none: no complete line)
};

// Reads --output for --resume. A complete line ends with a newline and parses as a result with
// an id (or a Batch output line with a custom_id); a last line without a newline (the run was
// killed while writing it) is cut off (the file is truncated, said on stderr). Any other line,
// or a file that mixes the two formats, means the file is not flexh2o's results: refused before
// anything is changed.
// Once `*stop` is set (a stop signal; optional) it throws PlacementStopped, the file unchanged.
PriorResults read_prior_results(const std::string& path, const std::atomic<bool>* stop = nullptr);

// Checks --output for this run's results (see register_generate's help for the rules) and how
// it is to be opened; with --resume, fills `prior`. It is opened once the run is set up, so that
// a run refused before then (a bad flag, a placement that does not fit) leaves an --overwrite'd
// file as it was.
OutputFile::Mode check_results(const GenerateArgs& a, Format format, PriorResults& prior,
                               const std::atomic<bool>* stop = nullptr);

// What decides a result besides its request line: the model, the sampling defaults lines get
// (those a greedy run does not draw with, or that a Batch line's body sets itself, left out),
// the stop and EOS rules, the KV policy and dtype, 4-bit weights (a flat object of strings,
// numbers and booleans). Placement, batch shape, threads and device are not in it: they change
// how fast a result comes, not what it is. `kv_dtype`: the run's (run_kv_dtype); `format`: the
// input's; `eos_ids`: the run's (end_of_sequence_ids).
nlohmann::json run_identity(const GenerateArgs& a, const Model& m, DType kv_dtype, Format format,
                            std::span<const int32_t> eos_ids);

// --resume of a --output that records another run's identity (the extended attribute
// user.flexh2o.run, which record_run_identity sets): throws Error naming each difference, as the
// results would mix two runs'. A file that records none (a filesystem without user extended
// attributes, a copy) is not checked.
void check_resume_identity(const std::string& output, const nlohmann::json& identity);

// Records `identity` on `output`; best effort (a filesystem without user extended attributes
// keeps none, silently).
void record_run_identity(const std::string& output, const nlohmann::json& identity);

}  // namespace flexh2o::cli
