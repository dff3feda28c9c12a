// intrusive_list: a doubly linked list threaded through a list_hook member of its elements (no
// allocation, O(1) insert and unlink, safe to unlink the current element while iterating if the
// next one was read first). Owns nothing: elements are created and freed by their owner.
#pragma once

#include <cstddef>

namespace uvbus::detail {

template <class T>
struct list_hook {
  T* prev = nullptr;
  T* next = nullptr;
};

template <class T, list_hook<T> T::*Hook>
class intrusive_list {
 public:
  [[nodiscard]] T* front() const noexcept { return head_; }
  [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
  [[nodiscard]] size_t size() const noexcept { return size_; }
  [[nodiscard]] static T* next(const T* x) noexcept { return (x->*Hook).next; }

  void push_front(T* x) noexcept {
    list_hook<T>& h = x->*Hook;
    h.prev = nullptr;
    h.next = head_;
    if (head_ != nullptr) (head_->*Hook).prev = x;
    head_ = x;
    ++size_;
  }

  // x must be in this list.
  void remove(T* x) noexcept {
    list_hook<T>& h = x->*Hook;
    if (h.prev != nullptr) (h.prev->*Hook).next = h.next;
    if (h.next != nullptr) (h.next->*Hook).prev = h.prev;
    if (head_ == x) head_ = h.next;
    h.prev = h.next = nullptr;
    --size_;
  }

 private:
  T* head_ = nullptr;
  size_t size_ = 0;
};

}  // namespace uvbus::detail
