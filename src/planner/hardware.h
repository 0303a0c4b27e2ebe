// HardwareProfile: what the cost model knows about a machine — tier capacities, link
// bandwidths and compute rates — as a plain value read from / written to JSON
// (configs/hardware/*.json, or `flexh2o profile`). Not a measurement tool (see profile.h).
// Units in the struct are SI: bytes, bytes/s, FLOP/s. The JSON uses GB, GB/s and TFLOPS (1e9, 1e12).
#pragma once

#include <cstdint>
#include <filesystem>
#include <array>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "engine/device.h"

namespace flexh2o {

// The link that hidden states cross between two pipeline stages (engine "stage" = one rank and
// device), one way: JSON "stage_link": {"kind": "pcie_host" | "nvlink" | "network", "gbps":
// GB/s (> 0), "latency_us": microseconds per message (>= 0), optional "name", "source"}; no
// other keys. A message of n bytes takes latency + n / bandwidth seconds.
struct StageLink {
  enum class Kind { kPcieHost, kNvlink, kNetwork };
  Kind kind = Kind::kPcieHost;
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // seconds per message
  std::string name, source;
  double seconds(uint64_t bytes) const { return latency + double(bytes) / bandwidth; }
  // Throws flexh2o::Error naming `origin` and the field (quoting the value) for a bad one.
  static StageLink from_json(const nlohmann::json& j, const std::string& origin);
  static StageLink load(const std::filesystem::path& file);
  nlohmann::json to_json() const;
};
const char* stage_link_kind_name(StageLink::Kind k);  // "pcie_host", "nvlink", "network"
// A link file, or a name looked up as `configs_dir`/hardware/links/NAME.json (pcie-host,
// nvlink4, ethernet-25g, ...). Throws listing what was tried.
StageLink resolve_stage_link(const std::string& spec, const std::filesystem::path& configs_dir);

struct HardwareProfile {
  std::string name, source;  // source: where the numbers come from (measured, datasheet, fitted)
  // The engine's device on this machine (JSON "device": "cuda" or "cpu", default "cpu"): it
  // decides the activation dtype (CUDA: F16, CPU: F32) and the compute scratch.
  DeviceKind device = DeviceKind::kCpu;
  // Tier capacities in bytes, and the fraction of each the planner may fill (FlexGen's alpha).
  double device_memory = 0, host_memory = 0, disk_memory = 0;
  double usable_fraction = 1.0;
  // Links, bytes/s. *_cache variants apply to KV traffic (FlexGen fits them separately); 0 in
  // the JSON means "same as the plain link".
  double host_to_device = 0, device_to_host = 0, device_to_host_cache = 0;
  double disk_to_host = 0, host_to_disk = 0, host_to_disk_cache = 0, disk_to_host_cache = 0;
  // Compute on the device, FLOP/s: GEMM at prefill (large M) and decode (M = a micro-batch),
  // attention at prefill and decode. weight_read: bytes/s a GEMV streams weights (roofline
  // term for small micro-batches; 0 = not modelled).
  double device_gemm_prefill = 0, device_gemm_decode = 0;
  double device_attention_prefill = 0, device_attention_decode = 0;
  double device_weight_read = 0;
  // Decode GEMM time = max(flops / gemm_decode, bytes / weight_read) (a GPU's roofline, the
  // default) or their sum (JSON "device_gemm_time": "sum"): on the CPU device one core both
  // streams the f16 weights and does the arithmetic, so the two do not overlap.
  bool gemm_time_sum = false;
  // Disk reads and writes share one device (JSON "disk_duplex": false): the cost model then
  // serialises the disk-read and disk-write queues. The profiler measures it (concurrent read +
  // write passes vs their sum); datasheet profiles default to duplex (FlexGen's model).
  bool disk_duplex = true;
  // Host attention (cpu_cache_compute), FLOP/s, with FlexGen's efficiency correction
  // F_eff = F * max(0.1, 1 + c1*a*b - c2*a - c3*b), a = max(0, log2(64/gbs)),
  // b = max(0, log2(4096/hidden)); c1 = c2 = c3 = 0 disables it.
  double host_attention = 0, host_gemm = 0;
  double host_eff_c1 = 0, host_eff_c2 = 0, host_eff_c3 = 0;
  // Fixed costs, seconds (JSON "overheads_us", microseconds; all optional, 0 = not modelled):
  //  compute_step: per compute step of the schedule (one unit on one micro-batch): dispatch to
  //    the device's workers, the executor's hand-off, kernel launches, non-GEMM ops' fixed part;
  //  schedule_step: per non-compute step (queue hand-off of a load/store);
  //  token_step: per token step of the whole batch (sampling, the generate loop, schedule setup);
  //  disk_read / disk_write: per page-aligned range of a batched submission; the engine moves
  //    disk-homed KV in one submission per (layer, micro-batch) of one range per (sequence, KV
  //    head, K|V), so KV disk time = ranges x this + bytes / *_cache bandwidth.
  // elementwise: bytes/s of the non-GEMM ops per activation row (norms, activation, residual,
  //  embedding/logits copies), charged as rows x hidden x 4 B x kElementwisePasses; 0 = free.
  double compute_step_overhead = 0, schedule_step_overhead = 0, token_step_overhead = 0;
  double disk_read_request = 0, disk_write_request = 0;
  double device_elementwise = 0;
  // 4-bit compression (JSON "dequant_gbps": {"device", "host"}; 0 or absent = not known): the
  // extra time compute that reads Q4 records spends, as Q4 bytes per second — weights read by
  // a GEMM and KV read by attention cost q4_bytes / rate on top of the plain kernel's time, and
  // KV rows written compressed cost the same per byte to encode. `--policy auto` searches
  // compression only when the device rate is known (what it costs cannot be guessed).
  double device_dequant = 0, host_dequant = 0;
  bool prices_compression() const { return device_dequant > 0; }
  // KV-policy decisions on the host (JSON "host_kv_policy": {"mslots", "prefill_mslots",
  // "group_mslots", "row_us", "threads"}; mslots 0 or absent = free, the rest then ignored): a
  // bounded policy's step over a (sequence, KV head) row of n slots (scores summed, victims chosen,
  // the row compacted) costs one thread n * kv_slot_seconds(prefill, group) + host_kv_policy_row
  // seconds; where the engine decides a segment's sequences in parallel (kv_decision_parallelism)
  // they go min(sequences, host_kv_threads) times as fast (a measured profile's threads: what all
  // of them gained over one, so not always whole). A decode step evicts one slot of a row, a
  // prefill most of the prompt, a different selection at a different rate (prefill_mslots 0 or
  // absent: mslots, as profiles from before it was measured mean). The rates are of a query head
  // per KV head; each further query head of a group adds its scores' sum to every slot, at
  // group_mslots (0 or absent: free).
  double host_kv_policy = 0, host_kv_prefill = 0, host_kv_group = 0, host_kv_policy_row = 0, host_kv_threads = 1;
  double kv_policy_rate(bool prefill) const { return prefill && host_kv_prefill > 0 ? host_kv_prefill : host_kv_policy; }
  // Seconds a slot of a row costs one thread, `group` query heads per KV head (host_kv_policy > 0).
  double kv_slot_seconds(bool prefill, int64_t group) const {
    return 1 / kv_policy_rate(prefill) + (host_kv_group > 0 ? double(group - 1) / host_kv_group : 0.0);
  }
  // Between pipeline stages on this machine kind (JSON "stage_link", see StageLink);
  // stage_link_given says whether the profile has one.
  StageLink stage_link;
  bool stage_link_given = false;
  // stage_link when given, else PCIe through host memory at this profile's own rates: device
  // -> host then host -> device one after the other (bandwidth 1 / (1/device_to_host +
  // 1/host_to_device)), 10 us per message.
  StageLink between_stages() const;

