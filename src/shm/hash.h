// payload_hash inlined into the ring's hot loops: the low 32 bits of MurmurHash3_x64_128(payload,
// len, seed 0), bit for bit the value of uvbus::murmur3_x64_128 (ShmHash.MatchesCoreMurmur3
// checks every length up to 300), computed without the reference's byte-by-byte tail: the last
// len % 16 bytes are gathered with at most two overlapping in-bounds loads. Inlined, consecutive
// records' hashes also overlap in the CPU (the next record's position does not depend on the
// hash). Small records are the case this matters for: the hash was a third of both sides' time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace uvbus::shm_detail {

namespace mm {
inline uint64_t ld64(const uint8_t* p) noexcept {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (x86-64, aarch64): the region is host-endian anyway
}
inline uint32_t ld32(const uint8_t* p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t rotl(uint64_t x, int r) noexcept {
  return (x << r) | (x >> (64 - r));
}
inline uint64_t fmix(uint64_t k) noexcept {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}
}  // namespace mm

inline uint32_t payload_hash_inline(const void* data, size_t len) noexcept {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian loads");
  constexpr uint64_t c1 = 0x87c37b91114253d5ULL;
  constexpr uint64_t c2 = 0x4cf5ad432745937fULL;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h1 = 0, h2 = 0;
  const size_t nblocks = len / 16;
  for (size_t i = 0; i < nblocks; ++i) {
    uint64_t k1 = mm::ld64(p + i * 16);
    uint64_t k2 = mm::ld64(p + i * 16 + 8);
    k1 *= c1;
    k1 = mm::rotl(k1, 31);
    k1 *= c2;
    h1 ^= k1;
    h1 = mm::rotl(h1, 27);
    h1 += h2;
    h1 = h1 * 5 + 0x52dce729;
    k2 *= c2;
    k2 = mm::rotl(k2, 33);
    k2 *= c1;
    h2 ^= k2;
    h2 = mm::rotl(h2, 31);
    h2 += h1;
    h2 = h2 * 5 + 0x38495ab5;
  }
  // The tail: t = len % 16 bytes, k1 = its first 8 (little-endian), k2 = the rest.
  const size_t t = len & 15;
  uint64_t k1 = 0, k2 = 0;
  if (t != 0) {
    if (len >= 16) {
      // The 16 bytes ending at the end of the data hold the tail in their top t bytes.
      const uint64_t lo = mm::ld64(p + len - 16);
      const uint64_t hi = mm::ld64(p + len - 8);
      const unsigned s = static_cast<unsigned>(16 - t) * 8;  // 8..120
      if (s < 64) {
        k1 = (lo >> s) | (hi << (64 - s));
        k2 = hi >> s;
      } else {
        k1 = hi >> (s - 64);
      }
    } else if (len >= 8) {
      k1 = mm::ld64(p);
      if (len > 8) k2 = mm::ld64(p + len - 8) >> ((16 - len) * 8);
    } else if (len >= 4) {
      k1 = mm::ld32(p) | (uint64_t{mm::ld32(p + len - 4)} << ((len - 4) * 8));
    } else {
      k1 = uint64_t{p[0]} | (uint64_t{p[len >> 1]} << ((len >> 1) * 8)) |
           (uint64_t{p[len - 1]} << ((len - 1) * 8));
    }
    if (t > 8) {
      k2 *= c2;
      k2 = mm::rotl(k2, 33);
      k2 *= c1;
      h2 ^= k2;
    }
    k1 *= c1;
    k1 = mm::rotl(k1, 31);
    k1 *= c2;
    h1 ^= k1;
  }
  h1 ^= len;
  h2 ^= len;
  h1 += h2;
  h2 += h1;
  h1 = mm::fmix(h1);
  h2 = mm::fmix(h2);
  h1 += h2;
  return static_cast<uint32_t>(h1);
}

}  // namespace uvbus::shm_detail
