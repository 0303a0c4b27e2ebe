// Parsing of the offloading flags, byte sizes and the offload section of the run report.
#include "cli/offload_flags.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/common.h"
#include "cli/output_file.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/input_guard.h"
#include "planner/planner.h"
#include "planner/profile.h"

namespace flexh2o::cli {

void add_offload_flags(CLI::App* app, OffloadArgs& a) {
  const char* g = "Offloading (FlexGen-compatible)";
  app->add_option("--percent", a.percent,
                  "Placement: w_gpu w_cpu cache_gpu cache_cpu act_gpu act_cpu (percent; disk gets the rest)")
      ->expected(6)->group(g);
  app->add_option("--gpu-batch-size", a.gpu_batch_size, "Sequences per micro-batch")
      ->check(at_least(1))->group(g);
  app->add_option("--num-gpu-batches", a.num_gpu_batches, "Micro-batches sharing one weight load (block = product)")
      ->check(at_least(1))->group(g);
  app->add_flag("--cpu-cache-compute,--cpu", a.cpu_cache_compute,
                "Decode attention on the host where the KV cache lives")->group(g);
  // Not given: a --policy file's value, else true (so a file's false is not overridden by a default).
  app->add_option("--overlap", a.overlap, "Overlap transfers with compute (true/false)")
      ->default_str("true")->check(flag_bool_check())->group(g);
  app->add_option("--sep-layer", a.sep_layer,
                  "Attention and MLP stream as separate units (false: a whole layer at once); either way each "
                  "is placed by the midpoint rule over its own bytes, as FlexGen places them")
      ->default_str("true")->check(flag_bool_check())->group(g);
  app->add_option("--pin-weight", a.pin_weight,
                  "Host-homed weights in page-locked memory on a GPU (the checkpoint's pages locked in place "
                  "when possible)")->default_str("true")->check(flag_bool_check())->group(g);
  app->add_option("--policy", a.policy_file,
                  "JSON policy file (fields of the flags above, or `flexh2o plan --json` output; flags given "
                  "override it), or \"auto\": the planner picks (--overlap and --sep-layer given are searched "
                  "under, --pin-weight applied)")
      ->group(g);
  app->add_option("--hardware", a.hardware,
                  "Hardware profile for --policy auto: a name in configs/hardware or a file (default: measure this machine)")
      ->group(g);
  app->add_option("--offload-dir", a.offload_dir, "Directory for disk-homed weights and KV (NVMe)")->group(g);
  app->add_option("--gpu-mem", a.gpu_mem,
                  "Compute-device memory budget, e.g. 16GiB, 512MB, 1.5G (K/M/G/T and KiB..TiB: powers of 1024; "
                  "KB..TB: powers of 1000; no unit: bytes) (default: unlimited). --policy auto plans within the "
                  "profile's usable_fraction of each budget (FlexGen's 0.8 for a measured one), as of the profile's own "
                  "memory")->check(size_check("--gpu-mem"))->group(g);
  app->add_option("--cpu-mem", a.cpu_mem, "Host memory budget (default: unlimited)")->check(size_check("--cpu-mem"))
      ->group(g);
  app->add_option("--disk-mem", a.disk_mem,
                  "Disk budget in the offload dir, for the bytes of the weights and KV homed there (each file adds a "
                  "4 KiB header and its last page's padding) (default: unlimited)")
      ->check(size_check("--disk-mem"))->group(g);
  app->add_option("--io", a.io, "Disk I/O backend: auto (io_uring if it works), uring, pread")->capture_default_str()
      ->group(g);
  app->add_flag("--verify-store,!--trust-store", a.verify_store,
                "Hash every reused offload weight file before trusting it (the default); --trust-store skips "
                "the hash (one read of the disk-homed weights per run) and checks headers and sizes only")
      ->group(g);
  const char* z = "Compression (FlexGen's: 4 bits, groups of 64, an fp16 scale and min per group)";
  app->add_flag("--compress-weight", a.compress_weight,
                "Every 2-D weight (matrices, embeddings, lm_head) held 4-bit on every tier and moved so: "
                "0.28x the bytes of f16 (36 bytes per 64 values), dequantized inside the kernels")->group(z);
  app->add_flag("--compress-cache", a.compress_cache,
                "KV cache 4-bit in every tier (the same as --kv-dtype q4): 0.28x the bytes of f16 stored "
                "and moved")->group(z);
  app->add_flag("--allow-compress", a.allow_compress,
                "With --policy auto: also consider 4-bit weights and KV cache where the hardware profile "
                "prices dequantization. Lossy: the outputs change. Without it (or with --no-compress, the "
                "default) auto keeps full precision unless --compress-weight / --compress-cache ask for it")
      ->group(z);
  app->add_flag("--no-compress", a.no_compress, "With --policy auto: never choose compression (the default)")
      ->group(z);
  app->add_option("--trace", a.trace,
                  "Write every schedule step (loads, stores, compute per queue) as Chrome trace-event JSON "
                  "to FILE; open it in ui.perfetto.dev to see what the pipeline waits on")
      ->group(g);
}

void apply_batch_size_flag(bool batch_size_given, int64_t batch_size, OffloadArgs& a, bool refuse,
                           std::string_view flag) {
  if (!batch_size_given || !offload_requested(a)) return;
  if (a.gpu_batch_size || a.num_gpu_batches || !a.policy_file.empty()) {
    if (!refuse) return;
    FH_FAIL(flag, " ", batch_size, " contradicts ",
            !a.policy_file.empty() ? "--policy" : "--gpu-batch-size / --num-gpu-batches",
            ", which set the batch (a block of --gpu-batch-size x --num-gpu-batches sequences) when offloading; "
            "give one or the other");
  }
  a.gpu_batch_size = batch_size;
}

void check_hardware_flag(const OffloadArgs& a, bool balances_stages) {
  if (!a.hardware.empty() && a.policy_file != "auto" && !balances_stages)
    FH_FAIL("--hardware ", a.hardware, " is the profile --policy auto plans for (and --pipeline-stages balances by); "
            "add --policy auto, or drop --hardware");
}

bool offload_requested(const OffloadArgs& a) {
  return !a.percent.empty() || a.gpu_batch_size || a.num_gpu_batches || a.cpu_cache_compute ||
         !a.policy_file.empty() || !a.offload_dir.empty() || !a.gpu_mem.empty() || !a.cpu_mem.empty() ||
         !a.disk_mem.empty();
}

namespace {

constexpr const char* kSizeUnits =
    "units: B; K/KiB, M/MiB, G/GiB, T/TiB = powers of 1024; KB, MB, GB, TB = powers of 1000";
// No machine has an exabyte of any tier; above this, budget sums could approach 2^64.
constexpr uint64_t kMaxBudgetBytes = uint64_t(1) << 60;

}  // namespace

uint64_t parse_bytes(const std::string& text, const std::string& flag) {
  auto fail = [&](const std::string& why) {
    FH_FAIL(flag, ": ", why, "; give a size like 16GiB, 512MB or 1.5G (", kSizeUnits, ").");
  };
  // A plain decimal number (digits with at most one '.'), then a unit.
  size_t end = 0, dots = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
    dots += text[end++] == '.';
  if (end == 0 || dots > 1 || !std::isdigit(static_cast<unsigned char>(text[0])))
    fail("\"" + text + "\" is not a size");
  double v = 0;
  std::from_chars(text.data(), text.data() + end, v);
  std::string unit = text.substr(end);
  for (auto& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "tb") mult = 1e12;
  else fail("\"" + text + "\" has an unknown unit \"" + text.substr(end) + "\"");
  if (mult == 1 && dots > 0)  // "0.5" once became 0 bytes, which means "no limit"
    fail("\"" + text + "\" is a fraction of a byte (a number without a unit counts bytes)");
  const double bytes = std::floor(v * mult);
  if (!(bytes >= 1)) fail("\"" + text + "\" is less than one byte");
  if (bytes > double(kMaxBudgetBytes)) fail("\"" + text + "\" is more than 1 EiB, more than any machine has");
  return uint64_t(bytes);
}

namespace {
std::optional<bool> bool_word(const std::string& s) {
  if (s == "true" || s == "1" || s == "on" || s == "yes") return true;
  if (s == "false" || s == "0" || s == "off" || s == "no") return false;
  return std::nullopt;
}
std::string bool_word_error(const std::string& s) {
  return "must be true or false (or 1/0, on/off, yes/no), got \"" + s + "\"";
}
// What `flexh2o plan --json` wrote: its "policy" beside the prediction (a bare policy file has
// its keys at the top).
bool is_plan_json(const nlohmann::json& j) {
  return j.is_object() && j.contains("policy") && j["policy"].is_object() && j.contains("policy_flags");
}
}  // namespace

bool parse_flag_bool(const std::string& s, const char* flag) {
  if (const std::optional<bool> b = bool_word(s)) return *b;
  FH_FAIL(flag, " ", bool_word_error(s));
}

bool flag_bool_or(const std::string& s, bool otherwise, const char* flag) {
  return s.empty() ? otherwise : parse_flag_bool(s, flag);
}

CLI::Validator flag_bool_check() {
  return CLI::Validator([](std::string& s) { return bool_word(s) ? std::string() : bool_word_error(s); },
                        "true|false");
}

CLI::Validator at_least(int64_t min) {
  return CLI::Validator(
      [min](std::string& s) {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "must be an integer, got " + s;
        return v < min ? "must be at least " + std::to_string(min) + ", got " + s : std::string();
      },
      ">=" + std::to_string(min));
}

CLI::Validator size_check(const std::string& flag) {
  return CLI::Validator(
      [flag](std::string& s) {
        try {
          (void)parse_bytes(s, flag);
          return std::string();
        } catch (const Error& e) {  // CLI11 names the flag itself
          const std::string m = e.what(), prefix = flag + ": ";
          return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
        }
      },
      "SIZE");
}

CLI::Option* add_threads_flag(CLI::App* app, int& threads) {
  // The device's task arena gets no more workers than the machine has threads (oneTBB's limit):
  // a larger count would be reported but not run. 0: the machine does not say, so no bound.
  const int most = int(std::thread::hardware_concurrency());
  CLI::Option* o = app->add_option("--threads", threads,
                                   "CPU threads (default or 0: all " +
                                       (most ? std::to_string(most) + " hardware threads here" : std::string("cores")) +
                                       "; under mpirun, the host's shared by its ranks)")
                       ->check(at_least(0));
  if (most)
    o->check(CLI::Validator(
        [most](std::string& s) {
          int64_t v = 0;
          return CLI::detail::lexical_cast(s, v) && v > most
                     ? "must be at most " + std::to_string(most) + ", the hardware threads here; got " + s
                     : std::string();
        },
        "<=" + std::to_string(most)));
  return o;
}

OffloadOptions make_offload_options(const OffloadArgs& a) {
  OffloadOptions o;
  if (!a.policy_file.empty() && a.policy_file != "auto") {
    if (const Status st = check_regular_file(a.policy_file, "--policy file"); !st.ok())
      FH_FAIL(st.message(), " --policy takes a JSON policy file or \"auto\".");
    const nlohmann::json j = read_json_file(a.policy_file, "--policy file");
    const bool plan = is_plan_json(j);
    o.policy = policy_from_json(plan ? j["policy"] : j, plan ? a.policy_file + " (plan's \"policy\")" : a.policy_file);
  }
  Policy& p = o.policy;
  if (!a.percent.empty()) {
    FH_CHECK(a.percent.size() == 6, "--percent takes 6 numbers, got ", a.percent.size());
    p.set_percent(std::span<const double, 6>(a.percent.data(), 6));
  }
  if (a.gpu_batch_size) p.gpu_batch_size = a.gpu_batch_size;
  if (a.num_gpu_batches) p.num_gpu_batches = a.num_gpu_batches;
  if (a.cpu_cache_compute) p.cpu_cache_compute = true;
  if (a.compress_weight) p.compress_weight = true;
  if (a.compress_cache) p.compress_cache = true;
  p.overlap = flag_bool_or(a.overlap, p.overlap, "--overlap");
  p.sep_layer = flag_bool_or(a.sep_layer, p.sep_layer, "--sep-layer");
  p.pin_weight = flag_bool_or(a.pin_weight, p.pin_weight, "--pin-weight");
  p.validate();
  if (!a.gpu_mem.empty()) o.device_mem = parse_bytes(a.gpu_mem, "--gpu-mem");
  if (!a.cpu_mem.empty()) o.host_mem = parse_bytes(a.cpu_mem, "--cpu-mem");
  if (!a.disk_mem.empty()) o.disk_mem = parse_bytes(a.disk_mem, "--disk-mem");
  o.offload_dir = a.offload_dir;
  if (!a.disk_mem.empty() && a.offload_dir.empty())  // it would bound nothing, and turn the engine on
    FH_FAIL("--disk-mem bounds what --offload-dir holds: give --offload-dir DIR too, or drop --disk-mem");
  if (a.io == "auto") o.io = IoBackendChoice::kAuto;
  else if (a.io == "uring") o.io = IoBackendChoice::kUring;
  else if (a.io == "pread") o.io = IoBackendChoice::kPread;
  else FH_FAIL("--io must be auto, uring or pread, got \"", a.io, "\"");
  o.verify_store = a.verify_store;
  o.trace = !a.trace.empty();
  check_can_write({"--trace", a.trace});  // fail before the run, not after it (and truncate nothing)
  return o;
}

nlohmann::json plan_model_shape(const ModelConfig& c) {
  return {{"model_type", c.model_type}, {"layers", c.n_layers},        {"hidden", c.hidden},
          {"heads", c.n_heads},         {"kv_heads", c.n_kv_heads},    {"head_dim", c.head_dim},
          {"ffn_dim", c.ffn_dim},       {"experts", c.n_experts},      {"vocab", c.vocab_size}};
}

void check_plan_file(const OffloadArgs& a, const KvPolicyConfig& running, const Model& m, int64_t prompt_len,
                     int64_t gen_len, std::ostream& log) {
  if (a.policy_file.empty() || a.policy_file == "auto") return;
  const nlohmann::json j = read_json_file(a.policy_file, "--policy file");
  if (!is_plan_json(j)) return;
  if (j.contains("kv_policy") && j["kv_policy"].is_string()) {
    const std::string planned = j["kv_policy"].get<std::string>(), now = describe(running);
    if (planned != now)
      FH_FAIL("--policy ", a.policy_file, " was planned (flexh2o plan --json) for KV policy \"", planned,
              "\", but this run's is \"", now, "\": its block and placement were sized for that cache. Give the "
              "KV flags it was planned with, or plan again with this run's");
  }
  ModelConfig c = m.config();  // a pipeline stage's holds its own layers; the plan was the whole model's
  if (m.stage_range().total > 0) c.n_layers = m.stage_range().total;
  const nlohmann::json shape = plan_model_shape(c);
  if (j.contains("model_shape") && j["model_shape"] != shape) {
    // The keys that differ, planned -> this run's: the whole shapes bury them.
    std::string diff;
    for (const auto& item : shape.items()) {
      const nlohmann::json was = j["model_shape"].is_object() ? j["model_shape"].value(item.key(), nlohmann::json())
                                                              : nlohmann::json();
      if (was != item.value())
        diff += (diff.empty() ? "" : ", ") + item.key() + " " + was.dump() + " -> " + item.value().dump();
    }
    const std::string planned_model = j.value("model", std::string("another model"));
    log << "flexh2o: warning: --policy " << a.policy_file << " was planned for " << planned_model
        << ", another shape than " << c.name << " (" << diff
        << "): its block and placement were sized for that model; plan again with this one\n";
  }
  const auto planned_len = [&j](const char* key) {
    return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : int64_t(0);
  };
  const int64_t pp = planned_len("prompt_len"), pg = planned_len("gen_len");
  if (pp > 0 && pg > 0 && (prompt_len > pp || prompt_len + gen_len > pp + pg))
    log << "flexh2o: warning: --policy " << a.policy_file << " was planned for sequences of " << pp << " + " << pg
        << " tokens; this run's reach " << prompt_len << " + " << gen_len
        << ": its block's activations grow with the prompt and its KV cache with both, and may not fit the "
           "budgets; plan again with "
           "--prompt-len " << prompt_len << " --gen-len " << gen_len << "\n";
}

namespace {

// What --offload-dir can hold: its filesystem's free space and the files already there (a store
// this run may rewrite or reuse); the nearest existing directory above it where it is not made
// yet. nullopt where that cannot be read.
std::optional<uint64_t> offload_dir_room(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;  // a path that does not exist yet sets it: not an error here
  fs::path at = fs::absolute(dir, ec);
  if (ec) return std::nullopt;
  while (!fs::is_directory(at, ec) && at != at.parent_path()) at = at.parent_path();
  struct statvfs vfs {};
  if (::statvfs(at.c_str(), &vfs) != 0) return std::nullopt;
  uint64_t room = uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize);
  if (fs::is_directory(dir, ec))
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (std::error_code e; it->is_regular_file(e)) room += it->file_size(e);
  return room;
}

}  // namespace

