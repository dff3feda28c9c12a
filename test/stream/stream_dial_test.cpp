// dns:// dials over several addresses: a first address that never answers leaves time for the rest.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "stream/stream_harness.h"
#include "stream/test_access.h"

namespace uvbus::test::stream_dial_test {
namespace {

sockaddr_storage loopback(uint16_t port) {
  sockaddr_storage ss{};
  auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
  sin->sin_family = AF_INET;
  sin->sin_port = htons(port);
  sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ss;
}

// A raw listener with backlog 0 that never accepts, its accept queue filled by one connection:
// the kernel drops every later SYN to it, so a connect there hangs (a black hole on loopback).
struct black_hole {
  int fd = -1;
  int filler = -1;
  uint16_t port = 0;
  black_hole() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_storage ss = loopback(0);
    socklen_t len = sizeof(sockaddr_in);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 0) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      return;
    }
    port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    filler = dial(port);
  }
  ~black_hole() {
    if (filler >= 0) ::close(filler);
    if (fd >= 0) ::close(fd);
  }
  black_hole(const black_hole&) = delete;
  black_hole& operator=(const black_hole&) = delete;
};

class StreamDial : public stream_fixture {
 protected:
  // A listening channel's port (what it accepts lands in srv_).
  uint16_t listener() {
    stream_channel* s = make_channel(&srv_);
    listener_id l;
    EXPECT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
    return s->listener_port(l);
  }
  // Starts a dns:// dial from a channel of connect_timeout_ms `timeout_ms` (c_) whose resolver
  // answers `addrs`; the dial's id.
  connection_id start_dial(std::vector<sockaddr_storage> addrs, uint32_t timeout_ms) {
    stream_config cfg;
    cfg.connect_timeout_ms = timeout_ms;
    c_ = make_channel(&cli_, cfg);
    detail::stream_access::set_dns_answer(*c_, std::move(addrs));
    connection_id conn;
    EXPECT_EQ(c_->connect("dns://localhost:1", &conn), errc::ok);
    return conn;
  }
  // How the dial `conn` ended (run until it did).
  errc ended(connection_id conn) {
    EXPECT_TRUE(run([&] { return cli_.connected.count(conn.value) != 0; }));
    return cli_.connected.count(conn.value) != 0 ? cli_.connected[conn.value] : errc::ok;
  }

  recorder srv_, cli_;
  stream_channel* c_ = nullptr;
};

// Two addresses, the first a black hole: the dial reaches the second within connect_timeout_ms
// (the first got its share of the timeout, not all of it).
TEST_F(StreamDial, ABlackHoledFirstAddressLeavesTimeForTheNext) {
  black_hole bh;
  ASSERT_GE(bh.filler, 0);
  const uint16_t port = listener();
  const connection_id conn = start_dial({loopback(bh.port), loopback(port)}, 1000);
  const errc e = ended(conn);
  ASSERT_EQ(e, errc::ok) << to_string(e);
  ASSERT_TRUE(run([&] { return srv_.accepted.size() == 1; }));
  EXPECT_EQ(c_->metrics().connect_failed, 0u);
}

// Three addresses, two black holes first: each gets its share of what is left, the third connects.
TEST_F(StreamDial, EveryAddressGetsItsShare) {
  black_hole bh1, bh2;
  ASSERT_GE(bh1.filler, 0);
  ASSERT_GE(bh2.filler, 0);
  const uint16_t port = listener();
  const connection_id conn =
      start_dial({loopback(bh1.port), loopback(bh2.port), loopback(port)}, 1500);
  const errc e = ended(conn);
  EXPECT_EQ(e, errc::ok) << to_string(e);
}

// Every address a black hole: one timeout, reported once, and the dial ends (not one
// connect_timeout_ms per address; the deadline stays the overall one).
TEST_F(StreamDial, AllBlackHolesEndWithOneTimeout) {
  black_hole bh1, bh2;
  ASSERT_GE(bh1.filler, 0);
  ASSERT_GE(bh2.filler, 0);
  const connection_id conn = start_dial({loopback(bh1.port), loopback(bh2.port)}, 400);
  EXPECT_EQ(ended(conn), errc::timeout);
  EXPECT_EQ(c_->metrics().connect_failed, 1u);
  EXPECT_TRUE(cli_.disconnected.empty());
}

// A refused first address still falls through at once to the next (no share waited for).
TEST_F(StreamDial, ARefusedAddressFallsThroughAtOnce) {
  const int probe = socket(AF_INET, SOCK_STREAM, 0);  // a port nobody listens on
  sockaddr_storage ss = loopback(0);
  socklen_t len = sizeof(sockaddr_in);
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&ss), len), 0);
  ASSERT_EQ(getsockname(probe, reinterpret_cast<sockaddr*>(&ss), &len), 0);
  const uint16_t port = listener();
  const connection_id conn = start_dial({ss, loopback(port)}, stream_config{}.connect_timeout_ms);
  EXPECT_EQ(ended(conn), errc::ok);
  ::close(probe);
}

// A dial cancelled while an attempt is in flight behind a black hole ends cancelled, once.
TEST_F(StreamDial, CancelledWhileAnAttemptHangs) {
  black_hole bh;
  ASSERT_GE(bh.filler, 0);
  const connection_id conn = start_dial({loopback(bh.port), loopback(bh.port)}, 10000);
  // Resolved and the first attempt started: a loop turn 50 ms on (a timer, not a sleep).
  int ticks = 0;
  uv_timer_t t;
  uv_timer_init(&loop_, &t);
  t.data = &ticks;
  uv_timer_start(
      &t, [](uv_timer_t* tt) { ++*static_cast<int*>(tt->data); }, 50, 0);
  ASSERT_TRUE(run([&] { return ticks == 1; }));
  uv_close(reinterpret_cast<uv_handle_t*>(&t),
           [](uv_handle_t* h) { ++*static_cast<int*>(h->data); });
  ASSERT_TRUE(run([&] { return ticks == 2; }));
  ASSERT_EQ(c_->disconnect(conn), errc::ok);
  EXPECT_EQ(ended(conn), errc::cancelled);
}

}  // namespace
}  // namespace uvbus::test::stream_dial_test
