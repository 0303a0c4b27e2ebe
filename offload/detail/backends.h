// Private to offload/: constructors of the concrete IoBackends, used by make_io_backend().
// Not a public API; callers go through make_io_backend().
#pragma once

#include <memory>
#include <string>

#include "offload/io_backend.h"

namespace flexh2o::detail {

// Returns nullptr and sets *why when ring setup or the NOP probe fails.
std::unique_ptr<IoBackend> make_uring_backend(const IoBackendOptions& opts, std::string* why);
std::unique_ptr<IoBackend> make_pread_backend(const IoBackendOptions& opts);

}  // namespace flexh2o::detail
