// Nothing is allocated per message in steady state: every heap allocation of the counting threads
// is counted (the global operator new replaced here; under ASan or TSan also every malloc, through
// the sanitizer's allocator hooks) while warmed-up stream channels and shm rings carry thousands of
// messages; steady_alloc_bus_test.cpp (the same binary) does the same for bus nodes. Its own
// binary: the replacement applies to the whole program.
#include <gtest/gtest.h>
#include <uv.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "hardening/steady_alloc.h"
#include "test_util.h"
#include "uvbus/shm.h"
#include "uvbus/stream.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// The sanitizer runtimes' allocator hooks (<sanitizer/allocator_interface.h>, which GCC does not
// ship): called for every allocation the runtime makes for the program, malloc included.
extern "C" int __sanitizer_install_malloc_and_free_hooks(  // NOLINT(bugprone-reserved-identifier)
    void (*malloc_hook)(const volatile void*, size_t), void (*free_hook)(const volatile void*));
#define UVBUS_TEST_MALLOC_HOOKS 1
#endif

namespace uvbus::steady_alloc_test {

using namespace test::steady_alloc;

void note_allocation() noexcept {
  if (counting) ++allocations;
}

void* counted_new(size_t n) {
  note_allocation();
  void* p = std::malloc(n != 0 ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* counted_new_aligned(size_t n, std::align_val_t a) {
  note_allocation();
  const auto align = static_cast<size_t>(a);
  void* p = std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace uvbus::steady_alloc_test

// The replaceable allocation functions (C++17): every form counts, and frees with free().
void* operator new(size_t n) {
  return uvbus::steady_alloc_test::counted_new(n);
}
void* operator new[](size_t n) {
  return uvbus::steady_alloc_test::counted_new(n);
}
void* operator new(size_t n, const std::nothrow_t& /*tag*/) noexcept {
  uvbus::steady_alloc_test::note_allocation();
  return std::malloc(n != 0 ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& /*tag*/) noexcept {
  uvbus::steady_alloc_test::note_allocation();
  return std::malloc(n != 0 ? n : 1);
}
void* operator new(size_t n, std::align_val_t a) {
  return uvbus::steady_alloc_test::counted_new_aligned(n, a);
}
void* operator new[](size_t n, std::align_val_t a) {
  return uvbus::steady_alloc_test::counted_new_aligned(n, a);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t /*n*/) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t /*n*/) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t /*a*/) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t /*a*/) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t /*n*/, std::align_val_t /*a*/) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t /*n*/, std::align_val_t /*a*/) noexcept {
  std::free(p);
}

namespace uvbus::steady_alloc_test {

#ifdef UVBUS_TEST_MALLOC_HOOKS
// C allocations too (libuv's, OpenSSL's, the library's malloc calls). operator new above goes
// through malloc, so a C++ allocation counts twice under a sanitizer (the bounds allow for it).
void malloc_hook(const volatile void* /*p*/, size_t /*n*/) {
  note_allocation();
}
void free_hook(const volatile void* /*p*/) {}
const bool hooks_installed = __sanitizer_install_malloc_and_free_hooks(malloc_hook, free_hook) != 0;
#endif

// A stream channel that listens on loopback TCP and connects to itself; counts what it receives.
struct stream_pair {
  uv_loop_t* loop;
  size_t max = kSmall;    // the largest payload
  size_t batch = kBatch;  // messages a round
  uint64_t received = 0;
  uint64_t bad = 0;  // messages out of order or of the wrong size
  connection_id out{};
  bool connected = false;
  std::unique_ptr<stream_channel> ch;

  stream_pair(uv_loop_t* l, const stream_config& cfg) : loop(l) {
    stream_callbacks cb;
    cb.on_connected = [this](connection_id, errc st) { connected = st == errc::ok; };
    cb.on_received = [this](connection_id, const uint8_t* p, size_t n) {
      uint64_t seq = 0;
      std::memcpy(&seq, p, sizeof seq);
      bad += (n != payload_size(seq, max) || seq != received) ? 1 : 0;
      ++received;
    };
    ch = std::make_unique<stream_channel>(loop, cfg, cb);
  }
  void connect() {
    listener_id lid{};
    ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &lid), errc::ok);
    const std::string url = "ipv4://127.0.0.1:" + std::to_string(ch->listener_port(lid));
    ASSERT_EQ(ch->connect(url, &out), errc::ok);
    ASSERT_TRUE(test::run_until(
        loop, [&] { return connected; }, kDeadline));
  }
  // The allocations of kCountedRounds batches through the channel.
  uint64_t measure_sends() {
    payloads pl;
    uint64_t sent = 0;
    const uint64_t counted = measure(
        loop,
        [&](uint64_t i) {
          size_t n = 0;
          const uint8_t* p = pl.make(i, &n, max);
          return ch->send(out, p, n) == errc::ok;
        },
        [&](uint64_t want) { return received == want; }, &sent, batch);
    EXPECT_EQ(sent, batch * (kWarmRounds + kCountedRounds)) << "every send was taken";
    EXPECT_EQ(bad, 0U);
    return counted;
  }
};

