// Hostile peers: a corrupt stream closes only its own connection, with the right reason.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/frame.h"
#include "core/try_alloc.h"
#include "stream/stream_harness.h"
#include "stream/stream_impl.h"
#include "stream/test_access.h"

namespace uvbus::test::stream_hostile_test {
namespace {

// A plain blocking TCP client writing raw bytes: the kernel completes the handshake from the
// listen backlog, so it needs no loop.
class raw_peer {
 public:
  explicit raw_peer(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  }
  ~raw_peer() { close_now(); }
  [[nodiscard]] bool ok() const { return ok_; }
  bool write_all(const std::vector<uint8_t>& b) {
    size_t off = 0;
    while (off < b.size()) {
      const ssize_t n = ::write(fd_, b.data() + off, b.size() - off);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

std::vector<uint8_t> frame_of(const std::string& s) {
  std::vector<uint8_t> out(frame_size(s.size()));
  EXPECT_EQ(frame_encode(s.data(), s.size(), out.data(), out.size()), out.size());
  return out;
}

class StreamHostile : public stream_fixture {
 protected:
  // Starts *t (cut_frame_setup): its server, its peer and the cut frame held (fatal failures).
  template <class Setup>
  void start_cut_frame(Setup* t) {
    stream_config cfg;
    cfg.queue.ring_bytes = cfg.queue.max_bytes = size_t{32} << 20;
    t->s = make_channel(&t->srv, cfg);
    listener_id l;
    ASSERT_EQ(t->s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
    t->big = std::make_unique<raw_peer>(t->s->listener_port(l));
    ASSERT_TRUE(t->big->ok());
    t->frame = frame_of(std::string(200000, 'r'));
    ASSERT_TRUE(
        t->big->write_all(std::vector<uint8_t>(t->frame.begin(), t->frame.begin() + 100000)));
    ASSERT_TRUE(run([&] {
      return t->srv.accepted.size() == 1 && cm(t->s, t->srv.accepted[0]).read_calls > 0;
    }));
    t->id = t->srv.accepted[0];
    ASSERT_TRUE(run([&] { return cm(t->s, t->id).receive_memory_bytes >= 100000; }));
  }

  // A server channel recording into *srv and listening on a port from the OS; returns the port
  // (0 if it could not listen: a raw_peer to it then fails ok()).
  uint16_t listening_server(recorder* srv, stream_channel** out) {
    *out = make_channel(srv);
    listener_id l;
    if ((*out)->listen("ipv4://127.0.0.1:0", &l) != errc::ok) return 0;
    return (*out)->listener_port(l);
  }

  // A server channel (cfg) listening on a port from the OS, and a client channel with one
  // connection to it (fatal failures).
  struct good_pair {
    stream_channel* s = nullptr;
    stream_channel* c = nullptr;
    listener_id l;
    connection_id good;     // on c
    uint64_t good_srv = 0;  // its id on s
  };
  void connect_good(recorder* srv, recorder* cli, const stream_config& cfg, good_pair* p) {
    p->s = make_channel(srv, cfg);
    p->c = make_channel(cli);
    ASSERT_EQ(p->s->listen("ipv4://127.0.0.1:0", &p->l), errc::ok);
    ASSERT_EQ(p->c->connect(p->s->listener_url(p->l), &p->good), errc::ok);
    ASSERT_TRUE(run([&] { return srv->accepted.size() == 1 && !cli->live.empty(); }));
    p->good_srv = srv->accepted_ids[0];
  }

  // Sends `bytes` from a raw peer after one good frame, and checks that the raw connection ends
  // with `reason` after delivering only the good frame, while a well-behaved connection on the
  // same listener keeps working.
  void expect_disconnect(const std::vector<uint8_t>& bytes, errc reason, bool close_after = false) {
    recorder srv, cli;
    stream_channel* s = make_channel(&srv);
    stream_channel* c = make_channel(&cli);
    listener_id l;
    ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
    connection_id good;
    ASSERT_EQ(c->connect(s->listener_url(l), &good), errc::ok);
    ASSERT_TRUE(run([&] { return srv.accepted.size() == 1 && !cli.live.empty(); }));
    connection_id good_srv = srv.accepted[0];

    raw_peer bad(s->listener_port(l));
    ASSERT_TRUE(bad.ok());
    std::vector<uint8_t> stream = frame_of("fine");
    stream.insert(stream.end(), bytes.begin(), bytes.end());
    // What follows a bad frame must never be delivered.
    const std::vector<uint8_t> after = frame_of("after");
    stream.insert(stream.end(), after.begin(), after.end());
    if (close_after) stream.resize(stream.size() - after.size());
    ASSERT_TRUE(bad.write_all(stream));
    if (close_after) bad.close_now();
    ASSERT_TRUE(run([&] { return srv.accepted.size() == 2 && srv.disconnected.size() == 1; }));
    const uint64_t bad_id = srv.accepted_ids[1];
    EXPECT_EQ(srv.disconnected.count(bad_id), 1u);
    EXPECT_EQ(srv.disconnected[bad_id], reason) << to_string(srv.disconnected[bad_id]);
    ASSERT_EQ(srv.received[bad_id].size(), 1u);
    EXPECT_EQ(srv.received[bad_id][0], "fine");

    // The good connection is untouched: both directions still work.
    ASSERT_EQ(c->send(good, "still", 5), errc::ok);
    ASSERT_EQ(s->send(good_srv, "here", 4), errc::ok);
    ASSERT_TRUE(run([&] {
      return srv.received[good_srv.value].size() == 1 && cli.received[good.value].size() == 1;
    }));
    EXPECT_EQ(srv.received[good_srv.value][0], "still");
    EXPECT_EQ(cm(s, good_srv).decode_errors, 0u);
    const auto m = s->metrics();
    const bool corrupt = reason != errc::connection_reset && reason != errc::ok;
    EXPECT_EQ(m.totals.decode_errors, corrupt ? 1u : 0u);
  }
};

TEST_F(StreamHostile, GarbageClosesOnlyThatConnection) {
  // Four hash bytes then a length prefix that never ends: eleven continuation bytes.
  // (Built at its final size: g++ 12 -O3 warns falsely on vector::insert into a 4-byte vector.)
  std::vector<uint8_t> garbage(15, 0xff);
  const uint8_t hash[4] = {0xde, 0xad, 0xbe, 0xef};
  std::copy(hash, hash + 4, garbage.begin());
  expect_disconnect(garbage, errc::bad_varint);
}

TEST_F(StreamHostile, ABadHashClosesOnlyThatConnection) {
  std::vector<uint8_t> f = frame_of("corrupted payload");
  f[0] ^= 0x01;
  expect_disconnect(f, errc::bad_hash);
}

TEST_F(StreamHostile, AFlippedPayloadBitClosesOnlyThatConnection) {
  std::vector<uint8_t> f = frame_of("corrupted payload");
  f.back() ^= 0x80;
  expect_disconnect(f, errc::bad_hash);
}

TEST_F(StreamHostile, AnOversizeLengthClosesOnlyThatConnection) {
  // Announces 1 MiB against the default 64 KiB limit; the decoder must not wait for the payload.
  std::vector<uint8_t> f = {0, 0, 0, 0};
  uint8_t v[kVarintMaxBytes];
  const size_t n = varint_encode(1 << 20, v);
  f.insert(f.end(), v, v + n);
  expect_disconnect(f, errc::oversize);
}

TEST_F(StreamHostile, LimitPlusOneIsOversize) {
  std::vector<uint8_t> f = {0, 0, 0, 0};
  uint8_t v[kVarintMaxBytes];
  const size_t n = varint_encode(kDefaultMessageLimit + 1, v);
  f.insert(f.end(), v, v + n);
  expect_disconnect(f, errc::oversize);
}

TEST_F(StreamHostile, ClosingMidFrameIsAResetAndDeliversNothingPartial) {
  std::vector<uint8_t> f = frame_of(std::string(5000, 'p'));
  f.resize(f.size() / 2);
  expect_disconnect(f, errc::connection_reset, /*close_after=*/true);
}

// The peer's EOF right after a whole frame is a graceful end (errc::ok), not a reset.
TEST_F(StreamHostile, ClosingAtAFrameBoundaryIsAGracefulEnd) {
  expect_disconnect({}, errc::ok, /*close_after=*/true);
}

TEST_F(StreamHostile, AFrameSplitIntoSingleBytesStillArrives) {
  recorder srv;
  stream_channel* s = nullptr;
  raw_peer peer(listening_server(&srv, &s));
  ASSERT_TRUE(peer.ok());
  const std::vector<uint8_t> f = frame_of(std::string(300, 's'));
  for (uint8_t b : f) {
    ASSERT_TRUE(peer.write_all({b}));
    run([&] { return srv.accepted.size() == 1 && cm(s, srv.accepted[0]).read_calls > 0; },
        std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
  EXPECT_EQ(srv.received[srv.accepted[0].value][0], std::string(300, 's'));
}

// A frame cut by the end of a read is held by the connection until it completes; after a read
// that ends at a frame boundary the connection holds no receive memory (100 000 mostly quiet
// connections must not each keep a buffer).
TEST_F(StreamHostile, AFrameCutByAReadLeavesNoReceiveMemoryOnceComplete) {
  recorder srv;
  stream_channel* s = nullptr;
  raw_peer peer(listening_server(&srv, &s));
  ASSERT_TRUE(peer.ok());
  const std::vector<uint8_t> f = frame_of(std::string(1000, 'q'));
  ASSERT_TRUE(peer.write_all({f.begin(), f.begin() + 600}));
  ASSERT_TRUE(run([&] {  // the cut frame, held
    return srv.accepted.size() == 1 && cm(s, srv.accepted[0]).receive_memory_bytes >= 600;
  }));
  EXPECT_GE(s->metrics().totals.receive_memory_bytes, 600u);
  ASSERT_TRUE(peer.write_all({f.begin() + 600, f.end()}));
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
  EXPECT_EQ(cm(s, srv.accepted[0]).receive_memory_bytes, 0u);
  EXPECT_EQ(s->metrics().totals.receive_memory_bytes, 0u);
  EXPECT_EQ(srv.received[srv.accepted[0].value][0], std::string(1000, 'q'));
}

}  // namespace
}  // namespace uvbus::test::stream_hostile_test

namespace uvbus::test::stream_hostile_test {
namespace {

// A slow-loris peer: a header and part of a payload, then silence. Its connection is closed with
// timeout once partial_frame_timeout_ms passes, while a connection that is idle between frames
// (nothing partial) stays up and keeps working.
TEST_F(StreamHostile, AStalledHalfFrameIsClosedWithTimeoutAndAnIdleConnectionIsNot) {
  recorder srv, cli;
  stream_config cfg;
  cfg.partial_frame_timeout_ms = 100;
  good_pair p;
  ASSERT_NO_FATAL_FAILURE(connect_good(&srv, &cli, cfg, &p));
  stream_channel* s = p.s;
  stream_channel* c = p.c;
  const connection_id idle = p.good;
  const uint64_t idle_srv_id = p.good_srv;

  raw_peer loris(s->listener_port(p.l));
  ASSERT_TRUE(loris.ok());
  std::vector<uint8_t> half = frame_of(std::string(1000, 'z'));
  half.resize(half.size() / 2);
  ASSERT_TRUE(loris.write_all(half));
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 2; }));
  const uint64_t loris_id = srv.accepted_ids[1];
  ASSERT_TRUE(run([&] { return srv.disconnected.count(loris_id) != 0; }));
  EXPECT_EQ(srv.disconnected[loris_id], errc::timeout);
  EXPECT_EQ(s->metrics().totals.partial_frame_timeouts, 1u);
  EXPECT_TRUE(srv.received[loris_id].empty());

  // The idle connection (at a frame boundary for far longer than the timeout) is still up.
  EXPECT_EQ(srv.disconnected.count(idle_srv_id), 0u);
  ASSERT_EQ(c->send(idle, "still here", 10), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received[idle_srv_id].size() == 1; }));
  EXPECT_EQ(srv.received[idle_srv_id][0], "still here");
}

// However many connections, a pass from the front ends within the sweep's period, its firings
// at least kSweepMinMs apart, each looking at no more than a slice unless the period has room for
// no more firings. (Rounding each firing's share down once made a pass over 257 connections take
// two periods.)
TEST(StreamSweepPlan, EveryPassEndsWithinItsPeriod) {
  for (const uint64_t period : {10U, 25U, 100U, 2500U, 7500U}) {
    for (const size_t slice : {size_t{16}, detail::kSweepSlice}) {
      for (size_t n = 0; n <= 20000; n += (n < 3000 ? 1 : 997)) {
        const detail::sweep_plan p = detail::plan_sweep(n, slice, period);
        SCOPED_TRACE(testing::Message()
                     << "n " << n << ", slice " << slice << ", period " << period);
        ASSERT_GE(p.delay_ms, detail::kSweepMinMs);
        if (n == 0) continue;
        ASSERT_GE(p.share, 1U);
        const size_t firings = (n + p.share - 1) / p.share;
        ASSERT_LE(firings * p.delay_ms, period);
        if ((n + slice - 1) / slice <= period / detail::kSweepMinMs) {  // room for the firings
          ASSERT_LE(p.share, slice);
        }
      }
    }
  }
}

// Many slow-loris peers: more connections than one firing of the sweep looks at (its slice, set
// to 16 here: detail::kSweepSlice otherwise), so the pass is cut into slices; every stalled
// connection is still closed with timeout, and no firing looked at more than a slice.
TEST_F(StreamHostile, ManyStalledHalfFramesAreSweptInSlicesAndEveryOneIsClosed) {
  constexpr size_t kSlice = 16;
  constexpr size_t kPeers = 80;
  recorder srv;
  stream_config cfg;
  cfg.partial_frame_timeout_ms = 400;  // a pass every 100 ms
  stream_channel* s = make_channel(&srv, cfg);
  detail::stream_access::set_sweep_slice(*s, kSlice);
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  std::vector<uint8_t> half = frame_of(std::string(100, 'z'));
  half.resize(half.size() / 2);
  std::vector<std::unique_ptr<raw_peer>> peers;
  for (size_t i = 0; i < kPeers; ++i) {
    peers.push_back(std::make_unique<raw_peer>(s->listener_port(l)));
    ASSERT_TRUE(peers.back()->ok() && peers.back()->write_all(half));
  }
  ASSERT_TRUE(run([&] { return srv.disconnected.size() == kPeers; }));
  for (const auto& [id, why] : srv.disconnected) EXPECT_EQ(why, errc::timeout) << id;
  EXPECT_EQ(s->metrics().totals.partial_frame_timeouts, kPeers);
  const size_t slice = detail::stream_access::sweep_largest_slice(*s);
  EXPECT_GT(slice, 0U);
  EXPECT_LE(slice, kSlice);

  // Idle peers this time; the connection where the next slice starts is closed between two
  // firings, and the sweep carries on from the one after it.
  peers.clear();
  for (size_t i = 0; i < kPeers; ++i) {
    peers.push_back(std::make_unique<raw_peer>(s->listener_port(l)));
    ASSERT_TRUE(peers.back()->ok());
  }
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 2 * kPeers; }));
  const auto firings = [&] { return detail::stream_access::sweep_firings(*s); };
  const uint64_t before = firings();
  ASSERT_TRUE(run([&] { return firings() > before && detail::stream_access::sweep_cursor(*s); }));
  const connection_id at = detail::stream_access::sweep_cursor(*s);
  ASSERT_EQ(s->disconnect(at), errc::ok);
  ASSERT_TRUE(run([&] { return srv.disconnected.count(at.value) != 0; }));
  EXPECT_NE(detail::stream_access::sweep_cursor(*s), at);
  const uint64_t after = firings();
  ASSERT_TRUE(run([&] { return firings() >= after + 10; }));  // past the end, and round again
  EXPECT_EQ(s->metrics().connections_open, kPeers - 1);
}

