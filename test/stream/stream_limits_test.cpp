// The stream channel under operating-system limits: a listener and dials out of descriptors
// (RLIMIT_NOFILE lowered in a forked child, so no other test is disturbed).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "limits_util.h"
#include "stream/stream_harness.h"
#include "stream/test_access.h"

namespace uvbus::test::stream_limits_test {
namespace {

// The listener of the scenarios (a unix one when g_unix_path is set).
std::string g_listen_url = "ipv4://127.0.0.1:0";
std::string g_unix_path;

// A blocking unix-socket client of path, or -1.
int dial_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  std::snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path.c_str());
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof sun) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What a scenario takes away besides the descriptors themselves.
enum class starve {
  plain,               // out of descriptors; the channel sheds with its reserve
  libuv_reserve_lost,  // and libuv's reserve (if the loop has one) taken by "another thread"
  both_reserves_lost,  // and the channel's reserve too, with one descriptor left
};

// A client waits in a listener's backlog while the process is out of descriptors as `how` says.
// 0 when the loop did not spin (at most 200 iterations in 500 ms), the waiting client was closed,
// the scenario's own check held and a new client is accepted once descriptors are free again.
// -1 (in_child): killed by the alarm, the loop turn never ended. 2: spun; 3: the client hung;
// 4: libuv_reserve_lost: the shedding not logged; both_reserves_lost: the client announced (its
// descriptor was needed for the reserve); 5: no recovery.
int starved_listener(uv_loop_t* loop, starve how) {
  return with_child_channel(loop, [loop, how](child_channel& c) {
    if (c.listen(g_listen_url) != 0) return 10;
    const auto connect_client = [&] {
      return g_unix_path.empty() ? c.dial_listener() : dial_unix(g_unix_path);
    };
    const int client = connect_client();
    if (client < 0) return 11;
    int taken[2] = {-1, -1};  // descriptors "other threads" took
    if (how != starve::plain) {
      // The listener accepts by itself and never needs libuv's reserve; a loop whose streams
      // made one loses it all the same.
      if (loop->emfile_fd >= 0) ::close(loop->emfile_fd);
      loop->emfile_fd = -1;
      if (how == starve::both_reserves_lost && detail::stream_access::drop_reserve(c.ch) < 0) {
        return 15;
      }
      taken[0] = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (how == starve::both_reserves_lost) taken[1] = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    rlimit old{};
    if (!lower_nofile(&old, how == starve::both_reserves_lost ? 1 : 0)) return 12;
    ::alarm(10);  // a loop turn that never ends is killed: the test fails with a signal
    const uint64_t spins = iterations_in(loop, 500);
    const bool closed = run_loop_until(loop, [&] { return peer_closed(client); });
    ::alarm(0);
    setrlimit(RLIMIT_NOFILE, &old);
    for (const int fd : taken) {
      if (fd >= 0) ::close(fd);
    }
    std::fprintf(stderr, "iterations %llu, waiting client closed %d, accepted %zu\n",
                 static_cast<unsigned long long>(spins), closed ? 1 : 0, c.rec.accepted.size());
    c.print_logs();
    const bool named = c.lines_with("1 waiting clients closed") != 0;
    int rc = 0;
    if (spins > 200) rc = 2;
    if (!closed && rc == 0) rc = 3;
    if (how == starve::libuv_reserve_lost && !named && rc == 0) rc = 4;
    if (how == starve::both_reserves_lost && !c.rec.accepted.empty() && rc == 0) rc = 4;
    ::close(client);
    const int again = connect_client();
    if (!run_loop_until(loop, [&] { return !c.rec.accepted.empty(); }) && rc == 0) rc = 5;
    ::close(again);
    return rc;
  });
}

// The channel takes the waiting clients off the backlog and closes them with its reserve
// descriptor (libuv's uv__emfile_trick did, untold, while libuv accepted for the channel).
TEST(StreamLimits, AListenerOutOfDescriptorsShedsWaitingClientsAndRecovers) {
  EXPECT_EQ(in_child([](uv_loop_t* l) { return starved_listener(l, starve::plain); }), 0);
}

// libuv keeps one descriptor (loop->emfile_fd) to shed a backlog it cannot accept from. When that
// reserve was lost (another thread took the slot while libuv had it closed: emulated here by taking
// it and clearing the private field), libuv's accept loop called the channel again at once for as
// long as accept() failed: the loop turn never ended (killed by the alarm) before the channel shed
// the backlog with a reserve of its own. The channel now accepts by itself (stream_accept.cpp).
TEST(StreamLimits, AListenerWhoseLibuvReserveIsLostShedsWithItsOwnAndDoesNotHang) {
  EXPECT_EQ(in_child([](uv_loop_t* l) { return starved_listener(l, starve::libuv_reserve_lost); }),
            0);
}

TEST(StreamLimits, AUnixListenerWhoseLibuvReserveIsLostShedsWithItsOwnAndDoesNotHang) {
  g_unix_path = "/tmp/uvbus-limits-" + std::to_string(::getpid()) + ".sock";
  g_listen_url = "unix://" + g_unix_path;
  EXPECT_EQ(in_child([](uv_loop_t* l) { return starved_listener(l, starve::libuv_reserve_lost); }),
            0);
  ::unlink(g_unix_path.c_str());
  g_unix_path.clear();
  g_listen_url = "ipv4://127.0.0.1:0";
}

// Both reserves lost (libuv's and the channel's) and one descriptor free: the accept takes it for a
// client and the next accept would fail with nothing to shed with. The channel keeps that
// client's descriptor as its reserve (the client is closed) instead.
TEST(StreamLimits, WithBothReservesLostTheLastDescriptorBecomesTheReserve) {
  EXPECT_EQ(in_child([](uv_loop_t* l) { return starved_listener(l, starve::both_reserves_lost); }),
            0);
}

int dials_out_of_descriptors(uv_loop_t* loop) {
  return with_child_channel(loop, [loop](child_channel& c) {
    stream_channel& ch = c.ch;
    if (c.listen() != 0) return 10;
    const std::string port = std::to_string(ch.listener_port(c.l));
    rlimit old{};
    if (!lower_nofile(&old)) return 12;
    connection_id lit, dns, uds;
    listener_id l2;
    const errc e0 = ch.listen("ipv4://127.0.0.1:0", &l2);
    const std::string d0 = ch.last_error().detail;
    int fd = -1;
    const errc ed = ch.detach_listener(c.l, &fd);
    const std::string dd = ch.last_error().detail;
    const errc e1 = ch.connect("ipv4://127.0.0.1:" + port, &lit);
    const std::string d1 = ch.last_error().detail;
    const errc e2 = ch.connect("dns://127.0.0.1:" + port, &dns);
    const errc e3 = ch.connect("unix:///tmp/uvbus-limits-none.sock", &uds);
    const bool ended = run_loop_until(loop, [&] { return c.rec.connected.size() == 2; });
    setrlimit(RLIMIT_NOFILE, &old);
    std::fprintf(stderr, "listen: %s (%s)\nliteral: %s (%s)\n", to_string(e0), d0.c_str(),
                 to_string(e1), d1.c_str());
    for (const auto& [id, st] : c.rec.connected) {
      std::fprintf(stderr, "  on_connected %llu: %s\n", static_cast<unsigned long long>(id),
                   to_string(st));
    }
    int rc = 0;
    // Refused at once, the detail naming the system's reason.
    if (e0 == errc::ok || d0.find("too many open files") == std::string::npos) rc = 2;
    if (e1 != errc::io_error || d1.find("too many open files") == std::string::npos) rc = 3;
    std::fprintf(stderr, "detach: %s (%s)\n", to_string(ed), dd.c_str());
    if (ed != errc::io_error || dd.find("Too many open files") == std::string::npos) rc = 7;
    if (ch.listener_port(c.l) == 0) rc = 8;  // a failed hand-over keeps listening
    // Failing from the loop, with the system error (not a caller error such as invalid_argument).
    if (e2 != errc::ok || e3 != errc::ok || !ended) return 4;
    if (c.rec.connected[dns.value] != errc::io_error) rc = 5;
    if (c.rec.connected[uds.value] != errc::io_error) rc = 6;
    return rc;
  });
}

TEST(StreamLimits, ListenAndDialsOutOfDescriptorsFailWithTheReason) {
  // 2: listen's detail, 3: a literal connect's detail, 5: a dns dial's reason, 6: a unix dial's,
  // 7: detach_listener's detail, 8: the listener lost by a failed detach.
  EXPECT_EQ(in_child(dials_out_of_descriptors), 0);
}

class StreamUrlEdges : public stream_fixture {};

// Ports 0 / 65535 / 65536, IPv6 scope ids and bad literals: refused with a detail naming the part.
TEST_F(StreamUrlEdges, BadPortsAndLiteralsAreNamedInTheDetail) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  const struct {
    const char* url;
    const char* says;
  } cases[] = {
      {"ipv4://127.0.0.1:65536", "port \"65536\""},
      {"ipv4://127.0.0.1:-1", "port \"-1\""},
      {"ipv4://127.0.0.1:8o", "port \"8o\""},
      {"dns://localhost:99999", "port \"99999\""},
      {"ipv4://300.1.2.3:80", "\"300.1.2.3\" is not an IPv4 address"},
      {"ipv6://[fe80::1%lo]:80", "scope"},
      {"ipv6://[::1:80", "\"[::1:80\""},
      {"ipv6://[1::2::3]:80", "\"1::2::3\" is not an IPv6 address"},
      // An IPv6 address alone: the port is missing, not the address wrong.
      {"ipv6://::1", "missing port (bracket the address: ipv6://[::1]:port)"},
      {"ipv6://fe80::1", "missing port (bracket the address: ipv6://[fe80::1]:port)"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(ch->connect(c.url), errc::bad_url) << c.url;
    EXPECT_NE(ch->last_error().detail.find(c.says), std::string::npos)
        << c.url << ": " << ch->last_error().detail;
    EXPECT_EQ(ch->listen(c.url), errc::bad_url) << c.url;
  }
  // The highest port is a port: a connect to it is attempted (refused by nobody listening).
  connection_id top;
  ASSERT_EQ(ch->connect("ipv4://127.0.0.1:65535", &top), errc::ok);
  ASSERT_TRUE(run([&] { return r.connected.count(top.value) == 1; }));
  EXPECT_NE(r.connected[top.value], errc::ok);
}

// The channel's reserve descriptor is held only while it has a listener.
TEST_F(StreamUrlEdges, TheReserveDescriptorIsHeldOnlyWhileListening) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  listener_id l;
  ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &l), errc::ok);  // anything opened once per loop
  ASSERT_EQ(ch->close_listener(l), errc::ok);
  uv_run(&loop_, UV_RUN_NOWAIT);
  const int before = lowest_free_fd();
  ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  EXPECT_GT(lowest_free_fd(), before + 1);  // the socket and the reserve
  ASSERT_EQ(ch->close_listener(l), errc::ok);
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(lowest_free_fd(), before);
}