HardwareProfile auto_profile(const OffloadArgs& a, const std::filesystem::path& configs_dir, CpuDevice& cpu,
                             DeviceKind kind, const std::string& device_name, std::ostream& log,
                             std::optional<MeasuredProfile>* measured) {
  HardwareProfile hw;
  bool measured_here = false;  // this machine's memory as of now is the profile's already
  if (!a.hardware.empty()) {
    hw = resolve_profile(a.hardware, configs_dir);
  } else if (kind == DeviceKind::kCuda) {
    if (device_name.find("H200") == std::string::npos)
      FH_FAIL("--policy auto on ", device_name, ": give --hardware PROFILE (configs/hardware has t4-paper and h200)");
    hw = resolve_profile("h200", configs_dir);
  } else if (measured && *measured && (*measured)->offload_dir == a.offload_dir) {
    log << "flexh2o: --policy auto: this machine's rates as measured for an earlier plan, its memory as of now\n";
    hw = (*measured)->profile;
    set_measured_memory(hw);
    measured_here = true;
  } else {
    log << "flexh2o: --policy auto: measuring this machine (give --hardware to skip)\n";
    ProfileOptions po;
    po.offload_dir = a.offload_dir;
    hw = measure_profile(cpu, po);
    if (measured) *measured = MeasuredProfile{hw, a.offload_dir};
    measured_here = true;
  }
  hw.device = kind;
  cap_profile_memory(a.gpu_mem, a.cpu_mem, a.disk_mem, hw);
  // A profile's host memory is its machine's, and a container's limit is not in /proc/meminfo:
  // without --cpu-mem this run's host tier is what this process can still take.
  if (a.cpu_mem.empty()) {
    const HostMemory host = read_host_memory();
    const std::string within = memory_cgroup_note(host);
    if (measured_here) {
      if (!within.empty())
        log << "flexh2o: --policy auto: the host tier is the " << human_bytes(uint64_t(hw.host_memory)) << " measured"
            << within << "\n";
    } else if (const std::optional<uint64_t> avail = host.available(); avail && double(*avail) < hw.host_memory) {
      log << "flexh2o: --policy auto: the host tier is the " << human_bytes(*avail) << " this process can take now"
          << within << ", less than the profile's (give --cpu-mem to set it)\n";
      hw.host_memory = double(*avail);
      if (hw.shared_memory && a.gpu_mem.empty()) hw.device_memory = std::min(hw.device_memory, hw.host_memory);
    }
  }
  // A profile's disk is its machine's; this run's is what --offload-dir has room for.
  if (const std::optional<uint64_t> room = a.offload_dir.empty() || !a.disk_mem.empty()
                                               ? std::nullopt
                                               : offload_dir_room(a.offload_dir);
      room && double(*room) < hw.disk_memory) {
    log << "flexh2o: --policy auto: the disk tier is the " << human_bytes(*room) << " --offload-dir " << a.offload_dir
        << " has room for (free space and its files), less than the profile's\n";
    hw.disk_memory = double(*room);
  }
  return hw;
}