  // Device and host tiers are one pool (JSON "shared_memory": true; `flexh2o profile` of the
  // CPU device, whose tiers are both RAM): the host's capacity bounds the two together.
  bool shared_memory = false;

  double usable(int tier) const;  // tier 0 device, 1 host, 2 disk; bytes the planner may use
  // The bytes of a placement's per-tier `memory` that count against `tier`'s usable bytes: the
  // tier's own, and for the host of a shared pool the device's too.
  double charged(int tier, const std::array<uint64_t, 3>& memory) const;
  // Whether a placement's per-tier `memory` fits: every tier's charged() within its usable().
  bool fits(const std::array<uint64_t, 3>& memory) const;
  // The tiers `memory` overflows, "<tier> needs X GB, usable Y GB (short by Z GB)" joined by
  // "; " (a shared pool's host says "host with the device"); empty when it fits.
  std::string overflow_note(const std::array<uint64_t, 3>& memory) const;
  // Throws flexh2o::Error naming the field when one is missing from `j`, negative, or (for
  // the rates and capacities the model divides by) zero. `origin` names the file.
  static HardwareProfile from_json(const nlohmann::json& j, const std::string& origin);
  static HardwareProfile load(const std::filesystem::path& file);
  nlohmann::json to_json() const;
};

// A profile path, or a name looked up as `configs_dir`/hardware/NAME.json. Throws listing
// what was tried.
HardwareProfile resolve_profile(const std::string& spec, const std::filesystem::path& configs_dir);

}  // namespace flexh2o
