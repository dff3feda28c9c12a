// Helpers shared by the SIMD kernels of murmur3_x86_32_batch (murmur3_avx2.cpp and
// murmur3_avx512.cpp): a lane's 32-byte chunk, zero-padded past its end, and the 8x8 transpose
// of 32-bit words that turns eight lanes' chunks into eight vectors of one block index each.
// Included only by those files (it needs -mavx2); everything here has internal linkage, so no
// AVX-compiled copy can be picked by the linker for code that runs on any CPU.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/murmur3_batch_impl.h"

namespace uvbus::murmur3_batch_detail {
namespace {

inline constexpr uint32_t kC1 = 0xcc9e2d51U;
inline constexpr uint32_t kC2 = 0x1b873593U;
inline constexpr uint32_t kC3 = 0xe6546b64U;
inline constexpr uint32_t kF1 = 0x85ebca6bU;
inline constexpr uint32_t kF2 = 0xc2b2ae35U;
inline constexpr uint32_t kChunk = 32;  // bytes per lane per round: eight 4-byte blocks

// Where a lane that has ended points its (fully masked) loads. A masked load whose 32 bytes cross
// a page boundary can take a microcode assist even when the mask excludes the far page; a lane
// that ended near a page end would pay it in every remaining round (measured: 5x slower batches of
// 8-16384 B frames). This block never crosses a page.
alignas(64) inline constexpr uint8_t kZeroChunk[kChunk] = {};

// r[i] holds words 0..7 of lane i; afterwards r[j] holds word j of lanes 0..7.
inline void transpose8(__m256i r[8]) noexcept {
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]);
  const __m256i t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]);
  const __m256i t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]);
  const __m256i t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]);
  const __m256i t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  // u0: words 0|4 of lanes 0-3, u1: 1|5, u2: 2|6, u3: 3|7; u4..u7 the same for lanes 4-7.
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2);
  const __m256i u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);
  const __m256i u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6);
  const __m256i u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7);
  const __m256i u7 = _mm256_unpackhi_epi64(t5, t7);
  r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// The lanes' lengths as 32-bit values, and how many 32-byte rounds the SIMD loop runs: as many as
// the second-longest lane needs, so that at least two lanes are busy in every round. Lanes longer
// than that leave the loop on a block boundary and are finished by finish_scalar(). words: the
// 4-byte words (blocks and tail) of the longest lane that the loop covers; rounds stop there, as
// every lane's words past it are zero.
// used / min_len: how many lanes hold a buffer and the shortest of them: a round that ends at or
// below min_len loads every used lane's chunk whole (full_round()).
//
// Nothing here branches on a single lane's length. Real frame lengths are random, and a branch per
// lane and round (GCC turns `off < len ? a : b` into one) mispredicts so often that it cost more
// than the hashing: 63 cycles a frame instead of 26 for 8-128 B frames whose lengths the predictor
// cannot learn (docs/core.md). Branches left are per batch or per round, on aggregates that repeat.
struct lanes {
  const uint8_t* p[16] = {};
  uint32_t len[16] = {};
  uint32_t tail[16] = {};  // the last 1..3 bytes as a zero-padded word (0 without a tail)
  uint32_t rounds = 0;
  uint32_t words = 0;
  size_t used = 0;
  uint32_t min_len = 0;
};

// The tail word of p[0, len): branch-free when len >= 4 (the 4 bytes ending at len are in
// bounds), byte by byte below that.
inline uint32_t tail_word(const uint8_t* p, uint32_t len) noexcept {
  const uint32_t t = len & 3;
  if (len >= 4) {
    uint32_t last = 0;
    std::memcpy(&last, p + len - 4, 4);                            // little-endian host (x86)
    return static_cast<uint32_t>(uint64_t{last} >> (32 - 8 * t));  // t == 0: shifts out all
  }
  uint32_t k = 0;
  for (uint32_t j = 0; j < t; ++j) k |= static_cast<uint32_t>(p[j]) << (8 * j);
  return k;
}

inline void load_lanes(const uint8_t* const* data, const size_t* len, size_t n, lanes* l) noexcept {
  uint32_t top1 = 0;
  uint32_t top2 = 0;
  uint32_t shortest = UINT32_MAX;
  for (size_t i = 0; i < n; ++i) {
    l->p[i] = data[i];
    l->len[i] = static_cast<uint32_t>(len[i]);
    l->tail[i] = tail_word(data[i], l->len[i]);
    const uint32_t r = (l->len[i] + kChunk - 1) / kChunk;
    top2 = std::max(top2, std::min(top1, r));  // min/max, not if/else: no branch per lane
    top1 = std::max(top1, r);
    shortest = std::min(shortest, l->len[i]);
  }
  l->rounds = top2;
  l->used = n;
  l->min_len = shortest;
  uint32_t words = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t w = (l->len[i] + 3) / 4;
    if (w > words) words = w;
  }
  l->words = words < top2 * 8 ? words : top2 * 8;
}

