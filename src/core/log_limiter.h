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
    slot& s = slots_[kind < kKinds ? kind : kKinds - 1];
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

 private:
  struct slot {
    uint64_t window_start = 0;
    uint32_t in_window = 0;
    uint64_t dropped = 0;
  };
  std::array<slot, kKinds> slots_{};
};

}  // namespace uvbus::detail
