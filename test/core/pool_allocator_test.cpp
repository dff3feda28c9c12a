// pool_allocator: a std::map's freed nodes are taken back by its next insertions, at most kKeep
// are kept, and the map behaves as with std::allocator (order, copies, moves; ASan checks that
// every node is freed once).
#include "core/pool_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace uvbus::detail::pool_allocator_test {
namespace {

using pooled_map = std::map<uint64_t, std::string, std::less<>,
                            pool_allocator<std::pair<const uint64_t, std::string>>>;

TEST(PoolAllocator, FreedNodesAreTakenBackAndTheMapKeepsItsOrder) {
  pooled_map m;
  for (uint64_t i = 0; i < 100; ++i) m.emplace(i, std::to_string(i));
  EXPECT_EQ(m.get_allocator().pooled(), 0U);
  for (uint64_t i = 0; i < 100; i += 2) m.erase(i);
  EXPECT_EQ(m.get_allocator().pooled(), 50U);
  for (uint64_t i = 1000; i < 1030; ++i) m.emplace(i, "x");
  EXPECT_EQ(m.get_allocator().pooled(), 20U) << "30 nodes taken back";
  uint64_t prev = 0;
  size_t n = 0;
  for (const auto& [k, v] : m) {
    EXPECT_TRUE(n == 0 || k > prev);
    prev = k;
    ++n;
  }
  EXPECT_EQ(n, 80U);
  EXPECT_EQ(m.at(1029), "x");
  EXPECT_EQ(m.at(99), "99");
}

TEST(PoolAllocator, AtMostKKeepNodesAreKept) {
  pooled_map m;
  const uint64_t many = node_pool::kKeep + 500;
  for (uint64_t i = 0; i < many; ++i) m.emplace(i, std::string());
  m.clear();
  EXPECT_EQ(m.get_allocator().pooled(), node_pool::kKeep);
}

TEST(PoolAllocator, CopiesAndMovesBehaveAsWithTheStandardAllocator) {
  pooled_map a;
  for (uint64_t i = 0; i < 10; ++i) a.emplace(i, std::string(40, static_cast<char>('a' + i)));
  pooled_map b = a;  // its own pool
  EXPECT_EQ(b, a);
  EXPECT_FALSE(b.get_allocator() == a.get_allocator());
  pooled_map c = std::move(a);
  EXPECT_EQ(c.size(), 10U);
  a.clear();  // NOLINT(bugprone-use-after-move): a moved-from map stays usable
  a.emplace(1, "again");
  EXPECT_EQ(a.at(1), "again");
  b.erase(3);
  c = b;
  EXPECT_EQ(c.size(), 9U);
  EXPECT_EQ(c.count(3), 0U);
  pooled_map d;
  d = std::move(c);
  EXPECT_EQ(d.at(9), std::string(40, 'j'));
}

}  // namespace
}  // namespace uvbus::detail::pool_allocator_test