// Whether each of the first `width` lanes has all 32 bytes of this round's chunk (plain loads, no
// masks): all of them hold a buffer, and the shortest is long enough.
inline bool full_round(const lanes& l, size_t width, uint32_t round) noexcept {
  return l.used >= width && l.min_len >= (round + 1) * kChunk;
}

// Where lane p[0, len) has its bytes [off, off + 32) and how many of them exist (*rem, 0..len):
// past its end, kZeroChunk and 0. Selected with masks, not ?: (see lanes).
inline const uint8_t* chunk_at(const uint8_t* p, uint32_t len, uint32_t off,
                               uint32_t* rem) noexcept {
  const uintptr_t in = uintptr_t{0} - static_cast<uintptr_t>(off < len);  // all ones inside
  *rem = (len - off) & static_cast<uint32_t>(in);
  const uintptr_t at = ((reinterpret_cast<uintptr_t>(p) + off) & in) |
                       (reinterpret_cast<uintptr_t>(kZeroChunk) & ~in);  // see kZeroChunk
  return reinterpret_cast<const uint8_t*>(at);
}

// Words of round `round` that some lane still needs (1..8).
inline int round_words(const lanes& l, uint32_t round) noexcept {
  const uint32_t left = l.words - round * 8;
  return left < 8 ? static_cast<int>(left) : 8;
}

// Bytes [off, off + 32) of lane i, zero past its end, for AVX2, without a branch on the lane's
// length (lengths vary at random from frame to frame, and mispredicted branches here cost more
// than the hashing): the whole words come from a masked load (masked-off words are not accessed,
// so they cannot fault) and the word holding the last 1..3 bytes, assembled once per lane by
// load_lanes(), is blended in at its index. Zero padding is what makes the kernels' tail handling
// work: the word after the last full block holds the tail bytes exactly as the reference
// assembles them, and every word after that is zero (a no-op, see the kernels' step()).
inline __m256i load_chunk(const lanes& l, size_t i, uint32_t round) noexcept {
  const uint32_t len = l.len[i];
  // Whole words of lane i before this chunk's start, minus the chunk's first word index: the
  // chunk's words j < rel are whole blocks, word j == rel is the tail word, the rest are zero.
  const int rel = static_cast<int>(len / 4) - static_cast<int>(round * 8);
  uint32_t rem = 0;
  const uint8_t* q = chunk_at(l.p[i], len, round * kChunk, &rem);
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i relv = _mm256_set1_epi32(rel);
  const __m256i v =
      _mm256_maskload_epi32(reinterpret_cast<const int*>(q), _mm256_cmpgt_epi32(relv, index));
  return _mm256_blendv_epi8(v, _mm256_set1_epi32(static_cast<int>(l.tail[i])),
                            _mm256_cmpeq_epi32(relv, index));
}

// Lanes [base, base + 8) of round `round`, transposed: r[j] holds word j of the eight lanes. A
// round that every lane fills takes plain loads; otherwise partial(i) loads lane i's chunk, zero
// past its end (each kernel's masked load).
template <class Partial>
inline void load_round_with(const lanes& l, size_t base, uint32_t round, __m256i r[8],
                            Partial partial) noexcept {
  if (full_round(l, base + 8, round)) {
    const size_t off = size_t{round} * kChunk;
    for (size_t i = 0; i < 8; ++i) {
      r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.p[base + i] + off));
    }
  } else {
    for (size_t i = 0; i < 8; ++i) r[i] = partial(base + i);
  }
  transpose8(r);
}

// out[i] for every lane: the SIMD result (done), or for the lanes longer than the SIMD rounds
// (usually none or one) the scalar continuation from their state after those rounds.
inline void finish_lanes(const lanes& l, size_t n, const uint32_t* state, const uint32_t* done,
                         uint32_t* out) noexcept {
  const uint32_t simd_bytes = l.rounds * kChunk;
  uint32_t rest = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = done[i];
    rest |= static_cast<uint32_t>(l.len[i] > simd_bytes) << i;
  }
  while (rest != 0) {
    const auto i = static_cast<size_t>(__builtin_ctz(rest));
    rest &= rest - 1;
    out[i] = finish_scalar(state[i], l.p[i], l.len[i], simd_bytes);
  }
}

}  // namespace
}  // namespace uvbus::murmur3_batch_detail
