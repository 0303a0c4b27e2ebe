// Writer / Reader (temporary copy until the dp branch's comm.cpp is merged).
#include "dist/comm.h"

namespace flexh2o::dist {

Writer& Writer::put_bytes(std::span<const std::byte> b) {
  put<uint64_t>(b.size());
  bytes_.insert(bytes_.end(), b.begin(), b.end());
  return *this;
}

Writer& Writer::put_string(const std::string& s) { return put_bytes(std::as_bytes(std::span(s.data(), s.size()))); }

const std::byte* Reader::take(size_t n) {
  if (b_.size() - pos_ < n) FH_FAIL(what_, " is shorter than its contents (", b_.size(), " bytes)");
  const std::byte* p = b_.data() + pos_;
  pos_ += n;
  return p;
}

std::span<const std::byte> Reader::get_bytes() {
  const auto n = get<uint64_t>();
  if (n > b_.size() - pos_) FH_FAIL(what_, " is shorter than its contents (", b_.size(), " bytes)");
  return {take(size_t(n)), size_t(n)};
}

std::string Reader::get_string() {
  const auto b = get_bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace flexh2o::dist
