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

// Bytes needed to encode v (1..10).
[[nodiscard]] constexpr size_t varint_size(uint64_t v) noexcept {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Writes the encoding of v to out (which must have room for varint_size(v) bytes) and returns the
// number of bytes written.
size_t varint_encode(uint64_t v, uint8_t* out) noexcept;

enum class varint_status {
  ok,         // *value and *consumed are set
  truncated,  // the input ends before the last byte; feed more and try again
  too_long,   // more than 10 bytes, or a value that does not fit in 64 bits: malformed
};

// Decodes one varint from [p, p + len). On ok sets *value and *consumed; otherwise leaves them.
[[nodiscard]] varint_status varint_decode(const uint8_t* p, size_t len, uint64_t* value,
                                          size_t* consumed) noexcept;

}  // namespace uvbus
