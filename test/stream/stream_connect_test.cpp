// Connecting, listening, addresses and connection failures.
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "stream/stream_harness.h"
#include "stream/stream_impl.h"

#if defined(__SANITIZE_ADDRESS__)
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace uvbus::test::stream_connect_test {
namespace {

class StreamConnect : public stream_fixture {
 protected:
  // Listens on listen_url, connects to the URL make_url builds from the bound listener, and checks
  // one message each way.
  template <class MakeUrl>
  void connect_and_exchange(const std::string& listen_url, MakeUrl make_url) {
    recorder srv, cli;
    stream_channel* s = make_channel(&srv);
    stream_channel* c = make_channel(&cli);
    listener_id l;
    ASSERT_EQ(s->listen(listen_url, &l), errc::ok) << listen_url;
    ASSERT_TRUE(l);
    const std::string url = make_url(s, l);
    connection_id conn;
    ASSERT_EQ(c->connect(url, &conn), errc::ok) << url;
    ASSERT_TRUE(run([&] { return !srv.accepted.empty() && cli.connected.count(conn.value); }));
    ASSERT_EQ(cli.connected[conn.value], errc::ok) << url;
    EXPECT_TRUE(c->outbound(conn));
    EXPECT_FALSE(s->outbound(srv.accepted[0]));
    EXPECT_EQ(s->listener(srv.accepted[0]), l);
    ASSERT_EQ(c->send(conn, "ping", 4), errc::ok);
    ASSERT_EQ(s->send(srv.accepted[0], "pong!", 5), errc::ok);
    ASSERT_TRUE(run([&] {
      return srv.received[srv.accepted[0].value].size() == 1 &&
             cli.received[conn.value].size() == 1;
    }));
    EXPECT_EQ(srv.received[srv.accepted[0].value][0], "ping");
    EXPECT_EQ(cli.received[conn.value][0], "pong!");
    const uint64_t cid = conn.value;
    ASSERT_EQ(c->disconnect(conn), errc::ok);
    ASSERT_TRUE(run([&] { return cli.disconnected.count(cid) && srv.live.empty(); }));
    EXPECT_EQ(cli.disconnected[cid], errc::ok);
    // A graceful close reaches the peer as a graceful end (EOF at a frame boundary), not a reset.
    EXPECT_EQ(srv.disconnected[srv.accepted_ids[0]], errc::ok);
  }
};

TEST_F(StreamConnect, ExchangesOverIpv4WithAnEphemeralPort) {
  connect_and_exchange("ipv4://127.0.0.1:0", [](stream_channel* s, listener_id l) {
    EXPECT_NE(s->listener_port(l), 0);
    EXPECT_EQ(s->listener_url(l), "ipv4://127.0.0.1:" + std::to_string(s->listener_port(l)));
    return s->listener_url(l);
  });
}

// ipv6 loopback must work on the machines we test on: a missing ::1 fails loudly, never skips.
TEST_F(StreamConnect, ExchangesOverIpv6) {
  connect_and_exchange("ipv6://[::1]:0", [](stream_channel* s, listener_id l) {
    EXPECT_EQ(s->listener_url(l), "ipv6://[::1]:" + std::to_string(s->listener_port(l)));
    return s->listener_url(l);
  });
}

TEST_F(StreamConnect, AcceptsTheLibatbusIpv6Form) {
  connect_and_exchange("ipv6://::1:0", [](stream_channel* s, listener_id l) {
    return "ipv6://::1:" + std::to_string(s->listener_port(l));
  });
}

TEST_F(StreamConnect, ResolvesDnsNames) {
  // localhost may resolve to ::1 first: the connect must fall through to 127.0.0.1.
  connect_and_exchange("ipv4://127.0.0.1:0", [](stream_channel* s, listener_id l) {
    return "dns://localhost:" + std::to_string(s->listener_port(l));
  });
}

TEST_F(StreamConnect, ListensOnDnsNames) {
  connect_and_exchange("dns://localhost:0", [](stream_channel* s, listener_id l) {
    EXPECT_NE(s->listener_port(l), 0);
    EXPECT_EQ(s->listener_url(l).rfind("ipv", 0), 0u) << s->listener_url(l);
    return s->listener_url(l);
  });
}

std::string unix_path() {
  return "/tmp/" + unique_name("sock") + ".sock";
}

TEST_F(StreamConnect, ExchangesOverUnixSocketsAndRemovesTheFile) {
  const std::string path = unix_path();
  connect_and_exchange("unix://" + path, [&](stream_channel* s, listener_id l) {
    struct stat st {};
    EXPECT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(s->listener_url(l), "unix://" + path);
    return s->listener_url(l);
  });
  channels_.clear();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "socket file left behind";
}

TEST_F(StreamConnect, ClosingAUnixListenerRemovesItsFile) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  const std::string path = unix_path();
  listener_id l;
  ASSERT_EQ(ch->listen("unix://" + path, &l), errc::ok);
  EXPECT_EQ(access(path.c_str(), F_OK), 0);
  ASSERT_EQ(ch->close_listener(l), errc::ok);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_EQ(ch->metrics().listeners_open, 0u);
}

TEST_F(StreamConnect, ReplacesAStaleUnixSocketFile) {
  const std::string path = unix_path();
  // A socket file whose owner is gone: bound, never listened on, closed.
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  std::strcpy(sun.sun_path, path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sun), sizeof sun), 0);
  close(fd);
  ASSERT_EQ(access(path.c_str(), F_OK), 0);
  connect_and_exchange("unix://" + path,
                       [](stream_channel* s, listener_id l) { return s->listener_url(l); });
  channels_.clear();
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST_F(StreamConnect, RefusesALiveListenersUnixSocketFile) {
  recorder r;
  stream_channel* a = make_channel(&r);
  stream_channel* b = make_channel(&r);
  const std::string path = unix_path();
  ASSERT_EQ(a->listen("unix://" + path), errc::ok);
  EXPECT_EQ(b->listen("unix://" + path), errc::address_in_use);
  // The live listener's file is untouched and still accepts. (The liveness probe itself shows up
  // as one short-lived accepted connection.)
  connection_id c;
  ASSERT_EQ(b->connect("unix://" + path, &c), errc::ok);
  ASSERT_TRUE(run([&] { return r.connected.count(c.value) && !r.accepted.empty(); }));
  EXPECT_EQ(r.connected[c.value], errc::ok);
  a->close();
  b->close();
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST_F(StreamConnect, RefusesToReplaceAFileThatIsNotASocket) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  const std::string path = unix_path();
  { std::ofstream(path) << "precious"; }
  EXPECT_EQ(ch->listen("unix://" + path), errc::already_exists);
  std::ifstream in(path);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "precious");
  unlink(path.c_str());
}

