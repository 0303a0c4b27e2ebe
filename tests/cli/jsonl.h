// Reading a JSONL file a test run of the program wrote: one parsed value per line.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace flexh2o::test {

inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  for (std::string l; std::getline(f, l);) v.push_back(nlohmann::json::parse(l));
  return v;
}

}  // namespace flexh2o::test
