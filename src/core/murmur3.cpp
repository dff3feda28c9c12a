// MurmurHash3_x86_32 by Austin Appleby (public domain), written from the algorithm's description
// (the x64_128 variant is inline in the header). Blocks are read with core/endian.h's loads.
#include "core/murmur3.h"

#include "core/endian.h"

namespace uvbus {
namespace {

inline uint32_t rotl32(uint32_t x, int r) noexcept {
  return (x << r) | (x >> (32 - r));
}
inline uint32_t fmix32(uint32_t h) noexcept {
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  h ^= h >> 16;
  return h;
}
}  // namespace

uint32_t murmur3_x86_32(const void* data, size_t len, uint32_t seed) noexcept {
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t nblocks = len / 4;
  constexpr uint32_t c1 = 0xcc9e2d51U;
  constexpr uint32_t c2 = 0x1b873593U;
  uint32_t h1 = seed;

  for (size_t i = 0; i < nblocks; ++i) {
    uint32_t k1 = load_le32(p + i * 4);
    k1 *= c1;
    k1 = rotl32(k1, 15);
    k1 *= c2;
    h1 ^= k1;
    h1 = rotl32(h1, 13);
    h1 = h1 * 5 + 0xe6546b64U;
  }

  // The tail (len % 4 bytes): from 4 bytes on, the input's last word shifted down to them, so
  // no branch depends on len % 4 (a switch on it mispredicted on mixed lengths: random 8-128 B
  // frames 39.1 -> 33.2 ns, docs/core.md); mix(0) == 0 leaves h1 alone when there is no tail.
  // Shorter inputs take the reference's byte steps.
  const auto t = static_cast<unsigned>(len & 3);
  uint32_t k1 = 0;
  if (len >= 4) {
    k1 = t == 0 ? 0 : load_le32(p + len - 4) >> (32 - 8 * t);
  } else {
    for (unsigned j = 0; j < t; ++j) k1 |= static_cast<uint32_t>(p[j]) << (8 * j);
  }
  k1 *= c1;
  k1 = rotl32(k1, 15);
  k1 *= c2;
  h1 ^= k1;
  // The reference mixes in the length as a 32-bit int.
  h1 ^= static_cast<uint32_t>(len);
  return fmix32(h1);
}

}  // namespace uvbus
