// Stream links over TLS 1.3, their limits and accounting: socket errors counted once (a reset
// mid-handshake, a write the session refuses, close_notify into a reset connection), KeyUpdate
// storms and renewal, and a quiet link's memory (its ciphertext buffers and OpenSSL's) given back.
#include <openssl/bio.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hardening/hardening_util.h"
#include "stream/test_access.h"
#include "stream/tls_session.h"
#include "stream_tls_harness.h"

namespace uvbus::test::stream_tls_limits_test {
namespace {

// The first flight of a TLS 1.3 client (a ClientHello), made with OpenSSL over memory BIOs.
std::string client_hello() {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL* ssl = SSL_new(ctx);
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, BIO_new(BIO_s_mem()), out);
  (void)SSL_connect(ssl);  // wants the server's answer; the hello is in `out`
  char* p = nullptr;
  const long n = BIO_get_mem_data(out, &p);  // NOLINT(google-runtime-int): OpenSSL's type
  std::string hello(p, static_cast<size_t>(n));
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  return hello;
}

TEST_F(StreamTls, APeerThatResetsMidHandshakeCountsOnceAsAFailedHandshake) {
  // A peer resets the TCP connection during the handshake: once the server has read part of a
  // record (it is waiting for the rest: a read error), or right after a whole ClientHello (the
  // server answers into a reset socket: a write error). Either way that handshake failed: counted
  // once, in tls_failed, and logged, not in io_errors as well (nor only there).
  const uint8_t part[] = {0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3f, 0xfc, 0x03, 0x03};
  const std::string first[] = {std::string(reinterpret_cast<const char*>(part), sizeof part),
                               client_hello()};
  for (const std::string& bytes : first) {
    const bool reading = bytes.size() == sizeof part;
    SCOPED_TRACE(reading ? "reset while the server reads" : "reset before the server answers");
    srec_ = recorder{};
    serve(server_config());  // a server of its own: its counters are this peer's
    const int fd = dial(server_->listener_port(listener_));
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    if (reading) {
      ASSERT_TRUE(run([&] { return server_->metrics().totals.read_calls == 1; }));
    }
    const linger reset{1, 0};
    ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
    ::close(fd);  // RST
    // Counted (so accepted) and released: nothing more can be counted for it.
    ASSERT_TRUE(run([&] {
      const stream_channel_metrics m = server_->metrics();
      return m.tls_failed + m.totals.io_errors != 0 && m.connections_open == 0;
    }));
    const stream_channel_metrics m = server_->metrics();
    EXPECT_EQ(m.tls_failed, 1u);
    EXPECT_EQ(m.totals.io_errors, 0u);
    EXPECT_TRUE(logged("during the handshake"));
    EXPECT_TRUE(srec_.accepted.empty());
  }
  expect_honest_peer_works(client_config());
}

// The first 9 bytes of a ClientHello: a whole handshake record of 4 bytes, a handshake header
// announcing `announced` body bytes (the rest never comes).
std::string hello_head(uint32_t announced) {
  const uint8_t b[] = {0x16,
                       0x03,
                       0x01,
                       0x00,
                       0x04,
                       0x01,
                       static_cast<uint8_t>(announced >> 16),
                       static_cast<uint8_t>(announced >> 8),
                       static_cast<uint8_t>(announced)};
  return {reinterpret_cast<const char*>(b), sizeof b};
}

TEST_F(StreamTls, AClientHelloAnnouncingMoreThanTheBoundIsRefusedBeforeOpenSslHoldsIt) {
  // 9 bytes announcing a ClientHello of 131 396 bytes (OpenSSL's own limit) made OpenSSL grow its
  // handshake buffer to that size and hold it for handshake_timeout_ms: each such peer cost the
  // server about 239 KB. Now refused at once, naming the length, however the bytes are cut.
  constexpr int kPeers = 8;
  serve(server_config());
  expect_honest_peer_works(client_config());  // warms up OpenSSL and the per-thread buffers
  const size_t before = hardening::heap_bytes();
  const uint64_t reads_before = server_->metrics().totals.read_calls;
  std::vector<int> fds;
  const std::string head = hello_head(131396);
  for (int i = 0; i < kPeers; ++i) {
    const int fd = dial(server_->listener_port(listener_));
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
    if (i % 2 == 0) {
      ASSERT_EQ(::write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
      continue;
    }
    for (size_t k = 0; k < head.size(); ++k) {  // a byte a read: the guard follows the cut
      const uint64_t reads = server_->metrics().totals.read_calls;
      ASSERT_EQ(::write(fd, head.data() + k, 1), 1);
      ASSERT_TRUE(run([&] { return server_->metrics().totals.read_calls > reads; }));
    }
  }
  ASSERT_TRUE(run([&] {  // a read of 9 bytes, or 9 reads of one, each
    return server_->metrics().totals.read_calls >= reads_before + uint64_t{kPeers} / 2 * 10;
  }));
  // What the peers make us hold once their bytes were read (their connections, if still open).
  const size_t held = hardening::heap_bytes();
  const double per_peer =
      held > before ? static_cast<double>(held - before) / static_cast<double>(kPeers) : 0.0;
  std::printf("[ memory ] a peer announcing a 131396-byte ClientHello holds %.0f bytes\n",
              per_peer);
  const bool refused =
      run([&] { return server_->metrics().tls_failed == kPeers; }, std::chrono::milliseconds(3000));
  for (const int fd : fds) ::close(fd);
  ASSERT_TRUE(refused) << server_->metrics().tls_failed << " of " << kPeers << " refused";
  EXPECT_TRUE(logged("announces 131396 bytes, more than the 20480 accepted"));
  EXPECT_LT(per_peer, 32.0 * 1024);
  expect_honest_peer_works(client_config());
}

TEST(HelloGuard, EveryPlaintextHandshakeMessageIsCheckedAcrossAnyCut) {
  // The shape after a HelloRetryRequest: a first ClientHello, a ChangeCipherSpec record (middlebox
  // compatibility) and a second ClientHello, here announcing 131 396 bytes. However the bytes are
  // cut into reads, the guard refuses the second hello's header, and only it; encrypted records
  // (application_data) are skipped whatever they hold.
  const std::string first = client_hello();
  const std::string ccs = {0x14, 0x03, 0x03, 0x00, 0x01, 0x01};
  std::string encrypted = {0x17, 0x03, 0x03, 0x00, 0x04};
  encrypted += hello_head(131396).substr(5);  // looks like a header, but inside ciphertext
  const std::string ok_stream = first + ccs + encrypted + first;
  const std::string bad_stream = first + ccs + hello_head(131396);
  for (const size_t cut : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{100}, size_t{4096}}) {
    SCOPED_TRACE("reads of " + std::to_string(cut));
    for (const std::string* stream : {&ok_stream, &bad_stream}) {
      detail::hello_guard g;
      std::string why;
      bool ok = true;
      size_t refused_at = 0;
      for (size_t at = 0; ok && at < stream->size(); at += cut) {
        const size_t n = std::min(cut, stream->size() - at);
        ok = g.scan(reinterpret_cast<const uint8_t*>(stream->data()) + at, n, &why);
        refused_at = at + n;
      }
      if (stream == &ok_stream) {
        EXPECT_TRUE(ok) << why;
        continue;
      }
      EXPECT_FALSE(ok);
      EXPECT_GE(refused_at, bad_stream.size());  // at the read that completes the header
      EXPECT_NE(why.find("announces 131396 bytes, more than the 20480 accepted"), std::string::npos)
          << why;
    }
  }
}

TEST_F(StreamTls, AClientHelloAtTheBoundIsLeftToOpenSsl) {
  // 20 480 announced bytes pass the guard: the connection waits for the rest (and goes at the
  // handshake deadline), as any slow ClientHello does.
  tls_config t = server_config();
  t.handshake_timeout_ms = 200;
  serve(t);
  const int fd = dial(server_->listener_port(listener_));
  ASSERT_GE(fd, 0);
  const std::string head = hello_head(20480);
  ASSERT_EQ(::write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  ::close(fd);
  EXPECT_TRUE(logged("handshake not finished within 200 ms"));
  EXPECT_FALSE(logged("more than the 20480 accepted"));
  EXPECT_TRUE(srec_.accepted.empty());
}

TEST_F(StreamTls, AKeyUpdateStormClosesThatPeer) {
  serve(server_config());
  raw_tls_client storm(server_->listener_port(listener_),
                       {TLS1_3_VERSION, pki_->client.cert, pki_->client.key, pki_->ca_file, 1000});
  ASSERT_TRUE(run([&] { return storm.finished(); }));
  EXPECT_TRUE(storm.handshake_ok());
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  EXPECT_TRUE(logged("KeyUpdate messages within"));
  ASSERT_EQ(srec_.accepted.size(), 1u);  // it was authenticated, then misbehaved
  accepted_before_ = 1;
  EXPECT_EQ(srec_.disconnected[srec_.accepted[0].value], errc::protocol_error);
  expect_honest_peer_works(client_config());
}

TEST_F(StreamTls, AStalledPartialRecordIsClosedWithTimeoutLikeAHalfFrame) {
  // An authenticated peer sends the start of a TLS record (a header announcing 16 640 bytes and
  // 100 of them), then nothing. OpenSSL keeps the part in its read buffer, and SSL_free_buffers
  // refuses while it holds data, so the link pins OpenSSL's record buffers (about 17 KiB each way)
  // for as long as the peer likes: partial_frame_timeout_ms must close it, as it closes a half
  // frame in clear text (the frame decoder itself holds nothing). An idle link stays up.
  stream_config cfg;
  cfg.partial_frame_timeout_ms = 100;
  cfg.send_ring_idle_ms = 50;
  serve(server_config(), cfg);
  recorder crec;
  const connection_id idle = dial_with(&crec, client_config());
  stream_channel* ch = channels_.back().get();
  ASSERT_TRUE(
      run([&] { return crec.connected.count(idle.value) != 0 && srec_.accepted.size() == 1; }));
  std::string partial = {0x17, 0x03, 0x03, 0x41, 0x00};
  partial.append(100, 'x');
  raw_tls_client loris(server_->listener_port(listener_),
                       {TLS1_3_VERSION, pki_->client.cert, pki_->client.key, pki_->ca_file, 0},
                       partial);
  ASSERT_TRUE(run([&] { return srec_.accepted.size() == 2; }));
  const connection_id s = srec_.accepted[1];
  const bool closed =
      run([&] { return srec_.disconnected.count(s.value) != 0; }, std::chrono::milliseconds(3000));
  if (!closed) (void)server_->disconnect(s, disconnect_mode::force);  // ends the peer's thread
  ASSERT_TRUE(run([&] { return loris.finished(); }));
  ASSERT_TRUE(closed) << "still open 3 s after its partial record (partial_frame_timeout_ms 100)";
  EXPECT_EQ(srec_.disconnected[s.value], errc::timeout);
  EXPECT_EQ(server_->metrics().totals.partial_frame_timeouts, 1u);
  EXPECT_TRUE(srec_.received[s.value].empty());
  // The idle link (between records for far longer than the timeout) is up and works.
  const connection_id is = srec_.accepted[0];
  EXPECT_EQ(srec_.disconnected.count(is.value), 0u);
  ASSERT_EQ(ch->send(idle, "ping", 4), errc::ok);
  ASSERT_EQ(server_->send(is, "pong", 4), errc::ok);
  ASSERT_TRUE(run([&] {
    return srec_.received[is.value].size() == 1 && crec.received[idle.value].size() == 1;
  }));
  EXPECT_EQ(srec_.received[is.value][0], "ping");
  EXPECT_EQ(crec.received[idle.value][0], "pong");
}

TEST_F(StreamTls, AStalledPartialHandshakeMessageIsClosedWithTimeout) {
  // After the handshake, an authenticated server sends the first records of a NewSessionTicket of
  // about 50 KB (every record whole), and never the rest. OpenSSL keeps the part of the message
  // in a buffer it grew to the message's announced size, which SSL_free_buffers does not free
  // (about 120 KiB): partial_frame_timeout_ms must close the client's link, as for a half frame.
  raw_tls_server server(pki_->server, "", 40000);
  url_ = "ipv4://127.0.0.1:" + std::to_string(server.port());
  stream_config cfg;
  cfg.partial_frame_timeout_ms = 100;
  cfg.send_ring_idle_ms = 50;
  recorder crec;
  const connection_id c = dial_with(&crec, client_config(), cfg);
  stream_channel* ch = channels_.back().get();
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0; }));
  ASSERT_EQ(crec.connected[c.value], errc::ok);
  ASSERT_TRUE(
      run([&] { return ch->metrics().totals.read_calls != 0 && server.ticket_sent() != 0; }));
  const bool closed =
      run([&] { return crec.disconnected.count(c.value) != 0; }, std::chrono::milliseconds(3000));
  if (!closed) (void)ch->disconnect(c, disconnect_mode::force);  // ends the server's thread
  ASSERT_TRUE(run([&] { return server.finished(); }));
  ASSERT_TRUE(closed) << "still open 3 s after " << server.ticket_sent()
                      << " bytes of a ticket message (partial_frame_timeout_ms 100)";
  EXPECT_EQ(crec.disconnected[c.value], errc::timeout);
  EXPECT_EQ(ch->metrics().totals.partial_frame_timeouts, 1u);
}

