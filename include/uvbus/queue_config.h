// Send-queue configuration: how a stream connection bounds the packets waiting for its socket.
// The queue itself is internal; this is the part of it a user configures (stream_config::queue).
#pragma once

#include <cstddef>
#include <cstdint>

namespace uvbus {

// static_ring: one allocation of ring_bytes, made on the connection's first send; a block (one
// whole frame) is always contiguous and never wraps; a full ring refuses (queue_full), it never
// reallocates. dynamic: one allocation per frame, bounded by max_bytes and max_blocks.
enum class queue_mode : uint8_t { static_ring, dynamic };

struct write_queue_config {
  queue_mode mode = queue_mode::static_ring;
  // static_ring: the ring's size. Each block costs its size rounded up to 8 plus 16 bytes.
  size_t ring_bytes = size_t{2} * 1024 * 1024;
  // Limits in both modes: payload bytes held (block sizes, without overhead) and number of blocks.
  // 0 means "no limit beyond the ring" (static) — dynamic mode requires both to be non-zero.
  size_t max_bytes = size_t{2} * 1024 * 1024;
  size_t max_blocks = 65536;
};

}  // namespace uvbus
