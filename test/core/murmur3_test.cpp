// MurmurHash3: the reference verification values, known vectors, every alignment and length.
#include "core/murmur3.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace uvbus::murmur3_test {
namespace {

// smhasher's VerificationTest: hash key[0..i) (key[i] = i) with seed 256 - i for i = 0..255,
// concatenate the little-endian hashes, hash that with seed 0; the first 4 bytes read as a
// little-endian u32 are the published verification value.
template <size_t kHashBytes, class H>
uint32_t verification_value(H hash) {
  uint8_t key[256];
  uint8_t hashes[256 * kHashBytes];
  for (int i = 0; i < 256; ++i) {
    key[i] = static_cast<uint8_t>(i);
    hash(key, static_cast<size_t>(i), static_cast<uint32_t>(256 - i), &hashes[i * kHashBytes]);
  }
  uint8_t final_hash[kHashBytes];
  hash(hashes, sizeof hashes, 0, final_hash);
  return static_cast<uint32_t>(final_hash[0]) | static_cast<uint32_t>(final_hash[1]) << 8 |
         static_cast<uint32_t>(final_hash[2]) << 16 | static_cast<uint32_t>(final_hash[3]) << 24;
}

void put_le_bytes(uint64_t v, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

void x86_32_bytes(const void* p, size_t n, uint32_t seed, uint8_t* out) {
  put_le_bytes(murmur3_x86_32(p, n, seed), out, 4);
}
void x64_128_bytes(const void* p, size_t n, uint32_t seed, uint8_t* out) {
  uint64_t h[2];
  murmur3_x64_128(p, n, seed, h);
  put_le_bytes(h[0], out, 8);
  put_le_bytes(h[1], out + 8, 8);
}

TEST(Murmur3, X86_32MatchesSmhasherVerificationValue) {
  EXPECT_EQ(verification_value<4>(x86_32_bytes), 0xB0F57EE3u);
}

TEST(Murmur3, X64_128MatchesSmhasherVerificationValue) {
  EXPECT_EQ(verification_value<16>(x64_128_bytes), 0x6384BA69u);
}

TEST(Murmur3, KnownVectors) {
  EXPECT_EQ(murmur3_x86_32("hello world", 11, 0), 0x5E928F0Fu);
  EXPECT_EQ(murmur3_x86_32("", 0, 0), 0u);
  EXPECT_EQ(murmur3_x86_32("", 0, 1), 0x514E28B7u);
  EXPECT_EQ(murmur3_x86_32("hello", 5, 0), 0x248BFA47u);  // the libatbus "hello" frame's hash
  uint64_t h[2];
  murmur3_x64_128("", 0, 0, h);
  EXPECT_EQ(h[0], 0u);
  EXPECT_EQ(h[1], 0u);
}

TEST(Murmur3, SameResultForEveryAlignmentAndLength) {
  std::vector<uint8_t> base(300);
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<uint8_t> shifted(base.size() + 16);
  for (size_t len = 0; len <= 80; ++len) {
    const uint32_t want32 = murmur3_x86_32(base.data(), len, 42);
    uint64_t want128[2];
    murmur3_x64_128(base.data(), len, 42, want128);
    for (size_t off = 1; off < 16; ++off) {
      std::memcpy(shifted.data() + off, base.data(), len);
      EXPECT_EQ(murmur3_x86_32(shifted.data() + off, len, 42), want32) << len << " " << off;
      uint64_t got[2];
      murmur3_x64_128(shifted.data() + off, len, 42, got);
      EXPECT_EQ(got[0], want128[0]) << len << " " << off;
      EXPECT_EQ(got[1], want128[1]) << len << " " << off;
    }
  }
}

TEST(Murmur3, Low32IsTheLowWordOfX64_128) {
  std::vector<uint8_t> buf(64);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 13 + 1);
  for (size_t len = 0; len <= buf.size(); ++len) {
    uint64_t h[2];
    murmur3_x64_128(buf.data(), len, 7, h);
    EXPECT_EQ(murmur3_x64_128_low32(buf.data(), len, 7), static_cast<uint32_t>(h[0])) << len;
  }
}

TEST(Murmur3, EveryInputBitChangesTheHash) {
  uint8_t buf[37] = {};
  const uint32_t h0 = murmur3_x86_32(buf, sizeof buf, 0);
  for (size_t bit = 0; bit < sizeof buf * 8; ++bit) {
    buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(murmur3_x86_32(buf, sizeof buf, 0), h0) << bit;
    buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace uvbus::murmur3_test
