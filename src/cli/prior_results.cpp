// generate's --input format and --output for --resume (prior_results.h).
#include "cli/prior_results.h"

#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/kv_flags.h"
#include "cli/openai_batch.h"
#include "cli/run_setup.h"
#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::cli {
using nlohmann::json;
namespace batch = openai_batch;

const char* format_name(Format f) {
  return f == Format::kBatch ? "an OpenAI Batch file" : "a flexh2o JSONL file";
}

Format input_format(std::istream& in, const std::string& path) {
  int64_t first_batch = 0, first_ours = 0;
  for_each_jsonl(
      in,
      [&](int64_t line, const nlohmann::ordered_json& oj) {
        const json j(oj);
        int64_t& first = batch::is_input_line(j) ? first_batch : first_ours;
        if (!first) first = line;
        if (first_batch && first_ours)
          FH_FAIL("--input ", path, " mixes formats: line ", first_batch, " is an OpenAI Batch request "
                  "({\"custom_id\", \"method\", \"url\", \"body\"}) and line ", first_ours,
                  " is a flexh2o request ({\"prompt\"} or {\"prompt_ids\"}); give one format per file");
      },
      [](int64_t, const std::string&) {});
  return first_batch ? Format::kBatch : Format::kFlexh2o;
}


std::optional<std::string> resume_key(const json& id) {
  if (!id.is_string() && !id.is_number()) return std::nullopt;
  return id.dump();
}


PriorResults read_prior_results(const std::string& path, const std::atomic<bool>* stop) {
  PriorResults prior;
  std::ifstream in(path, std::ios::binary);
  if (!in) FH_FAIL("--resume: cannot read --output ", path);
  const uint64_t size = std::filesystem::file_size(path);
  LineReader reader(in, kMaxLineBytes, path);  // bounded: the file may not be ours
  std::string line;
  uint64_t complete_bytes = 0;
  for (LineReader::Result r; (r = reader.next(line)) != LineReader::Result::kEnd;) {
    const int64_t lineno = reader.line_number();
    if (stop && stop->load(std::memory_order_relaxed))  // a million results take seconds to scan
      throw PlacementStopped(detail::concat("stopped while reading --output's results for --resume (line ", lineno,
                                            "); it is as it was"));
    if (r == LineReader::Result::kTooLong)
      FH_FAIL("--resume: ", path, ":", lineno, " is longer than ", kMaxLineBytes, " bytes: not a result line");
    if (complete_bytes + line.size() + 1 > size) break;  // no newline: a partial last line
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool is_batch = batch::is_output_line(j);  // it has an "id" and an "error" too: first
    const std::optional<std::string> key =
        is_batch ? batch::custom_id_key(j["custom_id"])
        : j.is_object() && j.contains("id") && (j.contains("error") || j.contains("token_ids")) ? resume_key(j["id"])
                                                                                                : std::nullopt;
    const bool unkeyed = is_batch && !key && batch::output_line_failed(j);
    if (!key && !unkeyed && j.is_discarded() && prior.format)  // after result lines: a damaged one
      FH_FAIL("--resume: ", path, ":", lineno, " is not valid JSON, after result lines: a damaged line. Delete it "
              "(its request then runs again) and rerun with --resume, which keeps the other results; --overwrite "
              "would start over");
    if (!key && !unkeyed)
      FH_FAIL("--resume: ", path, ":", lineno, " is not a result line with a string or number \"id\" (nor a Batch "
              "output line with a \"custom_id\"); refusing to append to a file flexh2o did not write (move it "
              "away, or pass --overwrite instead of --resume)");
    const Format f = is_batch ? Format::kBatch : Format::kFlexh2o;
    if (prior.format && *prior.format != f)
      FH_FAIL("--resume: ", path, ":", lineno, (is_batch ? " is an OpenAI Batch output line" : " is a flexh2o "
              "result line"), " but line 1 is not; refusing to append to a file that mixes the formats");
    prior.format = f;
    if (unkeyed) {
      ++prior.unkeyed;
    } else if (auto [it, fresh] = prior.line_of.emplace(*key, lineno); !fresh) {
      FH_FAIL("--resume: ", path, ":", lineno, " repeats ", is_batch ? "custom_id " : "id ", *key, " of line ",
              it->second);
    }
    prior.failed += is_batch ? batch::output_line_failed(j) : j.contains("error");
    complete_bytes += line.size() + 1;
  }
  if (size > complete_bytes) {
    if (::truncate(path.c_str(), off_t(complete_bytes)) != 0)
      FH_FAIL("--resume: cannot cut the partial last line of --output ", path, ": ", std::strerror(errno));
    std::cerr << "flexh2o: --resume: dropped a partial last line (" << size - complete_bytes << " bytes) of "
              << path << "\n";
  }
  return prior;
}

