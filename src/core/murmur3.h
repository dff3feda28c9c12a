// MurmurHash3 (Austin Appleby's public-domain algorithm), identical in output to the reference
// smhasher implementation for every length and every alignment of the input. Blocks are read with
// the little-endian loads of core/endian.h, so unaligned input is well defined and still compiles
// to plain loads on x86-64. The x64_128 variant is inline: the shm ring hashes every record in its
// hot loops (small records spend a third of their time there), and inlined, consecutive records'
// hashes overlap in the CPU and the unused high word is never computed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/endian.h"

namespace uvbus {

// The 32-bit x86 variant. The stream frame checksum is murmur3_x86_32(payload, len, 0).
[[nodiscard]] uint32_t murmur3_x86_32(const void* data, size_t len, uint32_t seed) noexcept;

namespace murmur3_detail {

inline uint64_t rotl64(uint64_t x, int r) noexcept {
  return (x << r) | (x >> (64 - r));
}
inline uint64_t fmix64(uint64_t k) noexcept {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

// The last t = len % 16 (> 0) bytes of p[0, len) as the reference's little-endian words k1 (the
// first 8) and k2 (the rest), gathered with at most two overlapping in-bounds loads instead of the
// reference's byte-by-byte switch.
inline void tail_words(const uint8_t* p, size_t len, uint64_t* k1, uint64_t* k2) noexcept {
  const size_t t = len & 15;
  if (len >= 16) {
    // The 16 bytes ending at the end of the data hold the tail in their top t bytes.
    const uint64_t lo = load_le64(p + len - 16);
    const uint64_t hi = load_le64(p + len - 8);
    const unsigned s = static_cast<unsigned>(16 - t) * 8;  // 8..120
    if (s < 64) {
      *k1 = (lo >> s) | (hi << (64 - s));
      *k2 = hi >> s;
    } else {
      *k1 = hi >> (s - 64);
    }
  } else if (len >= 8) {
    *k1 = load_le64(p);
    if (len > 8) *k2 = load_le64(p + len - 8) >> ((16 - len) * 8);
  } else if (len >= 4) {
    *k1 = load_le32(p) | (uint64_t{load_le32(p + len - 4)} << ((len - 4) * 8));
  } else {
    *k1 = uint64_t{p[0]} | (uint64_t{p[len >> 1]} << ((len >> 1) * 8)) |
          (uint64_t{p[len - 1]} << ((len - 1) * 8));
  }
}

}  // namespace murmur3_detail

// The 128-bit x64 variant; out[0] holds the low 64 bits (h1), out[1] the high (h2), matching the
// reference's output buffer read as two little-endian u64.
inline void murmur3_x64_128(const void* data, size_t len, uint32_t seed, uint64_t out[2]) noexcept {
  using murmur3_detail::rotl64;
  constexpr uint64_t c1 = 0x87c37b91114253d5ULL;
  constexpr uint64_t c2 = 0x4cf5ad432745937fULL;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h1 = seed;
  uint64_t h2 = seed;
  const size_t nblocks = len / 16;
  for (size_t i = 0; i < nblocks; ++i) {
    uint64_t k1 = load_le64(p + i * 16);
    uint64_t k2 = load_le64(p + i * 16 + 8);
    k1 *= c1;
    k1 = rotl64(k1, 31);
    k1 *= c2;
    h1 ^= k1;
    h1 = rotl64(h1, 27);
    h1 += h2;
    h1 = h1 * 5 + 0x52dce729;
    k2 *= c2;
    k2 = rotl64(k2, 33);
    k2 *= c1;
    h2 ^= k2;
    h2 = rotl64(h2, 31);
    h2 += h1;
    h2 = h2 * 5 + 0x38495ab5;
  }
  if ((len & 15) != 0) {
    uint64_t k1 = 0;
    uint64_t k2 = 0;
    murmur3_detail::tail_words(p, len, &k1, &k2);
    if ((len & 15) > 8) {
      k2 *= c2;
      k2 = rotl64(k2, 33);
      k2 *= c1;
      h2 ^= k2;
    }
    k1 *= c1;
    k1 = rotl64(k1, 31);
    k1 *= c2;
    h1 ^= k1;
  }
  h1 ^= static_cast<uint64_t>(len);
  h2 ^= static_cast<uint64_t>(len);
  h1 += h2;
  h2 += h1;
  h1 = murmur3_detail::fmix64(h1);
  h2 = murmur3_detail::fmix64(h2);
  h1 += h2;
  h2 += h1;
  out[0] = h1;
  out[1] = h2;
}

// The low 32 bits of murmur3_x64_128(data, len, seed): the shm record checksum's payload part.
[[nodiscard]] inline uint32_t murmur3_x64_128_low32(const void* data, size_t len,
                                                    uint32_t seed) noexcept {
  uint64_t h[2];
  murmur3_x64_128(data, len, seed, h);
  return static_cast<uint32_t>(h[0]);
}

}  // namespace uvbus
