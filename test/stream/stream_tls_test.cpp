// Stream links over TLS 1.3: data both ways with certificates and with a PSK, and hostile peers
// (wrong, expired or missing certificate, wrong PSK, garbage, a TLS 1.2 client, a stalled
// handshake, a KeyUpdate storm, a server that does not know the PSK), each refused while an
// honest peer on the same listener works; nothing delivered after a disconnect in on_accepted.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hardening/hardening_util.h"
#include "stream/test_access.h"
#include "stream_harness.h"
#include "tls_test_pki.h"

namespace uvbus::test {
namespace {

const char kToken[] = "cluster-access-token-0123456789";

int dial(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{30, 0};  // a test that goes wrong ends instead of hanging
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

// A TLS client of our own, made with OpenSSL directly and run on its own thread (blocking socket),
// for the peers a tls_config cannot describe: no certificate, TLS 1.2, a KeyUpdate storm.
class raw_tls_client {
 public:
  struct options {
    int max_version = TLS1_3_VERSION;
    std::string cert, key, ca;
    int key_updates = 0;  // sent after the handshake, as fast as possible
  };
  raw_tls_client(uint16_t port, options o) : opt_(std::move(o)) {
    thread_ = std::thread([this, port] { run(port); });
  }
  ~raw_tls_client() { thread_.join(); }
  raw_tls_client(const raw_tls_client&) = delete;
  raw_tls_client& operator=(const raw_tls_client&) = delete;
  // True once the thread saw the connection end (or fail).
  [[nodiscard]] bool finished() const { return finished_.load(); }
  [[nodiscard]] bool handshake_ok() const { return handshake_ok_.load(); }

 private:
  void run(uint16_t port) {
    const int fd = dial(port);
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_max_proto_version(ctx, opt_.max_version);
    if (!opt_.ca.empty()) SSL_CTX_load_verify_locations(ctx, opt_.ca.c_str(), nullptr);
    if (!opt_.cert.empty()) {
      SSL_CTX_use_certificate_chain_file(ctx, opt_.cert.c_str());
      SSL_CTX_use_PrivateKey_file(ctx, opt_.key.c_str(), SSL_FILETYPE_PEM);
    }
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (fd >= 0 && SSL_connect(ssl) == 1) {
      handshake_ok_ = true;
      for (int i = 0; i < opt_.key_updates; ++i) {
        if (SSL_key_update(ssl, SSL_KEY_UPDATE_NOT_REQUESTED) != 1 || SSL_do_handshake(ssl) != 1) {
          break;
        }
      }
      char b[256];
      while (SSL_read(ssl, b, sizeof b) > 0) {
      }
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    if (fd >= 0) ::close(fd);
    finished_ = true;
  }

  options opt_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> handshake_ok_{false};
  std::thread thread_;
};

// A TLS 1.3 server of our own (OpenSSL directly, its own thread, blocking sockets) that accepts one
// connection with a certificate and no PSK: an impostor for a PSK client. It reads until the
// connection ends or `wanted` arrived, then closes.
class raw_tls_server {
 public:
  raw_tls_server(const test_pki::pair& id, std::string wanted) : wanted_(std::move(wanted)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (fd_ >= 0 &&
        (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd_, 4) != 0 ||
         getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0)) {
      ::close(fd_);
      fd_ = -1;
    }
    port_ = ntohs(sa.sin_port);
    timeval tv{30, 0};  // accept() too: a test that goes wrong ends instead of hanging
    if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    thread_ = std::thread([this, id] { run(id); });
  }
  ~raw_tls_server() {
    thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  raw_tls_server(const raw_tls_server&) = delete;
  raw_tls_server& operator=(const raw_tls_server&) = delete;
  [[nodiscard]] uint16_t port() const { return port_; }
  [[nodiscard]] bool finished() const { return finished_.load(); }
  [[nodiscard]] bool handshake_ok() const { return handshake_ok_.load(); }
  // The plaintext read (valid once finished()).
  [[nodiscard]] const std::string& received() const { return received_; }

 private:
  void run(const test_pki::pair& id) {
    const int c = fd_ < 0 ? -1 : ::accept(fd_, nullptr, nullptr);
    timeval tv{30, 0};
    if (c >= 0) setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_use_certificate_chain_file(ctx, id.cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx, id.key.c_str(), SSL_FILETYPE_PEM);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, c);
    if (c >= 0 && SSL_accept(ssl) == 1) {
      handshake_ok_ = true;
      char b[256];
      int n = 0;
      while (received_.find(wanted_) == std::string::npos && (n = SSL_read(ssl, b, sizeof b)) > 0) {
        received_.append(b, static_cast<size_t>(n));
      }
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    if (c >= 0) ::close(c);
    finished_ = true;
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::string wanted_;
  std::string received_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> handshake_ok_{false};
  std::thread thread_;
};

class StreamTls : public stream_fixture {
 protected:
  static void SetUpTestSuite() { pki_ = new test_pki; }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  static tls_config cert_config(const test_pki::pair& p, const std::string& expected) {
    tls_config t;
    t.mode = tls_mode::certificate;
    t.cert_file = p.cert;
    t.key_file = p.key;
    t.ca_file = pki_->ca_file;
    t.expected_peer = expected;
    return t;
  }
  static tls_config server_config() { return cert_config(pki_->server, "node-42"); }
  static tls_config client_config() { return cert_config(pki_->client, "server.test"); }
  static tls_config psk_config(const char* token = kToken) {
    tls_config t;
    t.mode = tls_mode::psk;
    t.psk_token = token;
    return t;
  }

  // A server channel listening with `tls` on port 0.
  void serve(const tls_config& tls, const stream_config& cfg = {}) {
    server_ = make_channel(&srec_, cfg);
    ASSERT_EQ(server_->listen("ipv4://127.0.0.1:0", tls, &listener_), errc::ok)
        << server_->last_error().detail;
    url_ = server_->listener_url(listener_);
  }

  // Connects a new client channel with `tls`; returns its connection id (0 if connect() failed).
  connection_id dial_with(recorder* rec, const tls_config& tls, const stream_config& cfg = {}) {
    stream_channel* ch = make_channel(rec, cfg);
    connection_id c;
    EXPECT_EQ(ch->connect(url_, tls, &c), errc::ok) << ch->last_error().detail;
    return c;
  }

  // An honest client on the same listener: connects, a message each way, both arrive.
  void expect_honest_peer_works(const tls_config& tls) {
    recorder rec;
    const connection_id c = dial_with(&rec, tls);
    ASSERT_TRUE(run([&] { return rec.connected.count(c.value) != 0; }));
    ASSERT_EQ(rec.connected[c.value], errc::ok);
    stream_channel* ch = channels_.back().get();
    ASSERT_TRUE(run([&] { return srec_.accepted.size() == accepted_before_ + 1; }));
    const connection_id s = srec_.accepted.back();
    ++accepted_before_;
    ASSERT_EQ(ch->send(c, "ping", 4), errc::ok);
    ASSERT_EQ(server_->send(s, "pong", 4), errc::ok);
    ASSERT_TRUE(
        run([&] { return !rec.received[c.value].empty() && !srec_.received[s.value].empty(); }));
    EXPECT_EQ(srec_.received[s.value].back(), "ping");
    EXPECT_EQ(rec.received[c.value].back(), "pong");
    ch->close();
  }

  [[nodiscard]] bool logged(const std::string& what) const {
    for (const auto& l : srec_.logs) {
      if (l.second.find(what) != std::string::npos) return true;
    }
    return false;
  }

  static test_pki* pki_;
  recorder srec_;
  stream_channel* server_ = nullptr;
  listener_id listener_;
  std::string url_;
  size_t accepted_before_ = 0;
};

test_pki* StreamTls::pki_ = nullptr;

// Sends n messages of sizes 8.. cycling up to max and one large one, each way, and checks them.
void exchange(recorder* a_rec, stream_channel* a, connection_id ac, recorder* b_rec,
              stream_channel* b, connection_id bc,
              const std::function<bool(const std::function<bool()>&)>& run) {
  std::vector<std::string> sent;
  sent.reserve(2002);
  for (int i = 0; i < 2000; ++i)
    sent.emplace_back(8 + (i * 37) % 120, static_cast<char>('a' + i % 26));
  sent.emplace_back(size_t{200} * 1024, 'L');  // a large frame: encrypted from its queue block
  sent.emplace_back("tail");
  size_t next_a = 0, next_b = 0;
  auto pump = [&] {
    while (next_a < sent.size() &&
           a->send(ac, sent[next_a].data(), sent[next_a].size()) == errc::ok) {
      ++next_a;
    }
    while (next_b < sent.size() &&
           b->send(bc, sent[next_b].data(), sent[next_b].size()) == errc::ok) {
      ++next_b;
    }
    return b_rec->received[bc.value].size() == sent.size() &&
           a_rec->received[ac.value].size() == sent.size();
  };
  ASSERT_TRUE(run(pump));
  EXPECT_EQ(b_rec->received[bc.value], sent);
  EXPECT_EQ(a_rec->received[ac.value], sent);
}

TEST_F(StreamTls, CertificatesCarryDataBothWays) {
  serve(server_config());
  recorder crec;
  const connection_id c = dial_with(&crec, client_config());
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && !srec_.accepted.empty(); }));
  ASSERT_EQ(crec.connected[c.value], errc::ok);
  exchange(&crec, channels_.back().get(), c, &srec_, server_, srec_.accepted[0],
           [this](const std::function<bool()>& p) { return run(p); });
  EXPECT_EQ(server_->metrics().tls_failed, 0u);
  // A graceful end travels as close_notify: the server sees a clean end.
  ASSERT_EQ(channels_.back()->disconnect(c), errc::ok);
  ASSERT_TRUE(run([&] { return srec_.disconnected.count(srec_.accepted[0].value) != 0; }));
  EXPECT_EQ(srec_.disconnected[srec_.accepted[0].value], errc::ok);
  ASSERT_TRUE(run([&] { return crec.disconnected.count(c.value) != 0; }));
  EXPECT_EQ(crec.disconnected[c.value], errc::ok);
}

TEST_F(StreamTls, PskCarriesDataBothWays) {
  serve(psk_config());
  recorder crec;
  const connection_id c = dial_with(&crec, psk_config());
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && !srec_.accepted.empty(); }));
  ASSERT_EQ(crec.connected[c.value], errc::ok);
  exchange(&crec, channels_.back().get(), c, &srec_, server_, srec_.accepted[0],
           [this](const std::function<bool()>& p) { return run(p); });
  // Coalescing survives encryption: far fewer writes than messages.
  const stream_connection_metrics m = cm(channels_.back().get(), c);
  EXPECT_LT(m.write_calls, m.packets_sent / 10);
  EXPECT_GT(m.packets_merged, 0u);
}

