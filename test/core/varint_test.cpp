// The stream frame's length prefix (core/varint.h): encodings, sizes, malformed input.
#include "core/varint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <vector>

namespace uvbus::varint_test {
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

// The size from the highest set bit against a plain loop, at every 7-bit boundary.
TEST(Varint, SizeAgreesWithAPlainLoop) {
  const auto by_loop = [](uint64_t v) {
    size_t n = 1;
    for (; v >= 0x80; v >>= 7) ++n;
    return n;
  };
  for (int shift = 0; shift < 64; ++shift) {
    for (uint64_t v : {(uint64_t{1} << shift) - 1, uint64_t{1} << shift}) {
      EXPECT_EQ(varint_size(v), by_loop(v)) << v;
    }
  }
  static_assert(varint_size(0) == 1 && varint_size(127) == 1 && varint_size(128) == 2 &&
                    varint_size(UINT64_MAX) == 10,
                "varint_size stays usable in constant expressions");
}

// Every one- and two-byte value (the branch-free path) and the first three-byte ones: decodes
// back, and nothing is written past the encoding.
TEST(Varint, SmallValuesRoundTripAndWriteOnlyTheirBytes) {
  for (uint64_t v = 0; v < 0x4000 + 300; ++v) {
    uint8_t buf[kVarintMaxBytes + 1];
    std::fill(std::begin(buf), std::end(buf), 0xEE);
    const size_t n = varint_encode(v, buf);
    ASSERT_EQ(n, v < 0x80 ? 1u : v < 0x4000 ? 2u : 3u) << v;
    EXPECT_EQ(buf[n], 0xEE) << v;
    uint64_t got = 0;
    size_t used = 0;
    ASSERT_EQ(varint_decode(buf, n, &got, &used), varint_status::ok) << v;
    EXPECT_EQ(got, v);
    EXPECT_EQ(used, n);
    // The short decoder, whatever byte follows: the same value, or false for three bytes.
    for (uint8_t next : {uint8_t{0x00}, uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF}}) {
      uint8_t two[kVarintMaxBytes + 1];
      std::copy(buf, buf + n, two);
      two[n] = next;
      uint64_t s = 0;
      size_t su = 0;
      if (n <= 2) {
        ASSERT_TRUE(varint_decode_short(two, &s, &su)) << v;
        EXPECT_EQ(s, v);
        EXPECT_EQ(su, n);
      } else {
        EXPECT_FALSE(varint_decode_short(two, &s, &su)) << v;
        EXPECT_EQ(su, 0u);
      }
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
}  // namespace uvbus::varint_test