// Memory that runs out while a cut frame's buffer grows ends that connection with no_memory (not
// std::bad_alloc through libuv's read callback, which ended the process), is not counted as the
// peer's decode error, and leaves the other connections alone.
TEST_F(StreamHostile, ACutFrameThatFindsNoMemoryEndsOnlyItsConnection) {
  recorder srv, cli;
  good_pair p;
  ASSERT_NO_FATAL_FAILURE(connect_good(&srv, &cli, {}, &p));
  stream_channel* s = p.s;
  raw_peer big(s->listener_port(p.l));
  ASSERT_TRUE(big.ok());
  std::vector<uint8_t> part = frame_of(std::string(200000, 'm'));  // beyond the 64 KiB spare
  part.resize(part.size() / 2);
  detail::fail_next_try_resize(1);
  ASSERT_TRUE(big.write_all(part));
  ASSERT_TRUE(run([&] { return srv.disconnected.size() == 1; }));
  detail::fail_next_try_resize(0);
  const uint64_t big_id = srv.accepted_ids.at(1);
  EXPECT_EQ(srv.disconnected[big_id], errc::no_memory) << to_string(srv.disconnected[big_id]);
  EXPECT_EQ(s->metrics().totals.decode_errors, 0U);
  ASSERT_EQ(p.c->send(p.good, "after", 5), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received[p.good_srv].size() == 1; }));
  EXPECT_EQ(srv.disconnected.count(p.good_srv), 0U);
}

