// Tests of DiskStore::read_ranges / write_ranges (many page-aligned ranges of one entry in one
// submission), for both backends on O_DIRECT, tmpfs and forced-buffered directories: byte-exact
// round trips, misuse that throws before any I/O, and faults from the FaultyIo decorator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "offload/aligned_buffer.h"
#include "offload/disk_store.h"
#include "offload/store_fixture.h"

namespace flexh2o {
namespace {

using namespace testing;  // store_fixture.h; gtest is spelled ::testing here

constexpr size_t kPage = kIoAlign;

struct PageRange {
  uint64_t page = 0;   // first page of the payload
  uint64_t pages = 0;  // length in pages
};

// One batch: the ranges in submission order (shuffled, not sorted by offset), each with its own
// place in `host`, laid out in another shuffled order, so file order, submission order and buffer
// order all differ: a swapped, skipped or misplaced range shows up in a byte comparison.
struct Batch {
  std::vector<StoreRange> ranges;
  AlignedBuffer host;
  uint64_t bytes = 0;
};

Batch make_batch(const std::vector<PageRange>& layout, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> place(layout.size());
  std::iota(place.begin(), place.end(), 0);
  std::shuffle(place.begin(), place.end(), rng);
  Batch b;
  for (const PageRange& r : layout) b.bytes += r.pages * kPage;
  b.host = AlignedBuffer(b.bytes);
  std::memset(b.host.data(), 0xcd, b.host.size());
  std::vector<uint64_t> host_off(layout.size());
  uint64_t at = 0;
  for (size_t k : place) {
    host_off[k] = at;
    at += layout[k].pages * kPage;
  }
  for (size_t i = 0; i < layout.size(); ++i)
    b.ranges.push_back({layout[i].page * kPage, layout[i].pages * kPage, b.host.data() + host_off[i]});
  std::shuffle(b.ranges.begin(), b.ranges.end(), rng);
  return b;
}

// 1201 padded pages (payload 1200 pages + 1000 bytes): adjacent ranges, a range over 1 MiB (split
// into requests), 60 one-page ranges two pages apart, a run of 50 adjacent pages, widely spaced
// ones, and the last page, whose tail is padding. 118 ranges: far more than the queue depth.
constexpr uint64_t kPayload = 1200 * kPage + 1000;
std::vector<PageRange> kv_layout() {
  std::vector<PageRange> l = {{0, 1}, {1, 1}, {2, 2}, {10, 300}, {311, 1}, {600, 1}, {900, 3}, {1200, 1}};
  for (uint64_t k = 0; k < 60; ++k) l.push_back({400 + 3 * k, 1});
  for (uint64_t k = 0; k < 50; ++k) l.push_back({1000 + k, 1});
  return l;
}

class StoreRangesTest : public StoreTest {
 protected:
  // Creates `name` of kPayload bytes filled with random bytes; shadow_ mirrors the padded payload.
  void make_kv(const std::string& name) {
    ASSERT_TRUE(store_->create(name, kPayload).ok());
    auto fill = random_bytes(kPayload, 77);
    ASSERT_TRUE(store_->write(name, 0, kPayload, fill.data()).ok());
    shadow_.assign(align_up(kPayload), 0);
    std::memcpy(shadow_.data(), fill.data(), kPayload);
  }
  // Every byte of every range's buffer equals the shadow at that range's offset.
  void expect_matches_shadow(const Batch& b) {
    for (const StoreRange& r : b.ranges) {
      SCOPED_TRACE(::testing::Message() << "range at page " << r.offset / kPage << " +" << r.length / kPage);
      ASSERT_LE(r.offset + r.length, shadow_.size());
      EXPECT_EQ(std::memcmp(r.buf, shadow_.data() + r.offset, r.length), 0);
    }
  }
  std::vector<uint8_t> shadow_;
};

TEST_P(StoreRangesTest, RoundTripManyRanges) {
  make_kv("kv");
  Batch w = make_batch(kv_layout(), 1);
  auto data = random_bytes(w.bytes, 2);
  std::memcpy(w.host.data(), data.data(), w.bytes);
  for (const StoreRange& r : w.ranges) std::memcpy(shadow_.data() + r.offset, r.buf, r.length);
  const uint64_t written0 = store_->bytes_written(), read0 = store_->bytes_read();
  Status st = store_->write_ranges("kv", w.ranges);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(store_->bytes_written() - written0, w.bytes);
  // Untouched pages keep their old bytes; the ranges hold theirs (read back through plain read()).
  EXPECT_EQ(read_all("kv", kPayload), std::vector<uint8_t>(shadow_.begin(), shadow_.begin() + kPayload));

  Batch r = make_batch(kv_layout(), 3);
  const uint64_t read1 = store_->bytes_read();
  st = store_->read_ranges("kv", r.ranges);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(store_->bytes_read() - read1, r.bytes);
  expect_matches_shadow(r);
  EXPECT_GT(store_->bytes_read(), read0);

  reopen();  // persisted; the entry opens lazily on read_ranges
  Batch again = make_batch(kv_layout(), 4);
  ASSERT_TRUE(store_->read_ranges("kv", again.ranges).ok());
  expect_matches_shadow(again);
  EXPECT_TRUE(store_->verify("kv").ok());
}

// Each page carries its own index: a swapped pair or a skipped range leaves a wrong or 0xcd stamp.
TEST_P(StoreRangesTest, EveryRangeLandsInItsOwnPlace) {
  constexpr uint64_t kPages = 64;
  ASSERT_TRUE(store_->create("stamps", kPages * kPage).ok());
  std::vector<PageRange> pages;
  for (uint64_t p = 0; p < kPages; ++p) pages.push_back({kPages - 1 - p, 1});
  Batch w = make_batch(pages, 5);
  for (const StoreRange& r : w.ranges) {
    uint32_t stamp = uint32_t(r.offset / kPage) * 2654435761u + 1;
    for (size_t i = 0; i < kPage; i += 4) std::memcpy(static_cast<std::byte*>(r.buf) + i, &stamp, 4);
  }
  ASSERT_TRUE(store_->write_ranges("stamps", w.ranges).ok());
  for (uint64_t p = 0; p < kPages; ++p) {
    auto page = std::vector<uint8_t>(kPage);
    ASSERT_TRUE(store_->read("stamps", p * kPage, kPage, page.data()).ok());
    uint32_t stamp = uint32_t(p) * 2654435761u + 1;
    for (size_t i = 0; i < kPage; i += 4) ASSERT_EQ(std::memcmp(page.data() + i, &stamp, 4), 0) << "page " << p;
  }
  Batch r = make_batch(pages, 6);
  ASSERT_TRUE(store_->read_ranges("stamps", r.ranges).ok());
  for (const StoreRange& x : r.ranges) {
    uint32_t stamp = uint32_t(x.offset / kPage) * 2654435761u + 1;
    for (size_t i = 0; i < kPage; i += 4)
      ASSERT_EQ(std::memcmp(static_cast<std::byte*>(x.buf) + i, &stamp, 4), 0) << "page " << x.offset / kPage;
  }
}

TEST_P(StoreRangesTest, MisuseThrowsBeforeAnyIo) {
  constexpr uint64_t kBytes = 10 * kPage + 5;  // 11 padded pages
  ASSERT_TRUE(store_->create("kv", kBytes).ok());
  AlignedBuffer buf(4 * kPage);
  std::memset(buf.data(), 0x5a, buf.size());
  std::byte* p = buf.data();
  const StoreRange good{0, kPage, p};
  const StoreRange bad[] = {
      {100, kPage, p + kPage},              // offset
      {kPage, 100, p + kPage},              // length
      {kPage, kPage, p + kPage + 512},      // buffer (512-aligned is not enough)
      {kPage, kPage, nullptr},              // null buffer
      {11 * kPage, kPage, p + kPage},       // past the padded payload
      {10 * kPage, 2 * kPage, p + kPage},   // crosses its end
      {align_down(~uint64_t(0)), kPage, p}, // offset + length overflows
  };
  const uint64_t w0 = store_->bytes_written(), r0 = store_->bytes_read();
  for (const StoreRange& b : bad) {
    SCOPED_TRACE(::testing::Message() << b.offset << " +" << b.length << " @" << b.buf);
    const StoreRange batch[] = {good, b};
    EXPECT_THROW((void)store_->write_ranges("kv", batch), Error);
    EXPECT_THROW((void)store_->read_ranges("kv", batch), Error);
  }
  const StoreRange overlap[] = {{0, 2 * kPage, p}, {3 * kPage, kPage, p + 3 * kPage}, {kPage, kPage, p + 2 * kPage}};
  EXPECT_THROW((void)store_->write_ranges("kv", overlap), Error);
  EXPECT_EQ(store_->bytes_written(), w0);
  EXPECT_EQ(store_->bytes_read(), r0);
  EXPECT_EQ(read_all("kv", kBytes), std::vector<uint8_t>(kBytes, 0));  // nothing was written

  ASSERT_TRUE(store_->read_ranges("kv", overlap).ok());  // overlapping reads are fine
  EXPECT_EQ(std::memcmp(p, std::vector<uint8_t>(4 * kPage, 0).data(), 4 * kPage), 0);
  EXPECT_TRUE(store_->read_ranges("kv", {}).ok());
  const StoreRange empty[] = {{kPage, 0, nullptr}};
  EXPECT_TRUE(store_->write_ranges("kv", empty).ok());
  EXPECT_EQ(store_->read_ranges("missing", {&good, 1}).code(), StatusCode::kNotFound);
}

TEST_P(StoreRangesTest, PutEntriesAreReadOnly) {
  auto src = random_bytes(3 * kPage + 10, 8);
  ASSERT_TRUE(store_->put("w", u8_view(src)).ok());
  AlignedBuffer buf(2 * kPage);
  const StoreRange last[] = {{3 * kPage, kPage, buf.data()}, {0, kPage, buf.data() + kPage}};
  EXPECT_THROW((void)store_->write_ranges("w", last), Error);
  ASSERT_TRUE(store_->read_ranges("w", last).ok());  // the last page includes its zero padding
  EXPECT_EQ(std::memcmp(buf.data(), src.data() + 3 * kPage, 10), 0);
  EXPECT_EQ(std::memcmp(buf.data() + 10, std::vector<uint8_t>(kPage - 10, 0).data(), kPage - 10), 0);
  EXPECT_EQ(std::memcmp(buf.data() + kPage, src.data(), kPage), 0);
  EXPECT_TRUE(store_->verify("w").ok());
}

TEST_P(StoreRangesTest, EioMidBatchIsIoError) {
  make_kv("kv");
  // Short reads of one page per pass: the first pass moves one page of each of the 40 two-page
  // ranges, then the 60th request seen (in the second pass) fails.
  std::vector<PageRange> layout;
  for (uint64_t k = 0; k < 40; ++k) layout.push_back({7 * k, 2});
  Batch r = make_batch(layout, 9);
  faulty_->set_short_reads(kPage);
  faulty_->fail_nth_read(60, EIO);
  const uint64_t r0 = store_->bytes_read();
  Status st = store_->read_ranges("kv", r.ranges);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.message();
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("kv.fhs"), std::string::npos) << st.message();
  EXPECT_EQ(store_->bytes_read() - r0, 40 * kPage);  // what moved before the failure is counted
  faulty_->set_short_reads(0);
  ASSERT_TRUE(store_->read_ranges("kv", r.ranges).ok());
  expect_matches_shadow(r);