// A send while the peer holds back the rest of a post-handshake message (a NewSessionTicket cut
// after its first records): SSL_write only asks for input then, and that was taken for a TLS
// failure (protocol_error, "write failed: SSL error 2") that ended the link at once. The write
// now waits for the message's rest and goes out when it arrives.
TEST_F(StreamTls, ASendWhileThePeerHoldsPartOfATicketWaitsForItsRest) {
  raw_tls_server server(pki_->server, "ping", 40000);
  recorder crec;
  connection_id c;
  stream_channel* ch = dial_cut_ticket(&server, &crec, &c);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(ch->send(c, "ping", 4), errc::ok);
  // The flush waits (it ended the link at once before).
  EXPECT_FALSE(
      run([&] { return crec.disconnected.count(c.value) != 0; }, std::chrono::milliseconds(100)));
  EXPECT_EQ(ch->metrics().tls_failed, 0U);
  server.send_rest();
  ASSERT_TRUE(run([&] { return server.finished(); }));
  EXPECT_NE(server.received().find("ping"), std::string::npos) << server.received();
  EXPECT_EQ(ch->metrics().tls_failed, 0U);
  (void)ch->disconnect(c, disconnect_mode::force);
}

// A graceful disconnect in the same window: close_notify waits for the message's rest too
// (OpenSSL refuses SSL_shutdown until then, and the link ended with a bare FIN, which the peer
// takes for a truncation), then goes out. The rest may come with the peer's own close_notify in
// one read: the read that completed the message ended there, without flushing, and the link hung
// (on_disconnected never came).
TEST_F(StreamTls, AGracefulEndWhileThePeerHoldsPartOfATicketSendsCloseNotify) {
  for (const bool with_close_notify : {false, true}) {
    SCOPED_TRACE(with_close_notify ? "the rest with the peer's close_notify" : "the rest alone");
    raw_tls_server server(pki_->server, "never sent", 40000);
    connection_id c;
    recorder crec;  // nothing queued: the end is the close_notify alone
    ASSERT_EQ(dial_cut_ticket(&server, &crec, &c)->disconnect(c, disconnect_mode::graceful),
              errc::ok);
    EXPECT_FALSE(run([&] { return crec.disconnected.count(c.value) != 0; },
                     std::chrono::milliseconds(100)));  // the end waits
    server.send_rest(with_close_notify);
    ASSERT_TRUE(run([&] { return server.finished() && crec.disconnected.count(c.value) != 0; }));
    EXPECT_TRUE(server.close_notified());
    EXPECT_EQ(crec.disconnected[c.value], errc::ok) << to_string(crec.disconnected[c.value]);
  }
}

