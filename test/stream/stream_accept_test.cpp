// The stream channel's own accept loop (a uv_poll_t on each listening socket): accept failures no
// reserve mends wait for a timer instead of spinning, shed clients are counted, a bounded batch per
// loop turn; abstract unix sockets (unix://@name); port 0 URLs; scope ids of link-local peers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "limits_util.h"
#include "stream/stream_harness.h"
#include "stream/stream_impl.h"
#include "stream/test_access.h"
#include "uvbus/address.h"

namespace uvbus::test::stream_accept_test {
namespace {

// A soft RLIMIT_NOFILE of 3, below every descriptor the process holds, the channel's reserve
// included: closing the reserve makes no room, so neither shedding nor accepting can work. libuv's
// accept loop called the channel again at once for as long as accept() failed, and the loop turn
// never ended (killed by the alarm). 0: the loop turned (at most 200 iterations in 500 ms: a
// spin shows as thousands), the failure was logged once and counted, and the waiting client was
// accepted once the limit was raised. 2: spun, 3: not logged once, 4: not counted, 5: never
// accepted, 6: the client was closed although nothing could be accepted.
int soft_limit_below_held(uv_loop_t* loop) {
  return with_child_channel(loop, [loop](child_channel& c) {
    if (c.listen() != 0) return 10;
    const int client = c.dial_listener();
    if (client < 0) return 11;
    rlimit old{};
    getrlimit(RLIMIT_NOFILE, &old);
    rlimit low = old;
    low.rlim_cur = 3;
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 12;
    ::alarm(10);  // a loop turn that never ends is killed: the test fails with a signal
    const uint64_t spins = iterations_in(loop, 500);
    ::alarm(0);
    const bool client_closed = peer_closed(client);
    const uint64_t errors = detail::stream_access::accept_errors(c.ch);
    setrlimit(RLIMIT_NOFILE, &old);
    const bool accepted = run_loop_until(loop, [&] { return c.rec.accepted.size() == 1; });
    std::fprintf(stderr, "iterations %llu, accept errors %llu, accepted %zu\n",
                 static_cast<unsigned long long>(spins), static_cast<unsigned long long>(errors),
                 c.rec.accepted.size());
    c.print_logs();
    int rc = 0;
    if (spins > 200) rc = 2;
    if (c.lines_with("trying again every 100 ms") != 1 && rc == 0) rc = 3;
    if (errors == 0 && rc == 0) rc = 4;
    if (!accepted && rc == 0) rc = 5;
    if (client_closed && rc == 0) rc = 6;
    if (c.lines_with("accepting again") != 1 && rc == 0) rc = 3;
    ::close(client);
    return rc;
  });
}

TEST(StreamAccept, ASoftLimitBelowTheDescriptorsHeldWaitsForATimerInsteadOfHanging) {
  EXPECT_EQ(in_child(soft_limit_below_held), 0);
}

// Out of descriptors with the reserve at hand: the waiting client is closed, logged and counted in
// connections_rejected (libuv's shedding, while libuv accepted for the channel, was neither).
// 0: all that; 2: not closed, 3: not logged, 4: not counted, 5: no accept once descriptors free.
int shed_is_counted(uv_loop_t* loop) {
  return with_child_channel(loop, [loop](child_channel& c) {
    if (c.listen() != 0) return 10;
    const int client = c.dial_listener();
    if (client < 0) return 11;
    rlimit old{};
    if (!lower_nofile(&old)) return 12;
    ::alarm(10);
    const bool closed = run_loop_until(loop, [&] { return peer_closed(client); });
    ::alarm(0);
    setrlimit(RLIMIT_NOFILE, &old);
    const uint64_t rejected = c.ch.metrics().connections_rejected;
    c.print_logs();
    int rc = 0;
    if (!closed) rc = 2;
    if (c.lines_with("1 waiting clients closed") != 1 && rc == 0) rc = 3;
    if (rejected != 1 && rc == 0) rc = 4;
    ::close(client);
    const int again = c.dial_listener();
    if (!run_loop_until(loop, [&] { return c.rec.accepted.size() == 1; }) && rc == 0) rc = 5;
    ::close(again);
    return rc;
  });
}

TEST(StreamAccept, ShedWaitingClientsAreCountedAndLogged) {
  EXPECT_EQ(in_child(shed_is_counted), 0);
}

// A listening socket whose accept() fails for good (another holder of the socket, such as the
// process that handed it over, shut it down: EINVAL): libuv's accept loop called the channel
// again at once for ever. Now the failure is logged once, counted, and the socket polled again
// every 100 ms; listening again on it resumes accepting. 2: spun, 3: not logged once, 4: not
// counted, 5: no accept after listen() again.
int accept_fails_for_good(uv_loop_t* loop) {
  return with_child_channel(loop, [loop](child_channel& c) {
    int s = -1;
    int other = -1;  // the other holder
    if (!listening_pair(&s, &other)) return 10;
    if (c.ch.listen_fd("ipv4://127.0.0.1:0", s, &c.l) != errc::ok) return 11;
    ::shutdown(other, SHUT_RD);
    ::alarm(10);
    const uint64_t spins = iterations_in(loop, 500);
    ::alarm(0);
    const uint64_t errors = detail::stream_access::accept_errors(c.ch);
    c.print_logs();
    std::fprintf(stderr, "iterations %llu, accept errors %llu\n",
                 static_cast<unsigned long long>(spins), static_cast<unsigned long long>(errors));
    int rc = 0;
    if (spins > 200) rc = 2;
    if (c.lines_with("accept failed") != 1 && rc == 0) rc = 3;
    if (errors == 0 && rc == 0) rc = 4;
    if (::listen(other, 16) != 0) return 12;
    const uint16_t port = port_of(other);
    if (port == 0) return 12;
    const int client = dial(port);
    if (!run_loop_until(loop, [&] { return c.rec.accepted.size() == 1; }) && rc == 0) rc = 5;
    ::close(client);
    ::close(other);
    return rc;
  });
}

TEST(StreamAccept, AnAcceptThatFailsForGoodIsRetriedOnATimerNotInALoop) {
  EXPECT_EQ(in_child(accept_fails_for_good), 0);
}

class StreamAcceptLoop : public stream_fixture {};

// 100 clients waiting: one readable event accepts at most kAcceptBatch of them (libuv accepted
// the whole backlog in one go), the rest at the next loop turns; every one is accepted.
TEST_F(StreamAcceptLoop, OneLoopTurnAcceptsABoundedBatch) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  listener_id l;
  ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  std::vector<int> clients;
  for (int i = 0; i < 100; ++i) {
    clients.push_back(dial(ch->listener_port(l)));
    ASSERT_GE(clients.back(), 0);
  }
  size_t first_turn = 0;
  ASSERT_TRUE(run([&] {
    first_turn = r.accepted.size();
    return first_turn != 0;
  }));
  EXPECT_LE(first_turn, static_cast<size_t>(detail::kAcceptBatch));
  EXPECT_TRUE(run([&] { return r.accepted.size() == 100; }));
  for (const int fd : clients) ::close(fd);
}

// Port 0: the URL names the port the system chose, for each kind of TCP URL.
TEST_F(StreamAcceptLoop, PortZeroUrlsNameThePortChosen) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  const struct {
    const char* url;
    const char* prefix;
  } cases[] = {{"ipv4://127.0.0.1:0", "ipv4://127.0.0.1:"},
               {"ipv6://[::1]:0", "ipv6://[::1]:"},
               {"ipv6://::1:0", "ipv6://[::1]:"},
               {"dns://127.0.0.1:0", "ipv4://127.0.0.1:"}};
  for (const auto& c : cases) {
    listener_id l;
    ASSERT_EQ(ch->listen(c.url, &l), errc::ok) << c.url << ": " << ch->last_error().detail;
    const uint16_t port = ch->listener_port(l);
    EXPECT_NE(port, 0) << c.url;
    EXPECT_EQ(ch->listener_url(l), c.prefix + std::to_string(port)) << c.url;
    connection_id conn;
    ASSERT_EQ(ch->connect(ch->listener_url(l), &conn), errc::ok);
    ASSERT_TRUE(run([&] { return r.connected.count(conn.value) == 1 && !r.accepted.empty(); }));
    EXPECT_EQ(r.connected[conn.value], errc::ok) << c.url;
    EXPECT_EQ(ch->listener(r.accepted.back()), l);
    (void)ch->disconnect(conn, disconnect_mode::force);
    (void)ch->close_listener(l);
    r.accepted.clear();
  }
}

