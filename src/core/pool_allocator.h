// pool_allocator: an allocator for a node-based container (std::map, std::set, std::list) that
// gains and loses an element per message. Freed nodes go to a free list shared by the copies of
// the allocator (a container rebinds its allocator to its node type), and the next insertion takes
// one back: the container allocates only to grow past its largest size so far. At most kKeep free
// nodes are kept (beyond that they are freed), so the memory a burst leaves is bounded. Only
// single-node allocations of the first size asked for are pooled; others go to operator new.
// Not thread-safe: the container's owner thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace uvbus::detail {

struct node_pool {
  static constexpr size_t kKeep = 4096;
  struct free_node {
    free_node* next;
  };
  free_node* head = nullptr;
  size_t count = 0;       // nodes on the free list
  size_t node_bytes = 0;  // the pooled size (0: none yet)

  node_pool() = default;
  node_pool(const node_pool&) = delete;
  node_pool& operator=(const node_pool&) = delete;
  ~node_pool() {
    while (head != nullptr) {
      free_node* n = head;
      head = n->next;
      ::operator delete(n);
    }
  }
  void* take(size_t bytes) {
    if (node_bytes == 0 && bytes >= sizeof(free_node)) node_bytes = bytes;
    if (bytes == node_bytes && head != nullptr) {
      free_node* n = head;
      head = n->next;
      --count;
      return n;
    }
    return ::operator new(bytes);
  }
  void give(void* p, size_t bytes) noexcept {
    if (bytes == node_bytes && count < kKeep) {
      auto* n = static_cast<free_node*>(p);
      n->next = head;
      head = n;
      ++count;
      return;
    }
    ::operator delete(p);
  }
};

template <class T>
class pool_allocator {
 public:
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned nodes");

  pool_allocator() : pool_(std::make_shared<node_pool>()) {}
  // Copies only, no moves: a moved-from container keeps a pool and stays usable.
  pool_allocator(const pool_allocator&) noexcept = default;
  pool_allocator& operator=(const pool_allocator&) noexcept = default;
  ~pool_allocator() = default;
  template <class U>
  pool_allocator(const pool_allocator<U>& o) noexcept  // NOLINT(google-explicit-constructor)
      : pool_(o.pool_) {}

  // A copied container gets a pool of its own (it may live on elsewhere).
  [[nodiscard]] pool_allocator select_on_container_copy_construction() const {
    return pool_allocator();
  }

  T* allocate(size_t n) {
    if (n == 1) return static_cast<T*>(pool_->take(sizeof(T)));
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n == 1) {
      pool_->give(p, sizeof(T));
    } else {
      ::operator delete(p);
    }
  }
  // Free nodes kept now (for tests and metrics).
  [[nodiscard]] size_t pooled() const noexcept { return pool_->count; }

  template <class U>
  friend bool operator==(const pool_allocator& a, const pool_allocator<U>& b) noexcept {
    return a.pool_ == b.pool_;
  }
  template <class U>
  friend bool operator!=(const pool_allocator& a, const pool_allocator<U>& b) noexcept {
    return a.pool_ != b.pool_;
  }

 private:
  template <class U>
  friend class pool_allocator;
  std::shared_ptr<node_pool> pool_;
};

}  // namespace uvbus::detail
