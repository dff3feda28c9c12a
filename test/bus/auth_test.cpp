// Registration authentication: HMAC-SHA256 against RFC 4231, tokens, nonces, host identity.
#include "bus/auth.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace uvbus::detail::auth_test {
namespace {

TEST(Auth, HmacSha256MatchesRfc4231TestCase2) {
  const std::string data = "what do ya want for nothing?";
  uint8_t mac[kMacSize];
  ASSERT_TRUE(hmac_sha256("Jefe", reinterpret_cast<const uint8_t*>(data.data()), data.size(), mac));
  const uint8_t want[kMacSize] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                                  0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                                  0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  EXPECT_EQ(std::memcmp(mac, want, kMacSize), 0);
}

TEST(Auth, AnyOfSeveralTokensVerifiesAndNoOtherDoes) {
  const uint8_t data[] = {1, 2, 3};
  uint8_t proof[kMacSize];
  ASSERT_TRUE(hmac_sha256("new-token", data, sizeof data, proof));
  EXPECT_TRUE(verify_proof({"old-token", "new-token"}, data, sizeof data, proof));
  EXPECT_TRUE(verify_proof({"new-token"}, data, sizeof data, proof));
  EXPECT_FALSE(verify_proof({"old-token"}, data, sizeof data, proof));
  EXPECT_FALSE(verify_proof({}, data, sizeof data, proof));
  const uint8_t other[] = {1, 2, 4};  // another nonce: the same proof does not verify
  EXPECT_FALSE(verify_proof({"new-token"}, other, sizeof other, proof));
  proof[31] ^= 1;
  EXPECT_FALSE(verify_proof({"new-token"}, data, sizeof data, proof));
}

TEST(Auth, RandomBytesDiffer) {
  uint8_t a[32] = {};
  uint8_t b[32] = {};
  ASSERT_TRUE(random_bytes(a, sizeof a));
  ASSERT_TRUE(random_bytes(b, sizeof b));
  EXPECT_NE(std::memcmp(a, b, sizeof a), 0);
}

TEST(Auth, HostIdentityIsStableAndNonEmpty) {
  const std::string a = host_identity();
  EXPECT_GT(a.size(), 2u);
  EXPECT_LE(a.size(), 128u);
  EXPECT_EQ(a, host_identity());
}

}  // namespace
}  // namespace uvbus::detail::auth_test
