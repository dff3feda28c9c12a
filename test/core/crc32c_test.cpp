// crc32c: the published check values (RFC 3720's iSCSI vectors and "123456789"), every kernel this
// CPU has, forced in turn, against a bit-at-a-time reference on every length 0..4096 at every
// alignment 0..7 and on random lengths up to 64 KiB, continuation (the CRC of a split input equals
// the CRC of the whole), and the kernel switch itself.
#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <ostream>
#include <random>
#include <vector>

namespace uvbus::crc32c_test {
namespace {

// The definition, one bit at a time: what every kernel must match.
uint32_t reference(const uint8_t* p, size_t len, uint32_t crc = 0) {
  uint32_t reg = ~crc;
  for (size_t i = 0; i < len; ++i) {
    reg ^= p[i];
    for (int b = 0; b < 8; ++b) reg = (reg >> 1) ^ ((reg & 1U) != 0 ? 0x82F63B78U : 0U);
  }
  return ~reg;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

// A kernel, and for sse42 the variant for inputs of 256..1791 B (0 fold, 1 lanes; both run here,
// whichever the dispatch would time faster).
struct kernel {
  crc32c_impl impl;
  int medium;
  const char* name;
};

void PrintTo(const kernel& k, std::ostream* os) {
  *os << k.name;
}

std::vector<kernel> kernels() {
  std::vector<kernel> v{{crc32c_impl::table, -1, "table"}};
  if (crc32c_supported(crc32c_impl::sse42)) {
    v.push_back({crc32c_impl::sse42, 0, "sse42_fold"});
    v.push_back({crc32c_impl::sse42, 1, "sse42_lanes"});
  }
  return v;
}

class Crc32c : public ::testing::TestWithParam<kernel> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(crc32c_use(GetParam().impl));
    ASSERT_EQ(crc32c_active(), GetParam().impl);
    if (GetParam().medium >= 0) {
      ASSERT_TRUE(crc32c_detail::sse42_medium_use(GetParam().medium));
      ASSERT_EQ(crc32c_detail::sse42_medium_active(), GetParam().medium);
    }
  }
  void TearDown() override {
    (void)crc32c_detail::sse42_medium_use(-1);
    (void)crc32c_use(crc32c_impl::auto_);
  }
};

TEST_P(Crc32c, MatchesThePublishedCheckValues) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283U);
  std::vector<uint8_t> v(32, 0);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x8A9136AAU);
  std::fill(v.begin(), v.end(), 0xff);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x62A8AB43U);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x46DD794EU);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x113FDB5CU);
  EXPECT_EQ(crc32c(nullptr, 0), 0U);
}

TEST_P(Crc32c, EveryLengthUpTo4096AtEveryAlignmentMatchesTheDefinition) {
  const std::vector<uint8_t> data = random_bytes(4096 + 8, 1);
  for (size_t align = 0; align < 8; ++align) {
    uint32_t want = 0;  // the definition's CRC of data[align, align + len), grown a byte at a time
    for (size_t len = 0; len <= 4096; ++len) {
      // A copy of exactly len bytes: a kernel that reads past the end is an ASan report.
      const std::vector<uint8_t> exact(data.begin() + static_cast<long>(align),
                                       data.begin() + static_cast<long>(align + len));
      ASSERT_EQ(crc32c(exact.data(), len), want)
          << GetParam().name << " len " << len << " align " << align;
      want = reference(&data[align + len], 1, want);
    }
  }
}

TEST_P(Crc32c, RandomLengthsUpTo64KiBMatchTheDefinition) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const size_t len = rng() % (64 * 1024 + 1);
    const std::vector<uint8_t> v = random_bytes(len, static_cast<uint32_t>(round));
    ASSERT_EQ(crc32c(v.data(), len), reference(v.data(), len)) << "len " << len;
  }
}