TEST_F(StreamConnect, HonoursTheConfiguredUnixSocketMode) {
  recorder r;
  stream_config cfg;
  cfg.unix_socket_mode = 0660;
  stream_channel* ch = make_channel(&r, cfg);
  const std::string path = unix_path();
  ASSERT_EQ(ch->listen("unix://" + path), errc::ok);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST_F(StreamConnect, ReportsAddressInUseForABoundPort) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  listener_id l;
  ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  EXPECT_EQ(ch->listen(ch->listener_url(l)), errc::address_in_use);
}

TEST_F(StreamConnect, ReportsRefusedConnections) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  // A port that was free a moment ago: bind one, note it, close it.
  listener_id l;
  ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  const std::string url = ch->listener_url(l);
  ASSERT_EQ(ch->close_listener(l), errc::ok);
  connection_id c;
  ASSERT_EQ(ch->connect(url, &c), errc::ok);
  const uint64_t id = c.value;
  ASSERT_TRUE(run([&] { return r.connected.count(id) != 0; }));
  EXPECT_EQ(r.connected[id], errc::connection_refused);
  EXPECT_EQ(r.disconnected.count(id), 0u);
  EXPECT_EQ(ch->metrics().connect_failed, 1u);
  EXPECT_EQ(ch->metrics().connections_open, 0u);
}

TEST_F(StreamConnect, ReportsUnresolvableNames) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  connection_id c;
  ASSERT_EQ(ch->connect("dns://no-such-host.invalid:4000", &c), errc::ok);
  const uint64_t id = c.value;
  ASSERT_TRUE(run([&] { return r.connected.count(id) != 0; }));
  EXPECT_EQ(r.connected[id], errc::resolve_failed);
  EXPECT_EQ(ch->listen("dns://no-such-host.invalid:0"), errc::resolve_failed);
}

