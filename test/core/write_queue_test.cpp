// write_queue: configs, the static ring (growth, wrap, limits), dynamic mode, merging, models.
#include "core/write_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

namespace uvbus::write_queue_test {
namespace {

write_queue_config ring(size_t bytes) {
  write_queue_config c;
  c.mode = queue_mode::static_ring;
  c.ring_bytes = bytes;
  c.max_bytes = 0;
  c.max_blocks = 0;
  return c;
}

void fill(uint8_t* p, size_t n, uint64_t tag) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(tag * 13 + i);
}
bool check(const write_queue::block& b) {
  for (size_t i = 0; i < b.size; ++i) {
    if (b.data[i] != static_cast<uint8_t>(b.tag * 13 + i)) return false;
  }
  return true;
}

TEST(WriteQueue, RejectsInvalidConfig) {
  write_queue_config dyn;
  dyn.mode = queue_mode::dynamic;
  dyn.max_bytes = 0;
  EXPECT_EQ(write_queue::validate(dyn), errc::invalid_argument);
  write_queue q(dyn);
  errc e = errc::ok;
  EXPECT_EQ(q.reserve(1, 0, &e), nullptr);
  EXPECT_EQ(e, errc::invalid_argument);
  EXPECT_EQ(write_queue::validate(ring(8)), errc::invalid_argument);
}

// A mode outside the enum (a cast integer) is neither: it was taken as valid, its blocks went into
// a ring that merge_front() never read (merging 0 bytes: a flush loop that never ended). It is an
// invalid config now: every reserve fails and nothing is queued.
TEST(WriteQueue, RejectsAModeOutsideTheEnum) {
  write_queue_config bad;
  bad.mode = static_cast<queue_mode>(2);
  EXPECT_EQ(write_queue::validate(bad), errc::invalid_argument);
  write_queue q(bad);
  for (int i = 0; i < 3; ++i) {
    errc e = errc::ok;
    EXPECT_EQ(q.reserve(8, 8, &e), nullptr);
    EXPECT_EQ(e, errc::invalid_argument);
  }
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.memory_bytes(), 0u);
}

TEST(WriteQueue, StaticRingIsFullWithoutReallocating) {
  write_queue q(ring(1024));
  EXPECT_EQ(q.memory_bytes(), 0u);  // nothing before the first block
  size_t pushed = 0;
  errc e = errc::ok;
  ASSERT_NE(q.reserve(100, pushed++, &e), nullptr);
  const size_t mem = q.memory_bytes();
  EXPECT_EQ(mem, 1024u);  // a ring below ring_initial_bytes is allocated whole
  while (q.reserve(100, pushed, &e) != nullptr) ++pushed;
  EXPECT_EQ(e, errc::queue_full);
  EXPECT_EQ(pushed, 1024u / (16 + 104));
  EXPECT_EQ(q.memory_bytes(), mem);
  EXPECT_EQ(q.reserve(2000, 0, &e), nullptr);
  EXPECT_EQ(e, errc::message_too_large);
}

TEST(WriteQueue, StaticRingStartsSmallAndGrowsToRingBytes) {
  write_queue_config c = ring(size_t{64} * 1024);
  c.ring_initial_bytes = 256;
  write_queue q(c);
  EXPECT_EQ(q.memory_bytes(), 0u);
  uint64_t tag = 0;
  std::deque<uint64_t> model;
  auto push = [&](size_t n) {
    uint8_t* p = q.reserve(n, tag);
    if (p == nullptr) return false;
    fill(p, n, tag);
    model.push_back(tag++);
    return true;
  };
  ASSERT_TRUE(push(10));
  EXPECT_EQ(q.memory_bytes(), 256u);
  // Wrap the small ring, then grow it while wrapped: the order and the bytes survive.
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(push(30));
    if (q.size() > 3) {
      ASSERT_TRUE(check(q.front()));
      q.pop_front();
      model.pop_front();
    }
  }
  EXPECT_EQ(q.memory_bytes(), 256u);
  const write_queue::block before = q.front();
  ASSERT_TRUE(push(1000));
  // The old ring stays readable (a write in flight may still read `before`) until released.
  EXPECT_EQ(q.memory_bytes(), 256u + 2048u);
  EXPECT_TRUE(check(before));
  q.release_retired();
  EXPECT_EQ(q.memory_bytes(), 2048u);
  while (push(3000)) {
  }
  EXPECT_GE(q.memory_bytes(), c.ring_bytes);
  q.release_retired();
  EXPECT_EQ(q.memory_bytes(), c.ring_bytes);
  for (uint64_t t : model) {
    ASSERT_EQ(q.front().tag, t);
    ASSERT_TRUE(check(q.front()));
    q.pop_front();
  }
  EXPECT_TRUE(q.empty());
}