std::string budgets_beyond_memory(const OffloadArgs& a, DeviceKind kind) {
  uint64_t ram = 0;
  std::string flags;
  if (!a.cpu_mem.empty()) ram += parse_bytes(a.cpu_mem, "--cpu-mem"), flags = "--cpu-mem " + a.cpu_mem;
  if (kind == DeviceKind::kCpu && !a.gpu_mem.empty())
    ram += parse_bytes(a.gpu_mem, "--gpu-mem"), flags += (flags.empty() ? "" : " with ") + ("--gpu-mem " + a.gpu_mem);
  const HostMemory host = read_host_memory();
  const std::optional<uint64_t> avail = host.available();
  if (ram == 0 || !avail || ram <= *avail) return {};
  return detail::concat("flexh2o: warning: the RAM budgets given (", flags, ") come to ", human_bytes_beside(ram, *avail),
                        ", more than the ", human_bytes_beside(*avail, ram), " this process can take now",
                        memory_cgroup_note(host), ": the budget checks let through what the kernel may end with its "
                        "OOM killer; give budgets within it\n");
}

void cap_profile_memory(const std::string& gpu_mem, const std::string& cpu_mem, const std::string& disk_mem,
                        HardwareProfile& hw) {
  if (!gpu_mem.empty()) hw.device_memory = double(parse_bytes(gpu_mem, "--gpu-mem"));
  if (!cpu_mem.empty()) hw.host_memory = double(parse_bytes(cpu_mem, "--cpu-mem"));
  if (!disk_mem.empty()) hw.disk_memory = double(parse_bytes(disk_mem, "--disk-mem"));
  // Both budgets on a machine whose device and host share RAM (the CPU device) split that RAM: the
  // engine bounds each tier by its own, and so does the plan.
  if (hw.shared_memory && !gpu_mem.empty() && !cpu_mem.empty()) hw.shared_memory = false;
}