// No memory for the per-thread read buffer: the connection that was to read ends with no_memory,
// counted as neither a socket error nor the peer's decode error; the others go on.
TEST_F(StreamHostile, AReadBufferThatFindsNoMemoryIsNotASocketError) {
  recorder srv, cli;
  good_pair p;
  ASSERT_NO_FATAL_FAILURE(connect_good(&srv, &cli, {}, &p));
  raw_peer other(p.s->listener_port(p.l));
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 2; }));
  detail::stream_access::fail_read_buffer();
  ASSERT_TRUE(other.write_all(frame_of("never read")));
  ASSERT_TRUE(run([&] { return srv.disconnected.size() == 1; }));
  EXPECT_EQ(srv.disconnected.at(srv.accepted_ids.at(1)), errc::no_memory);
  EXPECT_EQ(p.s->metrics().totals.io_errors, 0U);
  EXPECT_EQ(p.s->metrics().totals.decode_errors, 0U);
  ASSERT_EQ(p.c->send(p.good, "after", 5), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received[p.good_srv].size() == 1; }));
}

// A server with send rings large enough to hold more than the kernel takes for a peer that does
// not read, and a raw peer that has sent the first 100 000 bytes of a 200 000-byte frame: the cut
// frame the server's decoder holds.
struct cut_frame_setup {
  recorder srv;
  stream_channel* s = nullptr;
  std::unique_ptr<raw_peer> big;
  std::vector<uint8_t> frame;
  connection_id id;

