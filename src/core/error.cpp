// Out-of-line pieces of error.h: building the FH_CHECK message.
#include "core/error.h"

namespace flexh2o::detail {

void throw_check(const char* file, int line, const char* cond, const std::string& msg) {
  std::string where = file;
  if (auto pos = where.rfind("/src/"); pos != std::string::npos) where = where.substr(pos + 1);
  throw Error(concat(msg.empty() ? std::string("internal check failed") : msg, " (", where, ":",
                     line, ": ", cond, ")"));
}

}  // namespace flexh2o::detail
