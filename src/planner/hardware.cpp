// HardwareProfile JSON (de)serialisation and validation.
#include "planner/hardware.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/input_guard.h"
#include "offload/tier.h"

namespace flexh2o {
namespace {

using nlohmann::json;
constexpr double kG = 1e9, kT = 1e12;

// Reads j[group][key] as a number >= 0 (> 0 when `positive`); `required` false -> default.
double field(const json& j, const std::string& origin, const char* group, const char* key, bool required,
             bool positive, double def = 0) {
  const std::string path = std::string(group) + "." + key;
  if (!j.contains(group) || !j[group].is_object() || !j[group].contains(key)) {
    if (required) FH_FAIL(origin, ": hardware profile field \"", path, "\" is missing");
    return def;
  }
  const json& v = j[group][key];
  if (!v.is_number()) FH_FAIL(origin, ": hardware profile field \"", path, "\" must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0) FH_FAIL(origin, ": hardware profile field \"", path, "\" is negative (", x, ")");
  if (positive && x == 0) FH_FAIL(origin, ": hardware profile field \"", path, "\" must be > 0");
  return x;
}

// One stage_link field: a finite number >= 0 (> 0 when `positive`).
double link_number(const json& j, const std::string& origin, const char* key, bool positive) {
  const std::string path = std::string("stage_link.") + key;
  if (!j.contains(key)) FH_FAIL(origin, ": hardware profile field \"", path, "\" is missing");
  const json& v = j[key];
  if (!v.is_number()) FH_FAIL(origin, ": hardware profile field \"", path, "\" must be a number, got ", v.dump());
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0 || (positive && x == 0))
    FH_FAIL(origin, ": hardware profile field \"", path, "\" must be ", positive ? "> 0" : ">= 0", ", got ", v.dump());
  return x;
}

}  // namespace

const char* stage_link_kind_name(StageLink::Kind k) {
  switch (k) {
    case StageLink::Kind::kPcieHost: return "pcie_host";
    case StageLink::Kind::kNvlink: return "nvlink";
    case StageLink::Kind::kNetwork: return "network";
  }
  return "?";
}

StageLink StageLink::from_json(const json& j, const std::string& origin) {
  if (!j.is_object()) FH_FAIL(origin, ": hardware profile field \"stage_link\" must be an object, got ", j.dump());
  for (const auto& [key, v] : j.items()) {
    if (key != "kind" && key != "gbps" && key != "latency_us" && key != "name" && key != "source")
      FH_FAIL(origin, ": hardware profile field \"stage_link.", key, "\" is not known (kind, gbps, latency_us, name, source)");
  }
  StageLink l;
  if (!j.contains("kind")) FH_FAIL(origin, ": hardware profile field \"stage_link.kind\" is missing");
  const json& k = j["kind"];
  const std::string ks = k.is_string() ? k.get<std::string>() : std::string();
  if (ks == "pcie_host") l.kind = Kind::kPcieHost;
  else if (ks == "nvlink") l.kind = Kind::kNvlink;
  else if (ks == "network") l.kind = Kind::kNetwork;
  else FH_FAIL(origin, ": hardware profile field \"stage_link.kind\" must be \"pcie_host\", \"nvlink\" or \"network\", got ", k.dump());
  l.bandwidth = link_number(j, origin, "gbps", true) * kG;
  l.latency = link_number(j, origin, "latency_us", false) * 1e-6;
  for (const char* key : {"name", "source"}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_string()) FH_FAIL(origin, ": hardware profile field \"stage_link.", key, "\" must be a string, got ", j[key].dump());
    (std::string_view(key) == "name" ? l.name : l.source) = j[key].get<std::string>();
  }
  return l;
}

StageLink StageLink::load(const std::filesystem::path& file) {
  const json j = read_json_file(file, "stage link");
  StageLink l = from_json(j, file.string());
  if (l.name.empty()) l.name = file.stem().string();
  return l;
}