TEST_F(StreamConnect, ReportsAMissingUnixSocket) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  connection_id c;
  ASSERT_EQ(ch->connect("unix://" + unix_path(), &c), errc::ok);
  const uint64_t id = c.value;
  ASSERT_TRUE(run([&] { return r.connected.count(id) != 0; }));
  EXPECT_EQ(r.connected[id], errc::not_found);
}

TEST_F(StreamConnect, RejectsBadUrlsAtOnceWithoutCallbacks) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  EXPECT_EQ(ch->connect("ipv4://127.0.0.1"), errc::bad_url);
  EXPECT_EQ(ch->connect("ipv4://127.0.0.1:0"), errc::bad_url);
  EXPECT_EQ(ch->connect("shm://x"), errc::unsupported_scheme);
  EXPECT_EQ(ch->listen("mem://x"), errc::unsupported_scheme);
  EXPECT_EQ(ch->connect("nonsense"), errc::bad_url);
  run([] { return false; }, std::chrono::milliseconds(50));
  EXPECT_TRUE(r.connected.empty());
  EXPECT_EQ(ch->metrics().connections_open, 0u);
}

// A socket address holds a path of at most 107 bytes. libuv's uv_pipe_connect() cut a longer
// one silently, so connect() reached whatever listened at the first 107 bytes: another socket.
TEST_F(StreamConnect, AUnixPathTooLongForASocketAddressIsRefusedNotCut) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  std::string path = unix_path();
  path.insert(path.size() - 5, 107 - path.size(), 'p');  // exactly 107 bytes: it fits
  ASSERT_EQ(path.size(), 107u);
  listener_id l;
  ASSERT_EQ(s->listen("unix://" + path, &l), errc::ok);
  const std::string longer = "unix://" + path + "-other";
  connection_id conn;
  EXPECT_EQ(c->connect(longer, &conn), errc::bad_url);
  EXPECT_NE(c->last_error().detail.find("longer than 107 bytes"), std::string::npos)
      << c->last_error().detail;
  EXPECT_EQ(s->listen(longer), errc::bad_url);
  run([] { return false; }, std::chrono::milliseconds(50));
  EXPECT_TRUE(srv.accepted.empty()) << "connected to " << path << " instead";
  EXPECT_TRUE(cli.connected.empty());
}

TEST_F(StreamConnect, CancelsAPendingConnect) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  listener_id l;
  ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  connection_id c;
  ASSERT_EQ(ch->connect(ch->listener_url(l), &c), errc::ok);
  const uint64_t id = c.value;
  EXPECT_EQ(ch->send(c, "x", 1), errc::not_connected);
  ASSERT_EQ(ch->disconnect(c), errc::ok);
  EXPECT_TRUE(r.connected.empty()) << "the callback must not run inside disconnect()";
  ASSERT_TRUE(run([&] { return r.connected.count(id) != 0; }));
  EXPECT_EQ(r.connected[id], errc::cancelled);
}

TEST_F(StreamConnect, AConnectThatHangsTimesOut) {
  // A raw listener with backlog 0 that never accepts: once its accept queue holds one connection
  // the kernel drops further SYNs, so later connects hang until our timer fires.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(fd, 0), 0);
  socklen_t len = sizeof sa;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  const std::string url = "ipv4://127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  recorder r;
  stream_config cfg;
  cfg.connect_timeout_ms = 300;
  stream_channel* ch = make_channel(&r, cfg);
  constexpr int kConns = 4;
  for (int i = 0; i < kConns; ++i) ASSERT_EQ(ch->connect(url), errc::ok);
  ASSERT_TRUE(run([&] { return r.connected.size() == kConns; }));
  int timeouts = 0;
  for (const auto& kv : r.connected) {
    EXPECT_TRUE(kv.second == errc::ok || kv.second == errc::timeout) << to_string(kv.second);
    timeouts += kv.second == errc::timeout;
  }
  EXPECT_GE(timeouts, 1);
  EXPECT_EQ(ch->metrics().connect_failed, static_cast<uint64_t>(timeouts));
  // A dial that timed out is an ordinary end, the owner's to log (on_connected tells it): not a
  // stalled connection.
  for (const auto& l : r.logs) ADD_FAILURE() << "logged: " << l.second;
  ch->close();
  ::close(fd);
}

