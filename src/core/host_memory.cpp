// read_host_memory(): MemAvailable from /proc/meminfo, and the room the process's memory cgroup
// (v1 or v2) and its ancestors leave, found through /proc/self/cgroup and /proc/self/mountinfo.
#include "core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace flexh2o {
namespace {

namespace fs = std::filesystem;

// v1's "no limit" is PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages); anything
// that large is no limit on any machine.
constexpr uint64_t kUnlimited = uint64_t(1) << 62;

std::optional<uint64_t> parse_u64(const std::string& s) {
  if (s.empty() || s.size() > 20 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  try {
    return std::stoull(s);
  } catch (const std::exception&) {
    return std::nullopt;  // out of range
  }
}

// The first whitespace-separated word of a file; empty when it cannot be read.
std::string first_word(const fs::path& p) {
  std::ifstream f(p);
  std::string w;
  f >> w;
  return w;
}

// "key value" lines (meminfo, memory.stat): the value of `key`, nullopt when absent.
std::optional<uint64_t> keyed_value(const fs::path& p, const std::string& key) {
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string k, v;
    if (!(in >> k >> v) || k != key) continue;
    return parse_u64(v);
  }
  return std::nullopt;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_octal(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() &&
        std::all_of(s.begin() + long(i) + 1, s.begin() + long(i) + 4, [](char c) { return c >= '0' && c <= '7'; })) {
      out += char((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

struct CgroupMount {
  std::string root, point;  // the hierarchy's directory mounted, and where
};

// The path of `path` (a cgroup path of /proc/self/cgroup) under a mount of `root` (the
// hierarchy's directory mounted): "" for the root itself; nullopt when the mount does not hold it.
std::optional<std::string> under_root(const std::string& path, const std::string& root) {
  if (root == "/") return path;
  if (path == root) return std::string();
  if (path.starts_with(root) && path[root.size()] == '/') return path.substr(root.size());
  return std::nullopt;
}

// The memory controller's mount that shows the cgroup `path`: a v1 "cgroup" mount whose super
// options name memory when `v1`, else a "cgroup2" mount; of those whose root holds the path and
// that no later mount at the same point hides (a container may mount the host's hierarchy over
// its own), the last listed.
std::optional<CgroupMount> find_mount(const fs::path& mountinfo, bool v1, const std::string& path) {
  std::ifstream f(mountinfo);
  std::string line;
  std::vector<std::pair<CgroupMount, bool>> mounts;  // every mount in order; whether it may show the path
  while (std::getline(f, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream pre(line.substr(0, dash)), post(line.substr(dash + 3));
    std::string id, parent, dev, root, point, fstype, source, super;
    if (!(pre >> id >> parent >> dev >> root >> point)) continue;
    post >> fstype >> source >> super;
    bool fits = false;
    if (v1 && fstype == "cgroup") {
      const std::vector<std::string> opts = split(super, ',');
      fits = std::find(opts.begin(), opts.end(), "memory") != opts.end();
    } else if (!v1) {
      fits = fstype == "cgroup2";
    }
    CgroupMount m{unescape_octal(root), unescape_octal(point)};
    fits = fits && under_root(path, m.root).has_value();
    mounts.emplace_back(std::move(m), fits);
  }
  std::set<std::string> hidden;  // points a later mount covers
  for (auto it = mounts.rbegin(); it != mounts.rend(); ++it)
    if (hidden.insert(it->first.point).second && it->second) return it->first;
  return std::nullopt;
}

// This process's cgroup directory for the memory controller, under files.root; nullopt when
// there is none or its path is outside the mounted part of the hierarchy.
std::optional<std::pair<fs::path, bool>> memory_cgroup_dir(const HostMemoryFiles& files, fs::path* mount_dir) {
  std::ifstream f(files.cgroup);
  std::string line, v1_path, v2_path;
  bool have_v1 = false, have_v2 = false;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.substr(0, a) == "0" && controllers.empty()) {
      v2_path = path;
      have_v2 = true;
    } else {
      const std::vector<std::string> c = split(controllers, ',');
      if (std::find(c.begin(), c.end(), "memory") != c.end()) {
        v1_path = path;
        have_v1 = true;
      }
    }
  }
  // On a hybrid machine the memory controller is on v1 when v1 lists it; else on v2.
  const bool v1 = have_v1;
  if (!have_v1 && !have_v2) return std::nullopt;
  const std::string& path = v1 ? v1_path : v2_path;
  const std::optional<CgroupMount> m = find_mount(files.mountinfo, v1, path);
  if (!m) return std::nullopt;  // no mount shows it (another namespace's path)
  const std::string rel = *under_root(path, m->root);
  for (const fs::path& part : fs::path(rel))
    if (part == "..") return std::nullopt;  // would leave the mount; a cgroup path has none
  const fs::path point = files.root / fs::path(m->point).relative_path();
  *mount_dir = point.lexically_normal();
  if (!mount_dir->has_filename()) *mount_dir = mount_dir->parent_path();
  fs::path dir = (point / fs::path(rel).relative_path()).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "point/" when the cgroup is the mount's root
  return std::make_pair(dir, v1);
}

// The page cache a level's usage holds (its active and inactive file pages; shmem is not among
// them), which the kernel reclaims before it kills: MemAvailable counts it as available too. v1's
// hierarchical totals where present.
uint64_t file_pages(const fs::path& stat, bool v1) {
  uint64_t n = 0;
  for (const char* key : {"active_file", "inactive_file"}) {
    std::optional<uint64_t> v = v1 ? keyed_value(stat, std::string("total_") + key) : std::nullopt;
    if (!v) v = keyed_value(stat, key);
    n += v.value_or(0);
  }
  return n;
}

// A level's limit: v1's memory.limit_in_bytes; v2's memory.max, or memory.high where lower (past
// it the kernel throttles and reclaims hard: systemd's MemoryHigh, Kubernetes' memory QoS).
std::optional<uint64_t> limit_of(const fs::path& level, bool v1) {
  auto read = [&](const char* file) {
    const std::optional<uint64_t> v = parse_u64(first_word(level / file));
    return v && *v < kUnlimited ? v : std::nullopt;
  };
  if (v1) return read("memory.limit_in_bytes");
  const std::optional<uint64_t> max = read("memory.max"), high = read("memory.high");
  if (max && high) return std::min(*max, *high);
  return max ? max : high;
}

}  // namespace

bool HostMemory::cgroup_binds() const { return cgroup_room && (!mem_available || *cgroup_room < *mem_available); }

std::optional<uint64_t> HostMemory::available() const {
  if (mem_available && cgroup_room) return std::min(*mem_available, *cgroup_room);
  return mem_available ? mem_available : cgroup_room;
}

HostMemory read_host_memory(const HostMemoryFiles& files) {
  HostMemory h;
  if (const std::optional<uint64_t> kib = keyed_value(files.meminfo, "MemAvailable:"); kib && *kib < kUnlimited / 1024)
    h.mem_available = *kib * 1024;

  fs::path mount_dir;
  const auto found = memory_cgroup_dir(files, &mount_dir);
  if (!found) return h;
  const auto& [dir, v1] = *found;
  h.cgroup_dir = dir.string();
  // From the process's cgroup up to the mount's root: each level's limit holds the levels below.
  for (fs::path level = dir;; level = level.parent_path()) {
    if (const std::optional<uint64_t> limit = limit_of(level, v1)) {
      uint64_t used = parse_u64(first_word(level / (v1 ? "memory.usage_in_bytes" : "memory.current"))).value_or(0);
      used -= std::min(used, file_pages(level / "memory.stat", v1));
      const uint64_t room = *limit - std::min(*limit, used);
      h.cgroup_limit = std::min(h.cgroup_limit.value_or(*limit), *limit);
      h.cgroup_room = std::min(h.cgroup_room.value_or(room), room);
    }
    if (level == mount_dir || level == level.parent_path() || !level.string().starts_with(mount_dir.string())) break;
  }
  return h;
}

std::optional<uint64_t> available_host_memory() { return read_host_memory().available(); }

}  // namespace flexh2o