json StageLink::to_json() const {
  json j = {{"kind", stage_link_kind_name(kind)}, {"gbps", bandwidth / kG}, {"latency_us", latency * 1e6}};
  if (!name.empty()) j["name"] = name;
  if (!source.empty()) j["source"] = source;
  return j;
}

StageLink resolve_stage_link(const std::string& spec, const std::filesystem::path& configs_dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(spec)) return StageLink::load(spec);
  const fs::path p = configs_dir / "hardware" / "links" / (spec + ".json");
  if (fs::is_regular_file(p)) return StageLink::load(p);
  FH_FAIL("stage link \"", spec, "\" is neither a file nor a name in ", (configs_dir / "hardware" / "links").string(),
          " (try pcie-host, nvlink4, ethernet-25g, infiniband-hdr)");
}

StageLink HardwareProfile::between_stages() const {
  if (stage_link_given) return stage_link;
  StageLink l;
  l.kind = StageLink::Kind::kPcieHost;
  l.bandwidth = device_to_host > 0 && host_to_device > 0 ? 1 / (1 / device_to_host + 1 / host_to_device) : 0;
  l.latency = 10e-6;
  l.name = "pcie_host (from this profile's device_to_host and host_to_device)";
  return l;
}

double HardwareProfile::usable(int tier) const {
  const double cap = tier == 0 ? device_memory : tier == 1 ? host_memory : disk_memory;
  return cap * usable_fraction;
}

double HardwareProfile::charged(int tier, const std::array<uint64_t, 3>& memory) const {
  const double own = double(memory[size_t(tier)]);
  return tier == 1 && shared_memory ? own + double(memory[0]) : own;
}

bool HardwareProfile::fits(const std::array<uint64_t, 3>& memory) const {
  for (int t = 0; t < 3; ++t)
    if (charged(t, memory) > usable(t)) return false;
  return true;
}

std::string HardwareProfile::overflow_note(const std::array<uint64_t, 3>& memory) const {
  std::ostringstream os;
  os.precision(4);
  for (int t = 0; t < 3; ++t) {
    const double need = charged(t, memory), have = usable(t);
    if (need <= have) continue;
    os << (os.tellp() > 0 ? "; " : "") << tier_name(Tier(t)) << (t == 1 && shared_memory ? " with the device" : "")
       << " needs " << need / 1e9 << " GB, usable " << have / 1e9 << " GB (short by " << (need - have) / 1e9 << " GB)";
  }
  return os.str();
}

