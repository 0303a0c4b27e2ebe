// Fuzz target: one .safetensors file (8-byte header length, JSON header, data section) opened
// through SafetensorsArchive::open_file, the path every checkpoint load takes. An accepted file
// must give views inside the mapping: the first and last byte of every tensor are read.
#include "archive_check.h"
#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flexh2o;
  static const std::filesystem::path file = fuzz::scratch() / "model.safetensors";
  fuzz::write_file(file, fuzz::as_text(data, size));
  fuzz::expect_clean(file.string(), [&] {
    fuzz::check_views(SafetensorsArchive::open_file(file));
  });
  return 0;
}