// The same graceful end, and the rest never comes: partial_frame_timeout_ms covers the draining
// link too (it looked at connected links only: the link and OpenSSL's buffer stayed for ever).
TEST_F(StreamTls, AGracefulEndWhoseTicketRestNeverComesIsClosedWithTimeout) {
  raw_tls_server server(pki_->server, "never sent", 40000);
  stream_config cfg;
  cfg.partial_frame_timeout_ms = 100;
  connection_id c;
  recorder crec;
  stream_channel* ch = dial_cut_ticket(&server, &crec, &c, cfg);
  ASSERT_EQ(ch->disconnect(c, disconnect_mode::graceful), errc::ok);
  const bool closed = run([&] { return crec.disconnected.count(c.value) != 0; });
  if (!closed) (void)ch->disconnect(c, disconnect_mode::force);  // ends the server's thread
  ASSERT_TRUE(run([&] { return server.finished(); }));
  ASSERT_TRUE(closed) << "a draining link holding part of a ticket was never closed";
  EXPECT_EQ(crec.disconnected[c.value], errc::timeout) << to_string(crec.disconnected[c.value]);
  EXPECT_EQ(ch->metrics().totals.partial_frame_timeouts, 1u);
}

// The same graceful end with a packet queued, and the peer leaves instead of sending the rest (a
// FIN, no close_notify): the link waited for a rest that could no longer come, for ever (the sweep
// looks only at a draining link that still reads), and the packet was never reported. The link
// now ends at the FIN (connection_reset) and reports the packet failed.
TEST_F(StreamTls, AGracefulEndWhosePeerLeavesMidTicketEndsAndFailsItsPackets) {
  raw_tls_server server(pki_->server, "never sent", 40000);
  connection_id c;
  recorder crec;
  stream_channel* ch = dial_cut_ticket(&server, &crec, &c);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(ch->send(c, "hello", 5), errc::ok);  // waits for the ticket's rest
  ASSERT_EQ(ch->disconnect(c, disconnect_mode::graceful), errc::ok);
  EXPECT_FALSE(run([&] { return crec.disconnected.count(c.value) != 0; },
                   std::chrono::milliseconds(100)));  // the end waits too
  server.close_instead();
  const bool closed = run([&] { return crec.disconnected.count(c.value) != 0; });
  if (!closed) (void)ch->disconnect(c, disconnect_mode::force);  // ends the server's thread
  ASSERT_TRUE(run([&] { return server.finished(); }));
  ASSERT_TRUE(closed) << "a draining link waiting for a ticket's rest outlived its peer";
  EXPECT_EQ(crec.disconnected[c.value], errc::connection_reset)
      << to_string(crec.disconnected[c.value]);
  EXPECT_EQ(crec.failed_count(c.value), 1U);
}

