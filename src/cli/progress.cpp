// Progress lines for long commands (progress.h): formatting and the rate limit.
#include "cli/progress.h"

#include <cmath>

#include "core/error.h"

namespace flexh2o::cli {
namespace {

const char* link_label(Link l) {
  switch (l) {
    case Link::kDiskToHost: return "disk->host";
    case Link::kHostToDevice: return "host->device";
    case Link::kDeviceToHost: return "device->host";
    case Link::kHostToDisk: return "host->disk";
  }
  return "?";
}

std::string rate_text(double bytes_per_s) {
  char buf[32];
  if (bytes_per_s >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB/s", bytes_per_s / 1e9);
  else if (bytes_per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.0f MB/s", bytes_per_s / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f kB/s", bytes_per_s / 1e3);
  return buf;
}

constexpr auto kRedrawEvery = std::chrono::milliseconds(200);
constexpr auto kLogEvery = std::chrono::seconds(10);

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = int64_t(std::llround(seconds));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  return buf;
}

std::string format_progress(const ProgressSnapshot& s) {
  char buf[160];
  const double rate = s.seconds > 0 ? double(s.done) / s.seconds : 0.0;
  if (s.unit == "bytes") {
    const bool gb = s.total >= 1000000000;
    const double scale = gb ? 1e9 : 1e6;
    std::snprintf(buf, sizeof buf, "[%s] %.1f/%.1f %s  %s", s.label.c_str(), double(s.done) / scale,
                  double(s.total) / scale, gb ? "GB" : "MB", rate_text(rate).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "[%s] %lld/%lld %s  %.1f %s/s", s.label.c_str(), (long long)s.done,
                  (long long)s.total, s.unit.c_str(), rate, s.unit == "tokens" ? "tok" : s.unit.c_str());
  }
  std::string line = buf;
  if (s.done >= s.total) line += "  done in " + format_duration(s.seconds);
  else  // under a second of work (a first batch's warm-up) says little of the rate to come
    line += "  ETA " +
            (rate > 0 && s.seconds >= 1 ? format_duration(double(s.total - s.done) / rate) : std::string("?"));
  if (s.links)
    for (int l = 0; l < kNumLinks; ++l)
      if (s.link_bytes_per_s[size_t(l)] > 0)
        line += std::string("  ") + link_label(Link(l)) + " " + rate_text(s.link_bytes_per_s[size_t(l)]);
  return line;
}

void add_progress_flag(CLI::App& app, std::string& value) {
  app.add_option("--progress", value,
                 "Progress on stderr: tokens/s, ETA and bytes/s per offloading link. auto: a line redrawn "
                 "in place when stderr is a terminal; always: also to a log (a line every 10 s); never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
}

ProgressMode parse_progress_mode(const std::string& value) {
  if (value == "auto") return ProgressMode::kAuto;
  if (value == "always") return ProgressMode::kAlways;
  if (value == "never") return ProgressMode::kNever;
  throw Error("--progress must be auto, always or never, not '" + value + "'");
}

Progress::Progress(std::string label, std::string unit, ProgressMode mode, bool is_tty, const OffloadEngine* engine,
                   std::FILE* out, std::chrono::milliseconds quiet)
    : label_(std::move(label)), unit_(std::move(unit)), engine_(engine), out_(out), quiet_(quiet) {
  enabled_ = mode == ProgressMode::kAlways || (mode == ProgressMode::kAuto && is_tty);
  redraw_ = is_tty;
  start_ = last_ = std::chrono::steady_clock::now();
  if (engine_) start_bytes_ = engine_->link_bytes();
}

Progress::~Progress() { finish(); }

void Progress::finish() {
  if (enabled_ && redraw_ && drawn_) std::fputc('\n', out_);
  drawn_ = false;
}

ProgressSnapshot Progress::snapshot(int64_t done, int64_t total) const {
  ProgressSnapshot s{label_, unit_, done, total};
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (engine_ && s.seconds > 0) {
    s.links = true;
    const auto now = engine_->link_bytes();
    for (int l = 0; l < kNumLinks; ++l)
      s.link_bytes_per_s[size_t(l)] = double(now[size_t(l)] - start_bytes_[size_t(l)]) / s.seconds;
  }
  return s;
}

void Progress::update(int64_t done, int64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!drawn_ && now - start_ < quiet_) return;  // quick work says nothing, its end included
  const bool final = done >= total;
  const std::chrono::steady_clock::duration every =
      redraw_ ? std::chrono::steady_clock::duration(kRedrawEvery) : std::chrono::steady_clock::duration(kLogEvery);
  if (!final && drawn_ && now - last_ < every)
    return;
  last_ = now;
  drawn_ = true;
  const std::string line = format_progress(snapshot(done, total));
  if (redraw_) std::fprintf(out_, "\r%s\x1b[K", line.c_str());  // erase what a longer line left
  else std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

Progress startup_progress(std::string label, const std::string& mode, bool is_tty) {
  return Progress(std::move(label), "bytes", parse_progress_mode(mode), is_tty, nullptr, stderr, std::chrono::seconds(1));
}

}  // namespace flexh2o::cli
