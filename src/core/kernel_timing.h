// Timing two kernels against each other once, to choose one at run time (the hash and CRC
// dispatch): each timed as the fastest of several runs, the two alternated so that a frequency
// step cannot favour one.
#pragma once

#include <chrono>
#include <cstdint>

namespace uvbus::detail {

// The fastest of `trials` runs of fn(), in nanoseconds (steady_clock).
template <typename F>
int64_t fastest_ns(int trials, F&& fn) noexcept {
  int64_t best = INT64_MAX;
  for (int t = 0; t < trials; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    best = ns < best ? ns : best;
  }
  return best;
}

struct kernel_times {
  int64_t a = INT64_MAX;
  int64_t b = INT64_MAX;
};

// a() and b() timed in two alternated rounds of 5 runs each; the fastest run of each.
template <typename A, typename B>
kernel_times time_alternately(A&& a, B&& b) noexcept {
  kernel_times t;
  for (int round = 0; round < 2; ++round) {
    const int64_t ta = fastest_ns(5, a);
    const int64_t tb = fastest_ns(5, b);
    t.a = ta < t.a ? ta : t.a;
    t.b = tb < t.b ? tb : t.b;
  }
  return t;
}

}  // namespace uvbus::detail
