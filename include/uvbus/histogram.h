// A latency histogram with fixed memory: log-linear buckets (HDR style) over nanoseconds, 32
// sub-buckets per power of two, so any reported value is within 1/32 (3.1 %) of the exact one.
// Used by the node's latency tracking (node_config::latency_histograms) and the benchmarks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace uvbus {

// p50 / p90 / p99 / p99.9 / max in nanoseconds (0 when empty).
struct latency_percentiles {
  uint64_t count = 0;
  uint64_t p50 = 0;
  uint64_t p90 = 0;
  uint64_t p99 = 0;
  uint64_t p999 = 0;
  uint64_t max = 0;
};

// Not thread-safe: one writer; read it on the writer's thread (or copy it there). No allocation:
// about 9.8 KiB inline. Values above kMaxValue (about 73 minutes) count in the last bucket, whose
// percentiles report max() (exact): that bucket has no upper bound of its own.
class latency_histogram {
 public:
  static constexpr unsigned kSubBits = 5;  // 32 sub-buckets per power of two
  static constexpr unsigned kMaxExponent = 42;
  static constexpr uint64_t kMaxValue = (uint64_t{1} << kMaxExponent) - 1;
  static constexpr size_t kBuckets = (kMaxExponent - kSubBits + 1) << kSubBits;

  // The bucket of v (values 0 .. 2^kSubBits - 1 have a bucket each).
  [[nodiscard]] static size_t bucket_of(uint64_t v) noexcept {
    if (v > kMaxValue) v = kMaxValue;
    if (v < (uint64_t{1} << kSubBits)) return static_cast<size_t>(v);
    const unsigned m = 63U - static_cast<unsigned>(__builtin_clzll(v));
    const unsigned shift = m - kSubBits;
    return (static_cast<size_t>(shift) << kSubBits) + static_cast<size_t>(v >> shift);
  }
  // The highest value of bucket b (what percentiles report).
  [[nodiscard]] static uint64_t bucket_upper(size_t b) noexcept;

  void record(uint64_t ns) noexcept {
    sat_add(&counts_[bucket_of(ns)], 1);
    sat_add(&count_, 1);
    add_to_sum(ns);
    if (ns < min_) min_ = ns;
    if (ns > max_) max_ = ns;
  }
  void record(uint64_t ns, uint64_t times) noexcept;

  [[nodiscard]] uint64_t count() const noexcept { return count_; }
  [[nodiscard]] uint64_t min() const noexcept { return count_ == 0 ? 0 : min_; }
  [[nodiscard]] uint64_t max() const noexcept { return max_; }
  // The values' sum, saturated at UINT64_MAX (about 584 years in nanoseconds): record(UINT64_MAX)
  // then record(1) wrapped it to 0. mean() is then a lower bound. count() (and each bucket's count)
  // saturates the same way.
  [[nodiscard]] uint64_t sum() const noexcept { return sum_; }
  [[nodiscard]] double mean() const noexcept {
    return count_ == 0 ? 0.0 : static_cast<double>(sum_) / static_cast<double>(count_);
  }
  // The nearest-rank percentile q in [0, 100]: the upper bound of the bucket holding the value of
  // rank ceil(q/100 * count), capped at max() (the last bucket: max()); 0 when empty.
  [[nodiscard]] uint64_t value_at_percentile(double q) const noexcept;
  [[nodiscard]] latency_percentiles percentiles() const noexcept;

  void merge(const latency_histogram& other) noexcept;
  void reset() noexcept;

  // Calls f(upper_bound_ns, cumulative_count) for each non-empty bucket in increasing order (the
  // last cumulative_count equals count()): a Prometheus histogram's buckets. The last bucket, which
  // also holds the values above kMaxValue, is bounded by max() when that is larger.
  template <class F>
  void for_each_bucket(F&& f) const {
    uint64_t cum = 0;
    for (size_t b = 0; b < kBuckets; ++b) {
      if (counts_[b] == 0) continue;
      sat_add(&cum, counts_[b]);
      const uint64_t upper = bucket_upper(b);
      f(b + 1 == kBuckets && max_ > upper ? max_ : upper, cum);
    }
  }

 private:
  // Counts and the sum saturate at UINT64_MAX instead of wrapping (record(v, times) and merge() can
  // reach it).
  static void sat_add(uint64_t* a, uint64_t v) noexcept {
    if (__builtin_add_overflow(*a, v, a)) *a = ~uint64_t{0};
  }
  void add_to_sum(uint64_t v) noexcept { sat_add(&sum_, v); }

  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t min_ = ~uint64_t{0};
  uint64_t max_ = 0;
};

}  // namespace uvbus
