// crc32c's SSE4.2 kernel (this file alone is built with -msse4.2 -mpclmul; crc32c.cpp calls it
// only on a CPU that has both). The crc32 instruction takes 3 cycles per 8 bytes but can start
// one every cycle, so one dependent chain runs at a third of the unit's speed: long inputs are cut
// into rounds of three 256-byte lanes hashed side by side, what is left (from 256 bytes on) into
// one round of three shorter lanes, and the three lane CRCs are joined by shifting each over the
// bytes that follow it: a carry-less multiply by x^(8n-33) mod P, reduced by one more crc32 (the
// identity behind zlib's crc32_combine, in two instructions). The same multiply, by a negative
// power of x, lets the first len % 8 bytes take one 8-byte step without a branch on len % 8; for
// a CRC started afresh (the register ~0, every record checksum) that multiply is a table entry.
#include <nmmintrin.h>
#include <wmmintrin.h>

#include <cstring>

#include "core/crc32c.h"

namespace uvbus::crc32c_detail {
namespace {

constexpr size_t kLane = 256;  // 3 x 256 B per round: measured fastest from 256 B to 16 KiB
// Shorter inputs run as one chain. Lanes pay for equal sizes from about 96 B on (71 B took 11.2 ns
// as one chain, 12.3 ns in lanes), but records of mixed sizes then branch at random on this
// threshold: for 8-140 B and 8-300 B records 256 was 15-20 % faster than 96 (docs/core.md).
constexpr size_t kMinLanes = 256;

// a * b mod P for reflected 32-bit polynomials (bit 31 is x^0).
constexpr uint32_t gf2_mul(uint32_t a, uint32_t b) noexcept {
  uint32_t prod = 0;
  for (int i = 0; i < 32; ++i) {
    if ((a & 0x80000000U) != 0) prod ^= b;
    a <<= 1;
    b = (b >> 1) ^ ((b & 1U) != 0 ? 0x82F63B78U : 0U);
  }
  return prod;
}

// x^n mod P, reflected.
constexpr uint32_t x_pow(uint64_t n) noexcept {
  uint32_t r = 0x80000000U;  // 1
  uint32_t p = 0x40000000U;  // x
  for (; n != 0; n >>= 1) {
    if ((n & 1U) != 0) r = gf2_mul(r, p);
    p = gf2_mul(p, p);
  }
  return r;
}

// kShift[w] = x^(64w-33) mod P. A register's carry-less product with it, reduced by one more
// crc32 (a multiply by x^32 followed by the reduction mod P; the -33 makes up for those 32 and the
// product's one-bit offset in reflected order), is the register shifted over 8w zero bytes.
constexpr size_t kMaxShiftWords = 2 * kLane / 8;  // the first of three lanes moves over two
struct shift_table {
  uint32_t k[kMaxShiftWords + 1];
};
constexpr shift_table make_shifts() noexcept {
  shift_table t{};
  for (size_t w = 1; w <= kMaxShiftWords; ++w) t.k[w] = x_pow(64 * w - 33);
  return t;
}
constexpr shift_table kShift = make_shifts();

// x^-1 modulo the polynomial (P(x) + 1) / x, in the same bit order: P's constant term is 1, so
// dropping it and dividing by x leaves the inverse of x.
constexpr uint32_t kInvX = ((0x82F63B78U & 0x7FFFFFFFU) << 1) | 1U;
static_assert(gf2_mul(kInvX, 0x40000000U) == 0x80000000U, "x * x^-1 must be 1");

constexpr uint32_t inv_x_pow(uint64_t n) noexcept {
  uint32_t r = 0x80000000U;  // 1
  uint32_t p = kInvX;
  for (; n != 0; n >>= 1) {
    if ((n & 1U) != 0) r = gf2_mul(r, p);
    p = gf2_mul(p, p);
  }
  return r;
}

// The first t = len % 8 bytes of an input of 8 bytes or more without a branch on t. Zero bytes in
// front of the data do not change a CRC whose register is zero, so for any register r,
//   update(r, head) == update(r * x^(-8 (8 - t)), (8 - t) zero bytes, head),
// which is one 8-byte step on the input's first 8 bytes moved up by 8 - t bytes (the first 8 - t
// zero, the bytes past the head shifted out; t == 0: r * x^-64 and a zero word, which is r
// again); the rest of the input is then whole words. kHead.shift[t] multiplies by x^(-8 (8 - t))
// in shift_words()'s convention (a constant for x^n is x^(n - 33)); kHead.fresh[t] is that
// product for the register ~0 of a CRC started afresh, so that the common case has no multiply on
// its dependency chain: the table entry is ready before the input is.
struct head_table {
  uint32_t shift[8];
  uint32_t fresh[8];
  uint64_t mask[8];
};
constexpr head_table make_head() noexcept {
  head_table t{};
  for (size_t k = 0; k < 8; ++k) {
    t.shift[k] = inv_x_pow(8 * (8 - k) + 33);
    t.fresh[k] = gf2_mul(0xFFFFFFFFU, inv_x_pow(8 * (8 - k)));
    t.mask[k] = k == 0 ? 0 : ~uint64_t{0} << (8 * (8 - k));
  }
  return t;
}
constexpr head_table kHead = make_head();

inline uint32_t mul_const(uint32_t reg, uint32_t k) noexcept {
  const __m128i prod = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(reg)),
                                            _mm_cvtsi32_si128(static_cast<int>(k)), 0);
  return static_cast<uint32_t>(_mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(prod))));
}

