// Fuzzes the varint length prefix (src/core/varint.h).
//
// The input is used twice: as bytes to decode, and its first 8 bytes as a value to encode.
// Invariants:
//   * decode(bytes) agrees with a bit-by-bit reading of the varint format (docs/internals.md):
//     ok exactly when a byte with the high bit clear appears within the first 10 bytes and the
//     value fits in 64 bits; truncated exactly when fewer than 10 bytes all have the high bit set
//     (and still fit); too_long otherwise. Every strict prefix of an ok encoding is truncated;
//   * an ok decode of a canonical encoding (no leading 0x80 byte) re-encodes to the same bytes;
//   * varint_decode_short() (2 readable bytes) agrees with decode for one- and two-byte
//     encodings and declines longer ones;
//   * encode(v) writes exactly varint_size(v) bytes (into an exactly-sized heap buffer, so ASan
//     catches one more), decodes back to v, and loses its last byte to a truncated decode.
#include <cstring>
#include <memory>

#include "core/varint.h"
#include "fuzz_util.h"

namespace {

using uvbus::varint_status;

// Straightforward model: accumulate in 128 bits' worth of checking.
varint_status model_decode(const uint8_t* p, size_t len, uint64_t* value, size_t* consumed) {
  uint64_t v = 0;
  for (size_t i = 0; i < len && i < uvbus::kVarintMaxBytes; ++i) {
    if (v >> 57 != 0) return varint_status::too_long;  // 7 more bits would overflow 64
    v = v << 7 | (p[i] & 0x7fu);
    if ((p[i] & 0x80u) == 0) {
      *value = v;
      *consumed = i + 1;
      return varint_status::ok;
    }
  }
  return len < uvbus::kVarintMaxBytes ? varint_status::truncated : varint_status::too_long;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Decode from an exactly-sized copy so a read past the end is an ASan report.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[size == 0 ? 1 : size]);
  if (size != 0) std::memcpy(copy.get(), data, size);
  const uint8_t* p = size == 0 ? nullptr : copy.get();

  uint64_t value = 0xdeadbeef;
  size_t consumed = 12345;
  const varint_status st = uvbus::varint_decode(p, size, &value, &consumed);
  uint64_t mvalue = 0;
  size_t mconsumed = 0;
  const varint_status mst = model_decode(p, size, &mvalue, &mconsumed);
  FUZZ_CHECK(st == mst);
  if (st == varint_status::ok) {
    FUZZ_CHECK(value == mvalue && consumed == mconsumed);
    FUZZ_CHECK(consumed >= 1 && consumed <= uvbus::kVarintMaxBytes && consumed <= size);
    FUZZ_CHECK(uvbus::varint_size(value) <= consumed);
    for (size_t k = 0; k < consumed; ++k) {
      uint64_t v2 = 0;
      size_t c2 = 0;
      FUZZ_CHECK(uvbus::varint_decode(p, k, &v2, &c2) == varint_status::truncated);
    }
    if (p[0] != 0x80 || consumed == 1) {
      uint8_t enc[uvbus::kVarintMaxBytes];
      FUZZ_CHECK(uvbus::varint_encode(value, enc) == consumed);
      FUZZ_CHECK(std::memcmp(enc, p, consumed) == 0);
    }
  } else {
    // Outputs are left alone on failure.
    FUZZ_CHECK(value == 0xdeadbeef && consumed == 12345);
  }
  // The short decoder (2 readable bytes): the general decoder's answer when that took one or two
  // bytes, false (outputs untouched) when it needs more.
  if (size >= 2) {
    uint64_t sv = 7;
    size_t sc = 9;
    if (uvbus::varint_decode_short(p, &sv, &sc)) {
      FUZZ_CHECK(st == varint_status::ok && consumed <= 2 && sv == value && sc == consumed);
    } else {
      FUZZ_CHECK(sv == 7 && sc == 9);
      FUZZ_CHECK(st != varint_status::ok || consumed > 2);
    }
  }

  // Round trip of a value taken from the input.
  uvbus::fuzz::byte_reader in(data, size);
  uint64_t v = in.u64();
  // Bias towards small and boundary values: the low byte picks a shift.
  v >>= (v & 0x3f);
  const size_t n = uvbus::varint_size(v);
  FUZZ_CHECK(n >= 1 && n <= uvbus::kVarintMaxBytes);
  std::unique_ptr<uint8_t[]> enc(new uint8_t[n]);
  FUZZ_CHECK(uvbus::varint_encode(v, enc.get()) == n);
  uint64_t back = 0;
  size_t used = 0;
  FUZZ_CHECK(uvbus::varint_decode(enc.get(), n, &back, &used) == varint_status::ok);
  FUZZ_CHECK(back == v && used == n);
  FUZZ_CHECK(uvbus::varint_decode(enc.get(), n - 1, &back, &used) == varint_status::truncated);
  FUZZ_CHECK(n == 1 || enc[0] != 0x80);  // encodings are canonical
  return 0;
}
