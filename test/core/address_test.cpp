// Channel URLs: every scheme parsed, malformed and hostile URLs refused, the canonical form.
#include "uvbus/address.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace uvbus::address_test {
namespace {

address parse_ok(const char* url) {
  address a;
  EXPECT_EQ(parse_address(url, &a), errc::ok) << url;
  return a;
}

TEST(Address, ParsesEveryScheme) {
  auto a = parse_ok("ipv4://127.0.0.1:16389");
  EXPECT_EQ(a.kind, scheme::ipv4);
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 16389);
  a = parse_ok("ipv6://[::1]:16389");
  EXPECT_EQ(a.kind, scheme::ipv6);
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 16389);
  a = parse_ok("ipv6://::1:16389");  // libatbus form: the last colon is the port
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 16389);
  a = parse_ok("dns://localhost:0");
  EXPECT_EQ(a.kind, scheme::dns);
  EXPECT_EQ(a.host, "localhost");
  a = parse_ok("unix:///tmp/x.sock");
  EXPECT_EQ(a.kind, scheme::unix_socket);
  EXPECT_EQ(a.host, "/tmp/x.sock");
  a = parse_ok("shm://ring1");
  EXPECT_EQ(a.kind, scheme::shm);
  EXPECT_FALSE(a.shm_numeric);
  EXPECT_EQ(a.host, "ring1");
  EXPECT_EQ(parse_ok("shm:///ring1").host, "ring1");
  a = parse_ok("shm://0x1234");
  EXPECT_TRUE(a.shm_numeric);
  EXPECT_EQ(a.shm_key, 0x1234u);
  EXPECT_EQ(parse_ok("shm://4660").shm_key, 4660u);
  EXPECT_EQ(parse_ok("mem://m").kind, scheme::mem);
}

TEST(Address, RejectsMalformedUrls) {
  address a;
  for (const char* bad : {"",
                          "ipv4",
                          "ipv4://",
                          "ipv4://127.0.0.1",
                          "ipv4://127.0.0.1:",
                          "ipv4://127.0.0.1:65536",
                          "ipv4://127.0.0.1:12x",
                          "ipv4://::1:80",
                          "ipv4://300.1.1.1:80",
                          "ipv6://[::1]",
                          "ipv6://[::1:80",
                          "ipv6://zz:80",
                          "dns://:80",
                          "unix://",
                          "shm://",
                          "shm://0x",
                          "shm://0",
                          "shm://0x123456789",
                          "shm://a/b",
                          "://x"}) {
    EXPECT_EQ(parse_address(bad, &a), errc::bad_url) << bad;
  }
  EXPECT_EQ(parse_address("http://x:1", &a), errc::unsupported_scheme);
}

// Each refusal says what was wrong, naming the part.
TEST(Address, SaysWhatWasWrong) {
  const struct {
    const char* url;
    const char* why;
  } cases[] = {
      {"nonsense", "no scheme: not a URL (missing \"://\"; ipv4, ipv6, dns, unix, shm or mem)"},
      {"tcp://x:1", "unknown scheme \"tcp\""},
      {"ipv4://127.0.0.1", "missing port"},
      {"ipv4://:80", "no host"},
      {"ipv4://127.0.0.1:65536", "port \"65536\" is not a number from 0 to 65535"},
      {"ipv4://300.1.1.1:80", "\"300.1.1.1\" is not an IPv4 address"},
      {"ipv6://[::1:80", "\"[::1:80\" is not [IPv6 address]:port"},
      {"ipv6://[fe80::1%lo]:80", "\"fe80::1%lo\": IPv6 scope ids (%zone) are not supported"},
      {"unix://", "no path"},
      {"shm://a/b", "\"a/b\": a name holds no '/'"},
      {"shm://0", "\"0\" is not a SysV key from 1 to 0xffffffff (4294967295)"},
  };
  for (const auto& c : cases) {
    address a;
    std::string why;
    EXPECT_NE(parse_address(c.url, &a, &why), errc::ok) << c.url;
    EXPECT_EQ(why, c.why) << c.url;
  }
  address a;
  std::string why = "untouched";
  EXPECT_EQ(parse_address("ipv4://127.0.0.1:0", &a, &why), errc::ok);
  EXPECT_EQ(why, "untouched");
}

// "." and ".." passed as shared-memory names and reached shm_open("/.") and shm_open("/.."): the
// shared-memory directory and its parent. Refused, saying why; names merely containing dots stay.
TEST(Address, ShmNamesDotAndDotDotAreRefused) {
  for (const char* url : {"shm://.", "shm://..", "shm:///.."}) {
    address a;
    std::string why;
    EXPECT_EQ(parse_address(url, &a, &why), errc::bad_url) << url;
    EXPECT_NE(why.find("name directories"), std::string::npos) << url << ": " << why;
  }
  EXPECT_EQ(parse_ok("shm://...").host, "...");
  EXPECT_EQ(parse_ok("shm://.hidden").host, ".hidden");
  EXPECT_EQ(parse_ok("shm://a..b").host, "a..b");
}

// A socket address holds 107 bytes of path: a longer one would be cut by connect() (libuv's
// uv_pipe_connect) and reach another socket.
TEST(Address, UnixPathsLimitedToWhatASocketAddressHolds) {
  const std::string fits = "/" + std::string(kMaxUnixPathBytes - 1, 'p');
  EXPECT_EQ(parse_ok(("unix://" + fits).c_str()).host, fits);
  address a;
  EXPECT_EQ(parse_address("unix://" + fits + "q", &a), errc::bad_url);
}

// Found by test/fuzz/fuzz_address: inet_pton/getaddrinfo/shm_open read a C string, so a NUL
// inside the URL validated only its first part; and a bracketed host starting with '[' produced a
// canonical URL that did not parse back.
TEST(Address, RejectsEmbeddedNulAndBracketsInHosts) {
  using namespace std::string_view_literals;
  address a;
  for (std::string_view bad :
       {"ipv4://127.0.0.1\0junk:80"sv, "ipv6://::\0]x:2"sv, "dns://host\0x:80"sv, "shm://name\0x"sv,
        "mem://a\0b"sv, "unix:///tmp/a\0b"sv, "dns://[[a]:80"sv, "dns://a]b:80"sv}) {
    EXPECT_EQ(parse_address(bad, &a), errc::bad_url) << bad.substr(0, bad.find('\0'));
  }
  EXPECT_EQ(parse_address("dns://[localhost]:80", &a), errc::ok);
  EXPECT_EQ(a.to_string(), "dns://localhost:80");
}

TEST(Address, CanonicalForm) {
  EXPECT_EQ(parse_ok("ipv6://::1:5").to_string(), "ipv6://[::1]:5");
  EXPECT_EQ(parse_ok("shm:///abc").to_string(), "shm://abc");
  EXPECT_EQ(parse_ok("shm://4660").to_string(), "shm://0x1234");
  EXPECT_EQ(parse_ok("ipv4://1.2.3.4:9").to_string(), "ipv4://1.2.3.4:9");
  EXPECT_EQ(parse_ok("unix://rel.sock").to_string(), "unix://rel.sock");
}

}  // namespace
}  // namespace uvbus::address_test