inline uint32_t shift_words(uint32_t reg, size_t words) noexcept {
  return mul_const(reg, kShift.k[words]);
}

inline uint64_t load64(const uint8_t* p) noexcept {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Three lanes of `words` 8-byte words side by side from p, joined into the CRC register of the
// 24 * words bytes continued from reg: the first lane's register is shifted over the other two
// lanes and the second's over the third, both products at once.
inline uint32_t three_lanes(uint32_t reg, const uint8_t* p, size_t words) noexcept {
  const size_t lane = words * 8;
  uint64_t a = reg;
  uint64_t b = 0;
  uint64_t c = 0;
  for (size_t i = 0; i < lane; i += 8) {
    a = _mm_crc32_u64(a, load64(p + i));
    b = _mm_crc32_u64(b, load64(p + lane + i));
    c = _mm_crc32_u64(c, load64(p + 2 * lane + i));
  }
  return shift_words(static_cast<uint32_t>(a), 2 * words) ^
         shift_words(static_cast<uint32_t>(b), words) ^ static_cast<uint32_t>(c);
}

}  // namespace

uint32_t sse42_update(uint32_t reg, const uint8_t* p, size_t len) noexcept {
  uint64_t r = reg;
  if (len >= 8) {
    // The head (kHead), then whole words: no branch on len % 8. The one branch on the register is
    // the same at every call from one place (record checksums always start afresh).
    const size_t t = len & 7;
    const uint32_t moved = reg == 0xFFFFFFFFU ? kHead.fresh[t] : mul_const(reg, kHead.shift[t]);
    r = _mm_crc32_u64(moved, (load64(p) << ((8 * (8 - t)) & 63)) & kHead.mask[t]);
    p += t;
    len -= t;
    for (; len >= 3 * kLane; len -= 3 * kLane, p += 3 * kLane) {
      r = three_lanes(static_cast<uint32_t>(r), p, kLane / 8);
    }
    // A shorter input of kMinLanes or more: three lanes as long as it allows (the join costs about
    // as much as three steps of one chain).
    if (len >= kMinLanes) {
      const size_t words = len / 24;
      r = three_lanes(static_cast<uint32_t>(r), p, words);
      p += 24 * words;
      len -= 24 * words;
    }
    for (; len != 0; len -= 8, p += 8) r = _mm_crc32_u64(r, load64(p));
    return static_cast<uint32_t>(r);
  }
  // Below 8 bytes: at most three steps (each step is a 3-cycle link of the one chain).
  auto r32 = static_cast<uint32_t>(r);
  if ((len & 4) != 0) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    r32 = _mm_crc32_u32(r32, v);
    p += 4;
  }
  if ((len & 2) != 0) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    r32 = _mm_crc32_u16(r32, v);
    p += 2;
  }
  if ((len & 1) != 0) r32 = _mm_crc32_u8(r32, *p);
  return r32;
}

}  // namespace uvbus::crc32c_detail
