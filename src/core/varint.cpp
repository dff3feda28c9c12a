// The stream frame's length prefix: encoding and decoding (format in varint.h).
#include "core/varint.h"

namespace uvbus {

size_t varint_encode(uint64_t v, uint8_t* out) noexcept {
  if (v < 0x4000) {
    // One or two bytes (every frame below 16 KiB), chosen without a branch: with one byte, out[0]
    // is written twice with the same value.
    const auto two = static_cast<uint32_t>(v >= 0x80);
    const auto low = static_cast<uint32_t>(v & 0x7f);
    const auto high = static_cast<uint32_t>(0x80 | (v >> 7));
    const uint32_t pick = 0U - two;  // all ones for two bytes (a mask: compilers branch on a ?:)
    out[two] = static_cast<uint8_t>(low);
    out[0] = static_cast<uint8_t>((low & ~pick) | (high & pick));
    return 1 + two;
  }
  const size_t n = varint_size(v);
  // Most significant group first: fill from the end.
  out[n - 1] = static_cast<uint8_t>(v & 0x7f);
  for (size_t i = n - 1; i > 0; --i) {
    v >>= 7;
    out[i - 1] = static_cast<uint8_t>(0x80 | (v & 0x7f));
  }
  return n;
}

varint_status varint_decode(const uint8_t* p, size_t len, uint64_t* value,
                            size_t* consumed) noexcept {
  uint64_t v = 0;
  const size_t limit = len < kVarintMaxBytes ? len : kVarintMaxBytes;
  for (size_t i = 0; i < limit; ++i) {
    // Shifting in 7 more bits must not push set bits out of the top.
    if (v > (UINT64_MAX >> 7)) return varint_status::too_long;
    v = (v << 7) | (p[i] & 0x7f);
    if ((p[i] & 0x80) == 0) {
      *value = v;
      *consumed = i + 1;
      return varint_status::ok;
    }
  }
  return len < kVarintMaxBytes ? varint_status::truncated : varint_status::too_long;
}

}  // namespace uvbus
