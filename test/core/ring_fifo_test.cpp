// ring_fifo: FIFO order across growth and wrap-around, storage kept when drained.
#include "core/ring_fifo.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

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

// The ring keeps its capacity apart from the vector: a move must carry it along and leave the
// source empty and usable, a copy must keep both rings' order.
TEST(RingFifo, MovedFromIsEmptyAndUsableAndCopiesKeepOrder) {
  struct entry {  // 48 bytes, like the flows' entries: not a power of two
    uint64_t v[6];
  };
  ring_fifo<entry> a;
  for (uint64_t i = 0; i < 100; ++i) a.push_back(entry{{i, 0, 0, 0, 0, 0}});
  for (int i = 0; i < 30; ++i) a.pop_front();  // head_ no longer 0
  ring_fifo<entry> copy = a;
  ring_fifo<entry> b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the test
  EXPECT_EQ(a.capacity(), 0U);
  a.push_back(entry{{7, 0, 0, 0, 0, 0}});
  EXPECT_EQ(a.front().v[0], 7U);
  ASSERT_EQ(b.size(), 70U);
  ASSERT_EQ(copy.size(), 70U);
  for (uint64_t i = 30; i < 100; ++i) {
    EXPECT_EQ(b.front().v[0], i);
    EXPECT_EQ(copy[i - 30].v[0], i);
    b.pop_front();
  }
  ring_fifo<entry> c;
  c.push_back(entry{{1, 0, 0, 0, 0, 0}});
  c = std::move(copy);
  EXPECT_EQ(c.size(), 70U);
  EXPECT_EQ(c.back().v[0], 99U);
  EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace uvbus::detail::ring_fifo_test