TEST_F(StreamTls, KeysAreRenewedAfterTheByteBudget) {
  // The receiver's KeyUpdate limit makes the sender's renewals visible: without a limit the data
  // arrives intact across them; with a limit of 5 per window the sixth closes the link. Neither
  // end could use its own settings at the other end (check() refuses a byte budget the peer's
  // guard would take for a storm): the receiver renews by time only, the sender has no guard.
  for (const uint32_t limit : {0U, 5U}) {
    tls_config st = psk_config();
    st.max_peer_key_updates = limit;
    st.key_update_bytes = 0;
    srec_ = recorder{};
    accepted_before_ = 0;
    serve(st);
    tls_config ct = psk_config();
    ct.key_update_bytes = uint64_t{16} * 1024;
    ct.max_peer_key_updates = 0;
    recorder crec;
    const connection_id c = dial_with(&crec, ct);
    stream_channel* ch = channels_.back().get();
    ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && !srec_.accepted.empty(); }));
    const std::string chunk(size_t{32} * 1024, 'k');
    int sent = 0;
    ASSERT_TRUE(run([&] {
      while (sent < 32 && ch->send(c, chunk.data(), chunk.size()) == errc::ok) ++sent;
      return limit == 0 ? srec_.received[srec_.accepted[0].value].size() == 32
                        : server_->metrics().tls_failed == 1;
    }));
    if (limit == 0) {
      for (const std::string& s : srec_.received[srec_.accepted[0].value]) EXPECT_EQ(s, chunk);
    } else {
      EXPECT_TRUE(logged("more than 5 KeyUpdate messages"));
    }
    for (auto& channel : channels_) channel->close();
  }
}

