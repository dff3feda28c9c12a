// Buffer pool: the free lists and the per-thread registry of pools by buffer size.
#include "core/buffer_pool.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace uvbus {

buffer_pool::buffer_pool(size_t buffer_size, size_t max_free) noexcept
    : size_(buffer_size < sizeof(void*) ? sizeof(void*) : buffer_size), max_free_(max_free) {}

buffer_pool::~buffer_pool() {
  while (head_ != nullptr) {
    void* next = nullptr;
    std::memcpy(static_cast<void*>(&next), head_, sizeof next);
    std::free(head_);
    head_ = next;
  }
}

uint8_t* buffer_pool::acquire() noexcept {
  ++outstanding_;
  if (head_ != nullptr) {
    void* p = head_;
    std::memcpy(static_cast<void*>(&head_), p, sizeof head_);
    --free_;
    ++reused_;
    return static_cast<uint8_t*>(p);
  }
  auto* p = static_cast<uint8_t*>(std::malloc(size_));
  if (p == nullptr) --outstanding_;
  return p;
}

void buffer_pool::release(uint8_t* p) noexcept {
  if (p == nullptr) return;
  --outstanding_;
  if (free_ >= max_free_) {
    std::free(p);
    return;
  }
  std::memcpy(p, static_cast<const void*>(&head_), sizeof head_);
  head_ = p;
  ++free_;
}

namespace {

// The thread's pools, built on first use and destroyed at thread exit. `gone` (trivially
// destructible, so still readable during and after that) stops later calls from using them.
thread_local bool gone = false;

struct registry {
  buffer_pool* pools[buffer_pool::kMaxPoolsPerThread] = {};
  size_t count = 0;
  registry() = default;
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;
  ~registry() {
    gone = true;
    for (size_t i = 0; i < count; ++i) delete pools[i];
  }
};

}  // namespace

namespace {
registry* thread_registry() noexcept {
  if (gone) return nullptr;
  thread_local registry reg;
  return &reg;
}
}  // namespace

size_t buffer_pool::thread_free_bytes() noexcept {
  const registry* r = thread_registry();
  size_t n = 0;
  for (size_t i = 0; r != nullptr && i < r->count; ++i) {
    n += r->pools[i]->free_count() * r->pools[i]->buffer_size();
  }
  return n;
}

buffer_pool* buffer_pool::local(size_t size) noexcept {
  registry* regp = thread_registry();
  if (regp == nullptr) return nullptr;
  registry& reg = *regp;
  for (size_t i = 0; i < reg.count; ++i) {
    if (reg.pools[i]->buffer_size() == size) return reg.pools[i];
  }
  if (reg.count == kMaxPoolsPerThread || size < sizeof(void*)) return nullptr;
  auto* p = new (std::nothrow) buffer_pool(size);
  if (p != nullptr) reg.pools[reg.count++] = p;
  return p;
}

}  // namespace uvbus