TEST(WriteQueue, ZeroInitialBytesAllocatesTheWholeRing) {
  write_queue_config c = ring(size_t{64} * 1024);
  c.ring_initial_bytes = 0;
  write_queue q(c);
  ASSERT_NE(q.reserve(1), nullptr);
  EXPECT_EQ(q.memory_bytes(), c.ring_bytes);
}

// The first ring is ring_initial_bytes rounded up to 8 and at least 64 bytes: with 4100, 32 or 1
// it was larger than ring_initial_bytes, so it counted as grown and was never handed back when
// the queue drained (only the idle sweep freed it; with send_ring_idle_ms 0, nothing). A ring of
// the size the first allocation makes goes back now; one that did grow is still kept.
TEST(WriteQueueStorage, AnUnalignedOrTinyInitialRingIsHandedBackAtDrain) {
  for (const size_t initial : {size_t{4100}, size_t{32}, size_t{1}}) {
    write_queue_config c = ring(size_t{64} * 1024);
    c.ring_initial_bytes = initial;
    write_queue q(c);
    ASSERT_NE(q.reserve(20), nullptr) << initial;
    q.pop_front();
    EXPECT_TRUE(q.release_storage(false)) << initial;
    EXPECT_EQ(q.memory_bytes(), 0u) << initial;
    ASSERT_NE(q.reserve(5000), nullptr) << initial;  // beyond the first ring: grown
    q.pop_front();
    EXPECT_FALSE(q.release_storage(false)) << initial;
    EXPECT_TRUE(q.release_storage(true)) << initial;
  }
  // An initial size that rounds up to the whole ring (4100 of 4100, both 4104) allocates it whole:
  // kept at drain as any whole ring, not reallocated at the next send.
  write_queue_config c = ring(4100);
  c.ring_initial_bytes = 4100;
  write_queue q(c);
  ASSERT_NE(q.reserve(20), nullptr);
  q.pop_front();
  EXPECT_FALSE(q.release_storage(false));
  EXPECT_FALSE(q.release_storage(true));
}

TEST(WriteQueue, ByteAndBlockLimitsApplyInBothModes) {
  for (auto mode : {queue_mode::static_ring, queue_mode::dynamic}) {
    write_queue_config c;
    c.mode = mode;
    c.ring_bytes = 1 << 20;
    c.max_bytes = 1000;
    c.max_blocks = 5;
    write_queue q(c);
    errc e = errc::ok;
    EXPECT_EQ(q.reserve(1001, 0, &e), nullptr);
    EXPECT_EQ(e, errc::message_too_large);
    for (int i = 0; i < 5; ++i) ASSERT_NE(q.reserve(10, 0, &e), nullptr);
    EXPECT_EQ(q.reserve(10, 0, &e), nullptr);
    EXPECT_EQ(e, errc::queue_full);
    while (!q.empty()) q.pop_front();
    ASSERT_NE(q.reserve(1000, 0, &e), nullptr);
    EXPECT_EQ(q.reserve(1, 0, &e), nullptr);
    EXPECT_EQ(e, errc::queue_full);
    EXPECT_EQ(q.bytes(), 1000u);
  }
}

TEST(WriteQueue, UnreserveBackUndoesTheLastReservation) {
  for (auto mode : {queue_mode::static_ring, queue_mode::dynamic}) {
    write_queue_config c;
    c.mode = mode;
    c.ring_bytes = 256;
    write_queue q(c);
    uint8_t* a = q.reserve(10, 1);
    fill(a, 10, 1);
    ASSERT_NE(q.reserve(20, 2), nullptr);
    q.unreserve_back();
    EXPECT_EQ(q.size(), 1u);
    EXPECT_EQ(q.bytes(), 10u);
    uint8_t* b = q.reserve(30, 3);
    fill(b, 30, 3);
    EXPECT_EQ(q.front().tag, 1u);
    EXPECT_TRUE(check(q.front()));
    q.pop_front();
    EXPECT_EQ(q.front().tag, 3u);
    EXPECT_TRUE(check(q.front()));
  }
}

