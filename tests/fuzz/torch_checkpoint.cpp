// Fuzz target: one pytorch_model.bin (a torch.save zip: central directory, data.pkl, storage
// records) opened through TorchArchive::open_file, the path a .bin model directory takes: the
// zip reader and the restricted unpickler both see every input. An accepted file must give
// views inside the mapping: the first and last byte of every tensor are read.
#include "archive_check.h"
#include "loader/torch_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flexh2o;
  static const std::filesystem::path file = fuzz::scratch() / "pytorch_model.bin";
  fuzz::write_file(file, fuzz::as_text(data, size));
  fuzz::expect_clean(file.string(), [&] {
    fuzz::check_views(TorchArchive::open_file(file));
  });
  return 0;
}
