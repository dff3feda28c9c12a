// latency_histogram against exact percentiles of recorded data: every reported percentile lies
// within the stated relative error (1/32) of the exact nearest-rank one; merge, reset, buckets.
#include "uvbus/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace uvbus::histogram_test {
namespace {

uint64_t exact(std::vector<uint64_t> v, double q) {
  std::sort(v.begin(), v.end());
  auto rank = static_cast<size_t>(std::ceil(q / 100.0 * static_cast<double>(v.size())));
  if (rank == 0) rank = 1;
  return v[rank - 1];
}

void expect_close(const latency_histogram& h, const std::vector<uint64_t>& v) {
  for (const double q : {0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0}) {
    const uint64_t want = exact(v, q);
    const uint64_t got = h.value_at_percentile(q);
    // The bucket's upper bound: never below the exact value, at most 1/32 above it.
    EXPECT_GE(got, std::min(want, latency_histogram::kMaxValue)) << "q=" << q;
    EXPECT_LE(static_cast<double>(got), static_cast<double>(want) * (1.0 + 1.0 / 32) + 1)
        << "q=" << q << " want " << want;
  }
  EXPECT_EQ(h.count(), v.size());
  EXPECT_EQ(h.max(), *std::max_element(v.begin(), v.end()));
  EXPECT_EQ(h.min(), *std::min_element(v.begin(), v.end()));
}

TEST(LatencyHistogram, UniformExponentialAndConstantDataStayWithinTheError) {
  std::mt19937_64 rng(42);
  std::vector<uint64_t> uni;
  uni.reserve(100000);
  std::uniform_int_distribution<uint64_t> u(0, 10'000'000);
  for (int i = 0; i < 100000; ++i) uni.push_back(u(rng));
  std::vector<uint64_t> tail;
  tail.reserve(100000);
  std::exponential_distribution<double> e(1.0 / 20000);  // long-tailed, mean 20 us
  for (int i = 0; i < 100000; ++i) tail.push_back(static_cast<uint64_t>(e(rng)));
  std::vector<uint64_t> constant(1000, 123456);
  for (const auto* data : {&uni, &tail, &constant}) {
    latency_histogram h;
    for (const uint64_t x : *data) h.record(x);
    expect_close(h, *data);
  }
}

TEST(LatencyHistogram, EdgesZeroSingleAndHugeValues) {
  latency_histogram h;
  EXPECT_EQ(h.value_at_percentile(50), 0u);
  EXPECT_EQ(h.percentiles().max, 0u);
  h.record(0);
  EXPECT_EQ(h.value_at_percentile(100), 0u);
  h.reset();
  h.record(7);
  EXPECT_EQ(h.value_at_percentile(0), 7u);
  EXPECT_EQ(h.value_at_percentile(100), 7u);
  h.record(~uint64_t{0});  // beyond kMaxValue: last bucket, max exact
  EXPECT_EQ(h.max(), ~uint64_t{0});
  EXPECT_EQ(h.value_at_percentile(100), ~uint64_t{0});  // not kMaxValue: the bucket is unbounded
  // Values beyond kMaxValue only: every percentile is at least kMaxValue, reported as max().
  latency_histogram big;
  big.record(latency_histogram::kMaxValue + 5);
  big.record(latency_histogram::kMaxValue * 3);
  EXPECT_EQ(big.value_at_percentile(50), latency_histogram::kMaxValue * 3);
  EXPECT_EQ(big.percentiles().p999, latency_histogram::kMaxValue * 3);
  big.record(1000);  // a value of an ordinary bucket keeps its bound
  EXPECT_EQ(big.value_at_percentile(10),
            latency_histogram::bucket_upper(latency_histogram::bucket_of(1000)));
  for (uint64_t v = 0; v < 5000; v += 7) {  // every value falls in a bucket that holds it
    const size_t b = latency_histogram::bucket_of(v);
    EXPECT_LE(v, latency_histogram::bucket_upper(b));
    if (b > 0) {
      EXPECT_GT(v, latency_histogram::bucket_upper(b - 1));
    }
  }
}

// sum() was added to unchecked: record(UINT64_MAX) then record(1) gave 0 (and a Prometheus
// _sum that fell). It saturates at UINT64_MAX, through record(v, times) and merge() too.
TEST(LatencyHistogram, SumSaturatesInsteadOfWrapping) {
  const uint64_t top = ~uint64_t{0};
  latency_histogram h;
  h.record(top);
  h.record(1);
  EXPECT_EQ(h.sum(), top);
  EXPECT_EQ(h.count(), 2u);
  latency_histogram times;
  times.record(uint64_t{1} << 40, uint64_t{1} << 30);  // 2^70
  EXPECT_EQ(times.sum(), top);
  latency_histogram m;
  m.record(5);
  m.merge(h);
  EXPECT_EQ(m.sum(), top);
  latency_histogram small;
  small.record(3, 4);
  small.record(10);
  EXPECT_EQ(small.sum(), 22u);
}

TEST(LatencyHistogram, CountsSaturateInsteadOfWrapping) {
  const uint64_t top = ~uint64_t{0};
  latency_histogram h;
  h.record(5, top);
  h.record(5);
  EXPECT_EQ(h.count(), top);
  EXPECT_EQ(h.min(), 5u);
  EXPECT_EQ(h.value_at_percentile(50), 5u);
  EXPECT_EQ(h.percentiles().count, top);
  latency_histogram m;
  m.record(7);
  m.merge(h);
  EXPECT_EQ(m.count(), top);
  EXPECT_EQ(m.min(), 5u);
  EXPECT_EQ(m.value_at_percentile(100), 7u);
  uint64_t last = 0;
  m.for_each_bucket([&](uint64_t, uint64_t cum) { last = cum; });
  EXPECT_EQ(last, top);
}

TEST(LatencyHistogram, TheLastBucketIsBoundedByTheLargestValueItHolds) {
  latency_histogram h;
  const uint64_t big = uint64_t{1} << 50;  // above kMaxValue: counted in the last bucket
  h.record(3);
  h.record(big);
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  h.for_each_bucket([&](uint64_t upper, uint64_t cum) { seen.emplace_back(upper, cum); });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(uint64_t{3}, uint64_t{1}));
  EXPECT_EQ(seen[1], std::make_pair(big, uint64_t{2}));
}

