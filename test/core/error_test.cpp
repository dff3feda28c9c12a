// Error codes: distinct names, retriable against fatal, the errno mapping.
#include "uvbus/error.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <limits>
#include <set>
#include <string>

namespace uvbus::error_test {
namespace {

TEST(Errc, EveryCodeHasADistinctName) {
  std::set<std::string> names;
  for (int i = 0; i <= static_cast<int>(errc::peer_not_authenticated); ++i) {
    const std::string s = to_string(static_cast<errc>(i));
    EXPECT_NE(s, "unknown error") << i;
    EXPECT_TRUE(names.insert(s).second) << s;
  }
  EXPECT_STREQ(to_string(errc::ok), "ok");
}

TEST(Errc, RetriableStatesAreSeparateFromFatalOnes) {
  EXPECT_TRUE(is_retriable(errc::queue_full));
  EXPECT_TRUE(is_retriable(errc::not_connected));
  EXPECT_TRUE(is_retriable(errc::would_block));
  EXPECT_FALSE(is_retriable(errc::wrong_state));
  EXPECT_FALSE(is_retriable(errc::wrong_thread));
  EXPECT_FALSE(is_retriable(errc::access_denied));
  EXPECT_FALSE(is_retriable(errc::bad_hash));
  EXPECT_FALSE(is_retriable(errc::closed));
}

TEST(Errc, MapsErrno) {
  EXPECT_EQ(errc_from_errno(-ECONNREFUSED), errc::connection_refused);
  EXPECT_EQ(errc_from_errno(-EPIPE), errc::connection_reset);
  EXPECT_EQ(errc_from_errno(-EADDRINUSE), errc::address_in_use);
  EXPECT_EQ(errc_from_errno(-EIO), errc::io_error);
  EXPECT_EQ(errc_from_errno(0), errc::ok);
  // No errno: negating INT_MIN was undefined behaviour (UBSan: "negation of -2147483648").
  EXPECT_EQ(errc_from_errno(std::numeric_limits<int>::min()), errc::io_error);
  EXPECT_EQ(errc_from_errno(EIO), errc::io_error);  // positive: not a negative errno
}

}  // namespace
}  // namespace uvbus::error_test
