// Caps on unregistered connections (max_unregistered, max_unregistered_per_address) and the lazy,
// growing send ring: what an accepted connection costs before its owner vouches for it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/buffer_pool.h"
#include "core/frame.h"
#include "core/write_queue.h"
#include "stream/stream_harness.h"

namespace uvbus::test::stream_caps_test {
namespace {

// A blocking client from a chosen loopback source address (127.0.0.x), or a unix-socket client.
class src_peer {
 public:
  src_peer(uint16_t port, uint8_t last_octet) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7f000000U | last_octet);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof src) == 0 &&
          ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  }
  explicit src_peer(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path.c_str());
    ok_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  }
  ~src_peer() {
    if (fd_ >= 0) ::close(fd_);
  }
  src_peer(const src_peer&) = delete;
  src_peer& operator=(const src_peer&) = delete;
  [[nodiscard]] bool ok() const { return ok_; }
  bool write_frame(const std::string& s) {
    std::vector<uint8_t> f(frame_size(s.size()));
    f.resize(frame_encode(s.data(), s.size(), f.data(), f.size()));
    return ::write(fd_, f.data(), f.size()) == static_cast<ssize_t>(f.size());
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

class StreamCaps : public stream_fixture {
 protected:
  // c connects to a listener of s on loopback; true once s accepted it and c has it live. The
  // server side's id is srv.accepted[0], the client's cli.live.begin().
  bool connect_pair(stream_channel* s, stream_channel* c, const recorder& srv,
                    const recorder& cli) {
    listener_id l;
    if (s->listen("ipv4://127.0.0.1:0", &l) != errc::ok) return false;
    if (c->connect(s->listener_url(l)) != errc::ok) return false;
    return run([&] { return srv.accepted.size() == 1 && !cli.live.empty(); });
  }
};

TEST_F(StreamCaps, ValidateRefusesAPerAddressCapAboveTheTotal) {
  stream_config cfg;
  cfg.max_unregistered = 10;
  cfg.max_unregistered_per_address = 11;
  std::string why;
  EXPECT_EQ(stream_channel::validate(cfg, &why), errc::invalid_argument);
  EXPECT_NE(why.find("max_unregistered_per_address"), std::string::npos) << why;
  cfg.max_unregistered = 0;  // no total cap: any per-address cap applies
  EXPECT_EQ(stream_channel::validate(cfg), errc::ok);
}

TEST_F(StreamCaps, UnregisteredConnectionsAreCappedPerChannelAndPerAddress) {
  recorder srv;
  stream_config cfg;
  cfg.max_unregistered = 4;
  cfg.max_unregistered_per_address = 2;
  stream_channel* s = make_channel(&srv, cfg);
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  const uint16_t port = s->listener_port(l);
  src_peer a(port, 1);
  src_peer b(port, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 2; }));
  EXPECT_EQ(s->metrics().unregistered_open, 2u);
  src_peer c(port, 1);  // a third from 127.0.0.1: over the per-address cap
  ASSERT_TRUE(run([&] { return s->metrics().rejected_per_address == 1; }));
  EXPECT_EQ(srv.accepted.size(), 2u);
  // A registered connection frees its place (and is never refused or closed by the caps).
  ASSERT_EQ(s->mark_registered(srv.accepted[0]), errc::ok);
  ASSERT_EQ(s->mark_registered(srv.accepted[0]), errc::ok);  // idempotent
  EXPECT_EQ(s->metrics().unregistered_open, 1u);
  src_peer d(port, 1);
  src_peer e(port, 2);
  src_peer f(port, 3);
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 5; }));
  EXPECT_EQ(s->metrics().unregistered_open, 4u);
  src_peer g(port, 4);  // a new address, but the channel holds max_unregistered already
  ASSERT_TRUE(run([&] { return s->metrics().rejected_unregistered == 1; }));
  const stream_channel_metrics m = s->metrics();
  EXPECT_EQ(m.connections_rejected, 2u);
  EXPECT_EQ(m.connections_accepted, 5u);
  EXPECT_EQ(srv.accepted.size(), 5u);
  bool per_address_logged = false;
  bool total_logged = false;
  for (const auto& [lv, text] : srv.logs) {
    EXPECT_EQ(lv, log_level::warn);
    per_address_logged |= text.find("max_unregistered_per_address (2)") != std::string::npos;
    total_logged |= text.find("max_unregistered (4)") != std::string::npos;
  }
  EXPECT_TRUE(per_address_logged && total_logged);
  // The registered connection works as before.
  ASSERT_TRUE(a.write_frame("still here"));
  ASSERT_TRUE(run([&] { return srv.received[srv.accepted_ids[0]].size() == 1; }));
  // Leaving releases the count.
  ASSERT_EQ(s->disconnect(srv.accepted[1], disconnect_mode::force), errc::ok);
  ASSERT_TRUE(run([&] { return s->metrics().unregistered_open == 3; }));
  EXPECT_EQ(s->mark_registered(srv.accepted[1]), errc::closed);
}