// Found by test/fuzz/fuzz_write_queue: a pop_front() that consumed the wrap point between a
// reserve() and its unreserve_back() left the ring believing it was still wrapped, so it refused
// every block until it drained.
TEST(WriteQueue, UnreserveAfterPoppingPastTheWrapKeepsTheRingUsable) {
  write_queue q(ring(304));
  for (uint64_t t = 1; t <= 4; ++t) ASSERT_NE(q.reserve(48, t), nullptr);  // 64 bytes each: 0..256
  q.pop_front();
  q.pop_front();                         // head at 128
  ASSERT_NE(q.reserve(48, 5), nullptr);  // wraps: at 0
  ASSERT_NE(q.reserve(48, 6), nullptr);  // at 64, after the wrap already existed
  q.pop_front();
  q.pop_front();  // head crosses the wrap point back to 0
  q.unreserve_back();
  ASSERT_EQ(q.size(), 1u);
  // One 64-byte block at 0 in a 304-byte ring: three more must fit.
  for (uint64_t t = 7; t <= 9; ++t) EXPECT_NE(q.reserve(48, t), nullptr) << t;
  EXPECT_EQ(q.front().tag, 5u);
}

TEST(WriteQueue, ZeroSizeBlocksAreQueued) {
  write_queue q(ring(256));
  ASSERT_NE(q.reserve(0, 7), nullptr);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.front().size, 0u);
  EXPECT_EQ(q.front().tag, 7u);
}

TEST(WriteQueue, MergeStopsAtLargeBlockCapacityAndWrapPoint) {
  write_queue q(ring(size_t{16} * 1024));
  for (uint64_t t = 0; t < 4; ++t) fill(q.reserve(100, t), 100, t);
  fill(q.reserve(5000, 4), 5000, 4);
  fill(q.reserve(100, 5), 100, 5);
  std::vector<uint8_t> buf(1 << 16);
  size_t n = 0;
  EXPECT_EQ(q.merge_front(buf.data(), buf.size(), 3072, &n), 400u);
  EXPECT_EQ(n, 4u);
  EXPECT_EQ(buf[100], static_cast<uint8_t>(1 * 13));
  EXPECT_EQ(q.merge_front(buf.data(), 250, 3072, &n), 200u);  // capacity
  EXPECT_EQ(n, 2u);
  for (int i = 0; i < 4; ++i) q.pop_front();
  EXPECT_EQ(q.merge_front(buf.data(), buf.size(), 3072, &n), 0u);  // large block at the head
  EXPECT_EQ(n, 0u);
}

TEST(WriteQueue, MergeSumsTheMergedBlocksTagsInBothModes) {
  for (auto mode : {queue_mode::static_ring, queue_mode::dynamic}) {
    write_queue_config c = ring(size_t{16} * 1024);
    c.mode = mode;
    c.max_bytes = 1 << 20;
    c.max_blocks = 1000;
    write_queue q(c);
    for (uint64_t t = 1; t <= 4; ++t) fill(q.reserve(100, t * 1000), 100, t);
    fill(q.reserve(5000, 7), 5000, 5);  // stops the merge: its tag is not counted
    std::vector<uint8_t> buf(1 << 16);
    size_t n = 0;
    size_t span = 0;
    uint64_t tags = 0;
    EXPECT_EQ(q.merge_front(buf.data(), buf.size(), 3072, &n, &span, &tags), 400u);
    EXPECT_EQ(n, 4u);
    EXPECT_EQ(tags, 10000u);
    EXPECT_EQ(q.merge_front(buf.data(), 250, 3072, &n, &span, &tags), 200u);  // capacity
    EXPECT_EQ(tags, 3000u);
    q.pop_front_n(2, 200, span);
    EXPECT_EQ(q.merge_front(buf.data(), buf.size(), 3072, &n, &span, &tags), 200u);
    EXPECT_EQ(tags, 7000u);
  }
}

