// murmur3_x86_32_batch: every kernel this CPU has, forced in turn, against murmur3_x86_32 — every
// length 0..4096 in batches mixing lengths, random batches (lengths, alignments, sizes, seeds),
// n = 0..17, lanes long enough to leave the SIMD loop early — plus the kernel switch itself, and
// frame_decoder's batched verification with each kernel (order, bad checksums, header errors).
#include "core/murmur3_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/frame.h"
#include "core/murmur3.h"
#include "core/murmur3_batch_impl.h"

namespace uvbus::murmur3_batch_test {
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

// ---- frame_decoder verifies the whole frames of a chunk as one batch ----

struct wire {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<size_t> at;  // where each frame starts in bytes
};

wire make_wire(size_t frames, size_t max_len, std::mt19937& rng) {
  wire w;
  for (size_t i = 0; i < frames; ++i) {
    std::vector<uint8_t> p(rng() % (max_len + 1));
    for (auto& b : p) b = static_cast<uint8_t>(rng());
    w.at.push_back(w.bytes.size());
    w.bytes.resize(w.bytes.size() + frame_size(p.size()));
    EXPECT_NE(frame_encode(p.data(), p.size(), w.bytes.data() + w.at.back(), frame_size(p.size())),
              0u);
    w.payloads.push_back(std::move(p));
  }
  return w;
}

// Feeds bytes in chunks of the given sizes (cycled); collects payloads up to the first error.
frame_status decode(frame_decoder& d, const std::vector<uint8_t>& bytes,
                    const std::vector<size_t>& chunks, std::vector<std::vector<uint8_t>>* out) {
  size_t pos = 0;
  for (size_t ci = 0; pos < bytes.size(); ++ci) {
    const size_t n = std::min(chunks[ci % chunks.size()], bytes.size() - pos);
    d.feed(bytes.data() + pos, n);
    pos += n;
    for (;;) {
      const auto r = d.next();
      if (r.status == frame_status::need_more) break;
      if (r.status != frame_status::payload) return r.status;
      out->emplace_back(r.data, r.data + r.size);
    }
  }
  return frame_status::need_more;
}

// Batches whose payloads average under a decoder's batch_min_mean go one at a time; 0 (the default
// with a SIMD kernel) batches them all.
constexpr size_t kMaxPayload = size_t{256} * 1024;
constexpr size_t kMinMeans[] = {0, 256};

TEST_P(Murmur3Batch, DecoderYieldsEveryFrameInOrderWhateverTheChunks) {
  std::mt19937 rng(5);
  // Up to 600 B: with a 256 B threshold some batches are checked together, some one by one.
  const wire w = make_wire(300, 600, rng);
  for (const size_t min_mean : kMinMeans) {
    for (const std::vector<size_t>& chunks : std::vector<std::vector<size_t>>{
             {w.bytes.size()}, {1}, {7, 100, 3}, {4096}, {65536}, {13, 1000}}) {
      frame_decoder d(kMaxPayload, min_mean);
      std::vector<std::vector<uint8_t>> got;
      EXPECT_EQ(decode(d, w.bytes, chunks, &got), frame_status::need_more);
      EXPECT_EQ(got, w.payloads);
      EXPECT_EQ(d.buffered(), 0u);
    }
  }
}

TEST_P(Murmur3Batch, DecoderStopsAtABadChecksumWhereverItIsInTheBatch) {
  std::mt19937 rng(9);
  const wire good = make_wire(40, 40, rng);
  for (size_t bad = 0; bad < good.payloads.size(); ++bad) {
    for (const bool in_payload : {false, true}) {
      wire w = good;
      if (in_payload && w.payloads[bad].empty()) continue;
      const size_t byte = in_payload ? w.at[bad] + frame_header_size(w.payloads[bad].size()) : 0;
      w.bytes[in_payload ? byte : w.at[bad]] ^= 0x40;
      for (const size_t min_mean : kMinMeans) {
        frame_decoder d(kMaxPayload, min_mean);
        std::vector<std::vector<uint8_t>> got;
        ASSERT_EQ(decode(d, w.bytes, {w.bytes.size()}, &got), frame_status::bad_hash) << bad;
        EXPECT_EQ(got, std::vector<std::vector<uint8_t>>(good.payloads.begin(),
                                                         good.payloads.begin() + bad));
        EXPECT_TRUE(d.failed());
        EXPECT_EQ(d.next().status, frame_status::bad_hash);  // for ever
      }
    }
  }
}

TEST_P(Murmur3Batch, DecoderReportsAHeaderErrorAfterTheWholeFramesBeforeIt) {
  std::mt19937 rng(13);
  const wire good = make_wire(5, 30, rng);
  // Oversize: a 2000-byte announcement to a decoder limited to 1000.
  std::vector<uint8_t> bytes = good.bytes;
  const uint8_t oversize[] = {1, 2, 3, 4, 0x8f, 0x50};
  bytes.insert(bytes.end(), oversize, oversize + sizeof oversize);
  bytes.resize(bytes.size() + 40, 0);
  frame_decoder d(1000, 0);
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(decode(d, bytes, {bytes.size()}, &got), frame_status::oversize);
  EXPECT_EQ(got, good.payloads);
  // Malformed varint: eleven continuation bytes.
  bytes = good.bytes;
  bytes.insert(bytes.end(), 4, 0);
  bytes.insert(bytes.end(), 11, 0x80);
  frame_decoder d2(kMaxPayload, 0);
  got.clear();
  EXPECT_EQ(decode(d2, bytes, {bytes.size()}, &got), frame_status::bad_varint);
  EXPECT_EQ(got, good.payloads);
}

// Where batches of small frames pay depends on the kernel (murmur3_batch.h); a decoder built
// without a threshold takes the active kernel's, and yields every small frame in order.
TEST_P(Murmur3Batch, SmallFramesAreBatchedWhereTheKernelMakesItPay) {
  size_t want = 0;
  if (GetParam() == murmur3_impl::scalar) want = kBatchMinMeanScalar;
  if (GetParam() == murmur3_impl::avx2) want = kBatchMinMeanAvx2;
  EXPECT_EQ(murmur3_batch_min_mean_bytes(), want);
  std::mt19937 rng(21);
  const wire w = make_wire(500, 128, rng);
  frame_decoder d(kMaxPayload);
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(decode(d, w.bytes, {w.bytes.size()}, &got), frame_status::need_more);
  EXPECT_EQ(got, w.payloads);
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

// Where the CPU has AVX2 but not AVX-512, auto_ times both kernels once on mixed-size frames: AVX2
// is taken only when it needs at most nine tenths of the scalar time (closer is noise).
TEST(Murmur3BatchSwitch, AutoTakesAvx2OnlyWhereItMeasuresATenthFaster) {
  EXPECT_EQ(murmur3_batch_detail::pick_avx2_or_scalar(1000, 900), murmur3_impl::avx2);
  EXPECT_EQ(murmur3_batch_detail::pick_avx2_or_scalar(1000, 400), murmur3_impl::avx2);
  EXPECT_EQ(murmur3_batch_detail::pick_avx2_or_scalar(1000, 901), murmur3_impl::scalar);
  EXPECT_EQ(murmur3_batch_detail::pick_avx2_or_scalar(1000, 1000), murmur3_impl::scalar);
  EXPECT_EQ(murmur3_batch_detail::pick_avx2_or_scalar(1000, 1700), murmur3_impl::scalar);
  ASSERT_TRUE(murmur3_batch_use(murmur3_impl::auto_));
  const murmur3_impl a = murmur3_batch_active();
  if (murmur3_batch_supported(murmur3_impl::avx512)) {
    EXPECT_EQ(a, murmur3_impl::avx512);
  } else if (murmur3_batch_supported(murmur3_impl::avx2)) {
    EXPECT_TRUE(a == murmur3_impl::avx2 || a == murmur3_impl::scalar) << to_string(a);
  } else {
    EXPECT_EQ(a, murmur3_impl::scalar);
  }
}

}  // namespace
}  // namespace uvbus::murmur3_batch_test
