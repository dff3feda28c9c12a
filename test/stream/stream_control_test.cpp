// The application steering a connection from its callbacks: a pause outlasting the stall timeout,
// a graceful disconnect inside on_received, reservations opened in on_writable or outliving a
// disconnect.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "core/frame.h"
#include "stream/stream_harness.h"

namespace uvbus::test::stream_control_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

class StreamControl : public stream_fixture {
 protected:
  struct pair {
    connection_id server;
    connection_id client;
  };
  // Connects client channel c to server channel s (listening on a port from the OS first).
  pair connect(stream_channel* s, recorder* srv, stream_channel* c, recorder* cli) {
    listener_id l;
    EXPECT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
    pair p;
    EXPECT_EQ(c->connect(s->listener_url(l), &p.client), errc::ok);
    const size_t before = srv->accepted.size();
    EXPECT_TRUE(run([&] {
      return srv->accepted.size() > before && cli->connected.count(p.client.value) != 0;
    }));
    p.server = srv->accepted.back();
    EXPECT_EQ(cli->connected[p.client.value], errc::ok);
    return p;
  }
  // Runs the loop for `ms` of wall-clock time (no sleep: the loop keeps serving events).
  void run_for(int ms) {
    const auto until = steady_clock::now() + milliseconds(ms);
    (void)run([&] { return steady_clock::now() >= until; }, milliseconds(ms + 5000));
  }
};

// A blocking TCP client writing raw bytes (the kernel completes its handshake from the backlog).
struct raw_writer {
  int fd = -1;
  explicit raw_writer(uint16_t port) : fd(dial(port)) {}
  ~raw_writer() {
    if (fd >= 0) ::close(fd);
  }
  bool write_all(const uint8_t* p, size_t n) const {
    while (n != 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
};

std::vector<uint8_t> frame_of(const std::string& s) {
  std::vector<uint8_t> out(frame_size(s.size()));
  EXPECT_EQ(frame_encode(s.data(), s.size(), out.data(), out.size()), out.size());
  return out;
}

// A bus node pauses an upstream link while the next hop is slow: the half frame it holds then is
// the application's doing, not a stalled peer, however long the pause lasts.
TEST_F(StreamControl, PausedConnectionOutlivesThePartialFrameTimeout) {
  recorder srv, cli;
  stream_config scfg;
  scfg.partial_frame_timeout_ms = 200;
  scfg.read_buffer_size = 4096;
  // The read buffer is per thread and only grows (an earlier test of this process may have left
  // it at the default 256 KiB): a larger frame is cut by the first read whatever its size.
  scfg.message_limit = size_t{512} * 1024;
  stream_config ccfg;
  ccfg.message_limit = scfg.message_limit;
  stream_channel* s = make_channel(&srv, scfg);
  stream_channel* c = make_channel(&cli, ccfg);
  const pair p = connect(s, &srv, c, &cli);
  srv.on_received_hook = [&](connection_id conn, const uint8_t*, size_t) {
    if (srv.received_count == 1) {
      ASSERT_EQ(s->pause_reading(conn), errc::ok);
    }
  };
  const std::string small(10, 's');
  std::string big(kDefaultReadBufferSize + 100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  ASSERT_EQ(c->send(p.client, small.data(), small.size()), errc::ok);
  ASSERT_EQ(c->send(p.client, big.data(), big.size()), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
  ASSERT_GT(cm(s, p.server).receive_memory_bytes, 0u) << "paused holding part of a frame";
  run_for(1000);  // five timeouts
  const uint64_t sid = p.server.value;
  ASSERT_EQ(srv.disconnected.count(sid), 0u) << to_string(srv.disconnected[sid]);
  EXPECT_EQ(s->metrics().totals.partial_frame_timeouts, 0u);
  EXPECT_EQ(srv.received_count, 1u);
  ASSERT_EQ(s->resume_reading(p.server), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == 2 || srv.disconnected.count(sid) != 0; }));
  ASSERT_EQ(srv.received_count, 2u) << to_string(srv.disconnected[sid]);
  EXPECT_EQ(srv.received[sid][0], small);
  EXPECT_TRUE(srv.received[sid][1] == big) << "the large message arrives whole";
}

// resume_reading() restarts the stall clock: a peer that sends the rest of its frame soon after
// the resume is not closed for the time the connection spent paused.
TEST_F(StreamControl, ResumeReadingRestartsTheStallClock) {
  recorder srv;
  stream_config scfg;
  scfg.partial_frame_timeout_ms = 400;  // swept every 100 ms
  stream_channel* s = make_channel(&srv, scfg);
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  raw_writer peer(s->listener_port(l));
  ASSERT_GE(peer.fd, 0);
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 1; }));
  const connection_id conn = srv.accepted[0];
  srv.on_received_hook = [&](connection_id id, const uint8_t*, size_t) {
    ASSERT_EQ(s->pause_reading(id), errc::ok);
  };
  std::vector<uint8_t> bytes = frame_of("first");
  const std::vector<uint8_t> second = frame_of(std::string(1000, 'x'));
  const size_t cut = bytes.size() + second.size() / 2;
  bytes.insert(bytes.end(), second.begin(), second.end());
  ASSERT_TRUE(peer.write_all(bytes.data(), cut));  // one frame and half of the next
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
  srv.on_received_hook = nullptr;
  run_for(1000);  // paused well past the timeout
  ASSERT_TRUE(srv.disconnected.empty());
  ASSERT_EQ(s->resume_reading(conn), errc::ok);
  run_for(150);  // at least one sweep, well within a timeout of the resume
  ASSERT_TRUE(srv.disconnected.empty()) << to_string(srv.disconnected.begin()->second);
  ASSERT_TRUE(peer.write_all(bytes.data() + cut, bytes.size() - cut));
  ASSERT_TRUE(run([&] { return srv.received_count == 2 || !srv.disconnected.empty(); }));
  EXPECT_EQ(srv.received[conn.value].back(), std::string(1000, 'x'));
  EXPECT_EQ(s->metrics().totals.partial_frame_timeouts, 0u);
}

