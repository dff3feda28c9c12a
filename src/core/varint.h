// The length prefix of the stream frame format (format in docs/internals.md, byte-compatible with
// libatbus): 7-bit groups, MOST significant group first, every byte but the last has the high bit
// set.
//   0 -> 00, 127 -> 7F, 128 -> 81 00, 300 -> 82 2C
// A 64-bit value needs at most 10 bytes; longer encodings are rejected.
#pragma once

#include <cstddef>
#include <cstdint>

namespace uvbus {

inline constexpr size_t kVarintMaxBytes = 10;

// Bytes needed to encode v (1..10): 7 bits a byte. Computed from the highest set bit, without a
// loop: a loop's exit mispredicts when the lengths of consecutive frames vary.
[[nodiscard]] constexpr size_t varint_size(uint64_t v) noexcept {
  const int bits = 64 - __builtin_clzll(v | 1);
  return static_cast<size_t>((bits + 6) / 7);
}

// Writes the encoding of v to out (which must have room for varint_size(v) bytes) and returns the
// number of bytes written.
size_t varint_encode(uint64_t v, uint8_t* out) noexcept;

enum class varint_status {
  ok,         // *value and *consumed are set
  truncated,  // the input ends before the last byte; feed more and try again
  too_long,   // more than 10 bytes, or a value that does not fit in 64 bits: malformed
};

// The one- and two-byte encodings (values below 16384: the length of every frame below 16 KiB),
// decoded without a branch on which: a receiver walking frames of mixed sizes would mispredict
// that branch. p must have 2 readable bytes (the second may belong to what follows). Returns
// false, leaving *value and *consumed, for a longer encoding: decode it with varint_decode().
[[nodiscard]] inline bool varint_decode_short(const uint8_t* p, uint64_t* value,
                                              size_t* consumed) noexcept {
  const uint32_t b0 = p[0];
  const uint32_t b1 = p[1];
  const uint32_t two = b0 >> 7;
  if ((two & (b1 >> 7)) != 0) return false;
  const uint32_t pick = 0U - two;  // all ones for two bytes (a mask: compilers branch on a ?:)
  *value = (b0 & ~pick) | (((b0 & 0x7f) << 7 | b1) & pick);
  *consumed = 1 + two;
  return true;
}

// Decodes one varint from [p, p + len). On ok sets *value and *consumed; otherwise leaves them.
[[nodiscard]] varint_status varint_decode(const uint8_t* p, size_t len, uint64_t* value,
                                          size_t* consumed) noexcept;

}  // namespace uvbus