// unix://@name: a Linux abstract socket. No file is made in the working directory (before, a file
// named "@name" was), data flows both ways, both ends name it unix://@name, a second listener on
// the name is refused, and once closed the name is free again and a dial to it is refused.
TEST_F(StreamAcceptLoop, AnAbstractUnixSocketCarriesDataBothWaysAndLeavesNoFile) {
  recorder rs, rc;
  stream_channel* s = make_channel(&rs);
  stream_config no_timeout;
  no_timeout.connect_timeout_ms = 0;  // the dial's outcome then needs a timer of its own
  stream_channel* c = make_channel(&rc, no_timeout);
  const std::string name = "@" + unique_name("abstract");
  const std::string url = "unix://" + name;
  listener_id l;
  ASSERT_EQ(s->listen(url, &l), errc::ok) << s->last_error().detail;
  EXPECT_EQ(s->listener_url(l), url);
  EXPECT_NE(::access(name.c_str(), F_OK), 0) << "a file " << name << " was made";
  EXPECT_EQ(s->listen(url), errc::address_in_use) << s->last_error().detail;
  connection_id conn;
  ASSERT_EQ(c->connect(url, &conn), errc::ok);
  ASSERT_TRUE(run([&] { return rc.connected.count(conn.value) == 1 && rs.accepted.size() == 1; }));
  EXPECT_EQ(rc.connected[conn.value], errc::ok);
  const connection_id acc = rs.accepted[0];
  EXPECT_EQ(s->peer_url(acc), url);
  EXPECT_EQ(c->peer_url(conn), url);
  ASSERT_EQ(c->send(conn, "ping", 4), errc::ok);
  ASSERT_EQ(s->send(acc, "pong", 4), errc::ok);
  ASSERT_TRUE(run(
      [&] { return rs.received[acc.value].size() == 1 && rc.received[conn.value].size() == 1; }));
  EXPECT_EQ(rs.received[acc.value][0], "ping");
  EXPECT_EQ(rc.received[conn.value][0], "pong");
  ASSERT_EQ(s->close_listener(l), errc::ok);
  connection_id refused;
  ASSERT_EQ(c->connect(url, &refused), errc::ok);  // the outcome comes from the loop
  EXPECT_EQ(rc.connected.count(refused.value), 0u);
  ASSERT_TRUE(run([&] { return rc.connected.count(refused.value) == 1; }));
  EXPECT_NE(rc.connected[refused.value], errc::ok);
  ASSERT_EQ(s->listen(url, &l), errc::ok) << s->last_error().detail;
  EXPECT_NE(::access(name.c_str(), F_OK), 0);
}

