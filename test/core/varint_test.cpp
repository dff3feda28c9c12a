#include "core/varint.h"

#include <gtest/gtest.h>

#include <vector>

namespace uvbus {
namespace {

std::vector<uint8_t> enc(uint64_t v) {
  std::vector<uint8_t> out(kVarintMaxBytes);
  out.resize(varint_encode(v, out.data()));
  return out;
}

TEST(Varint, EncodesMostSignificantGroupFirst) {
  EXPECT_EQ(enc(0), (std::vector<uint8_t>{0x00}));
  EXPECT_EQ(enc(1), (std::vector<uint8_t>{0x01}));
  EXPECT_EQ(enc(127), (std::vector<uint8_t>{0x7F}));
  EXPECT_EQ(enc(128), (std::vector<uint8_t>{0x81, 0x00}));
  EXPECT_EQ(enc(300), (std::vector<uint8_t>{0x82, 0x2C}));
  EXPECT_EQ(enc(16383), (std::vector<uint8_t>{0xFF, 0x7F}));
  EXPECT_EQ(enc(16384), (std::vector<uint8_t>{0x81, 0x80, 0x00}));
  EXPECT_EQ(enc(UINT64_MAX).size(), 10u);
  EXPECT_EQ(enc(UINT64_MAX)[0], 0x81);
}

TEST(Varint, SizeMatchesEncoding) {
  for (int shift = 0; shift < 64; ++shift) {
    for (uint64_t v :
         {(uint64_t{1} << shift) - 1, uint64_t{1} << shift, (uint64_t{1} << shift) + 1}) {
      EXPECT_EQ(varint_size(v), enc(v).size()) << v;
    }
  }
}

TEST(Varint, RoundTripsBoundaries) {
  for (int shift = 0; shift < 64; ++shift) {
    for (uint64_t v : {(uint64_t{1} << shift) - 1, uint64_t{1} << shift, UINT64_MAX >> shift}) {
      auto e = enc(v);
      uint64_t got = 0;
      size_t used = 0;
      ASSERT_EQ(varint_decode(e.data(), e.size(), &got, &used), varint_status::ok);
      EXPECT_EQ(got, v);
      EXPECT_EQ(used, e.size());
    }
  }
}

TEST(Varint, ReportsTruncatedInput) {
  auto e = enc(uint64_t{1} << 40);
  uint64_t v = 7;
  size_t used = 9;
  for (size_t n = 0; n < e.size(); ++n) {
    EXPECT_EQ(varint_decode(e.data(), n, &v, &used), varint_status::truncated) << n;
  }
  EXPECT_EQ(v, 7u);  // untouched on failure
  EXPECT_EQ(used, 9u);
}

TEST(Varint, RejectsEncodingsLongerThanTenBytes) {
  std::vector<uint8_t> eleven(11, 0x80);
  eleven.back() = 0x00;
  uint64_t v = 0;
  size_t used = 0;
  EXPECT_EQ(varint_decode(eleven.data(), eleven.size(), &v, &used), varint_status::too_long);
  std::vector<uint8_t> ten_cont(10, 0x80);
  EXPECT_EQ(varint_decode(ten_cont.data(), ten_cont.size(), &v, &used), varint_status::too_long);
}

TEST(Varint, RejectsValuesAbove64Bits) {
  // 10 bytes whose first group is 0x02: 2 << 63 does not fit.
  std::vector<uint8_t> big{0x82, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
  uint64_t v = 0;
  size_t used = 0;
  EXPECT_EQ(varint_decode(big.data(), big.size(), &v, &used), varint_status::too_long);
}

}  // namespace
}  // namespace uvbus
