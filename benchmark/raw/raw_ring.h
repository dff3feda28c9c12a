// The raw ceilings' single-producer single-consumer byte ring in shared memory: records
// [u32 length][u32 MurmurHash3 or 0][payload] padded to 8 bytes, a wrap marker where a record
// would not fit before the end; head and tail are byte counters on their own cache lines.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

namespace uvbus::raw {

inline constexpr uint32_t kWrap = 0xFFFFFFFFu;

struct alignas(64) ring_header {
  std::atomic<uint64_t> head{0};  // bytes published by the writer
  char pad1[56];
  std::atomic<uint64_t> tail{0};  // bytes consumed by the reader
  char pad2[56];
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline size_t record_size(size_t payload) {
  return (8 + payload + 7) & ~size_t{7};
}

// The writing side. reserve() waits (busy) until the record fits, commit() makes it visible once
// `publish_bytes` have accumulated (0: at once); publish() flushes what is committed.
class ring_writer {
 public:
  ring_writer(ring_header* h, uint8_t* data, size_t size, size_t publish_bytes)
      : h_(h), data_(data), mask_(size - 1), size_(size), batch_(publish_bytes) {}

  // Room for a record of `payload` bytes; returns where its 8-byte header starts.
  uint8_t* reserve(size_t payload) {
    const size_t pad = pad_for(payload);
    wait_room(pad + record_size(payload));
    return place(pad);
  }
  // As reserve(), but nullptr instead of waiting when the ring is full now.
  uint8_t* try_reserve(size_t payload) {
    const size_t pad = pad_for(payload);
    const size_t need = pad + record_size(payload);
    if (!fits(need)) {
      tail_cache_ = h_->tail.load(std::memory_order_acquire);
      if (!fits(need)) return nullptr;
    }
    return place(pad);
  }
  // Writes the record's length (the caller wrote the payload and, if any, the hash) and commits it.
  void commit(size_t payload) {
    const auto len = static_cast<uint32_t>(payload);
    std::memcpy(data_ + (head_ & mask_), &len, 4);
    head_ += record_size(payload);
    if (head_ - published_ >= batch_) publish();
  }
  void publish() {
    h_->head.store(head_, std::memory_order_release);
    published_ = head_;
  }

 private:
  // Bytes skipped (with a wrap marker) so that a record of `payload` bytes does not cross the end.
  [[nodiscard]] size_t pad_for(size_t payload) const {
    const size_t n = record_size(payload);
    const size_t pos = head_ & mask_;
    return size_ - pos < n ? size_ - pos : 0;
  }
  uint8_t* place(size_t pad) {
    if (pad != 0) {
      std::memcpy(data_ + (head_ & mask_), &kWrap, 4);
      head_ += pad;
    }
    return data_ + (head_ & mask_);
  }
  // Room for `need` more bytes by the last tail this writer read.
  [[nodiscard]] bool fits(size_t need) const { return size_ - (head_ - tail_cache_) >= need; }
  void wait_room(size_t need) {
    while (!fits(need)) {
      if (published_ != head_) publish();  // the reader may be waiting for what we hold back
      tail_cache_ = h_->tail.load(std::memory_order_acquire);
      cpu_relax();
    }
  }
  ring_header* h_;
  uint8_t* data_;
  size_t mask_, size_, batch_;
  uint64_t head_ = 0, published_ = 0, tail_cache_ = 0;
};

// The reading side: poll() hands every published record to fn(header, payload length) and then
// releases their room; returns the number handed out.
class ring_reader {
 public:
  ring_reader(ring_header* h, uint8_t* data, size_t size)
      : h_(h), data_(data), mask_(size - 1), size_(size) {}

  template <typename Fn>
  size_t poll(Fn&& fn) {
    const uint64_t head = h_->head.load(std::memory_order_acquire);
    size_t count = 0;
    while (tail_ != head) {
      const size_t pos = tail_ & mask_;
      uint32_t len;
      std::memcpy(&len, data_ + pos, 4);
      if (len == kWrap) {
        tail_ += size_ - pos;
        continue;
      }
      if (!fn(data_ + pos, static_cast<size_t>(len))) break;
      tail_ += record_size(len);
      ++count;
    }
    h_->tail.store(tail_, std::memory_order_release);
    return count;
  }

 private:
  ring_header* h_;
  uint8_t* data_;
  size_t mask_, size_;
  uint64_t tail_ = 0;
};

}  // namespace uvbus::raw
