// try_resize: grows like resize, reports a size no vector can hold and an injected failure as
// false with the buffer unchanged, and never fails a call that needs no new storage.
#include "core/try_alloc.h"

#include <gtest/gtest.h>

#include <vector>

namespace uvbus::detail::try_alloc_test {
namespace {

TEST(TryResize, GrowsAndShrinksLikeResize) {
  std::vector<uint8_t> v;
  ASSERT_TRUE(try_resize(&v, 1000));
  EXPECT_EQ(v.size(), 1000u);
  ASSERT_TRUE(try_resize(&v, 10));
  EXPECT_EQ(v.size(), 10u);
}

TEST(TryResize, ASizeNoVectorCanHoldIsFalseAndLeavesTheBufferAlone) {
  std::vector<uint8_t> v(16, 7);
  EXPECT_FALSE(try_resize(&v, v.max_size() + 1));  // std::length_error inside
  EXPECT_EQ(v.size(), 16u);
  EXPECT_EQ(v[15], 7);
}

TEST(TryResize, AnInjectedFailureHitsOnlyCallsThatNeedNewStorage) {
  std::vector<uint8_t> v(64, 1);
  fail_next_try_resize(1);
  EXPECT_TRUE(try_resize(&v, 32)) << "within capacity: no allocation, no failure";
  EXPECT_FALSE(try_resize(&v, 1 << 20));
  EXPECT_EQ(v.size(), 32u);
  EXPECT_TRUE(try_resize(&v, 1 << 20)) << "one failure injected, one taken";
  EXPECT_EQ(v.size(), size_t{1} << 20);
  fail_next_try_resize(0);
}

}  // namespace
}  // namespace uvbus::detail::try_alloc_test