OutputFile::Mode check_results(const GenerateArgs& a, Format format, PriorResults& prior,
                               const std::atomic<bool>* stop) {
  struct stat st {};
  const bool exists = ::stat(a.output.c_str(), &st) == 0;
  const bool holds_results = exists && S_ISREG(st.st_mode) && st.st_size > 0;
  if (a.resume && exists && !S_ISREG(st.st_mode))
    FH_FAIL("--resume needs --output to be a regular file; ", a.output, " is not");
  if (a.resume) {
    if (holds_results) prior = read_prior_results(a.output, stop);
    if (prior.format && *prior.format != format)
      FH_FAIL("--resume: --output ", a.output, " holds the results of ", format_name(*prior.format), " but --input ",
              a.input.empty() ? std::string("(--prompt)") : a.input, " is ", format_name(format),
              "; is it the output of another input?");
  } else if (holds_results && !a.overwrite) {
    FH_FAIL("--output ", a.output, " already holds results (", st.st_size, " bytes); pass --resume to finish "
            "that run, or --overwrite to replace them");
  }
  check_can_write({"--output", a.output});
  return a.resume ? OutputFile::Mode::kAppend : OutputFile::Mode::kTruncate;
}

namespace {
constexpr const char* kIdentityAttr = "user.flexh2o.run";
}  // namespace

json run_identity(const GenerateArgs& a, const Model& m, DType kv_dtype, Format format,
                  std::span<const int32_t> eos_ids) {
  const ModelConfig& c = m.config();
  auto g = [](float v) {  // as given (0.7, not the float's 0.699999988), whatever the locale
    char b[32];
    const auto r = std::to_chars(b, b + sizeof b, v);
    return std::string(b, r.ptr);
  };
  json id{{"model", c.name + " (" + c.model_type + ", " + std::to_string(m.parameter_count()) + " parameters)"},
          {"greedy", a.greedy},  // overrides the lines' temperature, where --temperature is their default
          {"repetition_penalty", g(a.repetition_penalty)},
          {"ignore_eos", a.ignore_eos},
          {"logprobs", a.logprobs},
          {"kv_policy", describe(make_kv_config(a.kv))},
          {"kv_dtype", dtype_name(kv_dtype)},
          {"compress_weight", a.offload.compress_weight}};
  if (!a.ignore_eos) {
    std::string eos;
    for (int32_t id : eos_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
    id["eos_ids"] = eos;
  }
  if (!a.greedy) {  // what a greedy run draws with does not change what it picks
    id["top_k"] = a.top_k;
    id["min_p"] = g(a.min_p);
    id["seed"] = a.seed;
  }
  if (format == Format::kFlexh2o) {  // a Batch line's body sets these itself (its own defaults)
    std::string stop;
    for (const std::string& s : a.stop) stop += (stop.empty() ? "" : ", ") + json(s).dump();
    id["stop"] = stop;
    id["max_new_tokens"] = a.max_new_tokens;
    id["presence_penalty"] = g(a.presence_penalty);
    id["frequency_penalty"] = g(a.frequency_penalty);
    if (!a.greedy) id["temperature"] = g(a.temperature), id["top_p"] = g(a.top_p);
  }
  return id;
}

void check_resume_identity(const std::string& output, const json& identity) {
  std::string bytes(65536, '\0');
  const ssize_t n = ::getxattr(output.c_str(), kIdentityAttr, bytes.data(), bytes.size());
  if (n <= 0) return;  // none recorded, no extended attributes here, or one too large to be ours
  bytes.resize(size_t(n));
  const json before = json::parse(bytes, nullptr, false);
  if (!before.is_object()) return;
  std::string diff;
  for (const auto& [key, now] : identity.items()) {
    const auto it = before.find(key);
    if (it == before.end() || *it == now) continue;
    diff += detail::concat(diff.empty() ? "" : "; ", key, " ", it->is_string() ? it->get<std::string>() : it->dump(),
                           " there, ", now.is_string() ? now.get<std::string>() : now.dump(), " in this run");
  }
  if (!diff.empty())
    FH_FAIL("--resume: ", output, " holds the results of a run with other settings (", diff,
            "); finishing it so would mix two runs' results. Resume with that run's model and flags, or give another "
            "--output (--overwrite starts this one afresh)");
}

void record_run_identity(const std::string& output, const json& identity) {
  const std::string bytes = identity.dump();
  (void)::setxattr(output.c_str(), kIdentityAttr, bytes.data(), bytes.size(), 0);
}

}  // namespace flexh2o::cli
