// The AVX2 kernel of murmur3_x86_32_batch: up to eight buffers hashed in the eight 32-bit lanes of
// a ymm register. Compiled with -mavx2 (src/core/CMakeLists.txt); only called after the dispatch
// in murmur3_batch.cpp has checked the CPU.
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
  hf = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hf, 2), hf),
                        _mm256_set1_epi32(static_cast<int>(kC3)));
  return _mm256_blendv_epi8(hx, hf, _mm256_cmpgt_epi32(nb, w));
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
  const __m256i lenv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.len));
  const __m256i nb = _mm256_srli_epi32(lenv, 2);  // full blocks per lane (< 2^28: signed compare)
  __m256i h = _mm256_set1_epi32(static_cast<int>(seed));
  for (uint32_t round = 0; round < l.rounds; ++round) {
    __m256i r[8];
    for (int i = 0; i < 8; ++i) r[i] = load_chunk(l.p[i], l.len[i], round * kChunk);
    transpose8(r);
    const int w0 = static_cast<int>(round * 8);
    for (int j = 0; j < 8; ++j) h = step(h, r[j], nb, _mm256_set1_epi32(w0 + j));
  }
  alignas(32) uint32_t state[8];
  alignas(32) uint32_t done[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(state), h);
  _mm256_store_si256(reinterpret_cast<__m256i*>(done), fmix(_mm256_xor_si256(h, lenv)));
  const uint32_t simd_bytes = l.rounds * kChunk;
  for (size_t i = 0; i < n; ++i) {
    out[i] =
        l.len[i] <= simd_bytes ? done[i] : finish_scalar(state[i], l.p[i], l.len[i], simd_bytes);
  }
}

}  // namespace uvbus::murmur3_batch_detail
