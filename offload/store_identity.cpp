// Store identity (store_identity.h): shard fingerprints, the manifest digest, a readable
// difference between two manifests, and the manifest file kept next to the store.
#include "offload/store_identity.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace flexh2o {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifestName = "store.manifest";
constexpr size_t kZipTailBytes = size_t(1) << 20;

std::string hex64(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// One manifest line: "<kind> [<name>] key=value ...": its key ("kind" or "kind name") and fields.
struct Line {
  std::string key;
  std::map<std::string, std::string> fields;
  std::string text;
};

std::map<std::string, Line> parse(std::string_view m) {
  std::map<std::string, Line> out;
  std::istringstream in{std::string(m)};
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty()) continue;
    Line l;
    l.text = text;
    std::istringstream words(text);
    std::string w;
    while (words >> w) {
      const size_t eq = w.find('=');
      if (eq == std::string::npos && l.fields.empty() && std::count(l.key.begin(), l.key.end(), ' ') < 1)
        l.key += (l.key.empty() ? "" : " ") + w;
      else if (eq != std::string::npos)
        l.fields[w.substr(0, eq)] = w.substr(eq + 1);
    }
    std::string key = l.key;
    out.emplace(std::move(key), std::move(l));
  }
  return out;
}

}  // namespace

std::string shard_fingerprint(const MappedFile& f) {
  const FileStamp& s = f.stamp();
  uint64_t header = 0;
  if (f.size() >= 4 && std::memcmp(f.data(), "PK\x03\x04", 4) == 0) {
    // A zip (torch checkpoint): its tail is the central directory, which records every entry's
    // size and CRC-32; the first 8 bytes are no length, and hashing "to the end" would read it all.
    const size_t tail = std::min<size_t>(f.size(), kZipTailBytes);
    header = XXH3_64bits(f.data() + f.size() - tail, tail);
  } else if (f.size() >= 8) {
    uint64_t n = 0;
    std::memcpy(&n, f.data(), 8);  // little-endian length of the JSON header
    header = XXH3_64bits(f.data(), size_t(std::min<uint64_t>(f.size(), 8 + std::min<uint64_t>(n, f.size()))));
  } else if (f.size() > 0) {
    header = XXH3_64bits(f.data(), f.size());
  }
  return detail::concat("shard ", f.path().filename().string(), " size=", f.size(), " dev=", s.dev, " ino=", s.ino,
                        " mtime=", s.mtime_ns, " ctime=", s.ctime_ns, " header=", hex64(header));
}

std::string manifest_digest(std::string_view manifest) {
  const XXH128_hash_t h = XXH3_128bits(manifest.data(), manifest.size());
  return hex64(h.high64) + hex64(h.low64);
}

std::string explain_manifest_change(std::string_view before, std::string_view now) {
  if (before == now) return {};
  const auto a = parse(before), b = parse(now);
  std::vector<std::string> shards, other;
  for (const auto& [key, l] : b) {
    const bool shard = key.starts_with("shard ");
    const auto it = a.find(key);
    std::string what;
    if (it == a.end()) {
      what = shard ? key + " added" : key;
    } else if (it->second.text != l.text) {
      std::string fields;
      for (const auto& [k, v] : l.fields) {
        const auto old = it->second.fields.find(k);
        if (old == it->second.fields.end() || old->second != v) fields += (fields.empty() ? "" : ", ") + k;
      }
      for (const auto& [k, v] : it->second.fields)
        if (!l.fields.count(k)) fields += (fields.empty() ? "" : ", ") + k;
      what = key + (fields.empty() ? "" : ": " + fields);
    } else {
      continue;
    }
    (shard ? shards : other).push_back(what);
  }
  for (const auto& [key, l] : a)
    if (!b.count(key)) (key.starts_with("shard ") ? shards : other).push_back(key + " removed");
  if (!other.empty()) {
    std::string s = other.front();
    const bool config = s.starts_with("config");
    return (config ? "model config changed (" : "store parameters changed (") + s +
           (other.size() > 1 ? detail::concat(" and ", other.size() - 1, " more)") : std::string(")"));
  }
  if (shards.empty()) return "store identity changed";
  return "checkpoint changed (" + shards.front() +
         (shards.size() > 1 ? detail::concat("; ", shards.size() - 1, " more shards)") : std::string(")"));
}

std::optional<std::string> read_store_manifest(const fs::path& dir) {
  std::ifstream in(dir / kManifestName, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Status write_store_manifest(const fs::path& dir, std::string_view manifest) {
  const fs::path path = dir / kManifestName;
  fs::path tmp = path;
  tmp += ".tmp";
  auto fail = [&](const char* what) {
    Status st(StatusCode::kIoError, detail::concat("cannot ", what, " '", tmp.string(), "': ", std::strerror(errno)));
    ::unlink(tmp.c_str());
    return st;
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("create");
  size_t done = 0;
  while (done < manifest.size()) {
    const ssize_t w = ::write(fd, manifest.data() + done, manifest.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ::close(fd);
      return fail("write");
    }
    done += size_t(w);
  }
  if (::close(fd) != 0) return fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  return Status::Ok();
}

}  // namespace flexh2o
