// Fuzzes crc32c (src/core/crc32c.h): every kernel this CPU has against a bit-at-a-time definition.
//
// Input: bytes 0-3 the CRC to continue from (0: a CRC started afresh, the path record checksums
// take), byte 4 a cut point, byte 5 an alignment, the rest the data.
// Invariants, for every kernel (forced in turn with crc32c_use; the sse42 kernel in both of its
// variants for inputs of 256..1791 B, crc32c_detail::sse42_medium_use):
//   * crc32c(data, len, from) equals the definition's;
//   * cut anywhere, the CRC of the tail continued from the CRC of the head is the CRC of the whole;
//   * nothing is read outside the data: it lives in an exactly-sized allocation after its
//     alignment bytes, so ASan reports a read past its end.
#include <cstring>
#include <initializer_list>
#include <memory>

#include "core/crc32c.h"
#include "fuzz_util.h"

namespace {

uint32_t reference(const uint8_t* p, size_t len, uint32_t crc) {
  uint32_t reg = ~crc;
  for (size_t i = 0; i < len; ++i) {
    reg ^= p[i];
    for (int b = 0; b < 8; ++b) reg = (reg >> 1) ^ ((reg & 1U) != 0 ? 0x82F63B78U : 0U);
  }
  return ~reg;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uvbus::fuzz::byte_reader in(data, size);
  const uint32_t from = in.u32();
  const uint8_t cut_byte = in.u8();
  const size_t align = in.u8() & 63;
  const uint8_t* src = nullptr;
  const size_t n = in.take(size, &src);
  std::unique_ptr<uint8_t[]> storage(new uint8_t[align + n]);
  uint8_t* buf = storage.get() + align;
  if (n != 0) std::memcpy(buf, src, n);
  const size_t cut = n == 0 ? 0 : cut_byte % (n + 1);
  const uint32_t want = reference(buf, n, from);
  for (const int k : {0, 1, 2}) {  // table, sse42 folding, sse42 in lanes
    if (!uvbus::crc32c_use(k == 0 ? uvbus::crc32c_impl::table : uvbus::crc32c_impl::sse42) ||
        (k != 0 && !uvbus::crc32c_detail::sse42_medium_use(k - 1))) {
      continue;
    }
    FUZZ_CHECK(uvbus::crc32c(buf, n, from) == want);
    const uint32_t head = uvbus::crc32c(buf, cut, from);
    FUZZ_CHECK(uvbus::crc32c(buf + cut, n - cut, head) == want);
  }
  (void)uvbus::crc32c_use(uvbus::crc32c_impl::auto_);
  return 0;
}
