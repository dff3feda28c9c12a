#include "core/varint.h"

namespace uvbus {

size_t varint_encode(uint64_t v, uint8_t* out) noexcept {
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