TEST_F(StreamTls, AQuietConnectionGivesItsCiphertextBuffersBack) {
  // A burst of large frames grows the sender's ciphertext buffers to a write batch's ciphertext
  // (queue_memory_bytes counts them with the ring); once the connection has been quiet for
  // send_ring_idle_ms both are freed, and the next burst grows them again.
  stream_config cfg;
  cfg.send_ring_idle_ms = 50;
  serve(psk_config(), cfg);
  recorder crec;
  const connection_id c = dial_with(&crec, psk_config());
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && !srec_.accepted.empty(); }));
  const connection_id s = srec_.accepted[0];
  size_t peak = 0;  // what the send path held when a batch had just been encrypted
  srec_.on_written_hook = [&](connection_id, uint64_t) {
    stream_connection_metrics w;
    if (server_->connection_metrics(s, &w) == errc::ok) peak = std::max(peak, w.queue_memory_bytes);
  };
  const std::string big(size_t{100} * 1024, 'b');
  stream_connection_metrics m;
  for (size_t round = 1; round <= 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    peak = 0;
    for (int i = 0; i < 4; ++i) ASSERT_EQ(server_->send(s, big.data(), big.size()), errc::ok);
    ASSERT_TRUE(run([&] { return crec.received[c.value].size() == 4 * round; }));
    EXPECT_GT(peak, size_t{512} * 1024);  // the grown ring and a batch's ciphertext
    ASSERT_TRUE(run([&] {
      return server_->connection_metrics(s, &m) == errc::ok && m.queue_memory_bytes == 0;
    })) << m.queue_memory_bytes;
    EXPECT_EQ(server_->metrics().totals.queue_memory_bytes, 0u);
  }
  for (const std::string& r : crec.received[c.value]) EXPECT_EQ(r, big);
  ASSERT_EQ(server_->send(s, "hello", 5), errc::ok);  // small again, and it still works
  ASSERT_TRUE(run([&] { return crec.received[c.value].size() == 9; }));
  EXPECT_EQ(crec.received[c.value].back(), "hello");
}