HardwareProfile HardwareProfile::from_json(const json& j, const std::string& origin) {
  if (!j.is_object()) FH_FAIL(origin, ": a hardware profile must be a JSON object");
  HardwareProfile h;
  h.name = j.value("name", std::string());
  h.source = j.value("source", std::string());
  if (j.contains("device")) {
    const json& d = j["device"];
    if (!d.is_string() || (d.get<std::string>() != "cuda" && d.get<std::string>() != "cpu"))
      FH_FAIL(origin, ": hardware profile field \"device\" must be \"cuda\" or \"cpu\"");
    h.device = d.get<std::string>() == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  }
  h.device_memory = field(j, origin, "memory_gb", "device", true, true) * kG;
  h.host_memory = field(j, origin, "memory_gb", "host", true, true) * kG;
  h.disk_memory = field(j, origin, "memory_gb", "disk", true, false) * kG;
  if (j.contains("usable_fraction")) {
    const json& u = j["usable_fraction"];
    if (!u.is_number() || !(u.get<double>() > 0 && u.get<double>() <= 1))
      FH_FAIL(origin, ": hardware profile field \"usable_fraction\" must be in (0, 1]");
    h.usable_fraction = u.get<double>();
  }
  const char* bw = "bandwidth_gbps";
  h.host_to_device = field(j, origin, bw, "host_to_device", true, true) * kG;
  h.device_to_host = field(j, origin, bw, "device_to_host", true, true) * kG;
  h.disk_to_host = field(j, origin, bw, "disk_to_host", true, true) * kG;
  h.host_to_disk = field(j, origin, bw, "host_to_disk", true, true) * kG;
  h.device_to_host_cache = field(j, origin, bw, "device_to_host_cache", false, false) * kG;
  h.host_to_disk_cache = field(j, origin, bw, "host_to_disk_cache", false, false) * kG;
  h.disk_to_host_cache = field(j, origin, bw, "disk_to_host_cache", false, false) * kG;
  if (h.disk_to_host_cache == 0) h.disk_to_host_cache = h.disk_to_host;
  if (h.device_to_host_cache == 0) h.device_to_host_cache = h.device_to_host;
  if (h.host_to_disk_cache == 0) h.host_to_disk_cache = h.host_to_disk;
  const char* dev = "device_tflops";
  h.device_gemm_prefill = field(j, origin, dev, "gemm_prefill", true, true) * kT;
  h.device_gemm_decode = field(j, origin, dev, "gemm_decode", true, true) * kT;
  h.device_attention_prefill = field(j, origin, dev, "attention_prefill", true, true) * kT;
  h.device_attention_decode = field(j, origin, dev, "attention_decode", true, true) * kT;
  h.device_weight_read = field(j, origin, "device_gbps", "weight_read", false, false) * kG;
  h.host_attention = field(j, origin, "host_tflops", "attention", true, true) * kT;
  h.host_gemm = field(j, origin, "host_tflops", "gemm", false, false) * kT;
  h.host_eff_c1 = field(j, origin, "host_attention_efficiency", "c1", false, false);
  h.host_eff_c2 = field(j, origin, "host_attention_efficiency", "c2", false, false);
  h.host_eff_c3 = field(j, origin, "host_attention_efficiency", "c3", false, false);
  if (j.contains("device_gemm_time")) {
    const json& g = j["device_gemm_time"];
    if (!g.is_string() || (g.get<std::string>() != "sum" && g.get<std::string>() != "max"))
      FH_FAIL(origin, ": hardware profile field \"device_gemm_time\" must be \"max\" or \"sum\"");
    h.gemm_time_sum = g.get<std::string>() == "sum";
  }
  if (j.contains("shared_memory")) {
    if (!j["shared_memory"].is_boolean())
      FH_FAIL(origin, ": hardware profile field \"shared_memory\" must be true or false");
    h.shared_memory = j["shared_memory"].get<bool>();
  }
  if (j.contains("disk_duplex")) {
    if (!j["disk_duplex"].is_boolean()) FH_FAIL(origin, ": hardware profile field \"disk_duplex\" must be true or false");
    h.disk_duplex = j["disk_duplex"].get<bool>();
  }
  const char* ov = "overheads_us";
  h.compute_step_overhead = field(j, origin, ov, "compute_step", false, false) * 1e-6;
  h.schedule_step_overhead = field(j, origin, ov, "schedule_step", false, false) * 1e-6;
  h.token_step_overhead = field(j, origin, ov, "token_step", false, false) * 1e-6;
  h.disk_read_request = field(j, origin, ov, "disk_read_request", false, false) * 1e-6;
  h.disk_write_request = field(j, origin, ov, "disk_write_request", false, false) * 1e-6;
  h.device_elementwise = field(j, origin, "device_gbps", "elementwise", false, false) * kG;
  h.device_dequant = field(j, origin, "dequant_gbps", "device", false, false) * kG;
  h.host_dequant = field(j, origin, "dequant_gbps", "host", false, false) * kG;
  h.host_kv_policy = field(j, origin, "host_kv_policy", "mslots", false, false) * 1e6;
  h.host_kv_prefill = field(j, origin, "host_kv_policy", "prefill_mslots", false, false) * 1e6;
  h.host_kv_group = field(j, origin, "host_kv_policy", "group_mslots", false, false) * 1e6;
  h.host_kv_policy_row = field(j, origin, "host_kv_policy", "row_us", false, false) * 1e-6;
  h.host_kv_threads = std::max(1.0, field(j, origin, "host_kv_policy", "threads", false, false, 1));
  if (j.contains("stage_link")) {
    h.stage_link = StageLink::from_json(j["stage_link"], origin);
    h.stage_link_given = true;
  }
  return h;
}