TEST(SteadyAlloc, StreamChannelOverTcpAllocatesNothingPerMessage) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    stream_pair s(&loop, stream_config{});
    ASSERT_NO_FATAL_FAILURE(s.connect());
    const uint64_t counted = s.measure_sends();
    EXPECT_LE(counted, kAllowed) << counted << " allocations for " << kBatch * kCountedRounds
                                 << " messages over TCP";
    s.ch->close();
  }
  EXPECT_EQ(close_loop(&loop), 0);
}

// Frames of 8-16384 bytes, 100 a round (20 counted rounds: 2 000 messages, 16 MB): reads cut
// frames, and the decoder's buffer for a cut frame is reused, not allocated again for each. A
// round's last read ends at a frame boundary, so the connection gives the buffer up (a quiet
// connection holds no receive memory), parked as the thread's spare, and the next round's first
// cut frame takes it back. Allowed: 10 in the 20 rounds (2 counted under ASan on 2026-12-07; 102
// when the buffer was freed at each boundary and grew again, doubling, every round; one per
// message would count 2 000 or more).
TEST(SteadyAlloc, LargeFramesOverTcpAllocateNothingPerMessage) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    stream_pair s(&loop, stream_config{});
    s.max = kLarge;
    s.batch = 100;
    ASSERT_NO_FATAL_FAILURE(s.connect());
    const uint64_t counted = s.measure_sends();
    EXPECT_LE(counted, static_cast<uint64_t>(kCountedRounds) / 2)
        << counted << " allocations for " << s.batch * kCountedRounds << " frames of 8-16384 B";
    s.ch->close();
  }
  EXPECT_EQ(close_loop(&loop), 0);
}

// The counter sees the library's own malloc calls: a send queue in dynamic mode allocates one
// block per message (uvbus/queue_config.h), and the count shows every one of them.
TEST(SteadyAlloc, TheCounterSeesAnAllocationPerMessage) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    stream_config cfg;
    cfg.queue.mode = queue_mode::dynamic;
    cfg.queue.max_bytes = size_t{4} << 20;
    cfg.queue.max_blocks = 4 * kBatch;
    stream_pair s(&loop, cfg);
    ASSERT_NO_FATAL_FAILURE(s.connect());
    const uint64_t counted = s.measure_sends();
#ifdef UVBUS_TEST_MALLOC_HOOKS
    EXPECT_GE(counted, kBatch * kCountedRounds) << "the dynamic queue's mallocs were not counted";
#else
    // Without a sanitizer only operator new is counted: the queue's std::malloc is not seen.
    EXPECT_EQ(counted, 0U);
#endif
    s.ch->close();
  }
  EXPECT_EQ(close_loop(&loop), 0);
}

// Records through a region: a reader on the loop and a writer that sends one message per call,
// coalescing them per loop turn (as a bus node writes) or publishing each at once.
void measure_shm(bool coalescing) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    uint64_t received = 0;
    uint64_t bad = 0;
    shm_reader r({[&](const shm_record* recs, size_t n) {
      for (size_t k = 0; k < n; ++k) {
        uint64_t seq = 0;
        std::memcpy(&seq, recs[k].data, sizeof seq);
        bad += (recs[k].size != payload_size(seq) || seq != received) ? 1 : 0;
        ++received;
      }
    }});
    const std::string url = "shm://" + test::unique_name("steady-alloc");
    shm_config cfg;
    cfg.ring_bytes = size_t{1} << 20;
    ASSERT_EQ(r.open(url, cfg), errc::ok);
    ASSERT_EQ(r.start(&loop), errc::ok);
    shm_writer w;
    ASSERT_EQ(w.open(url), errc::ok);
    if (coalescing) {
      ASSERT_EQ(w.coalesce(&loop), errc::ok);
    }
    payloads pl;
    uint64_t sent = 0;
    const uint64_t counted = measure(
        &loop,
        [&](uint64_t i) {
          size_t n = 0;
          const uint8_t* p = pl.make(i, &n);
          return w.send(p, n) == errc::ok;
        },
        [&](uint64_t want) { return received == want; }, &sent);
    EXPECT_EQ(sent, kBatch * (kWarmRounds + kCountedRounds)) << "every send was taken";
    EXPECT_EQ(bad, 0U);
    EXPECT_LE(counted, kAllowed) << counted << " allocations for " << kBatch * kCountedRounds
                                 << " records" << (coalescing ? " (coalescing writer)" : "");
    EXPECT_EQ(w.close(), 0U);
    r.close();  // removes the region
  }
  EXPECT_EQ(close_loop(&loop), 0);
}

TEST(SteadyAlloc, ShmRingAllocatesNothingPerRecord) {
  measure_shm(false);
}
TEST(SteadyAlloc, ShmCoalescingWriterAllocatesNothingPerRecord) {
  measure_shm(true);
}

}  // namespace uvbus::steady_alloc_test
