// The AVX2 kernel of murmur3_x86_32_batch: up to sixteen buffers hashed in the 32-bit lanes of
// two ymm registers (two independent dependency chains). Compiled with -mavx2
// (src/core/CMakeLists.txt); only called after the dispatch in murmur3_batch.cpp has checked the
// CPU.
#include <immintrin.h>

#include "core/murmur3_batch_impl.h"
#include "core/murmur3_batch_simd.h"

namespace uvbus::murmur3_batch_detail {
namespace {

template <int R>
inline __m256i rotl(__m256i x) noexcept {
  return _mm256_or_si256(_mm256_slli_epi32(x, R), _mm256_srli_epi32(x, 32 - R));
}

// One block index w for every lane. Lanes with w < nb take the reference's block step. The others
// take only "h ^= mix(k)": for the tail word (w == nb) that is the reference's tail step, and for
// the zero words after it mix(0) == 0 leaves h alone; so no lane needs a branch.
inline __m256i step(__m256i h, __m256i k, __m256i nb, __m256i w) noexcept {
  k = _mm256_mullo_epi32(k, _mm256_set1_epi32(static_cast<int>(kC1)));
  k = rotl<15>(k);
  k = _mm256_mullo_epi32(k, _mm256_set1_epi32(static_cast<int>(kC2)));
  const __m256i hx = _mm256_xor_si256(h, k);
  __m256i hf = rotl<13>(hx);
  hf = _mm256_add_epi32(_mm256_slli_epi32(hf, 2),
                        _mm256_add_epi32(hf, _mm256_set1_epi32(static_cast<int>(kC3))));
  return _mm256_blendv_epi8(hx, hf, _mm256_cmpgt_epi32(nb, w));
}

// Lanes [base, base + 8) of round `round`, transposed (load_round_with: the dword-masked load
// and tail blend where a lane ends in this round).
inline void load_round(const lanes& l, size_t base, uint32_t round, __m256i r[8]) noexcept {
  load_round_with(l, base, round, r, [&](size_t i) { return load_chunk(l, i, round); });
}

inline __m256i fmix(__m256i h) noexcept {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(kF1)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(kF2)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

}  // namespace

void batch_avx2(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                uint32_t* out) noexcept {
  lanes l;
  load_lanes(data, len, n, &l);
  const __m256i len0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.len));
  const __m256i len1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.len + 8));
  // Full blocks per lane (below 2^28, so the signed compare in step() is right).
  const __m256i nb0 = _mm256_srli_epi32(len0, 2);
  const __m256i nb1 = _mm256_srli_epi32(len1, 2);
  __m256i h0 = _mm256_set1_epi32(static_cast<int>(seed));
  __m256i h1 = h0;
  for (uint32_t round = 0; round < l.rounds; ++round) {
    __m256i r0[8];
    load_round(l, 0, round, r0);
    const int w0 = static_cast<int>(round * 8);
    const int e = round_words(l, round);
    if (n <= 8) {
      for (int j = 0; j < e; ++j) h0 = step(h0, r0[j], nb0, _mm256_set1_epi32(w0 + j));
      continue;
    }
    __m256i r1[8];
    load_round(l, 8, round, r1);
    for (int j = 0; j < e; ++j) {
      // Two independent chains: each hides the other's latency.
      const __m256i w = _mm256_set1_epi32(w0 + j);
      h0 = step(h0, r0[j], nb0, w);
      h1 = step(h1, r1[j], nb1, w);
    }
  }
  alignas(32) uint32_t state[16];
  alignas(32) uint32_t done[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(state), h0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(state + 8), h1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(done), fmix(_mm256_xor_si256(h0, len0)));
  _mm256_store_si256(reinterpret_cast<__m256i*>(done + 8), fmix(_mm256_xor_si256(h1, len1)));
  finish_lanes(l, n, state, done, out);
}

}  // namespace uvbus::murmur3_batch_detail
