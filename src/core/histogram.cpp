// latency_histogram: bucket bounds, percentiles, merge (uvbus/histogram.h).
#include "uvbus/histogram.h"

#include <cmath>
#include <limits>

namespace uvbus {

uint64_t latency_histogram::bucket_upper(size_t b) noexcept {
  constexpr size_t kSub = size_t{1} << kSubBits;
  if (b < 2 * kSub) return b;  // width 1 up to 2^(kSubBits + 1)
  const size_t shift = (b >> kSubBits) - 1;
  const uint64_t lower = static_cast<uint64_t>(b - (shift << kSubBits)) << shift;
  return lower + (uint64_t{1} << shift) - 1;
}

void latency_histogram::record(uint64_t ns, uint64_t times) noexcept {
  if (times == 0) return;
  sat_add(&counts_[bucket_of(ns)], times);
  sat_add(&count_, times);
  uint64_t add = 0;
  add_to_sum(__builtin_mul_overflow(ns, times, &add) ? ~uint64_t{0} : add);
  if (ns < min_) min_ = ns;
  if (ns > max_) max_ = ns;
}

uint64_t latency_histogram::value_at_percentile(double q) const noexcept {
  if (count_ == 0) return 0;
  if (!(q > 0)) q = 0;
  // Rank count() is max()'s (so also once saturated counts no longer add up).
  if (q >= 100) return max_;
  // q is a decimal the double only approximates (99.9 is a hair above it, 0.999 * 1000 a hair
  // above 999): a product within a few ulps of an integer is that integer, not the next rank.
  double x = q * static_cast<double>(count_) / 100.0;
  const double whole = std::round(x);
  if (std::fabs(x - whole) <= 4 * std::numeric_limits<double>::epsilon() * x) x = whole;
  auto rank = static_cast<uint64_t>(std::ceil(x));
  if (rank == 0) rank = 1;
  uint64_t cum = 0;
  for (size_t b = 0; b < kBuckets; ++b) {
    sat_add(&cum, counts_[b]);
    if (cum >= rank) {
      // The last bucket also holds every value above kMaxValue: it has no upper bound but max().
      const uint64_t v = b + 1 == kBuckets ? max_ : bucket_upper(b);
      return v < max_ ? v : max_;
    }
  }
  return max_;
}

latency_percentiles latency_histogram::percentiles() const noexcept {
  latency_percentiles p;
  p.count = count_;
  p.p50 = value_at_percentile(50);
  p.p90 = value_at_percentile(90);
  p.p99 = value_at_percentile(99);
  p.p999 = value_at_percentile(99.9);
  p.max = max_;
  return p;
}

void latency_histogram::merge(const latency_histogram& o) noexcept {
  for (size_t b = 0; b < kBuckets; ++b) sat_add(&counts_[b], o.counts_[b]);
  sat_add(&count_, o.count_);
  add_to_sum(o.sum_);
  if (o.count_ != 0 && o.min_ < min_) min_ = o.min_;
  if (o.max_ > max_) max_ = o.max_;
}

void latency_histogram::reset() noexcept {
  counts_.fill(0);
  count_ = 0;
  sum_ = 0;
  min_ = ~uint64_t{0};
  max_ = 0;
}

}  // namespace uvbus
