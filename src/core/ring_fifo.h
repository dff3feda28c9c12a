// ring_fifo: a FIFO queue in one growable power-of-two ring. Unlike std::deque it keeps its
// storage when drained, so a steady push/pop flow allocates nothing (std::deque allocates and frees
// a block every few hundred bytes of traffic).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace uvbus::detail {

template <class T>
class ring_fifo {
 public:
  ring_fifo() = default;
  ring_fifo(const ring_fifo&) = default;
  ring_fifo& operator=(const ring_fifo&) = default;
  // A moved-from ring is empty (cap_ must follow slots_).
  ring_fifo(ring_fifo&& o) noexcept
      : slots_(std::move(o.slots_)),
        cap_(std::exchange(o.cap_, 0)),
        head_(std::exchange(o.head_, 0)),
        size_(std::exchange(o.size_, 0)) {}
  ring_fifo& operator=(ring_fifo&& o) noexcept {
    if (this == &o) return *this;
    slots_ = std::move(o.slots_);
    cap_ = std::exchange(o.cap_, 0);
    head_ = std::exchange(o.head_, 0);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }
  ~ring_fifo() = default;

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] size_t size() const noexcept { return size_; }
  [[nodiscard]] size_t capacity() const noexcept { return cap_; }
  [[nodiscard]] T& front() noexcept { return slots_[head_]; }
  [[nodiscard]] const T& front() const noexcept { return slots_[head_]; }

  // The i-th element from the front (i < size()).
  [[nodiscard]] T& operator[](size_t i) noexcept { return slots_[(head_ + i) & (cap_ - 1)]; }
  [[nodiscard]] const T& operator[](size_t i) const noexcept {
    return slots_[(head_ + i) & (cap_ - 1)];
  }
  [[nodiscard]] T& back() noexcept { return (*this)[size_ - 1]; }
  void pop_back() noexcept { --size_; }
  void push_back(T v) {
    if (size_ == cap_) grow();
    slots_[(head_ + size_) & (cap_ - 1)] = std::move(v);
    ++size_;
  }
  void pop_front() noexcept {
    head_ = (head_ + 1) & (cap_ - 1);
    --size_;
  }
  // Drops the n front elements (n <= size()) in one step.
  void pop_front_n(size_t n) noexcept {
    head_ = (head_ + n) & (cap_ - 1);
    size_ -= n;
  }

 private:
  void grow() {
    std::vector<T> bigger(slots_.empty() ? 64 : slots_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(slots_[(head_ + i) & (cap_ - 1)]);
    slots_.swap(bigger);
    cap_ = slots_.size();
    head_ = 0;
  }

  std::vector<T> slots_;  // size 0 or a power of two
  // slots_.size(), kept apart: the vector's size() divides by sizeof(T), a multiply by a magic
  // constant on every index when T is not a power of two bytes long (tx_entry: 48).
  size_t cap_ = 0;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace uvbus::detail