SearchOptions auto_search(const OffloadArgs& a, int64_t requests) {
  if (!a.percent.empty() || a.gpu_batch_size || a.num_gpu_batches || a.cpu_cache_compute)
    FH_FAIL("--policy auto chooses --percent / --gpu-batch-size / --num-gpu-batches / --cpu-cache-compute itself; "
            "drop them");
  SearchOptions so;
  so.overlap = flag_bool_or(a.overlap, true, "--overlap");
  so.sep_layer = flag_bool_or(a.sep_layer, true, "--sep-layer");
  so.max_block = requests;
  so.allow_disk = !a.offload_dir.empty();
  search_compression(a.compress_weight, a.compress_cache, a.allow_compress, a.no_compress, so);
  return so;
}

void search_compression(bool weight, bool cache, bool allow, bool no, SearchOptions& so) {
  if (no && (weight || cache)) FH_FAIL("--no-compress contradicts --compress-weight / --compress-cache");
  if (no && allow) FH_FAIL("--no-compress contradicts --allow-compress");
  // Asked for: fixed on; allowed: searched (unset); else fixed off.
  so.compress_weight = weight ? std::optional(true) : allow ? std::nullopt : std::optional(false);
  so.compress_cache = cache ? std::optional(true) : allow ? std::nullopt : std::optional(false);
}

