// Write queue: a FIFO of variable-size byte blocks, the per-connection send queue of the stream
// channel. Two modes:
//
//  * static_ring: a ring allocated by the first reserve() (ring_initial_bytes, or the power of two
//    that holds the first block) and grown by doubling, up to ring_bytes, when a block does not
//    fit: the queued blocks are copied into the new ring in order. A block is always contiguous
//    (it never wraps); when the tail has no room for it the block starts again at offset 0. A full
//    ring of ring_bytes makes reserve() fail.
//  * dynamic: one allocation per block, bounded by max_bytes and max_blocks.
//
// Each block carries a 64-bit tag chosen by the producer (the stream channel stores the frame's
// payload size there). Not thread-safe: one owner thread.
//
// Sealing: the queue remembers which blocks were reserved since they were last handed out by
// take_unsealed(), so a producer can finish blocks in batches after filling them (the stream
// channel writes frame checksums 16 frames at a time) and must do so before anything reads them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "uvbus/error.h"
#include "uvbus/queue_config.h"

namespace uvbus {

class write_queue {
 public:
  struct block {
    uint8_t* data;
    size_t size;
    uint64_t tag;
  };

  // An invalid config (a mode outside the enum, zero ring, dynamic without limits) yields a queue
  // whose every reserve() fails with invalid_argument; validate() tells ahead of time.
  explicit write_queue(const write_queue_config& cfg = {});
  ~write_queue();
  write_queue(const write_queue&) = delete;
  write_queue& operator=(const write_queue&) = delete;

  // The largest ring_bytes validate() takes: rounded up to 8, a size near SIZE_MAX wrapped.
  static constexpr size_t kMaxRingBytes = SIZE_MAX / 2;
  [[nodiscard]] static errc validate(const write_queue_config& cfg) noexcept;

  // Appends a block of n bytes (n may be 0) and returns a pointer to its storage, which the caller
  // fills before the block is read. On failure returns nullptr and sets *err (if given) to
  // queue_full (no room now), message_too_large (n can never fit) or no_memory (the ring could not
  // be allocated or grown). Growing moves the queued blocks, but the memory they were read from
  // (a write in flight) stays valid until release_retired().
  // The common case (a static ring with blocks queued, within the limits, room right after the
  // tail) is inline; the rest is reserve_slow().
  [[nodiscard]] uint8_t* reserve(size_t n, uint64_t tag = 0, errc* err = nullptr) noexcept {
    // n < fast_n_ (the ring's size) keeps the sums from overflowing. The end of the room is the
    // ring's end, or the head once the tail has wrapped.
    if (n < fast_n_ && count_ != 0 && bytes_ + n <= byte_limit_ && count_ < block_limit_) {
      const size_t end = wrap_at_ == 0 ? cap_ : head_;
      if (tail_ + ring_stride(n) <= end) return push_ring(tail_, wrap_at_, n, tag);
    }
    return reserve_slow(n, tag, err);
  }

  // Frees the rings a growth replaced. Call it when no pointer into an older block is in use (no
  // write in flight); without a call they live until the queue is destroyed.
  void release_retired() noexcept;
  // Whether a growth left rings for release_retired().
  [[nodiscard]] bool has_retired() const noexcept { return retired_ != nullptr; }

  // An empty static ring of its initial size (ring_initial_bytes rounded up to 8, at least 64
  // bytes) hands its memory back (to the thread's buffer pool up to 16 KiB, see buffer_pool.h;
  // freed above); the next reserve() takes a ring again. Rings that grew are kept (their
  // connection bursts) unless grown_too (the owner's idle sweep); a ring allocated whole
  // (ring_initial_bytes 0 or >= ring_bytes) is always kept. Also frees retired rings, so the same
  // rule as release_retired() applies: no write may be reading the queue. Returns true if memory
  // was released.
  bool release_storage(bool grown_too = false) noexcept;

  // Removes the most recently reserved block (only valid right after reserve(), before any other
  // block was pushed). Lets a producer undo a reservation when a later step fails.
  void unreserve_back() noexcept;

  // Blocks reserved and not yet handed out by take_unsealed(), oldest first.
  [[nodiscard]] size_t unsealed() const noexcept { return unsealed_count_; }
  // Writes up to max of the oldest unsealed blocks to out and counts them as sealed; returns how
  // many. The caller finishes them (they are queued blocks: writable until popped).
  size_t take_unsealed(block* out, size_t max) noexcept;
  // Counts the newest block as sealed when it is the only unsealed one (the caller finished it
  // at once); otherwise nothing changes.
  void seal_newest() noexcept {
    if (unsealed_count_ == 1) unsealed_count_ = 0;
  }

  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  [[nodiscard]] size_t size() const noexcept { return count_; }
  // Payload bytes held (sum of block sizes).
  [[nodiscard]] size_t bytes() const noexcept { return bytes_; }

  // The oldest block. Precondition: !empty().
  [[nodiscard]] block front() const noexcept;
  void pop_front() noexcept;

  // Copies whole blocks from the front, in order, into [dst, dst + cap) without removing them: it
  // stops before the first block that does not fit, whose size is max_block or more, or that lies
  // across the ring's wrap point (a static ring's blocks after the wrap are not merged with those
  // before it). Returns the bytes copied; *blocks gets how many blocks they were. The blocks stay
  // queued: the caller pops them once the write that carries them completes.
  // *span (if given) gets what pop_front_n() needs to pop them all at once, and *tag_sum (if
  // given) the sum of their tags (the stream channel's tag is a frame's payload size, so this is
  // the payload bytes merged without reading the frames again).
  // It may write anywhere in [dst, dst + cap), past the bytes it reports copied too.
  size_t merge_front(uint8_t* dst, size_t cap, size_t max_block, size_t* blocks,
                     size_t* span = nullptr, uint64_t* tag_sum = nullptr) const noexcept;
  // Pops the n front blocks that the last merge_front() reported (n blocks, `bytes` copied, *span
  // `span`), with nothing popped since: one step in a static ring instead of n.
  void pop_front_n(size_t n, size_t bytes, size_t span) noexcept;