TEST_F(StreamTls, AWrongServerNameIsRefusedByTheClient) {
  serve(server_config());
  recorder crec;
  const connection_id c = dial_with(&crec, cert_config(pki_->client, "other.test"));
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0; }));
  EXPECT_EQ(crec.connected[c.value], errc::peer_not_authenticated);
  bool named = false;
  for (const auto& l : crec.logs) {
    named |= l.second.find("does not match expected 'other.test'") != std::string::npos;
  }
  EXPECT_TRUE(named);
  expect_honest_peer_works(client_config());
  EXPECT_EQ(srec_.accepted.size(), 1u);
}

TEST_F(StreamTls, AWrongNameClientCertificateIsRefused) {
  serve(server_config());
  recorder crec;
  const connection_id c = dial_with(&crec, cert_config(pki_->wrong_name, "server.test"));
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  ASSERT_TRUE(run([&] {
    return crec.disconnected.count(c.value) != 0 ||
           (crec.connected.count(c.value) != 0 && crec.connected[c.value] != errc::ok);
  }));
  EXPECT_TRUE(logged("CN 'mallory' (nor any subjectAltName) does not match expected 'node-42'"));
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(client_config());
}

TEST_F(StreamTls, ACertificateFromAnotherCaIsRefused) {
  serve(server_config());
  recorder crec;
  const connection_id c = dial_with(&crec, cert_config(pki_->rogue_client, "server.test"));
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  ASSERT_TRUE(run([&] {
    return crec.disconnected.count(c.value) != 0 ||
           (crec.connected.count(c.value) != 0 && crec.connected[c.value] != errc::ok);
  }));
  EXPECT_TRUE(logged("rejected"));
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(client_config());
}

