// write_queue: the ring's and the dynamic mode's slow paths, growth, merging and popping.
#include "core/write_queue.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/buffer_pool.h"

namespace uvbus {
namespace {

// In front of every ring allocation: the link of the list of retired rings (16 bytes keep the ring
// 8-byte aligned). Never inside the ring, so a write still reading a retired block is unaffected.
struct ring_prefix {
  uint8_t* next;  // the next retired ring (its ring pointer)
  size_t size;    // this ring's size
};
static_assert(sizeof(ring_prefix) == 16, "ring prefix must stay 16 bytes");

ring_prefix* prefix_of(uint8_t* ring) noexcept {
  return reinterpret_cast<ring_prefix*>(ring - sizeof(ring_prefix));
}

// Rings up to this size come from (and go back to) the thread's buffer_pool for their size: a
// connection's small ring is handed back whenever its queue drains (release_storage) and the next
// connection that sends takes it again, without malloc.
constexpr size_t kPooledRingMax = size_t{16} * 1024;

// Blocks up to this size are merged by a copy of this many bytes whatever their size (fixed 16-byte
// moves, no branch on the size): a memcpy of a random small size mispredicts its size classes,
// which cost more than the copy (docs/stream.md, "Write path"). Every ring is allocated this many
// bytes longer, so that the fixed copy of a block at the ring's end stays inside the allocation;
// the bytes it copies past the block are scratch that later blocks overwrite, or past the merge.
constexpr size_t kFixedCopy = 160;

// Copies kFixedCopy bytes from src (a ring block: the ring's slack keeps them readable) to dst.
inline void fixed_copy(uint8_t* dst, const uint8_t* src) noexcept {
  for (size_t k = 0; k < kFixedCopy; k += 16) {
    uint8_t w[16];
    std::memcpy(w, src + k, 16);
    std::memcpy(dst + k, w, 16);
  }
}

std::atomic<int> g_fail_ring_allocs{0};

uint8_t* alloc_ring(size_t size) noexcept {
  if (g_fail_ring_allocs.load(std::memory_order_relaxed) > 0 &&
      g_fail_ring_allocs.fetch_sub(1, std::memory_order_relaxed) > 0) {
    return nullptr;
  }
  const size_t total = write_queue::ring_storage_bytes(size);
  buffer_pool* pool = size <= kPooledRingMax ? buffer_pool::local(total) : nullptr;
  auto* mem = pool != nullptr ? pool->acquire() : static_cast<uint8_t*>(std::malloc(total));
  if (mem == nullptr) return nullptr;
  reinterpret_cast<ring_prefix*>(mem)->size = size;
  return mem + sizeof(ring_prefix);
}

void free_ring(uint8_t* ring) noexcept {
  if (ring == nullptr) return;
  uint8_t* mem = ring - sizeof(ring_prefix);
  const size_t size = reinterpret_cast<ring_prefix*>(mem)->size;
  buffer_pool* pool =
      size <= kPooledRingMax ? buffer_pool::local(write_queue::ring_storage_bytes(size)) : nullptr;
  if (pool != nullptr) {
    pool->release(mem);
  } else {
    std::free(mem);
  }
}

// The smallest ring grow() allocates.
constexpr size_t kSmallestRing = 64;

size_t pow2_at_least(size_t n) noexcept {
  size_t p = kSmallestRing;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

void detail::fail_next_ring_alloc(int n) noexcept {
  g_fail_ring_allocs.store(n, std::memory_order_relaxed);
}

struct write_queue::dyn_block {
  dyn_block* next;
  size_t size;
  uint64_t tag;
  // The data follows the struct; aligned to 8 by the struct's own alignment.
  uint8_t* data() noexcept { return reinterpret_cast<uint8_t*>(this + 1); }
};

size_t write_queue::ring_storage_bytes(size_t ring) noexcept {
  return sizeof(ring_prefix) + ring + kFixedCopy;
}

errc write_queue::validate(const write_queue_config& cfg) noexcept {
  // A mode outside the enum (an integer read from a config file) would be neither: its blocks
  // would go into a ring that merge_front() never reads, and a merged flush would loop for ever.
  if (cfg.mode != queue_mode::static_ring && cfg.mode != queue_mode::dynamic) {
    return errc::invalid_argument;
  }
  if (cfg.mode == queue_mode::static_ring) {
    // Rounded up to 8 (and a prefix added for the allocation), a size near SIZE_MAX wrapped.
    if (cfg.ring_bytes < 64 || cfg.ring_bytes > kMaxRingBytes) return errc::invalid_argument;
  } else if (cfg.max_bytes == 0 || cfg.max_blocks == 0) {
    return errc::invalid_argument;
  }
  return errc::ok;
}

write_queue::write_queue(const write_queue_config& cfg) : cfg_(cfg) {
  valid_ = validate(cfg) == errc::ok;
  if (valid_ && cfg_.mode == queue_mode::static_ring) {
    cfg_.ring_bytes = align8(cfg_.ring_bytes);
    fast_n_ = cfg_.ring_bytes;
    if (cfg_.max_bytes != 0) byte_limit_ = cfg_.max_bytes;
    if (cfg_.max_blocks != 0) block_limit_ = cfg_.max_blocks;
  }
}

write_queue::~write_queue() {
  release_retired();
  free_ring(ring_);
  while (first_ != nullptr) {
    dyn_block* next = first_->next;
    std::free(first_);
    first_ = next;
  }
}

size_t write_queue::memory_bytes() const noexcept {
  if (cfg_.mode == queue_mode::static_ring) return cap_ + retired_bytes_;
  return bytes_ + count_ * sizeof(dyn_block);
}

// What grow() makes of ring_initial_bytes for a first block that fits it: at least the smallest
// ring, at most the whole one, rounded up to 8 (4100 -> 4104, 1 -> 64).
size_t write_queue::initial_cap() const noexcept {
  return align8(std::min(std::max(cfg_.ring_initial_bytes, kSmallestRing), cfg_.ring_bytes));
}

bool write_queue::release_storage(bool grown_too) noexcept {
  if (cfg_.mode != queue_mode::static_ring || count_ != 0 || ring_ == nullptr) return false;
  // A ring allocated whole is kept: its owner asked for no reallocation (a first ring that comes
  // out as large as the whole one, ring_initial_bytes 4100 of a ring_bytes 4100 rounded to 4104,
  // is one too).
  if (cfg_.ring_initial_bytes == 0 || initial_cap() >= cfg_.ring_bytes) return false;
  if (cap_ > initial_cap() && !grown_too) return false;
  release_retired();
  free_ring(ring_);
  ring_ = nullptr;
  cap_ = 0;
  head_ = tail_ = wrap_at_ = last_off_ = prev_tail_ = prev_wrap_ = 0;
  return true;
}

void write_queue::release_retired() noexcept {
  while (retired_ != nullptr) {
    uint8_t* next = prefix_of(retired_)->next;
    free_ring(retired_);
    retired_ = next;
  }
  retired_bytes_ = 0;
}

bool write_queue::place(size_t need, size_t* at, size_t* new_wrap) const noexcept {
  *new_wrap = wrap_at_;
  if (count_ == 0) {
    *at = 0;
    *new_wrap = 0;
    return need <= cap_;
  }
  if (wrap_at_ == 0) {
    // Blocks occupy [head_, tail_). Room at the end, else start again at 0 before head_.
    if (tail_ + need <= cap_) {
      *at = tail_;
      return true;
    }
    if (need <= head_) {
      *at = 0;
      *new_wrap = tail_;
      return true;
    }
    return false;
  }
  // Wrapped: blocks occupy [head_, wrap_at_) and [0, tail_).
  *at = tail_;
  return tail_ + need <= head_;
}

errc write_queue::grow(size_t need) noexcept {
  size_t used = 0;
  for_each_front(count_, [&](const block& b) { used += ring_stride(b.size); });
  if (used + need > cfg_.ring_bytes) return errc::queue_full;  // the largest ring would refuse too
  size_t cap = cap_ == 0 ? cfg_.ring_initial_bytes : cap_ * 2;
  cap = std::max(cap, pow2_at_least(used + need));
  if (cap_ == 0 && cfg_.ring_initial_bytes == 0) cap = cfg_.ring_bytes;
  cap = align8(std::min(cap, cfg_.ring_bytes));
  uint8_t* next = alloc_ring(cap);
  if (next == nullptr) return errc::no_memory;
  size_t off = 0;
  size_t index = 0;
  const size_t first_unsealed = count_ - unsealed_count_;
  for_each_front(count_, [&](const block& b) {
    if (index++ == first_unsealed) unsealed_ = {off, nullptr};
    const size_t stride = ring_stride(b.size);
    std::memcpy(next + off, b.data - sizeof(ring_header), stride);
    off += stride;
  });
  if (ring_ != nullptr && count_ == 0) {
    free_ring(ring_);  // nothing queued: nothing can still read it
  } else if (ring_ != nullptr) {
    prefix_of(ring_)->next = retired_;
    prefix_of(ring_)->size = cap_;
    retired_ = ring_;
    retired_bytes_ += cap_;
  }
  ring_ = next;
  cap_ = cap;
  head_ = 0;
  tail_ = off;
  wrap_at_ = 0;
  return errc::ok;
}

// reserve() beyond its inline common case: errors, dynamic mode, the wrap and growth.
uint8_t* write_queue::reserve_slow(size_t n, uint64_t tag, errc* err) noexcept {
  auto failed = [err](errc e) -> uint8_t* {
    if (err != nullptr) *err = e;
    return nullptr;
  };
  if (!valid_) return failed(errc::invalid_argument);
  if (cfg_.max_bytes != 0 && n > cfg_.max_bytes) return failed(errc::message_too_large);
  if ((cfg_.max_bytes != 0 && bytes_ + n > cfg_.max_bytes) ||
      (cfg_.max_blocks != 0 && count_ >= cfg_.max_blocks)) {
    return failed(errc::queue_full);
  }

  if (cfg_.mode == queue_mode::dynamic) {
    auto* b = static_cast<dyn_block*>(std::malloc(sizeof(dyn_block) + n));
    if (b == nullptr) return failed(errc::no_memory);
    b->next = nullptr;
    b->size = n;
    b->tag = tag;
    before_last_ = last_;
    if (last_ != nullptr) {
      last_->next = b;
    } else {
      first_ = b;
    }
    last_ = b;
    ++count_;
    bytes_ += n;
    if (unsealed_count_++ == 0) unsealed_ = {0, b};
    return b->data();
  }

  const size_t need = ring_stride(n);
  if (need > cfg_.ring_bytes) return failed(errc::message_too_large);
  size_t at = 0;
  size_t new_wrap = 0;
  if (!place(need, &at, &new_wrap)) {
    if (cap_ >= cfg_.ring_bytes) return failed(errc::queue_full);
    const errc e = grow(need);
    if (e != errc::ok) return failed(e);
    if (!place(need, &at, &new_wrap)) return failed(errc::queue_full);
  }
  if (count_ == 0) head_ = 0;
  return push_ring(at, new_wrap, n, tag);
}

void write_queue::unreserve_back() noexcept {
  if (count_ == 0) return;
  if (unsealed_count_ != 0) --unsealed_count_;
  if (cfg_.mode == queue_mode::dynamic) {
    dyn_block* b = last_;
    bytes_ -= b->size;
    --count_;
    last_ = before_last_;
    before_last_ = nullptr;
    if (last_ != nullptr) {
      last_->next = nullptr;
    } else {
      first_ = nullptr;
    }
    std::free(b);
    return;
  }
  ring_header h{};
  std::memcpy(&h, ring_ + last_off_, sizeof h);
  bytes_ -= h.size;
  --count_;
  tail_ = prev_tail_;
  wrap_at_ = prev_wrap_;
  if (count_ == 0) head_ = tail_ = wrap_at_ = 0;
}

write_queue::cursor write_queue::begin() const noexcept {
  return {head_, first_};
}

write_queue::block write_queue::at(cursor c) const noexcept {
  if (cfg_.mode == queue_mode::dynamic) return {c.node->data(), c.node->size, c.node->tag};
  ring_header h{};
  std::memcpy(&h, ring_ + c.off, sizeof h);
  return {ring_ + c.off + sizeof(ring_header), static_cast<size_t>(h.size), h.tag};
}

write_queue::cursor write_queue::advance(cursor c) const noexcept {
  if (cfg_.mode == queue_mode::dynamic) return {0, c.node->next};
  ring_header h{};
  std::memcpy(&h, ring_ + c.off, sizeof h);
  size_t next = c.off + ring_stride(h.size);
  if (wrap_at_ != 0 && next == wrap_at_) next = 0;
  return {next, nullptr};
}

write_queue::block write_queue::front() const noexcept {
  return at(begin());
}

size_t write_queue::take_unsealed(block* out, size_t max) noexcept {
  const size_t n = std::min(max, unsealed_count_);
  for (size_t i = 0; i < n; ++i) {
    out[i] = at(unsealed_);
    unsealed_ = advance(unsealed_);
  }
  unsealed_count_ -= n;
  return n;
}

void write_queue::pop_front() noexcept {
  if (count_ == 0) return;
  // Popping an unsealed block (a queue dropped unfinished) moves the oldest unsealed one on.
  if (unsealed_count_ == count_) {
    --unsealed_count_;
    if (unsealed_count_ != 0) unsealed_ = advance(begin());
  }
  if (cfg_.mode == queue_mode::dynamic) {
    dyn_block* b = first_;
    first_ = b->next;
    if (first_ == nullptr) last_ = nullptr;
    if (before_last_ == b) before_last_ = nullptr;
    bytes_ -= b->size;
    --count_;
    std::free(b);
    return;
  }
  const block b = front();
  bytes_ -= b.size;
  --count_;
  if (count_ == 0) {
    head_ = tail_ = wrap_at_ = 0;
    return;
  }
  head_ += ring_stride(b.size);
  if (wrap_at_ != 0 && head_ == wrap_at_) {
    head_ = 0;
    wrap_at_ = 0;
    // The wrap is gone for good: an unreserve_back() of the newest block must not bring it back
    // (a stale wrap_at_ makes the ring refuse every block until it drains).
    prev_wrap_ = 0;
  }
}

size_t write_queue::merge_front(uint8_t* dst, size_t cap, size_t max_block, size_t* blocks,
                                size_t* span, uint64_t* tag_sum) const noexcept {
  if (cfg_.mode == queue_mode::static_ring) {
    return merge_ring(dst, cap, max_block, blocks, span, tag_sum);
  }
  size_t copied = 0;
  size_t n = 0;
  uint64_t tags = 0;
  for (const dyn_block* d = first_; d != nullptr; d = d->next) {
    if (d->size >= max_block || copied + d->size > cap) break;
    if (d->size != 0) std::memcpy(dst + copied, reinterpret_cast<const uint8_t*>(d + 1), d->size);
    copied += d->size;
    tags += d->tag;
    ++n;
  }
  *blocks = n;
  if (span != nullptr) *span = 0;  // pop_front_n() of a dynamic queue pops block by block
  if (tag_sum != nullptr) *tag_sum = tags;
  return copied;
}

// merge_front() of a static ring: the blocks from the head up to the wrap point (or the tail) lie
// at increasing offsets, each a ring_header and its bytes.
size_t write_queue::merge_ring(uint8_t* dst, size_t cap, size_t max_block, size_t* blocks,
                               size_t* span, uint64_t* tag_sum) const noexcept {
  const size_t end = wrap_at_ != 0 ? wrap_at_ : tail_;
  size_t copied = 0;
  size_t n = 0;
  uint64_t tags = 0;
  size_t off = head_;
  while (n < count_ && off < end) {
    ring_header h{};
    std::memcpy(&h, ring_ + off, sizeof h);
    const auto size = static_cast<size_t>(h.size);
    if (size >= max_block || copied + size > cap) break;
    const uint8_t* data = ring_ + off + sizeof(ring_header);
    if (size <= kFixedCopy && cap - copied >= kFixedCopy) {
      fixed_copy(dst + copied, data);
    } else if (size != 0) {
      std::memcpy(dst + copied, data, size);
    }
    copied += size;
    tags += h.tag;
    off += ring_stride(size);
    ++n;
  }
  *blocks = n;
  if (span != nullptr) *span = off - head_;
  if (tag_sum != nullptr) *tag_sum = tags;
  return copied;
}

void write_queue::pop_front_n(size_t n, size_t bytes, size_t span) noexcept {
  if (cfg_.mode == queue_mode::dynamic || n > count_ || n < 2) {
    for (size_t i = 0; i < n; ++i) pop_front();
    return;
  }
  if (n == count_) {
    count_ = bytes_ = unsealed_count_ = 0;
    head_ = tail_ = wrap_at_ = 0;
    return;
  }
  // Merged blocks never cross the wrap point, so the head lands on or before it.
  bytes_ -= bytes;
  count_ -= n;
  unsealed_count_ = std::min(unsealed_count_, count_);
  head_ += span;
  if (wrap_at_ != 0 && head_ == wrap_at_) {
    head_ = 0;
    wrap_at_ = 0;
    prev_wrap_ = 0;
  }
  if (unsealed_count_ == count_) unsealed_ = begin();
}

}  // namespace uvbus
