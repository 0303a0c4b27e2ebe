// Q4 payloads in the disk store (issue #12): a header of a Q4 tensor checks its payload by
// rows * row_nbytes of the last dimension (not numel * element size, which Q4 does not have),
// refuses rank 0 and wrong sizes as corrupt, and put / reuse round-trips Q4 records.
#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "core/quant4.h"
#include "offload/disk_store.h"
#include "offload/io_backend.h"
#include "offload/store_fixture.h"
#include "offload/store_header.h"

namespace flexh2o::testing {
namespace {

Status parse(const StoreHeader& h, StoreHeader* out = nullptr) {
  std::array<std::byte, kStoreHeaderBytes> buf{};
  encode_store_header(h, buf);
  return parse_store_header(buf, out);
}

TEST(StoreQ4, HeaderSizesRecordsByRow) {
  for (int64_t cols : {1, 7, 64, 65, 131}) {
    StoreHeader h;
    h.dtype = DType::Q4;
    h.shape = Shape{3, cols};
    h.payload_bytes = q4::tensor_bytes(3, cols);
    h.identity = "id";
    h.name = "w";
    StoreHeader out;
    Status st = parse(h, &out);
    ASSERT_TRUE(st.ok()) << cols << ": " << st.message();
    EXPECT_EQ(out.dtype, DType::Q4);
    EXPECT_EQ(out.shape, h.shape);
    h.payload_bytes = uint64_t(3 * cols) / 2 + 1;  // what nibbles alone would take
    EXPECT_EQ(parse(h).code(), StatusCode::kCorrupt) << cols;
  }
  StoreHeader scalar;
  scalar.dtype = DType::Q4;
  scalar.payload_bytes = 8;
  EXPECT_EQ(parse(scalar).code(), StatusCode::kCorrupt);
}

TEST(StoreQ4, PutAndReuseRoundTripRecords) {
  auto io = make_io_backend(IoBackendChoice::kPread, nullptr);
  const fs::path dir = unique_dir(fs::path(FLEXH2O_BINARY_DIR) / "offload_test_tmp");
  std::vector<float> x(size_t(5 * 130));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 37 % 101) - 50) * 0.01f;
  std::vector<std::byte> rec(q4::tensor_bytes(5, 130));
  q4::encode_rows(x.data(), 130, 5, 130, rec.data(), "x");
  {
    auto store = DiskStore::open(dir, "q4-store", *io);
    ASSERT_TRUE(store->put("w.x.Q4", TensorView{rec.data(), DType::Q4, Shape{5, 130}}).ok());
  }
  auto store = DiskStore::open(dir, "q4-store", *io);
  Status st = store->reuse("w.x.Q4", DType::Q4, Shape{5, 130}, ReuseCheck::kHash);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(store->reuse("w.x.Q4", DType::F16, Shape{5, 130}, ReuseCheck::kHash).code(), StatusCode::kInvalid);
  std::vector<std::byte> back(rec.size());
  ASSERT_TRUE(store->read("w.x.Q4", 0, back.size(), back.data()).ok());
  EXPECT_EQ(std::memcmp(back.data(), rec.data(), rec.size()), 0);
  store.reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace flexh2o::testing