  // 24 MB: more than the kernel's socket buffers take for a peer that does not read.
  void fill_queue(connection_id c) const {
    const std::vector<uint8_t> filler(60000, 'f');
    for (int i = 0; i < 400; ++i) ASSERT_EQ(s->send(c, filler.data(), filler.size()), errc::ok);
  }
};

// A connection its owner ends from on_received drains its queue first (graceful), for as long as
// the peer takes to read: the buffer of the cut frame just delivered goes at once, not after the
// drain. Here the peer never reads, so the drain lasts.
TEST_F(StreamHostile, AConnectionEndedFromOnReceivedGivesItsReceiveBufferBackAtOnce) {
  cut_frame_setup t;
  t.srv.on_received_hook = [&](connection_id c, const uint8_t*, size_t) {
    t.fill_queue(c);
    ASSERT_EQ(t.s->disconnect(c, disconnect_mode::graceful), errc::ok);
  };
  ASSERT_NO_FATAL_FAILURE(start_cut_frame(&t));
  ASSERT_TRUE(t.big->write_all(std::vector<uint8_t>(t.frame.begin() + 100000, t.frame.end())));
  ASSERT_TRUE(run([&] { return t.srv.received[t.id.value].size() == 1; }));
  EXPECT_EQ(t.srv.disconnected.count(t.id.value), 0U) << "still draining: the peer reads nothing";
  EXPECT_EQ(cm(t.s, t.id).receive_memory_bytes, 0U);
}

