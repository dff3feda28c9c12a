// The steady-state allocation tests' shared part (steady_alloc_test.cpp, steady_alloc_bus_test.cpp,
// one binary): the counter, the rounds, the payloads. steady_alloc_test.cpp replaces the global
// operator new (and hooks the sanitizer's malloc) to feed the counter.
#pragma once

#include <gtest/gtest.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "test_util.h"

namespace uvbus::test::steady_alloc {

using namespace std::chrono_literals;

// Set only on the threads that send or run the loop, only while a measured stretch runs:
// allocations of other threads (gtest's, the sanitizer runtime's) and of the setup are not counted.
inline thread_local bool counting = false;
inline std::atomic<uint64_t> allocations{0};  // every counting thread's

constexpr size_t kBatch = 1000;     // messages sent per loop turn
constexpr int kWarmRounds = 10;     // before counting: rings, pools and buffers at their size
constexpr int kCountedRounds = 20;  // 20 000 messages counted
// Allocations allowed in the counted rounds: one per 100 messages. What is not per message still
// happens now and then: a node's housekeeping tick (every 5-250 ms) builds a few vectors, and a
// batch of reports larger than any before grows the vector that holds them. One allocation per
// message would count at least 20 000 (40 000 under a sanitizer: operator new and malloc).
constexpr uint64_t kAllowed = kBatch * kCountedRounds / 100;
constexpr auto kDeadline = 60000ms;  // a sanitizer build on a busy machine

// The payload of message i: 8..max bytes (small: 128), its sequence number first.
constexpr size_t kSmall = 128;
constexpr size_t kLarge = 16384;
inline size_t payload_size(uint64_t i, size_t max = kSmall) {
  return 8 + static_cast<size_t>((i * 2654435761U) % (max - 7));
}

struct payloads {
  uint8_t bytes[kLarge] = {};
  const uint8_t* make(uint64_t i, size_t* n, size_t max = kSmall) {
    *n = payload_size(i, max);
    std::memcpy(bytes, &i, sizeof i);
    std::memset(bytes + 8, static_cast<int>(i & 0xff), *n - 8);
    return bytes;
  }
};

// Runs the loop until every handle is closed (or the deadline passes); uv_loop_close()'s result.
inline int close_loop(uv_loop_t* loop) {
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (uv_loop_alive(loop) != 0 && std::chrono::steady_clock::now() < end) {
    uv_run(loop, UV_RUN_NOWAIT);
  }
  return uv_loop_close(loop);
}

// Sends kWarmRounds and then kCountedRounds batches of `batch` messages, message i through
// send_one(i) (false: refused, the batch ends there), and after each batch runs the loop until
// done(messages accepted so far) holds. Returns the allocations made during the counted rounds;
// *sent gets the messages accepted. A deadline fails the test.
template <class SendOne, class Done>
uint64_t measure(uv_loop_t* loop, SendOne&& send_one, Done&& done, uint64_t* sent,
                 size_t batch = kBatch) {
  uint64_t counted = 0;
  *sent = 0;
  for (int r = 0; r < kWarmRounds + kCountedRounds; ++r) {
    if (r == kWarmRounds) {
      allocations = 0;
      counting = true;
    }
    for (size_t i = 0; i < batch && send_one(*sent); ++i) ++*sent;
    const uint64_t want = *sent;
    const bool ok = test::run_until(
        loop, [&] { return done(want); }, kDeadline);
    if (!ok) {
      counting = false;
      ADD_FAILURE() << "round " << r << ": not done within the deadline, " << want << " sent";
      return UINT64_MAX;
    }
  }
  counting = false;
  counted = allocations.load();
  return counted;
}

}  // namespace uvbus::test::steady_alloc
