// crc32c's SSE4.2 kernel (this file alone is built with -msse4.2 -mpclmul; crc32c.cpp calls it
// only on a CPU that has both). Two units compute the CRC side by side on long inputs: the crc32
// instruction (8 bytes a step, 3 cycles of latency; one step a cycle on Intel, one every 3 cycles
// on AMD Zen 1) and the carry-less multiplier, which folds 16-byte blocks forward over the input as
// zlib's and Linux's PCLMULQDQ CRCs do. From kMinFold bytes on, the whole 64-byte strides are
// folded (or, in the lanes variant, from kMinLanes bytes on three crc32 lanes side by side: where
// crc32 starts a step every cycle they beat the fold's longer reduction; crc32c.cpp times the two
// once and takes the faster); from kRound bytes on, each round folds its first 1 KiB while three
// crc32 chains take the other 768 bytes, and the four partial CRCs are joined by shifting each over
// the bytes that follow it: a carry-less multiply by x^(n-33) mod P, reduced by one more crc32 (the
// identity behind zlib's crc32_combine, in two instructions). The same multiply, by a negative
// power of x, lets the first len % 8 bytes take one 8-byte step without a branch on len % 8; for a
// CRC started afresh (the register ~0, every record checksum) that multiply is a table entry.
// Shorter inputs and the last words run as one chain. Figures and the algebra: docs/core.md.
#include <nmmintrin.h>
#include <smmintrin.h>
#include <wmmintrin.h>

#include <cstring>

#include "core/crc32c.h"

namespace uvbus::crc32c_detail {
namespace {

// Inputs this long or longer are folded (below: one chain of crc32 steps, which is also what a
// threshold crossed at random by records of mixed sizes costs least; docs/core.md).
constexpr size_t kMinFold = 128;
// The lanes variant takes inputs from this long on (below kRound) in three crc32 lanes instead.
constexpr size_t kMinLanes = 256;
// A round of the two units: kFoldBytes folded in 64-byte strides while three crc32 chains take
// kLaneBytes each (48 bytes a stride against the fold's 64: the two finish together on Zen 1).
constexpr size_t kStrides = 16;
constexpr size_t kFoldBytes = 64 * kStrides;
constexpr size_t kLaneBytes = 16 * kStrides;
constexpr size_t kRound = kFoldBytes + 3 * kLaneBytes;

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

// A constant for the join: a register's carry-less product with x^(n-33) mod P, reduced by one
// more crc32 (a multiply by x^32 followed by the reduction mod P; the -33 makes up for those 32
// and the product's one-bit offset in reflected order), is the register shifted over n zero bits.
constexpr uint32_t shift_bits(uint64_t n) noexcept {
  return x_pow(n - 33);
}

// kShift[w]: shift_bits(64 w), the register over w 8-byte words, for the three lanes' joins (the
// first lane moves over two lanes of up to kRound / 24 words).
constexpr size_t kMaxShiftWords = 2 * (kRound / 24);
struct shift_table {
  uint32_t k[kMaxShiftWords + 1];
};
constexpr shift_table make_shifts() noexcept {
  shift_table t{};
  for (size_t w = 1; w <= kMaxShiftWords; ++w) t.k[w] = shift_bits(64 * w);
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
// in shift_bits()'s convention (a constant for x^n is x^(n - 33)); kHead.fresh[t] is that
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

inline uint64_t load64(const uint8_t* p) noexcept {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline __m128i load128(const uint8_t* p) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// Folding. A 16-byte block X (its first 8 bytes in the low half) followed, d bits after its own
// start, by a block Y: X's contribution to the CRC equals that of a block Z xored into Y, where
//   Z = clmul(X.lo, x^(d+31) mod P) ^ clmul(X.hi, x^(d-33) mod P):
// in reflected order a product of a 64-bit block half and a 32-bit constant c, read as a 16-byte
// block, is half * c * x^33, and X.lo (X.hi) ends d + 64 (d) bits before Y does. A 95-bit product
// fits in Y's 128 bits, so X is gone and Y carries its weight.
struct fold_constants {
  uint64_t lo;  // x^(d+31) mod P
  uint64_t hi;  // x^(d-33) mod P
};
constexpr fold_constants fold_by(uint64_t d_bits) noexcept {
  return {x_pow(d_bits + 31), shift_bits(d_bits)};
}
constexpr fold_constants kBy16 = fold_by(128);  // to the next block
constexpr fold_constants kBy64 = fold_by(512);  // to the next 64-byte stride

inline __m128i constants(const fold_constants& c) noexcept {
  return _mm_set_epi64x(static_cast<int64_t>(c.hi), static_cast<int64_t>(c.lo));
}

inline __m128i fold(__m128i x, __m128i k, __m128i y) noexcept {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), y);
}

// The four 64-byte-stride accumulators folded into one block, and that block's CRC from a zero
// register (the input's register was xored into its first four bytes).
inline uint32_t reduce(const __m128i (&x)[4]) noexcept {
  const __m128i by16 = constants(kBy16);
  __m128i a = fold(x[0], by16, x[1]);
  a = fold(a, by16, x[2]);
  a = fold(a, by16, x[3]);
  const uint64_t r = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(a)));
  return static_cast<uint32_t>(_mm_crc32_u64(r, static_cast<uint64_t>(_mm_extract_epi64(a, 1))));
}