TEST_F(StreamTls, AQuietConnectionGivesOpenSslsRecordBuffersBackToo) {
  // OpenSSL keeps a read and a write record buffer per connection (about 17 KiB each in 3.0) once
  // it has read and written: 16 quiet server-side links held about 540 KiB more than their own
  // buffers before the sweep freed them with SSL_free_buffers.
  constexpr size_t kConns = 16;
  stream_config cfg;
  cfg.send_ring_idle_ms = 50;
  serve(psk_config(), cfg);
  recorder crec;
  stream_channel* client = make_channel(&crec);
  std::vector<connection_id> cs(kConns);
  for (connection_id& c : cs) ASSERT_EQ(client->connect(url_, psk_config(), &c), errc::ok);
  ASSERT_TRUE(
      run([&] { return crec.connected.size() == kConns && srec_.accepted.size() == kConns; }));
  for (const connection_id& c : cs) ASSERT_EQ(client->send(c, "ping", 4), errc::ok);
  for (const connection_id& s : srec_.accepted) ASSERT_EQ(server_->send(s, "pong", 4), errc::ok);
  ASSERT_TRUE(run([&] {
    size_t got = 0;
    for (const auto& [id, v] : crec.received) got += v.size();
    return srec_.received_count == kConns && got == kConns;
  }));
  const size_t heap_before = hardening::heap_bytes();
  const size_t own_before = server_->metrics().totals.queue_memory_bytes;
  ASSERT_TRUE(run([&] { return server_->metrics().totals.queue_memory_bytes == 0; }));
  const size_t heap_after = hardening::heap_bytes();
  const size_t freed = heap_before > heap_after ? heap_before - heap_after : 0;
  const size_t by_openssl = freed > own_before ? freed - own_before : 0;
  std::printf(
      "[ memory ] the sweep freed %zu bytes a TLS link: %zu of the channel's, %zu of OpenSSL's\n",
      freed / kConns, own_before / kConns, by_openssl / kConns);
  EXPECT_GE(by_openssl, kConns * 16 * 1024);
  for (const connection_id& s : srec_.accepted) ASSERT_EQ(server_->send(s, "again", 5), errc::ok);
  ASSERT_TRUE(run([&] {  // and the links still work both ways
    size_t got = 0;
    for (const auto& [id, v] : crec.received) got += v.size();
    return got == 2 * kConns;
  }));
}

