// Fuzz target: one pytorch_model.bin (a torch.save zip: central directory, data.pkl, storage
// records) opened through TorchArchive::open_file, the path a .bin model directory takes: the
// zip reader and the restricted unpickler both see every input. An accepted file must give
// views inside the mapping: the first and last byte of every tensor are read.
#include "fuzz_util.h"
#include "loader/torch_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flexh2o;
  static const std::filesystem::path file = fuzz::scratch() / "pytorch_model.bin";
  fuzz::write_file(file, fuzz::as_text(data, size));
  fuzz::expect_clean(file.string(), [&] {
    TorchArchive a = TorchArchive::open_file(file);
    const MappedFile& f = a.files().at(0);
    const auto* begin = reinterpret_cast<const std::byte*>(f.data());
    unsigned sum = 0;
    for (const TensorEntry& t : a.tensors()) {
      const auto* p = static_cast<const std::byte*>(t.view.data);
      const size_t n = t.view.nbytes();
      if (p < begin || p + n > begin + f.size()) fuzz::finding("a tensor view lies outside its file");
      if (n > 0) sum += unsigned(p[0]) + unsigned(p[n - 1]);
    }
    (void)a.total_bytes();
    // Keep the reads: the compiler may not drop them.
    asm volatile("" : : "r"(sum));
  });
  return 0;
}