// Loads the first 64-byte stride of p into x, the register xored into its first four bytes.
inline void start(__m128i (&x)[4], uint32_t reg, const uint8_t* p) noexcept {
  x[0] = _mm_xor_si128(load128(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  x[1] = load128(p + 16);
  x[2] = load128(p + 32);
  x[3] = load128(p + 48);
}

inline void fold_stride(__m128i (&x)[4], __m128i by64, const uint8_t* p) noexcept {
  x[0] = fold(x[0], by64, load128(p));
  x[1] = fold(x[1], by64, load128(p + 16));
  x[2] = fold(x[2], by64, load128(p + 32));
  x[3] = fold(x[3], by64, load128(p + 48));
}

// The CRC register of len bytes (a multiple of 64, at least 64) continued from reg, folded.
inline uint32_t fold_strides(uint32_t reg, const uint8_t* p, size_t len) noexcept {
  const __m128i by64 = constants(kBy64);
  __m128i x[4];
  start(x, reg, p);
  for (size_t i = 64; i < len; i += 64) fold_stride(x, by64, p + i);
  return reduce(x);
}

// Three crc32 chains over three lanes kLaneBytes apart, two 8-byte steps each per stride.
struct three_chains {
  uint64_t a = 0;
  uint64_t b = 0;
  uint64_t c = 0;
  void step(const uint8_t* q) noexcept {
    a = _mm_crc32_u64(a, load64(q));
    b = _mm_crc32_u64(b, load64(q + kLaneBytes));
    c = _mm_crc32_u64(c, load64(q + 2 * kLaneBytes));
    a = _mm_crc32_u64(a, load64(q + 8));
    b = _mm_crc32_u64(b, load64(q + kLaneBytes + 8));
    c = _mm_crc32_u64(c, load64(q + 2 * kLaneBytes + 8));
  }
};

// One round of kRound bytes continued from reg: the fold takes the first kFoldBytes while three
// crc32 chains take the three lanes after them; then each part is shifted over what follows it.
inline uint32_t round_of_both(uint32_t reg, const uint8_t* p) noexcept {
  const __m128i by64 = constants(kBy64);
  const uint8_t* lanes = p + kFoldBytes;
  __m128i x[4];
  start(x, reg, p);
  three_chains l;
  l.step(lanes);
  for (size_t i = 1; i < kStrides; ++i) {
    fold_stride(x, by64, p + 64 * i);
    l.step(lanes + 16 * i);
  }
  constexpr uint32_t kOverThree = shift_bits(kLaneBytes * 8 * 3);
  constexpr uint32_t kOverTwo = shift_bits(kLaneBytes * 8 * 2);
  constexpr uint32_t kOverOne = shift_bits(kLaneBytes * 8);
  return mul_const(reduce(x), kOverThree) ^ mul_const(static_cast<uint32_t>(l.a), kOverTwo) ^
         mul_const(static_cast<uint32_t>(l.b), kOverOne) ^ static_cast<uint32_t>(l.c);
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
  return mul_const(static_cast<uint32_t>(a), kShift.k[2 * words]) ^
         mul_const(static_cast<uint32_t>(b), kShift.k[words]) ^ static_cast<uint32_t>(c);
}

template <bool kLanes>
uint32_t update(uint32_t reg, const uint8_t* p, size_t len) noexcept {
  uint64_t r = reg;
  if (len >= 8) {
    // The head (kHead), then whole words: no branch on len % 8. The one branch on the register is
    // the same at every call from one place (record checksums always start afresh).
    const size_t t = len & 7;
    const uint32_t moved = reg == 0xFFFFFFFFU ? kHead.fresh[t] : mul_const(reg, kHead.shift[t]);
    r = _mm_crc32_u64(moved, (load64(p) << ((8 * (8 - t)) & 63)) & kHead.mask[t]);
    p += t;
    len -= t;
    for (; len >= kRound; len -= kRound, p += kRound) {
      r = round_of_both(static_cast<uint32_t>(r), p);
    }
    // What is left: from kMinLanes bytes on three lanes as long as it allows (lanes variant), or
    // from kMinFold bytes on its whole 64-byte strides folded.
    if (kLanes && len >= kMinLanes) {
      const size_t words = len / 24;
      r = three_lanes(static_cast<uint32_t>(r), p, words);
      p += 24 * words;
      len -= 24 * words;
    } else if (len >= kMinFold) {
      const size_t folded = len & ~size_t{63};
      r = fold_strides(static_cast<uint32_t>(r), p, folded);
      p += folded;
      len -= folded;
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

}  // namespace

uint32_t sse42_update(uint32_t reg, const uint8_t* p, size_t len) noexcept {
  return update<false>(reg, p, len);
}

uint32_t sse42_lanes_update(uint32_t reg, const uint8_t* p, size_t len) noexcept {
  return update<true>(reg, p, len);
}

}  // namespace uvbus::crc32c_detail
