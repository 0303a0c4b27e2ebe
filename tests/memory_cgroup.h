// A memory cgroup made for a test: a child of this process's own memory cgroup (v1, or a v2
// parent that delegates memory) with a limit, removed when it goes. Making one needs a writable
// cgroup hierarchy (root); where that is missing, make() says why and the test skips.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "core/host_memory.h"

namespace flexh2o::test {

class MemoryCgroup {
 public:
  // nullptr, with `why` set, where no memory cgroup can be made and limited here.
  static std::unique_ptr<MemoryCgroup> make(uint64_t limit_bytes, std::string* why) {
    namespace fs = std::filesystem;
    const HostMemory h = read_host_memory();
    if (h.cgroup_dir.empty()) {
      *why = "this process's memory cgroup is not mounted";
      return nullptr;
    }
    static int made = 0;
    const fs::path home = h.cgroup_dir;
    sweep(home);
    const fs::path dir = home / ("flexh2o-test-" + std::to_string(::getpid()) + "-" + std::to_string(made++));
    std::error_code ec;
    if (!fs::create_directory(dir, ec)) {
      *why = "cannot make a memory cgroup under " + home.string() + ": " + ec.message();
      return nullptr;
    }
    std::unique_ptr<MemoryCgroup> cg(new MemoryCgroup(home, dir));
    const bool v1 = fs::exists(dir / "memory.limit_in_bytes");
    if (!v1 && !fs::exists(dir / "memory.max")) {
      *why = "the memory cgroup " + home.string() + " does not delegate the memory controller";
      return nullptr;
    }
    std::ofstream limit(dir / (v1 ? "memory.limit_in_bytes" : "memory.max"));
    limit << limit_bytes << std::flush;
    if (!limit) {
      *why = "cannot set a memory limit in " + dir.string();
      return nullptr;
    }
    return cg;
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;
  // Moves whatever is in it back home (this process, if it joined), then removes it.
  ~MemoryCgroup() {
    std::ofstream(home_ / "cgroup.procs") << 0 << std::flush;
    std::error_code ec;
    std::filesystem::remove(dir_, ec);
  }

  // Removes the cgroups of earlier test processes that died before removing theirs (a crash, a
  // timeout): "flexh2o-test-PID-N" whose PID is gone. A cgroup still holding a process stays.
  static void sweep(const std::filesystem::path& home) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(home, ec)) {
      const std::string name = e.path().filename().string();
      if (!name.starts_with("flexh2o-test-")) continue;
      const long pid = std::strtol(name.c_str() + 13, nullptr, 10);
      if (pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove(e.path(), ec);
    }
  }

  const std::filesystem::path& dir() const { return dir_; }
  // Moves this process (all its threads) in; false when the kernel refuses.
  bool join() const {
    std::ofstream procs(dir_ / "cgroup.procs");
    procs << 0 << std::flush;
    return bool(procs);
  }
  // A run_flexh2o() prefix that runs the program inside: a shell joins, then execs it.
  std::string prefix() const {
    return "sh -c 'echo 0 > \"" + (dir_ / "cgroup.procs").string() + "\" && exec \"$0\" \"$@\"'";
  }

 private:
  MemoryCgroup(std::filesystem::path home, std::filesystem::path dir) : home_(std::move(home)), dir_(std::move(dir)) {}
  std::filesystem::path home_, dir_;
};

}  // namespace flexh2o::test
