// Fuzzes the compressed block codec (src/core/compress.h).
//
// Input layout: byte 0 picks the codec (lz4 or zstd) and a level, bytes 1-2 a limit (1..65536);
// the rest is used twice:
//   * as a hostile block, decompressed into an exactly-limit-sized heap buffer (ASan catches one
//     byte more). Invariants: no crash; ok only with size == the header's raw_size <= limit;
//     oversize exactly when a well-formed header announces more than the limit;
//   * as a message: compress() then decompress() gives it back, the block saves at least
//     compress_min_saving(n) bytes, and the block with one byte flipped (position and bit from the
//     input) still never crashes and never yields another size.
#include <cstring>
#include <memory>

#include "core/compress.h"
#include "fuzz_util.h"

namespace {

uvbus::compressor& shared() {
  static uvbus::compressor z;  // contexts reused across inputs, as on a link
  return z;
}

void check_hostile(uvbus::codec c, const uint8_t* p, size_t n, size_t limit) {
  std::unique_ptr<uint8_t[]> block(new uint8_t[n == 0 ? 1 : n]);
  if (n != 0) std::memcpy(block.get(), p, n);
  std::unique_ptr<uint8_t[]> out(new uint8_t[limit]);
  const auto r = shared().decompress(c, n == 0 ? nullptr : block.get(), n, out.get(), limit);
  uvbus::block_header h;
  const uvbus::errc he = uvbus::parse_block_header(block.get(), n, &h);
  if (r.code == uvbus::errc::ok) {
    FUZZ_CHECK(he == uvbus::errc::ok && h.c == c && r.size == h.raw_size && r.size <= limit);
  } else {
    FUZZ_CHECK(r.size == 0);
  }
  if (he == uvbus::errc::ok && h.c == c && h.raw_size > limit) {
    FUZZ_CHECK(r.code == uvbus::errc::oversize);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uvbus::fuzz::byte_reader in(data, size);
  const uint8_t sel = in.u8();
  const uvbus::codec c = (sel & 1) != 0 ? uvbus::codec::zstd : uvbus::codec::lz4;
  const int level = static_cast<int>(sel >> 1) % 8 - 2;  // -2..5: fast modes, default, HC / zstd
  const size_t limit = size_t{in.u16()} + 1;
  const uint8_t* rest = nullptr;
  const size_t n = in.take(in.left(), &rest);

  check_hostile(c, rest, n, limit);

  // Round trip of the same bytes as a message.
  uvbus::compressor& z = shared();
  std::unique_ptr<uint8_t[]> block(new uint8_t[n + 1]);
  const size_t b = z.compress(c, level, rest, n, block.get(), n + 1);
  if (b == 0) return 0;
  FUZZ_CHECK(n >= uvbus::kCompressMinInput && b + uvbus::compress_min_saving(n) <= n);
  std::unique_ptr<uint8_t[]> out(new uint8_t[n]);
  const auto r = z.decompress(c, block.get(), b, out.get(), n);
  FUZZ_CHECK(r.code == uvbus::errc::ok && r.size == n);
  FUZZ_CHECK(std::memcmp(out.get(), rest, n) == 0);
  // One flipped bit: an error, or a block of the announced size.
  const size_t at = (n > 2 ? rest[0] | rest[1] << 8 : 0) % b;
  block[at] = static_cast<uint8_t>(block[at] ^ (1u << (rest[n - 1] % 8)));
  check_hostile(c, block.get(), b, n);
  return 0;
}
