// The AVX-512 kernel of murmur3_x86_32_batch: up to sixteen buffers hashed in the sixteen 32-bit
// lanes of a zmm register (AVX-512F: native rotates and mask-register blends). Compiled with
// -mavx512f (src/core/CMakeLists.txt); only called after the dispatch in murmur3_batch.cpp has
// checked the CPU.
#include <immintrin.h>

#include "core/murmur3_batch_impl.h"
#include "core/murmur3_batch_simd.h"

namespace uvbus::murmur3_batch_detail {
namespace {

// As the AVX2 kernel's step(): the block step where w < nb, only "h ^= mix(k)" elsewhere.
inline __m512i step(__m512i h, __m512i k, __m512i nb, __m512i w) noexcept {
  k = _mm512_mullo_epi32(k, _mm512_set1_epi32(static_cast<int>(kC1)));
  k = _mm512_rol_epi32(k, 15);
  k = _mm512_mullo_epi32(k, _mm512_set1_epi32(static_cast<int>(kC2)));
  const __m512i hx = _mm512_xor_si512(h, k);
  __m512i hf = _mm512_rol_epi32(hx, 13);
  hf = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(hf, 2), hf),
                        _mm512_set1_epi32(static_cast<int>(kC3)));
  return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(nb, w), hx, hf);
}

inline __m512i fmix(__m512i h) noexcept {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(kF1)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(kF2)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

}  // namespace

void batch_avx512(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                  uint32_t* out) noexcept {
  lanes l;
  load_lanes(data, len, n, &l);
  const __m512i lenv = _mm512_loadu_si512(l.len);
  const __m512i nb = _mm512_srli_epi32(lenv, 2);  // full blocks per lane (< 2^28: signed compare)
  __m512i h = _mm512_set1_epi32(static_cast<int>(seed));
  for (uint32_t round = 0; round < l.rounds; ++round) {
    __m256i lo[8];
    __m256i hi[8];
    for (int i = 0; i < 8; ++i) {
      lo[i] = load_chunk(l.p[i], l.len[i], round * kChunk);
      hi[i] = load_chunk(l.p[8 + i], l.len[8 + i], round * kChunk);
    }
    transpose8(lo);
    transpose8(hi);
    const int w0 = static_cast<int>(round * 8);
    for (int j = 0; j < 8; ++j) {
      const __m512i k = _mm512_inserti64x4(_mm512_castsi256_si512(lo[j]), hi[j], 1);
      h = step(h, k, nb, _mm512_set1_epi32(w0 + j));
    }
  }
  alignas(64) uint32_t state[16];
  alignas(64) uint32_t done[16];
  _mm512_store_si512(state, h);
  _mm512_store_si512(done, fmix(_mm512_xor_si512(h, lenv)));
  const uint32_t simd_bytes = l.rounds * kChunk;
  for (size_t i = 0; i < n; ++i) {
    out[i] =
        l.len[i] <= simd_bytes ? done[i] : finish_scalar(state[i], l.p[i], l.len[i], simd_bytes);
  }
}

}  // namespace uvbus::murmur3_batch_detail