TEST(WriteQueue, MergeNeverCrossesTheWrapPoint) {
  write_queue q(ring(1024));
  // 7 blocks of 120 B stride (840 B), pop 4, then 2 more: one fits at the end, the next wraps.
  for (uint64_t t = 0; t < 7; ++t) fill(q.reserve(100, t), 100, t);
  for (int i = 0; i < 4; ++i) q.pop_front();
  fill(q.reserve(100, 7), 100, 7);  // at 840..960
  fill(q.reserve(100, 8), 100, 8);  // 960 + 120 > 1024: wraps to 0
  std::vector<uint8_t> buf(4096);
  size_t n = 0;
  EXPECT_EQ(q.merge_front(buf.data(), buf.size(), 3072, &n), 400u);
  EXPECT_EQ(n, 4u);  // tags 4,5,6,7; tag 8 lies after the wrap
  for (int i = 0; i < 4; ++i) q.pop_front();
  EXPECT_EQ(q.front().tag, 8u);
  EXPECT_EQ(q.merge_front(buf.data(), buf.size(), 3072, &n), 100u);
  EXPECT_EQ(n, 1u);
}

// A small block is merged by a fixed-size copy that reads and writes past the block
// (docs/stream.md, "Write path"): a block that ends exactly at the ring's end, merged into a buffer
// of exactly its size or with room to spare, still comes out right, and under ASan nothing outside
// the ring's allocation or the buffer is touched (the ring is above the pooled sizes: its own
// allocation).
TEST(WriteQueue, MergeOfASmallBlockAtTheRingEndStaysInBounds) {
  constexpr size_t kRing = size_t{32} * 1024;
  for (const size_t n : std::vector<size_t>{1, 7, 8, 9, 16, 100, 152, 159, 160, 161}) {
    write_queue_config c = ring(kRing);
    c.ring_initial_bytes = kRing;
    write_queue q(c);
    const size_t filler = kRing - size_t{32} - ((n + 7) & ~size_t{7});  // two 16-byte block headers
    fill(q.reserve(filler, 1), filler, 1);
    fill(q.reserve(n, 2), n, 2);
    q.pop_front();
    for (const size_t room : {size_t{0}, size_t{200}}) {
      const std::unique_ptr<uint8_t[]> dst(new uint8_t[n + room]);
      size_t blocks = 0;
      ASSERT_EQ(q.merge_front(dst.get(), n + room, 3072, &blocks), n) << n;
      EXPECT_EQ(blocks, 1u);
      const write_queue::block b{dst.get(), n, 2};
      EXPECT_TRUE(check(b)) << n << " " << room;
    }
  }
}

TEST(WriteQueue, ForEachFrontVisitsInOrder) {
  write_queue q(ring(4096));
  for (uint64_t t = 0; t < 10; ++t) ASSERT_NE(q.reserve(t, t), nullptr);
  std::vector<uint64_t> seen;
  q.for_each_front(6, [&](const write_queue::block& b) { seen.push_back(b.tag); });
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
}

// take_unsealed() hands out the model's oldest unsealed blocks (the newest `unsealed` of the
// model).
void seal_check(write_queue& q, const std::deque<std::pair<uint64_t, size_t>>& model,
                size_t* unsealed, size_t max) {
  write_queue::block got[16];
  const size_t n = q.take_unsealed(got, max);
  ASSERT_EQ(n, std::min(max, *unsealed));
  for (size_t i = 0; i < n; ++i) {
    const auto& want = model[model.size() - *unsealed + i];
    ASSERT_EQ(got[i].tag, want.first);
    ASSERT_EQ(got[i].size, want.second);
  }
  if (n != 0) {
    ASSERT_TRUE(check(got[n - 1]));  // the bytes too (of one block: valgrind runs this)
  }
  *unsealed -= n;
}

