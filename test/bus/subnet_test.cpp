// Subnets of bus ids: masks of every width, containment, nesting and overlap.
#include "uvbus/subnet.h"

#include <gtest/gtest.h>

namespace uvbus::subnet_test {
namespace {

TEST(Subnet, LowMaskIsCorrectForEveryWidth) {
  EXPECT_EQ(subnet::low_mask(0), 0u);
  EXPECT_EQ(subnet::low_mask(1), 1u);
  EXPECT_EQ(subnet::low_mask(31), 0x7FFFFFFFu);
  EXPECT_EQ(subnet::low_mask(32), 0xFFFFFFFFu);
  EXPECT_EQ(subnet::low_mask(63), 0x7FFFFFFFFFFFFFFFull);
  EXPECT_EQ(subnet::low_mask(64), ~uint64_t{0});
}

TEST(Subnet, ContainsExactlyItsRangeForEveryWidth) {
  const uint64_t prefix = 0xA5A5A5A5A5A5A5A5ull;
  for (unsigned bits = 0; bits <= 64; ++bits) {
    const subnet s{prefix, static_cast<uint8_t>(bits)};
    ASSERT_TRUE(s.valid());
    const uint64_t lo = s.first();
    const uint64_t hi = s.last();
    EXPECT_TRUE(s.contains(lo)) << bits;
    EXPECT_TRUE(s.contains(hi)) << bits;
    EXPECT_TRUE(s.contains(prefix)) << bits;
    EXPECT_EQ(hi - lo, subnet::low_mask(bits)) << bits;
    if (bits < 64) {
      EXPECT_FALSE(s.contains(lo - 1)) << bits;
      EXPECT_FALSE(s.contains(hi + 1)) << bits;
      // The lowest bit above the mask flips membership.
      EXPECT_FALSE(s.contains(prefix ^ (uint64_t{1} << bits))) << bits;
    }
    if (bits > 0) {
      EXPECT_TRUE(s.contains(prefix ^ (uint64_t{1} << (bits - 1)))) << bits;
    }
  }
  EXPECT_FALSE((subnet{0, 65}).valid());
}

TEST(Subnet, ZeroBitsHoldsOneIdAndSixtyFourHoldsAll) {
  EXPECT_TRUE((subnet{42, 0}).contains(42));
  EXPECT_FALSE((subnet{42, 0}).contains(43));
  EXPECT_TRUE((subnet{42, 64}).contains(0));
  EXPECT_TRUE((subnet{42, 64}).contains(~uint64_t{0}));
}

TEST(Subnet, NestingAndOverlap) {
  const subnet big{0x1200, 8};
  const subnet small{0x1230, 4};
  const subnet other{0x1300, 8};
  EXPECT_TRUE(big.contains(small));
  EXPECT_FALSE(small.contains(big));
  EXPECT_TRUE(big.overlaps(small));
  EXPECT_TRUE(small.overlaps(big));
  EXPECT_FALSE(big.overlaps(other));
  EXPECT_EQ((subnet{0x12AB, 8}), big);  // canonical comparison ignores host bits
  EXPECT_EQ((subnet{0x12AB, 8}).canonical().prefix, 0x1200u);
  EXPECT_EQ(big.to_string(), "0x1200/8");
}

}  // namespace
}  // namespace uvbus::subnet_test