TEST_F(StreamTls, AnExpiredCertificateIsRefused) {
  serve(server_config());
  recorder crec;
  const connection_id c = dial_with(&crec, cert_config(pki_->expired, "server.test"));
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  ASSERT_TRUE(run([&] {
    return crec.disconnected.count(c.value) != 0 ||
           (crec.connected.count(c.value) != 0 && crec.connected[c.value] != errc::ok);
  }));
  EXPECT_TRUE(logged("certificate has expired"));
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(client_config());
}

TEST_F(StreamTls, AClientWithoutACertificateIsRefused) {
  serve(server_config());
  raw_tls_client bad(server_->listener_port(listener_), {TLS1_3_VERSION, "", "", pki_->ca_file, 0});
  ASSERT_TRUE(run([&] { return bad.finished() && server_->metrics().tls_failed == 1; }));
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(client_config());
}

TEST_F(StreamTls, AWrongPskIsRefused) {
  serve(psk_config());
  recorder crec;
  const connection_id c = dial_with(&crec, psk_config("another-token-0123456789abcdef"));
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0; }));
  EXPECT_NE(crec.connected[c.value], errc::ok);
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(psk_config());
}

TEST_F(StreamTls, GarbageBeforeTheHandshakeIsRefused) {
  serve(psk_config());
  const int fd = dial(server_->listener_port(listener_));
  ASSERT_GE(fd, 0);
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::write(fd, junk, sizeof junk - 1), static_cast<ssize_t>(sizeof junk - 1));
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  EXPECT_TRUE(srec_.accepted.empty());
  ::close(fd);
  expect_honest_peer_works(psk_config());
}