// An abstract listener handed over (detach_listener, listen_fd) keeps its name and accepts.
TEST_F(StreamAcceptLoop, AnAbstractListenerIsHandedOver) {
  recorder ra, rb, rc;
  stream_channel* a = make_channel(&ra);
  stream_channel* b = make_channel(&rb);
  stream_channel* c = make_channel(&rc);
  const std::string url = "unix://@" + unique_name("handover");
  listener_id l;
  ASSERT_EQ(a->listen(url, &l), errc::ok);
  int fd = -1;
  ASSERT_EQ(a->detach_listener(l, &fd), errc::ok);
  EXPECT_EQ(b->listen_fd("unix:///elsewhere.sock", ::dup(fd)), errc::invalid_argument);
  EXPECT_NE(b->last_error().detail.find("bound to \"" + url.substr(7) + "\""), std::string::npos)
      << b->last_error().detail;
  ASSERT_EQ(b->listen_fd(url, fd, &l), errc::ok) << b->last_error().detail;
  EXPECT_EQ(b->listener_url(l), url);
  connection_id conn;
  ASSERT_EQ(c->connect(url, &conn), errc::ok);
  ASSERT_TRUE(run([&] { return rc.connected.count(conn.value) == 1 && rb.accepted.size() == 1; }));
  EXPECT_EQ(rc.connected[conn.value], errc::ok);
  EXPECT_TRUE(ra.accepted.empty());
}

// unix://@name parses and prints back; the name holds 1 to 107 bytes (sun_path less the leading
// NUL), and a longer or empty one is refused saying so (a 107-byte name was refused before as a
// path over 107 bytes).
TEST_F(StreamAcceptLoop, AbstractNamesRoundTripAndTheirLimitIsNamed) {
  address a;
  ASSERT_EQ(parse_address("unix://@bus", &a), errc::ok);
  EXPECT_EQ(a.host, "@bus");
  EXPECT_EQ(a.to_string(), "unix://@bus");
  std::string name = "@" + unique_name("longest");
  name.resize(108, 'x');  // '@' and 107 bytes of name
  ASSERT_EQ(parse_address("unix://" + name, &a), errc::ok);
  EXPECT_EQ(a.to_string(), "unix://" + name);
  recorder r;
  stream_channel* ch = make_channel(&r);
  listener_id l;
  ASSERT_EQ(ch->listen("unix://" + name, &l), errc::ok) << ch->last_error().detail;
  EXPECT_EQ(ch->listener_url(l), "unix://" + name);
  connection_id conn;
  ASSERT_EQ(ch->connect("unix://" + name, &conn), errc::ok);
  ASSERT_TRUE(run([&] { return r.connected.count(conn.value) == 1 && r.accepted.size() == 1; }));
  EXPECT_EQ(r.connected[conn.value], errc::ok);
  std::string why;
  EXPECT_EQ(parse_address("unix://" + name + "y", &a, &why), errc::bad_url);
  EXPECT_NE(why.find("abstract socket name is longer than 107 bytes"), std::string::npos) << why;
  EXPECT_EQ(ch->listen("unix://" + name + "y"), errc::bad_url);
  EXPECT_NE(ch->last_error().detail.find("abstract socket name"), std::string::npos);
  EXPECT_EQ(parse_address("unix://@", &a, &why), errc::bad_url);
  EXPECT_NE(why.find("no abstract socket name"), std::string::npos) << why;
}