Policy plan_auto_policy(const OffloadArgs& a, const Model& m, const std::filesystem::path& configs_dir,
                        int64_t prompt_len, int64_t gen_len, const std::optional<KvPolicyConfig>& kv, DType kv_dtype,
                        int64_t requests, CpuDevice& cpu, const Device& dev, std::ostream& log,
                        std::optional<MeasuredProfile>* measured) {
  const SearchOptions so = auto_search(a, requests);
  const HardwareProfile hw = auto_profile(a, configs_dir, cpu, dev.kind(), dev.name(), log, measured);
  Workload w;
  w.prompt_len = prompt_len;
  w.gen_len = gen_len;
  w.kv = kv;
  w.kv_dtype = kv_dtype;
  const Estimate e = plan_policy(m, hw, w, so, dev.kind() == DeviceKind::kCuda
                                                   ? std::optional<DType>(dev.weight_dtype(DType::F32))
                                                   : std::nullopt);
  Policy p = e.policy;
  p.pin_weight = flag_bool_or(a.pin_weight, true, "--pin-weight");
  log << "flexh2o: --policy auto on " << hw.name << ": " << p.str() << " (predicted " << e.throughput
      << " tok/s on the profile, bottleneck " << e.bottleneck;
  if (hw.usable_fraction < 1)  // a stated --gpu-mem is not all planned: say so where the choice is read
    log << "; planned within " << hw.usable_fraction * 100 << "% of each tier's memory, the profile's usable_fraction";
  log << ")\n";
  return p;
}