// The same from outside on_received (a timer, another connection's callback): the cut frame will
// never be delivered, and its buffer goes at once, not when the drain ends (maybe never).
TEST_F(StreamHostile, AGracefulDisconnectOutsideOnReceivedGivesTheCutFramesBufferBackAtOnce) {
  cut_frame_setup t;
  ASSERT_NO_FATAL_FAILURE(start_cut_frame(&t));
  ASSERT_NO_FATAL_FAILURE(t.fill_queue(t.id));
  ASSERT_EQ(t.s->disconnect(t.id, disconnect_mode::graceful), errc::ok);
  ASSERT_TRUE(run([&] { return cm(t.s, t.id).write_calls > 0; }));  // the drain has begun
  EXPECT_EQ(t.srv.disconnected.count(t.id.value), 0U) << "still draining: the peer reads nothing";
  EXPECT_EQ(cm(t.s, t.id).receive_memory_bytes, 0U);
  EXPECT_TRUE(t.srv.received[t.id.value].empty());
}

TEST_F(StreamHostile, ConnectionsBeyondMaxConnectionsAreClosedUnannounced) {
  recorder srv;
  stream_config cfg;
  cfg.max_connections = 2;
  stream_channel* s = make_channel(&srv, cfg);
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  raw_peer a(s->listener_port(l));
  raw_peer b(s->listener_port(l));
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 2; }));
  raw_peer extra(s->listener_port(l));  // the kernel completes the handshake; the channel closes it
  ASSERT_TRUE(extra.ok());
  ASSERT_TRUE(run([&] { return s->metrics().connections_rejected == 1; }));
  EXPECT_EQ(srv.accepted.size(), 2u);  // no on_accepted for the rejected one
  EXPECT_EQ(s->metrics().connections_open, 2u);
  // Once one leaves, a new connection is accepted again.
  a.close_now();
  ASSERT_TRUE(run([&] { return srv.disconnected.size() == 1; }));
  raw_peer later(s->listener_port(l));
  ASSERT_TRUE(run([&] { return srv.accepted.size() == 3; }));
  ASSERT_TRUE(later.write_all(frame_of("in")));
  ASSERT_TRUE(run([&] { return srv.received[srv.accepted_ids[2]].size() == 1; }));
}

TEST_F(StreamHostile, AFloodOfCorruptPeersIsLoggedAtAFewLinesPerSecond) {
  recorder srv;
  stream_channel* s = make_channel(&srv);
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  std::vector<uint8_t> f = frame_of("corrupted payload");
  f[0] ^= 0x01;
  constexpr size_t kPeers = 40;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < kPeers; ++i) {
    raw_peer bad(s->listener_port(l));
    ASSERT_TRUE(bad.ok());
    ASSERT_TRUE(bad.write_all(f));
    ASSERT_TRUE(run([&] { return srv.disconnected.size() == i + 1; }));
  }
  const auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_FALSE(srv.logs.empty());
  // A burst of 5 per second, whatever the flood.
  EXPECT_LE(srv.logs.size(), 5u * static_cast<size_t>(secs + 1));
  for (const auto& [lv, text] : srv.logs) {
    EXPECT_EQ(lv, log_level::warn);
    EXPECT_NE(text.find("bad_hash"), std::string::npos) << text;
  }
  EXPECT_EQ(s->metrics().totals.decode_errors, kPeers);
}

}  // namespace
}  // namespace uvbus::test::stream_hostile_test
