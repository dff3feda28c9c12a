// ring_fifo: FIFO order across growth and wrap-around, storage kept when drained.
#include "core/ring_fifo.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace uvbus::detail::ring_fifo_test {
namespace {

TEST(RingFifo, KeepsOrderAcrossWrapAroundAndGrowth) {
  ring_fifo<uint64_t> q;
  EXPECT_TRUE(q.empty());
  uint64_t next_in = 0;
  uint64_t next_out = 0;
  // Push more than we pop so the ring wraps and grows several times.
  for (int round = 0; round < 200; ++round) {
    for (int i = 0; i < 7; ++i) q.push_back(next_in++);
    for (int i = 0; i < 5; ++i) {
      ASSERT_FALSE(q.empty());
      EXPECT_EQ(q.front(), next_out++);
      q.pop_front();
    }
  }
  EXPECT_EQ(q.size(), next_in - next_out);
  while (!q.empty()) {
    EXPECT_EQ(q.front(), next_out++);
    q.pop_front();
  }
  EXPECT_EQ(next_out, next_in);
}

TEST(RingFifo, HoldsNonTrivialValues) {
  ring_fifo<std::string> q;
  for (int i = 0; i < 300; ++i) q.push_back(std::string(40, static_cast<char>('a' + i % 26)));
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(q.front(), std::string(40, static_cast<char>('a' + i % 26)));
    q.pop_front();
  }
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace uvbus::detail::ring_fifo_test