class StreamZeroWindow : public stream_fixture {};

// A peer that never reads while tiny and large sends alternate: the queue stops at its bound
// (queue_full, never grows, under twice the ring's memory), another connection of the same channel
// keeps working, and when the peer then resets every accepted packet is reported exactly once.
TEST_F(StreamZeroWindow, ANonReadingPeerIsBoundedHurtsNoOneAndItsResetReportsEverything) {
  recorder ra, rb;
  stream_config cfg;
  stream_channel* a = make_channel(&ra, cfg);
  stream_channel* b = make_channel(&rb, cfg);
  listener_id l;
  ASSERT_EQ(a->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  const int peer = ::socket(AF_INET, SOCK_STREAM, 0);
  const int small = 4096;
  setsockopt(peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(a->listener_port(l));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(peer, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_TRUE(run([&] { return ra.accepted.size() == 1; }));
  const connection_id c = ra.accepted[0];
  connection_id other;
  ASSERT_EQ(b->connect("ipv4://127.0.0.1:" + std::to_string(a->listener_port(l)), &other),
            errc::ok);
  ASSERT_TRUE(run([&] { return ra.accepted.size() == 2 && rb.connected.count(other.value); }));
  const std::string large(40000, 'L');
  uint64_t accepted = 0;
  int refused = 0;
  // Fill until queue_full, letting the loop write what the kernel takes between rounds.
  for (int round = 0; round < 200 && refused < 1000; ++round) {
    for (int i = 0; i < 64; ++i) {
      const bool big = (i % 8) == 7;
      const errc e = big ? a->send(c, large.data(), large.size()) : a->send(c, "t", 1);
      if (e == errc::ok) {
        ++accepted;
      } else {
        ASSERT_EQ(e, errc::queue_full);
        ++refused;
      }
    }
    uv_run(&loop_, UV_RUN_NOWAIT);
  }
  ASSERT_GT(refused, 0) << "the queue never filled";
  const stream_connection_metrics m = cm(a, c);
  EXPECT_LE(m.queue_bytes, cfg.queue.max_bytes + size_t{64} * 1024);
  // The ring, plus the rings its growth replaced while the stuck write still reads one of them
  // (freed when that write completes): less than twice ring_bytes (3.5 MiB of 2 MiB measured).
  EXPECT_LT(m.queue_memory_bytes, 2 * cfg.queue.ring_bytes);
  // The other connection is unaffected: 100 messages each way.
  const connection_id a_other = ra.accepted[1];
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(b->send(other, "ping", 4), errc::ok);
    ASSERT_EQ(a->send(a_other, "pong", 4), errc::ok);
  }
  ASSERT_TRUE(run([&] {
    return rb.received[other.value].size() == 100 && ra.received[a_other.value].size() == 100;
  }));
  // The peer resets: every accepted packet of c reported once, the end named.
  const linger lg{1, 0};
  setsockopt(peer, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  ::close(peer);
  ASSERT_TRUE(run([&] { return ra.disconnected.count(c.value) == 1; }));
  EXPECT_EQ(ra.disconnected[c.value], errc::connection_reset);
  ra.expect_exact(c.value, accepted);
  EXPECT_GT(ra.failed_count(c.value), 0u);
  std::fprintf(stderr,
               "accepted %llu, refused %d, written %llu, failed %llu, queue %zu B, %zu B held\n",
               static_cast<unsigned long long>(accepted), refused,
               static_cast<unsigned long long>(ra.written[c.value]),
               static_cast<unsigned long long>(ra.failed_count(c.value)), m.queue_bytes,
               m.queue_memory_bytes);
}

}  // namespace
}  // namespace uvbus::test::stream_limits_test