nlohmann::json offload_report_json(const OffloadEngine& e, const OffloadReport* since, bool placed_earlier) {
  OffloadReport r = since ? report_interval(e.report(), *since) : e.report();
  if (placed_earlier) r.placement_disk_read = r.placement_disk_written = r.weights_reused = r.weights_written = 0;
  nlohmann::json links, rates, busy, wait, peak;
  for (int l = 0; l < kNumLinks; ++l) {
    links[link_name(Link(l))] = r.bytes[size_t(l)];
    rates[link_name(Link(l))] = r.wall > 0 ? double(r.bytes[size_t(l)]) / r.wall : 0.0;
  }
  for (int q = 0; q < kNumQueues; ++q) {
    busy[queue_name(Queue(q))] = r.busy[size_t(q)];
    wait[queue_name(Queue(q))] = r.wait[size_t(q)];
  }
  for (int t = 0; t < 3; ++t) {
    peak[tier_name(Tier(t))] = r.peak[size_t(t)];
  }
  nlohmann::json budgets;
  for (int t = 0; t < 3; ++t) budgets[tier_name(Tier(t))] = e.budget(Tier(t)).capacity();
  return {{"policy", policy_to_json(e.options().policy)},
          {"device", r.device},
          {"kv_dtype", r.kv_dtype},
          {"activation_dtype", r.act_dtype},
          {"weight_dtype", r.weight_dtype},
          {"token_steps", r.token_steps},
          {"mean_step_seconds", r.token_steps ? r.wall / double(r.token_steps) : 0.0},
          {"weights_pinned_in_place_bytes", r.weights_pinned_in_place},
          {"bytes_moved", links},
          {"bytes_per_second", rates},  // over the schedules' wall time
          {"kv_bytes_moved", r.kv_bytes},
          {"queue_busy_seconds", busy},
          {"queue_wait_seconds", wait},
          {"schedule_wall_seconds", r.wall},
          {"batch_setup_seconds", r.batch_setup_seconds},
          {"batch_buffers_reused_bytes", r.batch_buffers_reused_bytes},
          {"overlap_efficiency", r.overlap_efficiency},
          {"step_overlap_efficiency", r.step_overlap_efficiency},
          {"peak_bytes", peak},
          {"budget_bytes", budgets},
          {"io", r.io_note},
          {"disk_io_bytes", {{"read", r.disk_read}, {"written", r.disk_written}}},  // whole pages
          {"placement_disk_io_bytes", {{"read", r.placement_disk_read}, {"written", r.placement_disk_written}}},
          {"weights_reused", r.weights_reused},
          {"weights_written", r.weights_written}};
}

}  // namespace flexh2o::cli

namespace flexh2o::cli {

void write_trace_file(const OffloadArgs& a, const OffloadEngine& e, std::ostream& log) {
  if (a.trace.empty()) return;
  std::ostringstream trace;
  e.write_trace(trace);
  write_text_file({"--trace", a.trace}, trace.str());
  log << "flexh2o: schedule trace written to " << a.trace << " (open it in ui.perfetto.dev)\n";
}

}  // namespace flexh2o::cli