TEST_F(StreamCaps, EveryUnixSocketPeerCountsAsOneAddress) {
  recorder srv;
  stream_config cfg;
  cfg.max_unregistered_per_address = 1;
  stream_channel* s = make_channel(&srv, cfg);
  const std::string path = "/tmp/uvbus-caps-" + std::to_string(getpid()) + ".sock";
  ASSERT_EQ(s->listen("unix://" + path), errc::ok);
  src_peer a(path);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 1; }));
  src_peer b(path);
  ASSERT_TRUE(run([&] { return s->metrics().rejected_per_address == 1; }));
  ASSERT_EQ(s->mark_registered(srv.accepted[0]), errc::ok);
  src_peer c(path);
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 2; }));
}

// stream_config::unix_send_buffer sets how much a unix socket takes before the peer reads: a
// server sends 2 MiB to a raw client that never reads, and the first flush writes until the
// socket is full (nothing drains it afterwards). 32 KiB asked for (the kernel doubles it) takes
// far less than 1 MiB asked for, which the kernel caps at net.core.wmem_max (at least 208 KiB).
TEST_F(StreamCaps, UnixSendBufferSetsHowMuchTheSocketTakesBeforeThePeerReads) {
  auto taken = [&](size_t sndbuf) -> uint64_t {
    recorder srv;
    stream_config cfg;
    cfg.unix_send_buffer = sndbuf;
    stream_channel* s = make_channel(&srv, cfg);
    const std::string path = "/tmp/" + unique_name("sndbuf") + ".sock";
    EXPECT_EQ(s->listen("unix://" + path), errc::ok);
    src_peer peer(path);
    EXPECT_TRUE(peer.ok());
    EXPECT_TRUE(run([&] { return srv.accepted.size() == 1; }));
    const connection_id conn = srv.accepted[0];
    const std::string m(1000, 'x');
    for (int i = 0; i < 2048; ++i) EXPECT_EQ(s->send(conn, m.data(), m.size()), errc::ok);
    EXPECT_TRUE(run([&] { return cm(s, conn).packets_sent > 0; }));
    const uint64_t bytes = cm(s, conn).bytes_sent;
    s->close();
    return bytes;
  };
  const uint64_t small = taken(size_t{32} * 1024);
  const uint64_t large = taken(size_t{1} << 20);
  EXPECT_LT(small, uint64_t{160} * 1024);
  EXPECT_GT(large, 2 * small);
  stream_config bad;
  bad.unix_send_buffer = size_t{2} << 30;
  std::string why;
  EXPECT_EQ(stream_channel::validate(bad, &why), errc::invalid_argument);
  EXPECT_NE(why.find("unix_send_buffer"), std::string::npos) << why;
}

TEST_F(StreamCaps, TheSendRingStartsSmallAndGrowsOnlyAsItFills) {
  recorder srv;
  recorder cli;
  stream_channel* s = make_channel(&srv);  // default queue: 2 MiB ring, 4 KiB at first
  stream_channel* c = make_channel(&cli);
  ASSERT_TRUE(connect_pair(s, c, srv, cli));
  const connection_id conn = srv.accepted[0];
  stream_connection_metrics m;
  ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
  EXPECT_EQ(m.queue_memory_bytes, 0u);  // nothing sent: nothing allocated
  ASSERT_EQ(s->send(conn, "hello", 5), errc::ok);
  ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
  EXPECT_EQ(m.queue_memory_bytes, s->config().queue.ring_initial_bytes);
  // Large messages sent in one go (they queue up before the loop runs): the ring grows to hold
  // them, and every byte arrives intact and in order.
  std::vector<std::string> sent{"hello"};
  for (int i = 0; i < 6; ++i) {
    std::string m(size_t{100} * 1024 + static_cast<size_t>(i), static_cast<char>('a' + i));
    ASSERT_EQ(s->send(conn, m.data(), m.size()), errc::ok);
    sent.push_back(std::move(m));
  }
  const uint64_t from = cli.live.begin()->first;
  ASSERT_TRUE(run([&] { return cli.received[from].size() == sent.size(); }));
  EXPECT_EQ(cli.received[from], sent);
  ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
  EXPECT_GT(m.queue_memory_bytes, size_t{100} * 1024);  // grown (the old rings released) ...
  EXPECT_LE(m.queue_memory_bytes, s->config().queue.ring_bytes);  // ... never beyond ring_bytes
  EXPECT_EQ(s->metrics().totals.queue_memory_bytes, m.queue_memory_bytes);
}