TEST_P(Crc32c, ContinuingFromAPrefixGivesTheCrcOfTheWhole) {
  const std::vector<uint8_t> v = random_bytes(5000, 3);
  const uint32_t whole = crc32c(v.data(), v.size());
  for (size_t cut :
       {size_t{0}, size_t{1}, size_t{7}, size_t{127}, size_t{128}, size_t{767}, size_t{768},
        size_t{1791}, size_t{1792}, size_t{2500}, size_t{3584}, size_t{4999}, size_t{5000}}) {
    const uint32_t head = crc32c(v.data(), cut);
    EXPECT_EQ(crc32c(v.data() + cut, v.size() - cut, head), whole) << "cut at " << cut;
    EXPECT_EQ(reference(v.data() + cut, v.size() - cut, head), whole) << "cut at " << cut;
  }
}

// A CRC continued from any register takes another path than one started afresh (whose first
// step is a table entry): every length 0..3800 (each len % 8, short inputs, the fold from 128 B,
// one and two rounds of the fold beside three crc32 chains from 1792 B, and every remainder after
// them) from four random registers that are neither 0 nor ~0 (the reference grows a byte at a
// time, so that the test stays linear: valgrind runs it too).
TEST_P(Crc32c, ContinuingFromAnyCrcMatchesTheDefinitionAtEveryLength) {
  const std::vector<uint8_t> data = random_bytes(3800, 11);
  std::mt19937 rng(13);
  for (int pass = 0; pass < 4; ++pass) {
    const uint32_t from = rng() | 1U;  // never 0: the fresh start is the other tests' case
    ASSERT_NE(from, 0xFFFFFFFFU);
    uint32_t want = from;  // the definition's CRC of data[0, len) continued from `from`
    for (size_t len = 0; len <= data.size(); ++len) {
      ASSERT_EQ(crc32c(data.data(), len, from), want) << "len " << len << " from " << from;
      if (len < data.size()) want = reference(&data[len], 1, want);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Crc32c, ::testing::ValuesIn(kernels()),
                         [](const ::testing::TestParamInfo<kernel>& i) {
                           return std::string(i.param.name);
                         });

TEST(Crc32cDispatch, AutoPicksTheFastestKernelTheCpuHasAndUnsupportedOnesAreRefused) {
  ASSERT_TRUE(crc32c_use(crc32c_impl::auto_));
  EXPECT_EQ(crc32c_active(),
            crc32c_supported(crc32c_impl::sse42) ? crc32c_impl::sse42 : crc32c_impl::table);
  EXPECT_TRUE(crc32c_supported(crc32c_impl::table));
  if (!crc32c_supported(crc32c_impl::sse42)) {
    const crc32c_impl before = crc32c_active();
    EXPECT_FALSE(crc32c_use(crc32c_impl::sse42));
    EXPECT_EQ(crc32c_active(), before);
  }
  EXPECT_STREQ(to_string(crc32c_impl::auto_), "auto");
}

// The sse42 kernel's variant for inputs of 256..1791 B is timed at its first use and can be
// forced; a value out of range, or a CPU without the kernel, changes nothing.
TEST(Crc32cDispatch, TheSse42VariantIsTimedOnceAndCanBeForced) {
  if (!crc32c_supported(crc32c_impl::sse42)) {
    EXPECT_FALSE(crc32c_detail::sse42_medium_use(0));
    EXPECT_EQ(crc32c_detail::sse42_medium_active(), -1);
    return;
  }
  const int timed = crc32c_detail::sse42_medium_active();
  EXPECT_TRUE(timed == 0 || timed == 1) << timed;
  EXPECT_FALSE(crc32c_detail::sse42_medium_use(2));
  EXPECT_FALSE(crc32c_detail::sse42_medium_use(-2));
  EXPECT_EQ(crc32c_detail::sse42_medium_active(), timed);
  for (const int v : {1, 0}) {
    ASSERT_TRUE(crc32c_detail::sse42_medium_use(v));
    EXPECT_EQ(crc32c_detail::sse42_medium_active(), v);
  }
  ASSERT_TRUE(crc32c_detail::sse42_medium_use(-1));
  const int again = crc32c_detail::sse42_medium_active();
  EXPECT_TRUE(again == 0 || again == 1) << again;
}

}  // namespace
}  // namespace uvbus::crc32c_test