  Batch w = make_batch(layout, 10);
  faulty_->fail_nth_write(25, EIO);
  st = store_->write_ranges("kv", w.ranges);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.message();
  EXPECT_NE(st.message().find("kv.fhs"), std::string::npos) << st.message();
}

TEST_P(StoreRangesTest, NoSpaceIsNoSpaceAndARetryWorks) {
  make_kv("kv");
  Batch w = make_batch(kv_layout(), 11);
  auto data = random_bytes(w.bytes, 12);
  std::memcpy(w.host.data(), data.data(), w.bytes);
  faulty_->fail_nth_write(50, ENOSPC);
  Status st = store_->write_ranges("kv", w.ranges);
  EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.message();
  ASSERT_TRUE(store_->write_ranges("kv", w.ranges).ok());  // space is back: the whole batch again
  for (const StoreRange& r : w.ranges) std::memcpy(shadow_.data() + r.offset, r.buf, r.length);
  Batch r = make_batch(kv_layout(), 13);
  ASSERT_TRUE(store_->read_ranges("kv", r.ranges).ok());
  expect_matches_shadow(r);
}

TEST_P(StoreRangesTest, ShortReadsAreCompleted) {
  make_kv("kv");
  faulty_->set_short_reads(kPage);
  Batch r = make_batch(kv_layout(), 14);
  Status st = store_->read_ranges("kv", r.ranges);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_matches_shadow(r);
  EXPECT_GT(faulty_->short_passes(), 297);  // the 300-page range alone is cut short 298 times
}

INSTANTIATE_TEST_SUITE_P(All, StoreRangesTest, ::testing::ValuesIn(store_params()), store_param_name);

}  // namespace
}  // namespace flexh2o
