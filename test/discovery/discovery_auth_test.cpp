// etcd_discovery against a real etcd with authentication on (a user whose role may read and write
// the test's prefix): a node with the user and password registers and watches; a wrong password
// or none never gets a session and the log says why; a token etcd stops accepting (auth switched
// off and on again) fails the session, and the next one authenticates afresh; a user name or
// password that is not UTF-8 is refused.
#include <string>

#include "discovery/discovery_harness.h"
#include "discovery/etcd_codec.h"

namespace uvbus::discovery_auth_test {
namespace {

using test::disc_instance;
using test::test_entry;
namespace etcd = detail::etcd;

class DiscoveryAuth : public test::discovery_fixture {
 protected:
  // One set-up request to etcd's auth API; fails the test unless etcd answers 200.
  void call(const std::string& path, const std::string& body, const std::string& token = "") {
    long status = 0;
    const std::string got =
        test::http_post(etcd_->endpoint(0) + path, body, &status, nullptr, token);
    ASSERT_EQ(status, 200) << path << ": " << got;
  }
  std::string root_token() {
    long status = 0;
    const std::string got = test::http_post(etcd_->endpoint(0) + "/v3/auth/authenticate",
                                            etcd::authenticate_request("root", "rootpw"), &status);
    std::string token;
    std::string why;
    EXPECT_TRUE(etcd::parse_authenticate(got, &token, &why)) << why << ": " << got;
    return token;
  }
  // root (needed to switch auth on), and user "uvbus" whose role reads and writes the prefix.
  void start_with_auth() {
    start_etcd(1);
    const std::string range = R"({"permType":"READWRITE","key":")" +
                              etcd::base64_encode("/uvbus-test") + R"(","range_end":")" +
                              etcd::base64_encode(etcd::prefix_end("/uvbus-test")) + R"("})";
    call("/v3/auth/role/add", R"({"name":"root"})");
    call("/v3/auth/user/add", etcd::authenticate_request("root", "rootpw"));
    call("/v3/auth/user/grant", R"({"user":"root","role":"root"})");
    call("/v3/auth/role/add", R"({"name":"uvbus"})");
    call("/v3/auth/role/grant", R"({"name":"uvbus","perm":)" + range + "}");
    call("/v3/auth/user/add", etcd::authenticate_request("uvbus", "s3cret"));
    call("/v3/auth/user/grant", R"({"user":"uvbus","role":"uvbus"})");
    call("/v3/auth/enable", "{}");
  }
  discovery_config auth_config(const std::string& password = "s3cret") {
    discovery_config c = config();
    c.etcd_username = "uvbus";
    c.etcd_password = password;
    return c;
  }
};

TEST_F(DiscoveryAuth, RegistersAndWatchesAsAUserWithAPassword) {
  start_with_auth();
  const auto two =
      make_two(auth_config());  // a lambda cannot capture a structured binding in C++17
  disc_instance* a = two.first;
  disc_instance* b = two.second;
  ASSERT_FALSE(HasFailure());
  // The watch and the keep-alives go on with the token: nothing leaves over 1.5 TTL.
  run_for(std::chrono::milliseconds(3000));
  EXPECT_EQ(b->count(directory_event::removed, 0x10), 0U);
  EXPECT_EQ(a->d->stats().failures, 0U);
}

TEST_F(DiscoveryAuth, AWrongPasswordOrNoneNeverGetsASession) {
  start_with_auth();
  disc_instance* wrong = make(test_entry(0x10), auth_config("guess"));
  disc_instance* none = make(test_entry(0x20), config());
  ASSERT_TRUE(
      wait([&] { return wrong->d->stats().failures >= 2 && none->d->stats().failures >= 2; }));
  for (disc_instance* in : {wrong, none}) {
    EXPECT_EQ(in->ups, 0);
    EXPECT_EQ(in->d->stats().registrations, 0U);
    EXPECT_TRUE(in->ids().empty());
  }
  EXPECT_TRUE(test::logged(wrong, "authenticate as \"uvbus\"", "authentication failed"))
      << wrong->d->last_error().detail;
  EXPECT_TRUE(test::logged(none, "put", "user name is empty")) << none->d->last_error().detail;
}

TEST_F(DiscoveryAuth, ATokenEtcdStopsAcceptingStartsAFreshSession) {
  start_with_auth();
  disc_instance* a = make(test_entry(0x10), auth_config());
  ASSERT_TRUE(wait([&] { return a->d->connected() && a->ids() == std::set<bus_id>{0x10}; }));
  // Switching auth off and on drops every token etcd gave out; the next put (an entry update)
  // meets that, fails the session, and the next session authenticates and puts the update.
  call("/v3/auth/disable", "{}", root_token());
  call("/v3/auth/enable", "{}");
  directory_entry moved = test_entry(0x10);
  moved.labels = {{"zone", "c"}};
  ASSERT_EQ(a->d->update_self(moved), errc::ok);
  ASSERT_TRUE(wait([&] { return a->d->stats().failures >= 1; }));
  EXPECT_TRUE(test::logged(a, "put", "invalid auth token")) << a->d->last_error().detail;
  ASSERT_TRUE(wait([&] {
    directory_entry got;
    return a->d->connected() && a->d->stats().registrations >= 2 && a->d->lookup(0x10, &got) &&
           got == moved;
  })) << a->d->last_error().detail;
}

TEST_F(DiscoveryAuth, APasswordWithoutAUserIsRefused) {
  discovery_config c;
  c.etcd_endpoints = {"http://127.0.0.1:2379"};
  c.etcd_password = "s3cret";
  std::string why;
  EXPECT_EQ(validate(c, &why), errc::invalid_argument);
  EXPECT_EQ(why, "etcd_password is set without etcd_username");
  c.etcd_username = std::string(257, 'u');
  EXPECT_EQ(validate(c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("etcd_username"), std::string::npos) << why;
}

// JSON carries text only: a user name or password that is not UTF-8 is refused, naming the field.
// Before, it was accepted and sent with U+FFFD in place of each bad byte: every session failed
// "authentication failed" with no hint why.
TEST_F(DiscoveryAuth, ANameOrPasswordThatIsNotUtf8IsRefused) {
  discovery_config c;
  c.etcd_endpoints = {"http://127.0.0.1:2379"};
  c.etcd_username = "uvbus";
  c.etcd_password =
      "s3cr\xff"
      "t";
  std::string why;
  EXPECT_EQ(validate(c, &why), errc::invalid_argument);
  EXPECT_EQ(why, "etcd_password is not valid UTF-8");
  c.etcd_password = "p\xc3\xa4sswort \xe6\x97\xa5";  // "ä", "日": well-formed
  EXPECT_EQ(validate(c, &why), errc::ok) << why;
  c.etcd_username = "u\xc3";  // a cut sequence
  EXPECT_EQ(validate(c, &why), errc::invalid_argument);
  EXPECT_EQ(why, "etcd_username is not valid UTF-8");
}

}  // namespace
}  // namespace uvbus::discovery_auth_test
