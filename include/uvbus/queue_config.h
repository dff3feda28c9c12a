// Send-queue configuration: how a stream connection bounds the packets waiting for its socket.
// The queue itself is internal; this is the part of it a user configures (stream_config::queue).
#pragma once

#include <cstddef>
#include <cstdint>

namespace uvbus {

// static_ring: a ring of at most ring_bytes, allocated on the connection's first send at
// ring_initial_bytes and doubled on demand (a few times per connection, never per message, never
// shrunk while in use) up to ring_bytes (the stream channel hands a drained ring of the initial
// size back at once, to a per-thread pool if it is 16 KiB or less, else to the allocator, and
// takes one again on the next send; it frees a grown ring once its queue has been idle for
// stream_config::send_ring_idle_ms); a block (one whole frame) is
// always contiguous and never wraps; a full ring of ring_bytes refuses (queue_full). dynamic: one
// allocation per frame, bounded by max_bytes and max_blocks. Any other value (an integer cast from
// a config file) is an invalid config (stream_channel::validate: invalid_argument).
enum class queue_mode : uint8_t { static_ring, dynamic };

struct write_queue_config {
  queue_mode mode = queue_mode::static_ring;
  // static_ring: the ring's size, 64 to SIZE_MAX / 2. Each block costs its size rounded up to 8
  // plus 16 bytes.
  size_t ring_bytes = size_t{2} * 1024 * 1024;
  // static_ring: the first allocation, rounded up to 8 bytes and at least 64 (or the power of two
  // that holds the first frame, if larger). A connection that only ever sends small messages (a
  // handshake, heartbeats) holds this much, not ring_bytes. Growing copies the queued frames once
  // into the larger ring. 0, or ring_bytes or more: the whole ring at once, never reallocated.
  size_t ring_initial_bytes = size_t{4} * 1024;
  // Limits in both modes: payload bytes held (block sizes, without overhead) and number of blocks.
  // 0 means "no limit beyond the ring" (static) — dynamic mode requires both to be non-zero.
  size_t max_bytes = size_t{2} * 1024 * 1024;
  size_t max_blocks = 65536;
};

}  // namespace uvbus
