// Rate limiting of repeated log events per kind: a burst per window, then silence, and the count
// of what was left out on the next line that passes. Fixed memory, no allocation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace uvbus::detail {

class log_limiter {
 public:
  static constexpr size_t kKinds = 16;
  static constexpr uint32_t kBurst = 5;
  static constexpr uint64_t kWindowMs = 1000;

  // Whether an event of kind (< kKinds; larger ones share the last slot) may be logged at now_ms.
  // When it may, *suppressed receives how many events of that kind were left out since the last
  // one that was logged (then reset).
  bool allow(size_t kind, uint64_t now_ms, uint64_t* suppressed) noexcept {
    slot& s = slot_of(kind);
    if (now_ms - s.window_start >= kWindowMs || s.window_start == 0) {
      s.window_start = now_ms == 0 ? 1 : now_ms;
      s.in_window = 0;
    }
    if (s.in_window >= kBurst) {
      ++s.dropped;
      return false;
    }
    ++s.in_window;
    *suppressed = s.dropped;
    s.dropped = 0;
    return true;
  }

  // The count of kind's events left out in a window that has passed, taken (0 from then on): for
  // a summary line from a timer when no later event of that kind comes to carry the count.
  uint64_t take_expired(size_t kind, uint64_t now_ms) noexcept {
    slot& s = slot_of(kind);
    if (s.dropped == 0 || now_ms - s.window_start < kWindowMs) return 0;
    const uint64_t n = s.dropped;
    s.dropped = 0;
    return n;
  }

 private:
  struct slot {
    uint64_t window_start = 0;
    uint32_t in_window = 0;
    uint64_t dropped = 0;
  };
  slot& slot_of(size_t kind) noexcept { return slots_[kind < kKinds ? kind : kKinds - 1]; }
  std::array<slot, kKinds> slots_{};
};

}  // namespace uvbus::detail