TEST_F(StreamTls, ATls12ClientIsRefused) {
  serve(server_config());
  raw_tls_client old(server_->listener_port(listener_),
                     {TLS1_2_VERSION, pki_->client.cert, pki_->client.key, pki_->ca_file, 0});
  ASSERT_TRUE(run([&] { return old.finished() && server_->metrics().tls_failed == 1; }));
  EXPECT_FALSE(old.handshake_ok());
  EXPECT_TRUE(logged("unsupported protocol"));
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(client_config());
}

TEST_F(StreamTls, AStalledHandshakeIsClosedByItsDeadline) {
  tls_config t = psk_config();
  t.handshake_timeout_ms = 200;
  serve(t);
  // A record header announcing 16 KiB, a little of it, then nothing: the session holds at most
  // that one record until the deadline.
  const int fd = dial(server_->listener_port(listener_));
  ASSERT_GE(fd, 0);
  const uint8_t part[] = {0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3f, 0xfc, 0x03, 0x03};
  ASSERT_EQ(::write(fd, part, sizeof part), static_cast<ssize_t>(sizeof part));
  ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
  EXPECT_TRUE(logged("handshake not finished within 200 ms"));
  char b[16];
  EXPECT_EQ(::read(fd, b, sizeof b), 0) << "the server closed it";
  ::close(fd);
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(psk_config());
}

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

