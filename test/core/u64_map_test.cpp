// u64_map: the same answers as std::unordered_map under random sets, erases and lookups (colliding
// keys, wrap-around at the table's end), growth at half full, and trim() after a burst.
#include "core/u64_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

namespace uvbus::detail::u64_map_test {
namespace {

// Checks every key of the model, and that a few absent keys are absent.
void expect_same(const u64_map& m, const std::unordered_map<uint64_t, uint64_t>& model,
                 std::mt19937_64& rng) {
  ASSERT_EQ(m.size(), model.size());
  for (const auto& [k, v] : model) {
    const uint64_t* got = m.find(k);
    ASSERT_NE(got, nullptr) << "key " << k;
    EXPECT_EQ(*got, v) << "key " << k;
  }
  for (int i = 0; i < 8; ++i) {
    const uint64_t k = rng();
    if (model.count(k) == 0) {
      EXPECT_EQ(m.find(k), nullptr);
    }
  }
}

// Random operations on keys from a small range (so sets replace, erases hit and miss, and
// probe runs collide and wrap), checked against std::unordered_map after each step.
TEST(U64Map, MatchesUnorderedMapUnderRandomOperations) {
  std::mt19937_64 rng(12345);
  for (const uint64_t range : {8U, 40U, 300U, 5000U}) {
    u64_map m;
    std::unordered_map<uint64_t, uint64_t> model;
    for (int step = 0; step < 20000; ++step) {
      const uint64_t k = rng() % range;
      switch (rng() % 3) {
        case 0:
        case 1: {
          const uint64_t v = rng();
          m.set(k, v);
          model[k] = v;
          break;
        }
        default:
          EXPECT_EQ(m.erase(k), model.erase(k) == 1) << "key " << k;
      }
      if (step % 997 == 0) {
        ASSERT_NO_FATAL_FAILURE(expect_same(m, model, rng));
      }
      ASSERT_LE(m.size() * 2, m.slots()) << "at most half full";
    }
    ASSERT_NO_FATAL_FAILURE(expect_same(m, model, rng));
    for (const auto& [k, v] : model) EXPECT_TRUE(m.erase(k));
    EXPECT_TRUE(m.empty());
    EXPECT_EQ(m.find(0), nullptr);
  }
}

// Sequential ids (a node's message ids), erased out of order, with key 0 and the largest key.
TEST(U64Map, SequentialIdsAndEdgeKeys) {
  u64_map m;
  EXPECT_EQ(m.slots(), 0U) << "nothing allocated before the first set";
  EXPECT_FALSE(m.erase(7));
  m.set(0, 10);
  m.set(UINT64_MAX, 20);
  for (uint64_t id = 1; id <= 1000; ++id) m.set(id, id * 3);
  for (uint64_t id = 1000; id >= 1; id -= 2) EXPECT_TRUE(m.erase(id));
  for (uint64_t id = 1; id <= 1000; ++id) {
    const uint64_t* v = m.find(id);
    if (id % 2 == 0) {
      EXPECT_EQ(v, nullptr) << id;
    } else {
      ASSERT_NE(v, nullptr) << id;
      EXPECT_EQ(*v, id * 3);
    }
  }
  ASSERT_NE(m.find(0), nullptr);
  EXPECT_EQ(*m.find(0), 10U);
  ASSERT_NE(m.find(UINT64_MAX), nullptr);
  EXPECT_EQ(*m.find(UINT64_MAX), 20U);
  m.set(0, 11);
  EXPECT_EQ(*m.find(0), 11U) << "set replaces";
  uint64_t was = 0;
  EXPECT_TRUE(m.erase(UINT64_MAX, &was));
  EXPECT_EQ(was, 20U) << "erase hands back the value";
  EXPECT_FALSE(m.erase(UINT64_MAX, &was));
  m.set(UINT64_MAX, 20);
  EXPECT_EQ(m.size(), 502U);
  m.clear();
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.find(1), nullptr);
}

// A burst grows the table; trim() shrinks it only after a second of holding an eighth or less,
// and gives it back once the map stayed empty that long. A map in steady use keeps its table.
TEST(U64Map, TrimShrinksOnlyAfterASparseSecond) {
  u64_map m;
  for (uint64_t id = 1; id <= 4000; ++id) m.set(id, id);
  const size_t grown = m.slots();
  EXPECT_GE(grown, 8000U);
  for (uint64_t id = 1; id <= 3990; ++id) m.erase(id);  // 10 left
  m.trim(100);  // the burst was since the last trim: not sparse yet
  EXPECT_EQ(m.slots(), grown);
  m.trim(200);  // sparse from now on
  m.trim(1100);
  EXPECT_EQ(m.slots(), grown) << "sparse for 0.9 s only";
  m.trim(1200);
  EXPECT_LT(m.slots(), grown);
  EXPECT_GE(m.slots(), 40U) << "room for 4x what it holds";
  for (uint64_t id = 3991; id <= 4000; ++id) {
    ASSERT_NE(m.find(id), nullptr) << id;
    EXPECT_EQ(*m.find(id), id);
  }
  // Steady use: 1000 in and out between every trim keeps the table.
  u64_map s;
  for (uint64_t t = 0; t < 5000; t += 250) {
    for (uint64_t id = 1; id <= 1000; ++id) s.set(t * 1000 + id, id);
    const size_t slots = s.slots();
    for (uint64_t id = 1; id <= 1000; ++id) s.erase(t * 1000 + id);
    s.trim(t);
    if (t > 0) {
      EXPECT_EQ(s.slots(), slots) << "at " << t << " ms";
    }
  }
  // Empty for a second: the table goes.
  for (const uint64_t t : {5000U, 5500U, 6000U}) s.trim(t);
  EXPECT_EQ(s.slots(), 0U);
  s.set(1, 2);
  EXPECT_EQ(*s.find(1), 2U) << "usable again";
}

}  // namespace
}  // namespace uvbus::detail::u64_map_test