TEST(LatencyHistogram, MergeEqualsRecordingBothAndBucketsAreCumulative) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> u(1, 1'000'000'000);
  latency_histogram a, b, both;
  std::vector<uint64_t> all;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t x = u(rng);
    (i % 2 == 0 ? a : b).record(x);
    both.record(x);
    all.push_back(x);
  }
  a.merge(b);
  EXPECT_EQ(a.count(), both.count());
  EXPECT_EQ(a.sum(), both.sum());
  for (const double q : {50.0, 99.0, 99.9}) {
    EXPECT_EQ(a.value_at_percentile(q), both.value_at_percentile(q));
  }
  expect_close(a, all);
  uint64_t last_bound = 0;
  uint64_t last_cum = 0;
  a.for_each_bucket([&](uint64_t bound, uint64_t cum) {
    EXPECT_GT(bound + 1, last_bound);
    EXPECT_GT(cum, last_cum);
    last_bound = bound + 1;
    last_cum = cum;
  });
  EXPECT_EQ(last_cum, a.count());
  latency_histogram w;
  w.record(1000, 5);
  EXPECT_EQ(w.count(), 5u);
  EXPECT_EQ(w.sum(), 5000u);
  a.reset();
  EXPECT_EQ(a.count(), 0u);
  EXPECT_EQ(a.value_at_percentile(99), 0u);
}

}  // namespace
}  // namespace uvbus::histogram_test
