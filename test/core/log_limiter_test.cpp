// detail::log_limiter: a burst per window and kind, the count of what was left out on the next
// line that passes, and (take_expired) that count for a summary line once the window has passed.
#include "core/log_limiter.h"

#include <gtest/gtest.h>

namespace uvbus::detail::log_limiter_test {
namespace {

TEST(LogLimiter, ABurstPerWindowThenTheCountOnTheNextLine) {
  log_limiter l;
  uint64_t suppressed = 99;
  for (uint32_t i = 0; i < log_limiter::kBurst; ++i) {
    EXPECT_TRUE(l.allow(0, 1000, &suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(l.allow(0, 1500, &suppressed));
  EXPECT_TRUE(l.allow(1, 1500, &suppressed)) << "another kind has its own burst";
  EXPECT_TRUE(l.allow(0, 2000, &suppressed));  // the next window
  EXPECT_EQ(suppressed, 7u);
}

TEST(LogLimiter, TheCountOfAPassedWindowIsTakenOnce) {
  log_limiter l;
  uint64_t suppressed = 0;
  for (uint32_t i = 0; i < log_limiter::kBurst + 3; ++i) (void)l.allow(2, 1000, &suppressed);
  EXPECT_EQ(l.take_expired(2, 1999), 0u) << "the window has not passed";
  EXPECT_EQ(l.take_expired(3, 5000), 0u) << "nothing left out of that kind";
  EXPECT_EQ(l.take_expired(2, 2000), 3u);
  EXPECT_EQ(l.take_expired(2, 2500), 0u) << "taken";
  EXPECT_TRUE(l.allow(2, 2600, &suppressed));
  EXPECT_EQ(suppressed, 0u) << "the summary carried it";
}

}  // namespace
}  // namespace uvbus::detail::log_limiter_test