HardwareProfile HardwareProfile::load(const std::filesystem::path& file) {
  const json j = read_json_file(file, "hardware profile");
  HardwareProfile h;
  try {
    h = from_json(j, file.string());
  } catch (const json::exception& e) {  // e.g. "name" that is not a string
    FH_FAIL(file.string(), ": unexpected hardware profile structure: ", json_error_text(e));
  }
  if (h.name.empty()) h.name = file.stem().string();
  return h;
}

json HardwareProfile::to_json() const {
  json j;
  j["name"] = name;
  j["source"] = source;
  j["device"] = device_kind_name(device);
  j["memory_gb"] = {{"device", device_memory / kG}, {"host", host_memory / kG}, {"disk", disk_memory / kG}};
  j["usable_fraction"] = usable_fraction;
  j["shared_memory"] = shared_memory;
  j["bandwidth_gbps"] = {{"host_to_device", host_to_device / kG},       {"device_to_host", device_to_host / kG},
                         {"device_to_host_cache", device_to_host_cache / kG}, {"disk_to_host", disk_to_host / kG},
                         {"host_to_disk", host_to_disk / kG},           {"host_to_disk_cache", host_to_disk_cache / kG},
                         {"disk_to_host_cache", disk_to_host_cache / kG}};
  j["device_tflops"] = {{"gemm_prefill", device_gemm_prefill / kT},
                        {"gemm_decode", device_gemm_decode / kT},
                        {"attention_prefill", device_attention_prefill / kT},
                        {"attention_decode", device_attention_decode / kT}};
  j["device_gbps"] = {{"weight_read", device_weight_read / kG}, {"elementwise", device_elementwise / kG}};
  j["device_gemm_time"] = gemm_time_sum ? "sum" : "max";
  j["disk_duplex"] = disk_duplex;
  j["overheads_us"] = {{"compute_step", compute_step_overhead * 1e6},
                       {"schedule_step", schedule_step_overhead * 1e6},
                       {"token_step", token_step_overhead * 1e6},
                       {"disk_read_request", disk_read_request * 1e6},
                       {"disk_write_request", disk_write_request * 1e6}};
  j["host_tflops"] = {{"attention", host_attention / kT}, {"gemm", host_gemm / kT}};
  j["host_attention_efficiency"] = {{"c1", host_eff_c1}, {"c2", host_eff_c2}, {"c3", host_eff_c3}};
  j["dequant_gbps"] = {{"device", device_dequant / kG}, {"host", host_dequant / kG}};
  j["host_kv_policy"] = {{"mslots", host_kv_policy / 1e6},
                         {"prefill_mslots", host_kv_prefill / 1e6},
                         {"group_mslots", host_kv_group / 1e6},
                         {"row_us", host_kv_policy_row * 1e6},
                         {"threads", host_kv_threads}};
  if (stage_link_given) j["stage_link"] = stage_link.to_json();
  return j;
}

HardwareProfile resolve_profile(const std::string& spec, const std::filesystem::path& configs_dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(spec)) return HardwareProfile::load(spec);
  const fs::path p = configs_dir / "hardware" / (spec + ".json");
  if (fs::is_regular_file(p)) return HardwareProfile::load(p);
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(configs_dir / "hardware", ec))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  FH_FAIL("hardware profile \"", spec, "\" is neither a file nor a name in ", (configs_dir / "hardware").string(),
          " (",
          names.empty() ? std::string("it holds no profiles: give --configs DIR before the command")
                        : "names there: " + known,
          "; or run `flexh2o profile` and give its file)");
}

}  // namespace flexh2o