TEST_F(StreamConnect, InvalidConfigIsRefused) {
  stream_config cfg;
  cfg.message_limit = 0;
  EXPECT_EQ(stream_channel::validate(cfg), errc::invalid_argument);
  cfg = {};
  cfg.queue.ring_bytes = 1024;  // cannot hold one frame of the limit
  EXPECT_EQ(stream_channel::validate(cfg), errc::invalid_argument);
  recorder r;
  stream_channel* ch = make_channel(&r, cfg);
  EXPECT_EQ(ch->listen("ipv4://127.0.0.1:0"), errc::invalid_argument);
  EXPECT_EQ(stream_channel::validate(stream_config{}), errc::ok);
}

TEST_F(StreamConnect, FiveHundredConcurrentConnectionsAllExchange) {
  constexpr int kConns = 500;
  // Two descriptors per connection in this process (both ends), plus the listener and slack.
  rlimit rl{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur < 2 * kConns + 64) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 4096);
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    ASSERT_GE(rl.rlim_cur, 2u * kConns + 64) << "RLIMIT_NOFILE hard limit too low";
  }
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  // The server echoes every message.
  srv.on_received_hook = [&](connection_id conn, const uint8_t* d, size_t n) {
    ASSERT_EQ(s->send(conn, d, n), errc::ok);
  };
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  std::vector<connection_id> conns(kConns);
  for (int i = 0; i < kConns; ++i) ASSERT_EQ(c->connect(s->listener_url(l), &conns[i]), errc::ok);
  cli.on_connected_hook = [&](connection_id conn, errc st) {
    ASSERT_EQ(st, errc::ok);
    const std::string msg = "hello " + std::to_string(conn.value);
    ASSERT_EQ(c->send(conn, msg.data(), msg.size()), errc::ok);
  };
  ASSERT_TRUE(run([&] {
    size_t done = 0;
    for (auto& kv : cli.received) done += kv.second.size();
    return done == kConns;
  }));
  for (connection_id conn : conns) {
    ASSERT_EQ(cli.received[conn.value].size(), 1u);
    EXPECT_EQ(cli.received[conn.value][0], "hello " + std::to_string(conn.value));
  }
  EXPECT_EQ(s->metrics().connections_accepted, static_cast<uint64_t>(kConns));
  EXPECT_EQ(c->metrics().connections_connected, static_cast<uint64_t>(kConns));
  c->close();
  ASSERT_TRUE(run([&] { return srv.live.empty(); }));
  EXPECT_EQ(cli.disconnected.size(), static_cast<size_t>(kConns));
}

// Heap bytes in use (mallinfo2 does not see ASan's allocator, which has its own counter).
size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

// The user-space heap an idle connection costs (what docs/stream.md quotes): measured with
// mallinfo2 over 200 idle connected pairs, so both ends are counted and halved.
TEST_F(StreamConnect, AnIdleConnectionCostsLittleMemory) {
  constexpr int kPairs = 200;
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  // Warm up the per-thread buffers and libuv's internals with one exchanging pair.
  connection_id first;
  ASSERT_EQ(c->connect(s->listener_url(l), &first), errc::ok);
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 1 && !cli.live.empty(); }));
  ASSERT_EQ(c->send(first, "warm", 4), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
  const size_t before = heap_in_use();
  for (int i = 0; i < kPairs; ++i) ASSERT_EQ(c->connect(s->listener_url(l)), errc::ok);
  ASSERT_TRUE(
      run([&] { return srv.accepted.size() == kPairs + 1 && cli.live.size() == kPairs + 1; }));
  const size_t after = heap_in_use();
  const double per_conn = static_cast<double>(after - before) / (2.0 * kPairs);
  std::printf("[ memory ] heap per idle connection: %.0f bytes (sizeof handle state %zu)\n",
              per_conn, sizeof(detail::conn_impl));
  // The test binary's own bookkeeping (recorder maps) is included, so allow some slack.
  EXPECT_LT(per_conn, 2048.0);
}

}  // namespace
}  // namespace uvbus::test::stream_connect_test
