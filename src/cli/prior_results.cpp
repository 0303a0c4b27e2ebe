// generate's --input format and --output for --resume (prior_results.h).
#include "cli/prior_results.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/openai_batch.h"
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


PriorResults read_prior_results(const std::string& path) {
  PriorResults prior;
  std::ifstream in(path, std::ios::binary);
  if (!in) FH_FAIL("--resume: cannot read --output ", path);
  const uint64_t size = std::filesystem::file_size(path);
  LineReader reader(in, kMaxLineBytes, path);  // bounded: the file may not be ours
  std::string line;
  uint64_t complete_bytes = 0;
  for (LineReader::Result r; (r = reader.next(line)) != LineReader::Result::kEnd;) {
    const int64_t lineno = reader.line_number();
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

OutputFile::Mode check_results(const GenerateArgs& a, Format format, PriorResults& prior) {
  struct stat st {};
  const bool exists = ::stat(a.output.c_str(), &st) == 0;
  const bool holds_results = exists && S_ISREG(st.st_mode) && st.st_size > 0;
  if (a.resume && exists && !S_ISREG(st.st_mode))
    FH_FAIL("--resume needs --output to be a regular file; ", a.output, " is not");
  if (a.resume) {
    if (holds_results) prior = read_prior_results(a.output);
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

}  // namespace flexh2o::cli
