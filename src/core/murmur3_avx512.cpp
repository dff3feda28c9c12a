// The AVX-512 kernels of murmur3_x86_32_batch: up to sixteen buffers in the 32-bit lanes of a zmm
// register, or up to eight in a ymm register (AVX-512VL), with native rotates, mask-register
// blends and byte-masked loads of the lanes' last partial chunk. Compiled with -mavx512f
// -mavx512bw -mavx512vl -mbmi2 (src/core/CMakeLists.txt); only called after the dispatch in
// murmur3_batch.cpp has checked the CPU.
#include <immintrin.h>

#include "core/murmur3_batch_impl.h"
#include "core/murmur3_batch_simd.h"

namespace uvbus::murmur3_batch_detail {
namespace {

// Bytes [off, off + 32) of lane i, zero past its end, with one byte-masked load (bytes past the
// end are masked off: neither read nor faulted on) and no branch on the lane's length (see lanes).
inline __m256i load_chunk_masked(const lanes& l, size_t i, uint32_t off) noexcept {
  uint32_t rem = 0;
  const uint8_t* q = chunk_at(l.p[i], l.len[i], off, &rem);
  // BZHI reads only the index's low 8 bits: clamp first (a cmov, not a branch).
  return _mm256_maskz_loadu_epi8(_bzhi_u32(0xffffffffU, std::min(rem, kChunk)), q);
}

// Lanes [base, base + 8) of round `round`, transposed (load_round_with: the byte-masked load
// where a lane ends in this round).
inline void load_round(const lanes& l, size_t base, uint32_t round, __m256i r[8]) noexcept {
  const uint32_t off = round * kChunk;
  load_round_with(l, base, round, r, [&](size_t i) { return load_chunk_masked(l, i, off); });
}

// Shifts, rotates and the 256-bit insert through their zero-masking forms with every lane
// selected (the same instructions): GCC 12's plain 512-bit forms pass _mm512_undefined_epi32(),
// which its own -Wuninitialized then reports at -O2 and above.
constexpr __mmask16 kAll16 = 0xffff;
constexpr __mmask8 kAll8 = 0xff;

// One block index w for every lane, as the AVX2 kernel's step(): the reference's block step where
// w < nb, only "h ^= mix(k)" elsewhere (the tail word, or zero words that leave h alone).
inline __m512i step(__m512i h, __m512i k, __m512i nb, __m512i w) noexcept {
  k = _mm512_mullo_epi32(k, _mm512_set1_epi32(static_cast<int>(kC1)));
  k = _mm512_maskz_rol_epi32(kAll16, k, 15);
  k = _mm512_mullo_epi32(k, _mm512_set1_epi32(static_cast<int>(kC2)));
  const __m512i hx = _mm512_xor_si512(h, k);
  __m512i hf = _mm512_maskz_rol_epi32(kAll16, hx, 13);
  hf = _mm512_add_epi32(_mm512_maskz_slli_epi32(kAll16, hf, 2),
                        _mm512_add_epi32(hf, _mm512_set1_epi32(static_cast<int>(kC3))));
  return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(nb, w), hx, hf);
}

inline __m256i step(__m256i h, __m256i k, __m256i nb, __m256i w) noexcept {
  k = _mm256_mullo_epi32(k, _mm256_set1_epi32(static_cast<int>(kC1)));
  k = _mm256_rol_epi32(k, 15);
  k = _mm256_mullo_epi32(k, _mm256_set1_epi32(static_cast<int>(kC2)));
  const __m256i hx = _mm256_xor_si256(h, k);
  __m256i hf = _mm256_rol_epi32(hx, 13);
  hf = _mm256_add_epi32(_mm256_slli_epi32(hf, 2),
                        _mm256_add_epi32(hf, _mm256_set1_epi32(static_cast<int>(kC3))));
  return _mm256_mask_blend_epi32(_mm256_cmpgt_epi32_mask(nb, w), hx, hf);
}

inline __m512i fmix(__m512i h) noexcept {
  h = _mm512_xor_si512(h, _mm512_maskz_srli_epi32(kAll16, h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(kF1)));
  h = _mm512_xor_si512(h, _mm512_maskz_srli_epi32(kAll16, h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(kF2)));
  return _mm512_xor_si512(h, _mm512_maskz_srli_epi32(kAll16, h, 16));
}

inline __m256i fmix(__m256i h) noexcept {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(kF1)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(kF2)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

}  // namespace

void batch_avx512(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                  uint32_t* out) noexcept {
  lanes l;
  load_lanes(data, len, n, &l);
  const __m512i lenv = _mm512_loadu_si512(l.len);
  // Full blocks per lane (below 2^28, so the signed compare in step() is right).
  const __m512i nb = _mm512_maskz_srli_epi32(kAll16, lenv, 2);
  __m512i h = _mm512_set1_epi32(static_cast<int>(seed));
  for (uint32_t round = 0; round < l.rounds; ++round) {
    __m256i lo[8];
    __m256i hi[8];
    load_round(l, 0, round, lo);
    load_round(l, 8, round, hi);
    const int w0 = static_cast<int>(round * 8);
    for (int j = 0, e = round_words(l, round); j < e; ++j) {
      const __m512i k = _mm512_maskz_inserti64x4(kAll8, _mm512_castsi256_si512(lo[j]), hi[j], 1);
      h = step(h, k, nb, _mm512_set1_epi32(w0 + j));
    }
  }
  alignas(64) uint32_t state[16];
  alignas(64) uint32_t done[16];
  _mm512_store_si512(state, h);
  _mm512_store_si512(done, fmix(_mm512_xor_si512(h, lenv)));
  finish_lanes(l, n, state, done, out);
}

void batch_avx512_8(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                    uint32_t* out) noexcept {
  lanes l;
  load_lanes(data, len, n, &l);
  const __m256i lenv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(l.len));
  const __m256i nb = _mm256_srli_epi32(lenv, 2);
  __m256i h = _mm256_set1_epi32(static_cast<int>(seed));
  for (uint32_t round = 0; round < l.rounds; ++round) {
    __m256i r[8];
    load_round(l, 0, round, r);
    const int w0 = static_cast<int>(round * 8);
    for (int j = 0, e = round_words(l, round); j < e; ++j) {
      h = step(h, r[j], nb, _mm256_set1_epi32(w0 + j));
    }
  }
  alignas(32) uint32_t state[8];
  alignas(32) uint32_t done[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(state), h);
  _mm256_store_si256(reinterpret_cast<__m256i*>(done), fmix(_mm256_xor_si256(h, lenv)));
  finish_lanes(l, n, state, done, out);
}

}  // namespace uvbus::murmur3_batch_detail