// The scope id of a link-local IPv6 address is its interface: printed as its number.
TEST(StreamAcceptUrls, ALinkLocalAddressKeepsItsScopeId) {
  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  in6.sin6_port = htons(80);
  ASSERT_EQ(inet_pton(AF_INET6, "fe80::1", &in6.sin6_addr), 1);
  in6.sin6_scope_id = 2;
  EXPECT_EQ(detail::sockaddr_url(reinterpret_cast<sockaddr*>(&in6)), "ipv6://[fe80::1%2]:80");
  in6.sin6_scope_id = 0;
  ASSERT_EQ(inet_pton(AF_INET6, "::1", &in6.sin6_addr), 1);
  EXPECT_EQ(detail::sockaddr_url(reinterpret_cast<sockaddr*>(&in6)), "ipv6://[::1]:80");
}

// ioctl(SIOCSIFADDR)'s argument for an IPv6 address (struct in6_ifreq of <linux/ipv6.h>, which
// does not mix with <netinet/in.h>).
struct ipv6_ifreq {
  in6_addr addr;
  uint32_t prefixlen;
  int ifindex;
};

// In a network namespace of its own (a forked child), lo gets fe80::1: a peer connecting from it
// to a listener on [::] has the peer URL ipv6://[fe80::1%<lo's index>]:<its port> (the scope id
// was dropped before). 77: no network namespace can be made here (not root): skipped.
int link_local_peer(uv_loop_t* loop) {
  if (::unshare(CLONE_NEWNET) != 0) return 77;
  // The address stays tentative for a moment after it is added (the kernel ends its duplicate
  // address detection from a work queue): the client's bind waits for the next address event.
  const int nl = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  sockaddr_nl groups{};
  groups.nl_family = AF_NETLINK;
  groups.nl_groups = RTMGRP_IPV6_IFADDR;
  const timeval patience{10, 0};
  if (nl < 0 || ::bind(nl, reinterpret_cast<sockaddr*>(&groups), sizeof groups) != 0 ||
      setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience) != 0) {
    return 23;
  }
  const int s = ::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  if (s < 0 || ::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) return 20;
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) return 21;
  const unsigned lo = if_nametoindex("lo");
  ipv6_ifreq req{};
  inet_pton(AF_INET6, "fe80::1", &req.addr);
  req.prefixlen = 64;
  req.ifindex = static_cast<int>(lo);
  if (::ioctl(s, SIOCSIFADDR, &req) != 0) return 22;
  ::close(s);
  return with_child_channel(loop, [loop, lo, nl](child_channel& c) {
    if (c.listen("ipv6://[::]:0") != 0) return 10;
    const int client = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 to{};
    to.sin6_family = AF_INET6;
    to.sin6_port = htons(c.ch.listener_port(c.l));
    to.sin6_scope_id = lo;
    inet_pton(AF_INET6, "fe80::1", &to.sin6_addr);
    sockaddr_in6 from = to;  // from fe80::1 too, not whatever source the kernel would pick
    from.sin6_port = 0;
    char event[4096];
    int tries = 0;
    while (::bind(client, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
      if (errno != EADDRNOTAVAIL || ++tries > 10 || ::recv(nl, event, sizeof event, 0) <= 0) {
        return 13;
      }
    }
    ::close(nl);
    if (::connect(client, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return 11;
    sockaddr_in6 me{};
    socklen_t len = sizeof me;
    getsockname(client, reinterpret_cast<sockaddr*>(&me), &len);
    if (!run_loop_until(loop, [&] { return c.rec.accepted.size() == 1; })) return 12;
    const std::string want =
        "ipv6://[fe80::1%" + std::to_string(lo) + "]:" + std::to_string(ntohs(me.sin6_port));
    const std::string got = c.ch.peer_url(c.rec.accepted[0]);
    std::fprintf(stderr, "peer url %s (want %s)\n", got.c_str(), want.c_str());
    ::close(client);
    return got != want ? 2 : 0;
  });
}

TEST(StreamAcceptUrls, AnAcceptedLinkLocalPeerKeepsItsScopeId) {
  const int rc = in_child(link_local_peer);
  if (rc == 77) GTEST_SKIP() << "no network namespace of our own here (needs root)";
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace uvbus::test::stream_accept_test