// "If the callback disconnects that connection, nothing more of it is delivered" holds for a
// graceful disconnect too, while the packets queued before it still reach the peer.
TEST_F(StreamControl, GracefulDisconnectInsideOnReceivedStopsDelivery) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  const pair p = connect(s, &srv, c, &cli);
  srv.on_received_hook = [&](connection_id conn, const uint8_t*, size_t) {
    for (int i = 0; i < 3; ++i) {
      const std::string reply = "reply-" + std::to_string(i);
      ASSERT_EQ(s->send(conn, reply.data(), reply.size()), errc::ok);
    }
    ASSERT_EQ(s->disconnect(conn, disconnect_mode::graceful), errc::ok);
    EXPECT_EQ(s->send(conn, "late", 4), errc::closed);
  };
  for (int i = 0; i < 5; ++i) {  // one write: the five frames arrive in one read
    const std::string m = "msg-" + std::to_string(i) + "...";
    ASSERT_EQ(m.size(), 8u);
    ASSERT_EQ(c->send(p.client, m.data(), m.size()), errc::ok);
  }
  const uint64_t sid = p.server.value;
  const uint64_t cid = p.client.value;
  ASSERT_TRUE(run([&] { return srv.disconnected.count(sid) && cli.disconnected.count(cid); }));
  EXPECT_EQ(srv.received_count, 1u);
  EXPECT_EQ(s->metrics().totals.packets_received, 1u);
  EXPECT_EQ(srv.disconnected[sid], errc::ok);
  EXPECT_EQ(srv.written[sid], 3u);
  EXPECT_TRUE(srv.failed.empty());
  EXPECT_EQ(cli.disconnected[cid], errc::ok);
  const std::vector<std::string> want = {"reply-0", "reply-1", "reply-2"};
  EXPECT_EQ(cli.received[cid], want);
}

// A dynamic queue of 8 blocks filled with 8-byte messages; on_writable then fires from inside a
// flush, which must not write, free or count a reservation opened there.
class ReservationInOnWritable : public StreamControl {
 protected:
  void SetUp() override {
    StreamControl::SetUp();
    stream_config ccfg;
    ccfg.queue.mode = queue_mode::dynamic;
    ccfg.queue.max_bytes = size_t{1} << 20;
    ccfg.queue.max_blocks = 8;
    s = make_channel(&srv);
    c = make_channel(&cli, ccfg);
    p = connect(s, &srv, c, &cli);
  }
  // Sends numbered 8-byte messages until the queue refuses one; checks their sequence numbers.
  void fill() {
    for (;;) {
      uint64_t seq = 0;
      const errc e = c->send(p.client, &sent, sizeof sent, &seq);
      if (e == errc::queue_full) return;
      ASSERT_EQ(e, errc::ok);
      ASSERT_EQ(seq, ++sent);
    }
  }
  // Every message 0..n-1 arrived in order, the reservation's (if any) last.
  void expect_received(uint64_t n, const std::string& last) {
    const auto& got = srv.received[p.server.value];
    ASSERT_EQ(got.size(), n + (last.empty() ? 0 : 1));
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], std::string(reinterpret_cast<const char*>(&i), sizeof i)) << i;
    }
    if (!last.empty()) {
      EXPECT_EQ(got.back(), last);
    }
  }

  recorder srv, cli;
  stream_channel* s = nullptr;
  stream_channel* c = nullptr;
  pair p;
  uint64_t sent = 0;
};

