#include "core/write_queue.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace uvbus {
namespace {

// Header in front of every block of the static ring. 16 bytes keeps block data 8-byte aligned.
struct ring_header {
  uint64_t size;
  uint64_t tag;
};
static_assert(sizeof(ring_header) == 16, "ring block header must stay 16 bytes");

constexpr size_t align8(size_t n) noexcept {
  return (n + 7) & ~static_cast<size_t>(7);
}
constexpr size_t ring_stride(size_t n) noexcept {
  return sizeof(ring_header) + align8(n);
}

}  // namespace

struct write_queue::dyn_block {
  dyn_block* next;
  size_t size;
  uint64_t tag;
  // The data follows the struct; aligned to 8 by the struct's own alignment.
  uint8_t* data() noexcept { return reinterpret_cast<uint8_t*>(this + 1); }
};

errc write_queue::validate(const write_queue_config& cfg) noexcept {
  if (cfg.mode == queue_mode::static_ring) {
    if (cfg.ring_bytes < 64) return errc::invalid_argument;
  } else if (cfg.max_bytes == 0 || cfg.max_blocks == 0) {
    return errc::invalid_argument;
  }
  return errc::ok;
}

write_queue::write_queue(const write_queue_config& cfg) : cfg_(cfg) {
  valid_ = validate(cfg) == errc::ok;
  if (valid_ && cfg_.mode == queue_mode::static_ring) {
    cfg_.ring_bytes = align8(cfg_.ring_bytes);
    ring_.reset(new (std::nothrow) uint8_t[cfg_.ring_bytes]);
    valid_ = ring_ != nullptr;
  }
}

write_queue::~write_queue() {
  while (first_ != nullptr) {
    dyn_block* next = first_->next;
    std::free(first_);
    first_ = next;
  }
}

size_t write_queue::memory_bytes() const noexcept {
  if (cfg_.mode == queue_mode::static_ring) return valid_ ? cfg_.ring_bytes : 0;
  return bytes_ + count_ * sizeof(dyn_block);
}

uint8_t* write_queue::reserve(size_t n, uint64_t tag, errc* err) noexcept {
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
    return b->data();
  }

  const size_t need = ring_stride(n);
  if (need > cfg_.ring_bytes) return failed(errc::message_too_large);
  size_t at = 0;
  size_t new_wrap = wrap_at_;
  if (count_ == 0) {
    head_ = tail_ = wrap_at_ = new_wrap = 0;
    at = 0;
  } else if (wrap_at_ == 0) {
    // Blocks occupy [head_, tail_). Room at the end, else start again at 0 before head_.
    if (tail_ + need <= cfg_.ring_bytes) {
      at = tail_;
    } else if (need <= head_) {
      at = 0;
      new_wrap = tail_;
    } else {
      return failed(errc::queue_full);
    }
  } else {
    // Wrapped: blocks occupy [head_, wrap_at_) and [0, tail_).
    if (tail_ + need <= head_) {
      at = tail_;
    } else {
      return failed(errc::queue_full);
    }
  }
  prev_tail_ = tail_;
  prev_wrap_ = wrap_at_;
  wrap_at_ = new_wrap;
  last_off_ = at;
  tail_ = at + need;
  ring_header h{n, tag};
  std::memcpy(ring_.get() + at, &h, sizeof h);
  ++count_;
  bytes_ += n;
  return ring_.get() + at + sizeof(ring_header);
}

void write_queue::unreserve_back() noexcept {
  if (count_ == 0) return;
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
  std::memcpy(&h, ring_.get() + last_off_, sizeof h);
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
  std::memcpy(&h, ring_.get() + c.off, sizeof h);
  return {ring_.get() + c.off + sizeof(ring_header), static_cast<size_t>(h.size), h.tag};
}

write_queue::cursor write_queue::advance(cursor c) const noexcept {
  if (cfg_.mode == queue_mode::dynamic) return {0, c.node->next};
  ring_header h{};
  std::memcpy(&h, ring_.get() + c.off, sizeof h);
  size_t next = c.off + ring_stride(h.size);
  if (wrap_at_ != 0 && next == wrap_at_) next = 0;
  return {next, nullptr};
}

write_queue::block write_queue::front() const noexcept {
  return at(begin());
}

void write_queue::pop_front() noexcept {
  if (count_ == 0) return;
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

size_t write_queue::merge_front(uint8_t* dst, size_t cap, size_t max_block,
                                size_t* blocks) const noexcept {
  size_t copied = 0;
  size_t n = 0;
  cursor c = begin();
  while (n < count_) {
    const block b = at(c);
    if (b.size >= max_block || copied + b.size > cap) break;
    if (b.size != 0) std::memcpy(dst + copied, b.data, b.size);
    copied += b.size;
    ++n;
    // The block that ends at the wrap point is the last one merged in this pass.
    if (cfg_.mode == queue_mode::static_ring && wrap_at_ != 0 &&
        c.off + ring_stride(b.size) == wrap_at_) {
      break;
    }
    c = advance(c);
  }
  *blocks = n;
  return copied;
}

}  // namespace uvbus