// A ring that grew for a burst is freed once the queue has been empty for send_ring_idle_ms
// (before, a connection kept up to ring_bytes for its life); the next send starts small again.
TEST_F(StreamCaps, AGrownSendRingIsFreedOnceTheConnectionIsQuiet) {
  recorder srv;
  recorder cli;
  stream_config cfg;
  cfg.send_ring_idle_ms = 50;
  stream_channel* s = make_channel(&srv, cfg);
  stream_channel* c = make_channel(&cli);
  ASSERT_TRUE(connect_pair(s, c, srv, cli));
  const connection_id conn = srv.accepted[0];
  const uint64_t from = cli.live.begin()->first;
  const std::string big(size_t{100} * 1024, 'b');
  stream_connection_metrics m;
  for (int round = 1; round <= 2; ++round) {
    for (int i = 0; i < 4; ++i) ASSERT_EQ(s->send(conn, big.data(), big.size()), errc::ok);
    ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
    EXPECT_GT(m.queue_memory_bytes, size_t{256} * 1024) << "round " << round;  // grown
    ASSERT_TRUE(run([&] { return cli.received[from].size() == size_t{4} * round; }));
    ASSERT_TRUE(run([&] {
      return s->connection_metrics(conn, &m) == errc::ok && m.queue_memory_bytes == 0;
    })) << m.queue_memory_bytes;
    EXPECT_EQ(s->metrics().totals.queue_memory_bytes, 0u);
  }
  ASSERT_EQ(s->send(conn, "hello", 5), errc::ok);  // small again
  ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
  EXPECT_EQ(m.queue_memory_bytes, s->config().queue.ring_initial_bytes);
  ASSERT_TRUE(run([&] { return cli.received[from].size() == 9; }));
  EXPECT_EQ(cli.received[from].back(), "hello");
}

TEST_F(StreamCaps, AQuietConnectionHandsItsSendRingBackToThePool) {
  recorder srv;
  recorder cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  ASSERT_TRUE(connect_pair(s, c, srv, cli));
  const connection_id conn = srv.accepted[0];
  const uint64_t from = cli.live.begin()->first;
  // The ring of the default queue comes from this (the loop's) thread's pool.
  buffer_pool* pool =
      buffer_pool::local(write_queue::ring_storage_bytes(s->config().queue.ring_initial_bytes));
  ASSERT_NE(pool, nullptr);
  stream_connection_metrics m;
  for (int round = 0; round < 3; ++round) {
    const uint64_t reused = pool->reused();
    ASSERT_EQ(s->send(conn, "hello", 5), errc::ok);
    ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
    EXPECT_EQ(m.queue_memory_bytes, s->config().queue.ring_initial_bytes);  // taken to send
    const size_t got = cli.received[from].size();
    ASSERT_TRUE(run([&] { return cli.received[from].size() == got + 1; }));
    // Written and drained: the connection holds no send memory until it sends again.
    ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
    EXPECT_EQ(m.queue_memory_bytes, 0u);
    EXPECT_EQ(s->metrics().totals.queue_memory_bytes, 0u);
    EXPECT_GE(pool->free_count(), 1u);
    if (round > 0) {
      EXPECT_EQ(pool->reused(), reused + 1);  // the same buffer, no malloc
    }
  }
}

TEST_F(StreamCaps, TheRingGrowsWhileAWriteIsInFlightAndKeepsItsBytesUntilItCompletes) {
  recorder srv;
  recorder cli;
  cli.keep_payloads = false;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  ASSERT_TRUE(connect_pair(s, c, srv, cli));
  const connection_id conn = srv.accepted[0];
  const connection_id peer = cli.live.begin()->second;
  ASSERT_EQ(c->pause_reading(peer), errc::ok);
  // Fill the socket until a write stays in flight (the queue keeps bytes after a loop turn).
  const std::string big(size_t{60} * 1024, 'x');
  stream_connection_metrics m;
  size_t sent = 0;
  for (int i = 0; i < 2000; ++i) {
    ASSERT_EQ(s->send(conn, big.data(), big.size()), errc::ok);
    ++sent;
    uv_run(&loop_, UV_RUN_NOWAIT);
    ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
    if (m.queue_bytes != 0) break;
  }
  ASSERT_NE(m.queue_bytes, 0u) << "the socket never filled";
  const size_t before = m.queue_memory_bytes;
  // Grow the ring now: the ring the write in flight reads from must stay until it completes.
  while (m.queue_memory_bytes < 4 * before) {
    ASSERT_EQ(s->send(conn, big.data(), big.size()), errc::ok);
    ++sent;
    ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
  }
  // Rings are powers of two: a sum that is not one holds retired rings beside the current one.
  EXPECT_NE(m.queue_memory_bytes & (m.queue_memory_bytes - 1), 0u) << m.queue_memory_bytes;
  ASSERT_EQ(c->resume_reading(peer), errc::ok);
  ASSERT_TRUE(run([&] { return cli.received_count == sent; }));
  EXPECT_EQ(c->metrics().totals.decode_errors, 0u);  // every frame's hash checked out
  ASSERT_EQ(s->connection_metrics(conn, &m), errc::ok);
  EXPECT_LE(m.queue_memory_bytes, s->config().queue.ring_bytes);  // the old rings are gone
}

}  // namespace
}  // namespace uvbus::test::stream_caps_test