TEST_F(StreamTls, CiphertextBuffersAreKeptWhileTrafficFlows) {
  // A steady flow (a message sent from every on_written) keeps its buffers: what the send path
  // holds at each report never drops (a drop would be a free, then an allocation per message).
  serve(psk_config());
  recorder crec;
  const connection_id c = dial_with(&crec, psk_config());
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && !srec_.accepted.empty(); }));
  const connection_id s = srec_.accepted[0];
  std::vector<size_t> held;
  srec_.on_written_hook = [&](connection_id, uint64_t) {
    stream_connection_metrics w;
    if (server_->connection_metrics(s, &w) != errc::ok) return;
    held.push_back(w.queue_memory_bytes);
    if (held.size() < 500) {
      EXPECT_EQ(server_->send(s, "tick", 4), errc::ok);
    }
  };
  ASSERT_EQ(server_->send(s, "tick", 4), errc::ok);
  ASSERT_TRUE(run([&] { return crec.received[c.value].size() == 500; }));
  ASSERT_EQ(held.size(), 500u);
  EXPECT_GT(held[0], 0u);
  for (size_t i = 1; i < held.size(); ++i) ASSERT_GE(held[i], held[i - 1]) << "report " << i;
}

TEST_F(StreamTls, AWriteTheSessionRefusesCountsOnceAsATlsFailure) {
  // The session refuses to encrypt (here OpenSSL's state after a fatal error: every SSL_write
  // fails, "protocol is shutdown"): the link ends with protocol_error, its packet reported failed.
  // A TLS failure, not a socket error: counted in tls_failed and logged, not in io_errors too.
  serve(psk_config());
  recorder crec;
  connection_id c;
  stream_channel* ch = dial_accepted(&crec, psk_config(), &c);
  ASSERT_TRUE(detail::stream_access::break_tls_writes(*ch, c));
  ASSERT_EQ(ch->send(c, "doomed", 6), errc::ok);
  ASSERT_TRUE(run([&] { return crec.disconnected.count(c.value) != 0; }));
  EXPECT_EQ(crec.disconnected[c.value], errc::protocol_error);
  EXPECT_EQ(crec.failed_count(c.value), 1u);
  const stream_channel_metrics m = ch->metrics();
  EXPECT_EQ(m.tls_failed, 1u);
  EXPECT_EQ(m.totals.io_errors, 0u);
  bool named = false;
  for (const auto& l : crec.logs)
    named |= l.second.find("protocol is shutdown") != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_EQ(srec_.received_count, 0u);
}

