// MurmurHash3 (Austin Appleby's public-domain algorithm), identical in output to the reference
// smhasher implementation for every length and every alignment of the input. Blocks are read with
// memcpy, so unaligned input is well defined and still compiles to plain loads on x86-64.
#pragma once

#include <cstddef>
#include <cstdint>

namespace uvbus {

// The 32-bit x86 variant. The stream frame checksum is murmur3_x86_32(payload, len, 0).
[[nodiscard]] uint32_t murmur3_x86_32(const void* data, size_t len, uint32_t seed) noexcept;

// The 128-bit x64 variant; out[0] holds the low 64 bits (h1), out[1] the high (h2), matching the
// reference's output buffer read as two little-endian u64.
void murmur3_x64_128(const void* data, size_t len, uint32_t seed, uint64_t out[2]) noexcept;

}  // namespace uvbus