  // Visits the first n blocks from the front (n <= size()) without removing them.
  template <class F>
  void for_each_front(size_t n, F&& f) const {
    cursor c = begin();
    for (size_t i = 0; i < n; ++i) {
      f(at(c));
      c = advance(c);
    }
  }

  [[nodiscard]] queue_mode mode() const noexcept { return cfg_.mode; }
  // What a static ring of `ring` bytes allocates: the ring, a 16-byte prefix and the slack of the
  // merge's fixed-size copies (merge_front). Rings up to 16 KiB come from the thread's buffer_pool
  // of this size.
  [[nodiscard]] static size_t ring_storage_bytes(size_t ring) noexcept;

  // Bytes allocated by the queue itself (the ring and the rings not yet released, or the blocks in
  // dynamic mode).
  [[nodiscard]] size_t memory_bytes() const noexcept;

 private:
  struct dyn_block;
  // Header in front of every block of the static ring. 16 bytes keeps block data 8-byte aligned.
  struct ring_header {
    uint64_t size;
    uint64_t tag;
  };
  static_assert(sizeof(ring_header) == 16, "ring block header must stay 16 bytes");
  static constexpr size_t align8(size_t n) noexcept { return (n + 7) & ~static_cast<size_t>(7); }
  // A block's room in the ring: its header and its data rounded up to 8 bytes.
  static constexpr size_t ring_stride(size_t n) noexcept { return sizeof(ring_header) + align8(n); }
  uint8_t* reserve_slow(size_t n, uint64_t tag, errc* err) noexcept;
  // The size of a first ring that did not have to grow (release_storage() hands it back).
  [[nodiscard]] size_t initial_cap() const noexcept;
  // A position: a byte offset in the ring, or a node pointer in dynamic mode.
  struct cursor {
    size_t off;
    dyn_block* node;
  };
  [[nodiscard]] cursor begin() const noexcept;
  [[nodiscard]] block at(cursor c) const noexcept;
  [[nodiscard]] cursor advance(cursor c) const noexcept;
  // Where a block of `need` ring bytes goes in the current ring: false when it does not fit now.
  bool place(size_t need, size_t* at, size_t* new_wrap) const noexcept;
  // merge_front() of a static ring (by offset, small blocks by a fixed-size copy).
  size_t merge_ring(uint8_t* dst, size_t cap, size_t max_block, size_t* blocks, size_t* span,
                    uint64_t* tag_sum) const noexcept;
  // Appends a block of n bytes at offset `at` of the ring (new_wrap: wrap_at_ after it).
  uint8_t* push_ring(size_t at, size_t new_wrap, size_t n, uint64_t tag) noexcept {
    prev_tail_ = tail_;
    prev_wrap_ = wrap_at_;
    wrap_at_ = new_wrap;
    last_off_ = at;
    tail_ = at + ring_stride(n);
    const ring_header h{n, tag};
    std::memcpy(ring_ + at, &h, sizeof h);
    ++count_;
    bytes_ += n;
    if (unsealed_count_++ == 0) unsealed_ = {at, nullptr};
    return ring_ + at + sizeof(ring_header);
  }
  // Moves the queued blocks into a larger ring that also holds `need` more bytes.
  errc grow(size_t need) noexcept;

  write_queue_config cfg_;
  bool valid_ = false;
  // reserve()'s fast path: taken for n below fast_n_ (the ring's size; 0 turns it off: dynamic
  // mode or an invalid config) within the limits (SIZE_MAX where the config sets none).
  size_t fast_n_ = 0;
  size_t byte_limit_ = SIZE_MAX;
  size_t block_limit_ = SIZE_MAX;
  size_t count_ = 0;
  size_t bytes_ = 0;
  // The oldest unsealed block (valid while unsealed_count_ != 0) and how many follow from it.
  cursor unsealed_{0, nullptr};
  size_t unsealed_count_ = 0;
  // static ring: ring_ points kRingPrefix bytes into its allocation, whose prefix chains the rings
  // retired by grow() (retired_, retired_bytes_) until release_retired().
  uint8_t* ring_ = nullptr;
  size_t cap_ = 0;  // the ring's size now (0: not allocated yet)
  uint8_t* retired_ = nullptr;
  size_t retired_bytes_ = 0;
  size_t head_ = 0;       // offset of the oldest block
  size_t tail_ = 0;       // offset where the next block goes
  size_t wrap_at_ = 0;    // when the tail has wrapped: where the blocks before the wrap end
  size_t last_off_ = 0;   // offset of the newest block (for unreserve_back)
  size_t prev_tail_ = 0;  // tail before the newest block was reserved
  size_t prev_wrap_ = 0;
  // dynamic
  dyn_block* first_ = nullptr;
  dyn_block* last_ = nullptr;
  dyn_block* before_last_ = nullptr;
};

namespace detail {
// Tests only: the next n ring allocations of any write_queue (a first ring, a growth) fail as if
// memory had run out. Process-wide.
void fail_next_ring_alloc(int n) noexcept;
}  // namespace detail

}  // namespace uvbus
