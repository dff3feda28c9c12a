// u64_map: a hash map from uint64_t to uint64_t in one flat table (open addressing, linear
// probing, backward-shift deletion), for maps that gain and lose an entry per message: unlike
// std::unordered_map, which allocates a node per insertion, it allocates only when its table grows
// (doubling at half full). trim(), called now and then, shrinks a table that has stayed mostly
// empty for a second, so a burst's memory does not outlive it. Not thread-safe: one owner thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace uvbus::detail {

class u64_map {
 public:
  // The smallest table (slots), allocated by the first set().
  static constexpr size_t kMinSlots = 16;
  // trim() shrinks a table only after it held fewer than an eighth of its slots for this long.
  static constexpr uint64_t kTrimAfterMs = 1000;

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] size_t size() const noexcept { return size_; }
  // Slots in the table (0 before the first set()): its memory is slots() * 24 bytes.
  [[nodiscard]] size_t slots() const noexcept { return table_.size(); }

  // The value stored for key, or nullptr. Valid until the next set(), erase(), trim() or clear().
  [[nodiscard]] uint64_t* find(uint64_t key) noexcept {
    if (size_ == 0) return nullptr;
    for (size_t i = home(key);; i = next(i)) {
      slot& s = table_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  [[nodiscard]] const uint64_t* find(uint64_t key) const noexcept {
    return const_cast<u64_map*>(this)->find(key);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  }

  // Stores value for key, replacing what key had. Allocates only when the table grows (may throw
  // std::bad_alloc then, as a std::vector does; the map is unchanged).
  void set(uint64_t key, uint64_t value) {
    if ((size_ + 1) * 2 > table_.size()) rehash(table_.empty() ? kMinSlots : table_.size() * 2);
    for (size_t i = home(key);; i = next(i)) {
      slot& s = table_[i];
      if (!s.used) {
        s = {key, value, true};
        if (++size_ > peak_) peak_ = size_;
        return;
      }
      if (s.key == key) {
        s.value = value;
        return;
      }
    }
  }

  // Removes key; false when it was not there. *value (if given) gets what key held. Never
  // allocates.
  bool erase(uint64_t key, uint64_t* value = nullptr) noexcept {
    if (size_ == 0) return false;
    size_t i = home(key);
    while (table_[i].key != key || !table_[i].used) {
      if (!table_[i].used) return false;
      i = next(i);
    }
    if (value != nullptr) *value = table_[i].value;
    // Backward shift: move up every entry after the hole that may not stay behind it (its home
    // is not cyclically in (hole, j]), so lookups never meet a gap before their key.
    for (size_t j = next(i);; j = next(j)) {
      if (!table_[j].used) break;
      const size_t h = home(table_[j].key);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (stays) continue;
      table_[i] = table_[j];
      i = j;
    }
    table_[i].used = false;
    --size_;
    return true;
  }

  void clear() noexcept {
    for (slot& s : table_) s.used = false;
    size_ = 0;
  }

  // Shrinks the table to fit when, at every call for the last kTrimAfterMs, it held fewer than
  // an eighth of its slots (an empty map gives its table back). now_ms: a monotonic clock.
  void trim(uint64_t now_ms) {
    const bool sparse = table_.size() > kMinSlots && peak_ * 8 < table_.size();
    const bool emptied = size_ == 0 && peak_ == 0 && !table_.empty();
    peak_ = size_;
    if (!sparse && !emptied) {
      sparse_since_ = kNever;
      return;
    }
    if (sparse_since_ == kNever) sparse_since_ = now_ms;
    if (now_ms - sparse_since_ < kTrimAfterMs) return;
    sparse_since_ = kNever;
    if (size_ == 0) {
      table_ = {};
      return;
    }
    size_t cap = kMinSlots;
    while (cap < size_ * 4) cap *= 2;
    if (cap < table_.size()) rehash(cap);
  }

 private:
  struct slot {
    uint64_t key;
    uint64_t value;
    bool used;
  };
  static constexpr uint64_t kNever = UINT64_MAX;

  [[nodiscard]] size_t home(uint64_t key) const noexcept {
    // MurmurHash3's 64-bit finalizer: sequential ids spread over the whole table.
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return static_cast<size_t>(key) & (table_.size() - 1);
  }
  [[nodiscard]] size_t next(size_t i) const noexcept { return (i + 1) & (table_.size() - 1); }

  void rehash(size_t cap) {
    std::vector<slot> old(cap, slot{0, 0, false});
    old.swap(table_);
    size_ = 0;
    for (const slot& s : old) {
      if (!s.used) continue;
      size_t i = home(s.key);
      while (table_[i].used) i = next(i);
      table_[i] = s;
      ++size_;
    }
  }

  std::vector<slot> table_;
  size_t size_ = 0;
  size_t peak_ = 0;  // the most entries held since the last trim()
  uint64_t sparse_since_ = kNever;
};

}  // namespace uvbus::detail