// A TLS failure partway through a batch (the second SSL_write of a flush fails, here at the key
// renewal due before it): the best-effort alert went out with the whole ciphertext buffer, the
// first buffer's records included, so the peer received a packet that was reported failed. None
// of the batch leaves now.
TEST_F(StreamTls, AWriteFailingMidBatchSendsNothingOfTheBatch) {
  serve(psk_config());
  tls_config t = psk_config();
  t.key_update_bytes = uint64_t{16} * 1024;  // due after the batch's first buffer
  t.max_peer_key_updates = 0;
  recorder crec;
  connection_id c;
  stream_channel* ch = dial_accepted(&crec, t, &c);
  ASSERT_FALSE(HasFailure());
  const connection_id s = srec_.accepted.back();
  ASSERT_TRUE(detail::stream_access::break_tls_writes_at_renewal(*ch, c));
  const std::string big(size_t{20} * 1024, 'b');  // one buffer of the batch (not merged)
  ASSERT_EQ(ch->send(c, big.data(), big.size()), errc::ok);
  ASSERT_EQ(ch->send(c, "second", 6), errc::ok);  // the next buffer: its write fails
  ASSERT_TRUE(run([&] {
    return crec.disconnected.count(c.value) != 0 && srec_.disconnected.count(s.value) != 0;
  }));
  EXPECT_EQ(crec.disconnected[c.value], errc::protocol_error);
  EXPECT_EQ(crec.failed_count(c.value), 2U);
  EXPECT_EQ(srec_.received[s.value].size(), 0U) << "reported failed, yet delivered";
}

TEST_F(StreamTls, AGracefulEndIntoAResetConnectionCountsTheWriteError) {
  // The peer has reset the connection (it closed with our data unread) when we disconnect
  // gracefully, before our loop has read the reset. In clear text the drain's read meets the
  // error (io_errors); over TLS the close_notify written first meets it, and that write error
  // counts the same, instead of being dropped for the shutdown's.
  for (const tls_mode mode : {tls_mode::off, tls_mode::psk}) {
    SCOPED_TRACE(mode == tls_mode::off ? "clear text" : "tls");
    const tls_config t = serve_in(mode);
    recorder crec;
    stream_channel* ch = make_channel(&crec);
    connection_id c;
    ASSERT_EQ(ch->connect(url_, t, &c), errc::ok);
    ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && !srec_.accepted.empty(); }));
    const connection_id s = srec_.accepted[0];
    ASSERT_EQ(server_->pause_reading(s), errc::ok);
    ASSERT_EQ(ch->send(c, "unread", 6), errc::ok);
    ASSERT_TRUE(run([&] { return crec.written[c.value] == 1; }));
    ASSERT_EQ(server_->disconnect(s, disconnect_mode::force), errc::ok);  // a reset: data unread
    ASSERT_EQ(ch->disconnect(c, disconnect_mode::graceful), errc::ok);
    ASSERT_TRUE(run([&] { return crec.disconnected.count(c.value) != 0; }));
    EXPECT_EQ(crec.disconnected[c.value], errc::connection_reset);
    EXPECT_EQ(ch->metrics().totals.io_errors, 1u);
    EXPECT_EQ(ch->metrics().tls_failed, 0u);
    for (auto& channel : channels_) channel->close();
  }
}

}  // namespace
}  // namespace uvbus::test::stream_tls_limits_test
