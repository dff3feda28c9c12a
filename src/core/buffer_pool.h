// Buffer pool: per-thread free lists of equally sized byte buffers, so a per-connection buffer
// (the stream channel's write ring) goes back to the pool when its connection goes quiet and the
// next busy connection reuses it without a trip to malloc.
//
// A pool belongs to one thread (buffer_pool::local()); a buffer may be released on another thread
// than the one that acquired it (it then joins that thread's pool: every buffer comes from
// malloc). Free buffers are chained through their own first bytes, so releasing never allocates;
// a pool keeps at most max_free of them and frees the rest. At thread exit the pools free their
// lists; a buffer released after that is freed at once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace uvbus {

class buffer_pool {
 public:
  static constexpr size_t kDefaultMaxFree = 256;
  // Buffers of buffer_size bytes (at least sizeof(void*)).
  explicit buffer_pool(size_t buffer_size, size_t max_free = kDefaultMaxFree) noexcept;
  ~buffer_pool();
  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;

  // A buffer of buffer_size() bytes (uninitialised): a free one, or a new one; nullptr when out
  // of memory.
  [[nodiscard]] uint8_t* acquire() noexcept;
  // Hands a buffer of this pool's size back (nullptr: nothing). Kept for reuse, or freed when the
  // pool already holds max_free.
  void release(uint8_t* p) noexcept;

  [[nodiscard]] size_t buffer_size() const noexcept { return size_; }
  [[nodiscard]] size_t free_count() const noexcept { return free_; }
  // Buffers acquired from this pool and not released to it (negative if others were released in).
  [[nodiscard]] int64_t outstanding() const noexcept { return outstanding_; }
  [[nodiscard]] uint64_t reused() const noexcept { return reused_; }  // acquires served from free

  // The calling thread's pool for buffers of `size` bytes, or nullptr when the thread already
  // has kMaxPoolsPerThread pools of other sizes (or is exiting): use malloc/free then.
  static constexpr size_t kMaxPoolsPerThread = 8;
  [[nodiscard]] static buffer_pool* local(size_t size) noexcept;
  // Bytes held in the free lists of the calling thread's pools (memory accounting, tests).
  [[nodiscard]] static size_t thread_free_bytes() noexcept;

 private:
  size_t size_;
  size_t max_free_;
  size_t free_ = 0;
  int64_t outstanding_ = 0;
  uint64_t reused_ = 0;
  void* head_ = nullptr;  // first free buffer; each holds the next one's address
};

}  // namespace uvbus
