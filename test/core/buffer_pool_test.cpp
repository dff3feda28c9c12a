// buffer_pool: reuse, the cap on free buffers, the per-thread registry, and the write queue
// handing its drained ring back (write_queue::release_storage).
#include "core/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "core/write_queue.h"

namespace uvbus::buffer_pool_test {
namespace {

TEST(BufferPool, AReleasedBufferIsHandedOutAgain) {
  buffer_pool pool(4096);
  uint8_t* a = pool.acquire();
  ASSERT_NE(a, nullptr);
  std::memset(a, 0xAB, 4096);  // the whole size is usable
  EXPECT_EQ(pool.outstanding(), 1);
  pool.release(a);
  EXPECT_EQ(pool.free_count(), 1u);
  EXPECT_EQ(pool.outstanding(), 0);
  uint8_t* b = pool.acquire();
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.reused(), 1u);
  EXPECT_EQ(pool.free_count(), 0u);
  pool.release(b);
  pool.release(nullptr);  // nothing
  EXPECT_EQ(pool.free_count(), 1u);
}

TEST(BufferPool, KeepsAtMostMaxFreeBuffers) {
  buffer_pool pool(64, 3);
  std::vector<uint8_t*> held(10);
  for (uint8_t*& p : held) p = pool.acquire();
  for (uint8_t* p : held) pool.release(p);
  EXPECT_EQ(pool.free_count(), 3u);
  EXPECT_EQ(pool.outstanding(), 0);
}

TEST(BufferPool, TinyBuffersStillHoldTheFreeListLink) {
  buffer_pool pool(1);
  EXPECT_EQ(pool.buffer_size(), sizeof(void*));
  uint8_t* p = pool.acquire();
  pool.release(p);
  EXPECT_EQ(pool.acquire(), p);
  pool.release(p);
}

TEST(BufferPool, EachThreadHasOnePoolPerSizeUpToALimit) {
  std::thread t([] {
    buffer_pool* a = buffer_pool::local(4112);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(buffer_pool::local(4112), a);
    EXPECT_NE(buffer_pool::local(8208), a);
    for (size_t i = 2; i < buffer_pool::kMaxPoolsPerThread; ++i) {
      EXPECT_NE(buffer_pool::local(100 + i), nullptr);
    }
    EXPECT_EQ(buffer_pool::local(99), nullptr);  // the registry is full: callers use malloc
    EXPECT_EQ(buffer_pool::local(4112), a);
    a->release(a->acquire());  // the thread's exit frees what its pools hold (ASan checks)
  });
  // A second fresh thread at the same time (not this one: the tests before this one in the same
  // process, as under valgrind, may have filled this thread's registry).
  buffer_pool* other = nullptr;
  std::thread u([&other] { other = buffer_pool::local(4112); });
  t.join();
  u.join();
  EXPECT_NE(other, nullptr);
}

TEST(WriteQueueStorage, ADrainedInitialRingGoesBackToThePoolAndComesBack) {
  write_queue_config cfg;  // static ring, 4 KiB at first
  write_queue q(cfg);
  EXPECT_FALSE(q.release_storage());  // nothing allocated yet
  ASSERT_NE(q.reserve(100), nullptr);
  EXPECT_EQ(q.memory_bytes(), cfg.ring_initial_bytes);
  EXPECT_FALSE(q.release_storage());  // a block is queued
  q.pop_front();
  buffer_pool* pool = buffer_pool::local(write_queue::ring_storage_bytes(cfg.ring_initial_bytes));
  ASSERT_NE(pool, nullptr);
  const size_t free_before = pool->free_count();
  EXPECT_TRUE(q.release_storage());
  EXPECT_EQ(q.memory_bytes(), 0u);
  EXPECT_EQ(pool->free_count(), free_before + 1);
  const uint64_t reused = pool->reused();
  uint8_t* p = q.reserve(10, 7);
  ASSERT_NE(p, nullptr);
  const uint8_t digits[10] = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'};
  std::memcpy(p, digits, sizeof digits);
  EXPECT_EQ(pool->reused(), reused + 1);
  EXPECT_EQ(q.front().size, 10u);
  EXPECT_EQ(q.front().tag, 7u);
  EXPECT_EQ(std::memcmp(q.front().data, digits, sizeof digits), 0);
}

TEST(WriteQueueStorage, GrownRingsAndDynamicQueuesKeepTheirMemory) {
  write_queue_config cfg;
  write_queue q(cfg);
  ASSERT_NE(q.reserve(10000), nullptr);  // needs a 16 KiB ring
  q.pop_front();
  EXPECT_FALSE(q.release_storage());
  EXPECT_GT(q.memory_bytes(), cfg.ring_initial_bytes);
  write_queue_config dyn;
  dyn.mode = queue_mode::dynamic;
  write_queue d(dyn);
  ASSERT_NE(d.reserve(10), nullptr);
  d.pop_front();
  EXPECT_FALSE(d.release_storage());
  EXPECT_FALSE(d.release_storage(true));
}

// The owner's idle sweep frees a grown ring (release_storage(true)); a ring allocated whole
// (ring_initial_bytes 0 or >= ring_bytes) is kept whatever the call, even when drained.
TEST(WriteQueueStorage, AGrownRingGoesOnlyWhenAskedAndAWholeRingStays) {
  write_queue_config cfg;
  write_queue q(cfg);
  ASSERT_NE(q.reserve(10000), nullptr);
  EXPECT_FALSE(q.release_storage(true));  // still queued
  q.pop_front();
  EXPECT_TRUE(q.release_storage(true));
  EXPECT_EQ(q.memory_bytes(), 0u);
  ASSERT_NE(q.reserve(10), nullptr);
  EXPECT_EQ(q.memory_bytes(), cfg.ring_initial_bytes);  // small again
  for (const size_t initial : {size_t{0}, cfg.ring_bytes, cfg.ring_bytes * 2}) {
    write_queue_config whole;
    whole.ring_initial_bytes = initial;
    write_queue w(whole);
    ASSERT_NE(w.reserve(10), nullptr);
    w.pop_front();
    EXPECT_FALSE(w.release_storage()) << initial;
    EXPECT_FALSE(w.release_storage(true)) << initial;
    EXPECT_EQ(w.memory_bytes(), whole.ring_bytes) << initial;
  }
}

}  // namespace
}  // namespace uvbus::buffer_pool_test
