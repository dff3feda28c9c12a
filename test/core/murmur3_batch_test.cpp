// murmur3_x86_32_batch: every kernel this CPU has, forced in turn, against murmur3_x86_32 — every
// length 0..4096 in batches mixing lengths, random batches (lengths, alignments, sizes, seeds),
// n = 0..17, lanes long enough to leave the SIMD loop early — plus the kernel switch itself.
#include "core/murmur3_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/murmur3.h"

namespace uvbus {
namespace {

// Each buffer in its own exactly-sized allocation (after `align` leading bytes), so that a kernel
// reading one byte past a buffer's end is an ASan report.
struct buffers {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<const uint8_t*> ptr;
  std::vector<size_t> len;

  void add(size_t n, size_t align, std::mt19937& rng) {
    std::vector<uint8_t> b(align + n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    storage.push_back(std::move(b));
    ptr.push_back(n == 0 && align == 0 ? nullptr : storage.back().data() + align);
    len.push_back(n);
  }
};

// Hashes [first, first + n) of b as one batch and compares with the scalar function.
void check_batch(const buffers& b, size_t first, size_t n, uint32_t seed) {
  std::vector<uint32_t> out(n + 1, 0xdeadbeefU);
  murmur3_x86_32_batch(b.ptr.data() + first, b.len.data() + first, n, seed, out.data());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], murmur3_x86_32(b.ptr[first + i], b.len[first + i], seed))
        << "kernel " << to_string(murmur3_batch_active()) << " lane " << i << " of " << n << " len "
        << b.len[first + i] << " seed " << seed;
  }
  EXPECT_EQ(out[n], 0xdeadbeefU) << "wrote past out[n - 1]";
}

std::vector<murmur3_impl> kernels() {
  std::vector<murmur3_impl> v;
  for (const murmur3_impl i : {murmur3_impl::scalar, murmur3_impl::avx2, murmur3_impl::avx512}) {
    if (murmur3_batch_supported(i)) v.push_back(i);
  }
  return v;
}

class Murmur3Batch : public ::testing::TestWithParam<murmur3_impl> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(murmur3_batch_use(GetParam()));
    ASSERT_EQ(murmur3_batch_active(), GetParam());
  }
  void TearDown() override { murmur3_batch_use(murmur3_impl::auto_); }
};

TEST_P(Murmur3Batch, EveryLengthUpTo4096InMixedBatches) {
  std::mt19937 rng(42);
  std::vector<size_t> lengths(4097);
  std::iota(lengths.begin(), lengths.end(), size_t{0});
  std::shuffle(lengths.begin(), lengths.end(), rng);
  buffers b;
  for (size_t i = 0; i < lengths.size(); ++i) b.add(lengths[i], i % 7, rng);
  // Batch sizes cycle through 1..17 so that every lane position sees many lengths.
  size_t at = 0;
  for (size_t k = 1; at < lengths.size(); k = k % 17 + 1) {
    const size_t n = std::min(k, lengths.size() - at);
    check_batch(b, at, n, static_cast<uint32_t>(k * 0x9e3779b9U));
    at += n;
  }
  // The same lengths sorted: neighbouring lanes nearly equal, the SIMD loop runs to the end.
  std::sort(lengths.begin(), lengths.end());
  buffers s;
  for (const size_t n : lengths) s.add(n, 0, rng);
  for (at = 0; at < lengths.size(); at += 16)
    check_batch(s, at, std::min<size_t>(16, 4097 - at), 0);
}

TEST_P(Murmur3Batch, RandomBatchesOfRandomLengthsAndAlignments) {
  std::mt19937 rng(7);
  for (int round = 0; round < 400; ++round) {
    buffers b;
    const size_t n = rng() % 40;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t pick = rng() % 8;
      const size_t len = pick < 5 ? rng() % 129 : pick < 7 ? rng() % 1100 : rng() % 9000;
      b.add(len, rng() % 64, rng);
    }
    check_batch(b, 0, n, static_cast<uint32_t>(rng()));
  }
}

TEST_P(Murmur3Batch, EveryBatchSizeUpTo17) {
  std::mt19937 rng(3);
  for (const size_t len : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{31}, size_t{32},
                           size_t{33}, size_t{64}, size_t{127}, size_t{128}, size_t{1024}}) {
    for (size_t n = 0; n <= 17; ++n) {
      buffers b;
      for (size_t i = 0; i < n; ++i) b.add(len + (i & 1), i % 5, rng);
      check_batch(b, 0, n, 0);
      check_batch(b, 0, n, 0xffffffffU);
    }
  }
}

TEST_P(Murmur3Batch, LongLanesLeaveTheSimdLoopOnABlockBoundary) {
  std::mt19937 rng(11);
  buffers b;
  b.add(100003, 1, rng);  // the longest lane: finished by the scalar continuation
  b.add(70001, 2, rng);   // the second longest: bounds the SIMD rounds
  for (size_t i = 0; i < 14; ++i) b.add(rng() % 300, i, rng);
  check_batch(b, 0, 16, 5);
  check_batch(b, 0, 8, 5);
  check_batch(b, 0, 2, 5);
  check_batch(b, 1, 15, 5);
}

TEST_P(Murmur3Batch, EqualBuffersHashEqually) {
  const char text[] = "The quick brown fox jumps over the lazy dog";
  const auto* p = reinterpret_cast<const uint8_t*>(text);
  const uint8_t* data[9];
  size_t len[9];
  for (int i = 0; i < 9; ++i) {
    data[i] = p;
    len[i] = sizeof text - 1;
  }
  uint32_t out[9];
  murmur3_x86_32_batch(data, len, 9, 0x9747b28cU, out);
  for (const uint32_t h : out) EXPECT_EQ(h, 0x2FA826CDU);  // published reference value
}

INSTANTIATE_TEST_SUITE_P(Kernels, Murmur3Batch, ::testing::ValuesIn(kernels()),
                         [](const ::testing::TestParamInfo<murmur3_impl>& info) {
                           return std::string(to_string(info.param));
                         });

TEST(Murmur3BatchSwitch, AutoPicksASupportedKernelAndScalarIsAlwaysThere) {
  EXPECT_TRUE(murmur3_batch_supported(murmur3_impl::scalar));
  EXPECT_TRUE(murmur3_batch_supported(murmur3_impl::auto_));
  ASSERT_TRUE(murmur3_batch_use(murmur3_impl::auto_));
  const murmur3_impl a = murmur3_batch_active();
  EXPECT_NE(a, murmur3_impl::auto_);
  EXPECT_TRUE(murmur3_batch_supported(a));
  for (const murmur3_impl i : {murmur3_impl::avx2, murmur3_impl::avx512}) {
    if (!murmur3_batch_supported(i)) {
      EXPECT_FALSE(murmur3_batch_use(i));
      EXPECT_EQ(murmur3_batch_active(), a);
    }
  }
  ASSERT_TRUE(murmur3_batch_use(murmur3_impl::scalar));
  EXPECT_EQ(murmur3_batch_active(), murmur3_impl::scalar);
  ASSERT_TRUE(murmur3_batch_use(murmur3_impl::auto_));
  EXPECT_EQ(murmur3_batch_active(), a);
}

}  // namespace
}  // namespace uvbus