TEST_F(ReservationInOnWritable, CommittedLaterGoesOutIntactAndIsReportedOnce) {
  uint8_t* held = nullptr;
  cli.on_writable_hook = [&](connection_id conn) {
    errc e = errc::ok;
    held = c->prepare_send(conn, 64, &e);
    ASSERT_NE(held, nullptr) << to_string(e);
  };
  fill();
  ASSERT_GT(sent, 0u);
  const std::string body(64, 'R');
  uint64_t commit_seq = 0;
  // The commit comes from outside the callback that opened the reservation.
  ASSERT_TRUE(run([&] {
    if (held != nullptr && commit_seq == 0) {
      std::memcpy(held, body.data(), body.size());
      EXPECT_EQ(c->commit_send(p.client, &commit_seq), errc::ok);
    }
    return cli.written[p.client.value] == sent + 1 || !srv.disconnected.empty();
  }));
  EXPECT_EQ(commit_seq, sent + 1);
  ASSERT_TRUE(run([&] { return srv.received_count == sent + 1 || !srv.disconnected.empty(); }));
  ASSERT_TRUE(srv.disconnected.empty()) << to_string(srv.disconnected.begin()->second);
  expect_received(sent, body);
  EXPECT_EQ(cm(c, p.client).packets_sent, sent + 1);
  EXPECT_EQ(cm(c, p.client).bytes_sent, sent * 8 + 64);
  EXPECT_TRUE(cli.failed.empty());
}

// The frames queued in on_writable before the reservation wait for it; cancelling it lets them go.
TEST_F(ReservationInOnWritable, CancelledLetsTheFramesQueuedBeforeItGo) {
  bool held = false;
  cli.on_writable_hook = [&](connection_id conn) {
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(c->send(conn, &sent, sizeof sent), errc::ok);
      ++sent;
    }
    held = c->prepare_send(conn, 64) != nullptr;
    ASSERT_TRUE(held);
  };
  fill();
  bool cancelled = false;
  ASSERT_TRUE(run([&] {
    if (held && !cancelled) {
      c->cancel_send(p.client);
      cancelled = true;
    }
    return srv.received_count == sent || !srv.disconnected.empty();
  }));
  ASSERT_TRUE(srv.disconnected.empty()) << to_string(srv.disconnected.begin()->second);
  expect_received(sent, "");
  ASSERT_TRUE(run([&] { return cli.written[p.client.value] == sent; }));
  EXPECT_EQ(cm(c, p.client).packets_sent, sent);
  EXPECT_TRUE(cli.failed.empty());
}

// A reservation is not a packet: once the connection is disconnected, commit_send() drops it and
// returns closed, and no report covers it.
TEST_F(StreamControl, CommitAfterForceDisconnectIsClosedAndUnreported) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  const pair p = connect(s, &srv, c, &cli);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(c->send(p.client, "abc", 3), errc::ok);
  errc e = errc::ok;
  uint8_t* buf = c->prepare_send(p.client, 16, &e);
  ASSERT_NE(buf, nullptr) << to_string(e);
  std::memset(buf, 'z', 16);
  ASSERT_EQ(c->disconnect(p.client, disconnect_mode::force), errc::ok);
  uint64_t seq = 0;
  EXPECT_EQ(c->commit_send(p.client, &seq), errc::closed);
  EXPECT_EQ(seq, 0u);
  EXPECT_EQ(c->commit_send(p.client, &seq), errc::closed) << "the reservation is gone";
  const uint64_t id = p.client.value;
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) != 0; }));
  EXPECT_EQ(cli.disconnected[id], errc::cancelled);
  cli.expect_exact(id, 3);
  ASSERT_EQ(cli.failed.size(), 1u);
  EXPECT_EQ(cli.failed[0].last, 3u) << "the reservation is not reported";
  EXPECT_EQ(c->metrics().totals.send_failed, 3u);
}

// The same after a graceful disconnect: the reservation is dropped and the queue still drains.
TEST_F(StreamControl, CommitAfterGracefulDisconnectIsClosedAndTheQueueDrains) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  const pair p = connect(s, &srv, c, &cli);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(c->send(p.client, "abc", 3), errc::ok);
  uint8_t* buf = c->prepare_send(p.client, 16);
  ASSERT_NE(buf, nullptr);
  std::memset(buf, 'z', 16);
  ASSERT_EQ(c->disconnect(p.client, disconnect_mode::graceful), errc::ok);
  EXPECT_EQ(c->commit_send(p.client), errc::closed);
  const uint64_t id = p.client.value;
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) != 0 && srv.live.empty(); }));
  EXPECT_EQ(cli.disconnected[id], errc::ok);
  EXPECT_EQ(cli.written[id], 3u);
  EXPECT_TRUE(cli.failed.empty());
  EXPECT_EQ(srv.received_count, 3u);
}

}  // namespace
}  // namespace uvbus::test::stream_control_test