// Random push/pop/merge/seal against a std::deque model, through many wraps.
void model_check(write_queue_config cfg, uint64_t seed) {
  write_queue q(cfg);
  std::deque<std::pair<uint64_t, size_t>> model;
  size_t unsealed = 0;  // the newest blocks of the model not yet taken by take_unsealed()
  std::mt19937_64 rng(seed);
  uint64_t next_tag = 0;
  size_t rejected = 0;
  std::vector<uint8_t> merge_buf(8192);
  for (int step = 0; step < 200000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      const size_t n = rng() % 4 == 0 ? rng() % 2000 : rng() % 200;
      errc e = errc::ok;
      uint8_t* p = q.reserve(n, next_tag, &e);
      if (p == nullptr) {
        ASSERT_TRUE(e == errc::queue_full || e == errc::message_too_large);
        ++rejected;
        continue;
      }
      fill(p, n, next_tag);
      model.emplace_back(next_tag++, n);
      ++unsealed;
    } else if (op == 8 && rng() % 2 == 0) {
      seal_check(q, model, &unsealed, 1 + rng() % 16);
    } else if (op == 8) {
      q.seal_newest();
      if (unsealed == 1) unsealed = 0;
    } else if (op < 9) {
      if (model.empty()) {
        ASSERT_TRUE(q.empty());
        continue;
      }
      auto b = q.front();
      ASSERT_EQ(b.tag, model.front().first);
      ASSERT_EQ(b.size, model.front().second);
      ASSERT_TRUE(check(b));
      q.pop_front();
      model.pop_front();
      unsealed = std::min(unsealed, model.size());
    } else {
      size_t n = 0;
      size_t span = 0;
      const size_t bytes = q.merge_front(merge_buf.data(), merge_buf.size(), 1024, &n, &span);
      ASSERT_LE(n, model.size());
      size_t off = 0;
      for (size_t i = 0; i < n; ++i) {
        for (size_t k = 0; k < model[i].second; ++k) {
          ASSERT_EQ(merge_buf[off + k], static_cast<uint8_t>(model[i].first * 13 + k));
        }
        off += model[i].second;
      }
      ASSERT_EQ(off, bytes);
      if (rng() % 2 == 0) {  // the blocks went out: pop them at once
        q.pop_front_n(n, bytes, span);
        model.erase(model.begin(), model.begin() + static_cast<std::ptrdiff_t>(n));
        unsealed = std::min(unsealed, model.size());
      }
    }
    ASSERT_EQ(q.size(), model.size());
    ASSERT_EQ(q.unsealed(), unsealed);
    size_t total = 0;
    for (auto& m : model) total += m.second;
    ASSERT_EQ(q.bytes(), total);
    if (cfg.max_bytes != 0) {
      ASSERT_LE(total, cfg.max_bytes);
    }
    if (cfg.max_blocks != 0) {
      ASSERT_LE(model.size(), cfg.max_blocks);
    }
  }
  EXPECT_GT(rejected, 0u);      // the run reached "full" ...
  EXPECT_GT(next_tag, 50000u);  // ... and cycled the ring many times
}

TEST(WriteQueue, StaticRingMatchesDequeModelThroughManyWraps) {
  model_check(ring(size_t{16} * 1024), 1);
  model_check(ring(4 * 1024 + 8), 2);
  write_queue_config grown = ring(size_t{32} * 1024);
  grown.ring_initial_bytes = 64;  // grows through every size while blocks are queued
  model_check(grown, 4);
}

TEST(WriteQueue, StaticRingWithLimitsMatchesDequeModel) {
  write_queue_config bytes = ring(size_t{16} * 1024);
  bytes.max_bytes = 3000;  // reached long before the ring is full, wrapped or not
  model_check(bytes, 5);
  write_queue_config blocks = ring(size_t{16} * 1024);
  blocks.max_blocks = 12;
  model_check(blocks, 6);
}

// reserve()'s fast path once the tail has wrapped: a block fits up to the head, not a byte beyond.
TEST(WriteQueue, WrappedRingFillsExactlyUpToTheHead) {
  write_queue_config c = ring(1024);
  c.ring_initial_bytes = 0;
  write_queue q(c);
  uint64_t tag = 0;
  for (int i = 0; i < 4; ++i) {  // 4 blocks of 256 ring bytes fill it
    uint8_t* p = q.reserve(240, tag, nullptr);
    ASSERT_NE(p, nullptr);
    fill(p, 240, tag++);
  }
  q.pop_front();
  q.pop_front();                 // the head is at 512
  for (int i = 0; i < 2; ++i) {  // at 0 (the wrap), then at 256: the tail reaches the head
    uint8_t* p = q.reserve(240, tag, nullptr);
    ASSERT_NE(p, nullptr);
    fill(p, 240, tag++);
  }
  errc e = errc::ok;
  EXPECT_EQ(q.reserve(0, tag, &e), nullptr);  // even an empty block needs its 16-byte header
  EXPECT_EQ(e, errc::queue_full);
  for (uint64_t want = 2; want < 6; ++want) {
    ASSERT_FALSE(q.empty());
    EXPECT_EQ(q.front().tag, want);
    EXPECT_TRUE(check(q.front()));
    q.pop_front();
  }
  EXPECT_TRUE(q.empty());
}

TEST(WriteQueue, DynamicModeMatchesDequeModel) {
  write_queue_config c;
  c.mode = queue_mode::dynamic;
  c.max_bytes = 20000;
  c.max_blocks = 100;
  model_check(c, 3);
}

}  // namespace
}  // namespace uvbus::write_queue_test