TEST_F(StreamTls, KeysAreRenewedAfterTheByteBudget) {
  // The receiver's KeyUpdate limit makes the sender's renewals visible: without a limit the data
  // arrives intact across them; with a limit of 5 per window the sixth closes the link.
  for (const uint32_t limit : {0U, 5U}) {
    tls_config st = psk_config();
    st.max_peer_key_updates = limit;
    srec_ = recorder{};
    accepted_before_ = 0;
    serve(st);
    tls_config ct = psk_config();
    ct.key_update_bytes = uint64_t{16} * 1024;
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
  const connection_id c = dial_with(&crec, psk_config());
  stream_channel* ch = channels_.back().get();
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && !srec_.accepted.empty(); }));
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

TEST_F(StreamTls, AGracefulEndIntoAResetConnectionCountsTheWriteError) {
  // The peer has reset the connection (it closed with our data unread) when we disconnect
  // gracefully, before our loop has read the reset. In clear text the drain's read meets the
  // error (io_errors); over TLS the close_notify written first meets it, and that write error
  // counts the same, instead of being dropped for the shutdown's.
  for (const tls_mode mode : {tls_mode::off, tls_mode::psk}) {
    SCOPED_TRACE(mode == tls_mode::off ? "clear text" : "tls");
    srec_ = recorder{};
    tls_config t = psk_config();
    t.mode = mode;
    serve(t);
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

TEST_F(StreamTls, BadSettingsAreNamed) {
  recorder rec;
  stream_channel* ch = make_channel(&rec);
  tls_config t = client_config();
  t.key_file = "/nonexistent/key.pem";
  EXPECT_EQ(ch->listen("ipv4://127.0.0.1:0", t), errc::not_found);
  EXPECT_NE(ch->last_error().detail.find("cannot read key file /nonexistent/key.pem"),
            std::string::npos)
      << ch->last_error().detail;
  t = client_config();
  t.key_file = pki_->server.key;  // not the certificate's key
  EXPECT_EQ(ch->listen("ipv4://127.0.0.1:0", t), errc::tls_handshake_failed);
  EXPECT_NE(ch->last_error().detail.find("cannot load key file " + pki_->server.key),
            std::string::npos)
      << ch->last_error().detail;
  EXPECT_EQ(ch->connect("ipv4://127.0.0.1:1", psk_config("short")), errc::invalid_argument);
  EXPECT_NE(ch->last_error().detail.find("psk_token"), std::string::npos);
  stream_config cfg;
  cfg.tls = psk_config("short");
  std::string why;
  EXPECT_EQ(stream_channel::validate(cfg, &why), errc::invalid_argument);
  EXPECT_NE(why.find("psk_token"), std::string::npos);
}

TEST_F(StreamTls, TheChannelDefaultAppliesToPlainListenAndConnect) {
  stream_config cfg;
  cfg.tls = psk_config();
  recorder a, b;
  stream_channel* s = make_channel(&a, cfg);
  stream_channel* cl = make_channel(&b, cfg);
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  connection_id c;
  ASSERT_EQ(cl->connect(s->listener_url(l), &c), errc::ok);
  ASSERT_TRUE(run([&] { return b.connected.count(c.value) != 0 && !a.accepted.empty(); }));
  ASSERT_EQ(cl->send(c, "x", 1), errc::ok);
  ASSERT_TRUE(run([&] { return a.received_count == 1; }));
  // A clear-text client on the TLS listener is refused.
  recorder plain;
  stream_channel* pc = make_channel(&plain);
  connection_id p;
  ASSERT_EQ(pc->connect(s->listener_url(l), &p), errc::ok);
  ASSERT_TRUE(run([&] { return plain.connected.count(p.value) != 0; }));
  ASSERT_EQ(pc->send(p, "hello", 5), errc::ok);
  ASSERT_TRUE(run([&] { return s->metrics().tls_failed == 1; }));
  EXPECT_EQ(a.accepted.size(), 1u);
}

TEST_F(StreamTls, APskClientRefusesAServerThatAuthenticatesWithACertificate) {
  // The impostor does not know the token; TLS 1.3 lets it ignore the offered PSK and present any
  // certificate. The PSK client must abort the handshake: nothing is sent, on_connected fails.
  raw_tls_server impostor(pki_->server, "secret-payload");
  recorder crec;
  stream_channel* ch = make_channel(&crec);
  crec.on_connected_hook = [&](connection_id c, errc s) {
    if (s == errc::ok) (void)ch->send(c, "secret-payload", 14);
  };
  connection_id c;
  ASSERT_EQ(ch->connect("ipv4://127.0.0.1:" + std::to_string(impostor.port()), psk_config(), &c),
            errc::ok);
  ASSERT_TRUE(run([&] { return crec.connected.count(c.value) != 0 && impostor.finished(); }));
  EXPECT_EQ(crec.connected[c.value], errc::peer_not_authenticated);
  EXPECT_FALSE(impostor.handshake_ok()) << "the client let the handshake finish";
  EXPECT_EQ(impostor.received().find("secret-payload"), std::string::npos) << "data leaked";
  EXPECT_EQ(ch->metrics().tls_failed, 1u);
  bool named = false;
  for (const auto& l : crec.logs) {
    named |= l.second.find("psk mode: the peer presented a certificate") != std::string::npos;
  }
  EXPECT_TRUE(named);
}

TEST_F(StreamTls, APskServerRefusesAClientWithoutThePsk) {
  // A PSK server has no certificate: a client that offers no PSK (here one that would accept any
  // certificate) cannot finish the handshake.
  serve(psk_config());
  raw_tls_client bad(server_->listener_port(listener_), {TLS1_3_VERSION, "", "", "", 0});
  ASSERT_TRUE(run([&] { return bad.finished() && server_->metrics().tls_failed == 1; }));
  EXPECT_FALSE(bad.handshake_ok());
  EXPECT_TRUE(logged("handshake failed"));
  EXPECT_TRUE(srec_.accepted.empty());
  expect_honest_peer_works(psk_config());
}

TEST_F(StreamTls, NothingIsDeliveredAfterAGracefulDisconnectInOnAccepted) {
  // The client's first messages arrive in the read that finishes the server's handshake; the
  // server disconnects in on_accepted, so none of them may reach on_received (as in clear text).
  for (const tls_mode mode : {tls_mode::off, tls_mode::psk}) {
    SCOPED_TRACE(mode == tls_mode::off ? "clear text" : "tls");
    srec_ = recorder{};
    tls_config t = psk_config();
    t.mode = mode;
    serve(t);
    srec_.on_accepted_hook = [&](connection_id s) {
      EXPECT_EQ(server_->disconnect(s, disconnect_mode::graceful), errc::ok);
    };
    recorder crec;
    stream_channel* ch = make_channel(&crec);
    crec.on_connected_hook = [&](connection_id c, errc s) {
      for (int i = 0; s == errc::ok && i < 3; ++i) EXPECT_EQ(ch->send(c, "early", 5), errc::ok);
    };
    connection_id c;
    ASSERT_EQ(ch->connect(url_, t, &c), errc::ok);
    ASSERT_TRUE(run([&] {
      return srec_.accepted.size() == 1 && srec_.disconnected.count(srec_.accepted[0].value) != 0;
    }));
    EXPECT_EQ(srec_.received_count, 0u);
    EXPECT_EQ(srec_.disconnected[srec_.accepted[0].value], errc::ok);
    EXPECT_EQ(server_->metrics().tls_failed, 0u);
    for (auto& channel : channels_) channel->close();
  }
}

TEST_F(StreamTls, UnixSocketsCarryTlsToo) {
  const std::string path = "/tmp/" + unique_name("tls") + ".sock";
  server_ = make_channel(&srec_);
  ASSERT_EQ(server_->listen("unix://" + path, psk_config(), &listener_), errc::ok);
  url_ = server_->listener_url(listener_);
  expect_honest_peer_works(psk_config());
  EXPECT_EQ(server_->metrics().tls_failed, 0u);
}

}  // namespace
}  // namespace uvbus::test
