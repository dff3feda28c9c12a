// The TLS stream tests' shared parts: a raw TCP dial, OpenSSL clients and servers of our own for
// the peers a tls_config cannot describe, and the StreamTls fixture (a server channel, configs,
// an honest-peer check).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "stream_harness.h"
#include "tls_test_pki.h"

namespace uvbus::test {

inline constexpr char kToken[] = "cluster-access-token-0123456789";

// A TLS client of our own, made with OpenSSL directly and run on its own thread (blocking socket),
// for the peers a tls_config cannot describe: no certificate, TLS 1.2, a KeyUpdate storm, a
// partial record.
class raw_tls_client {
 public:
  struct options {
    int max_version = TLS1_3_VERSION;
    std::string cert, key, ca;
    int key_updates = 0;  // sent after the handshake, as fast as possible
    // Sends its ClientHello followed, in the same write, by a plaintext close_notify alert, and
    // reads until the connection ends (no handshake).
    bool close_in_hello = false;
  };
  // raw_after: written to the socket as it is after the handshake (and the KeyUpdates), outside
  // TLS: the start of a record, say.
  raw_tls_client(uint16_t port, options o, std::string raw_after = {})
      : opt_(std::move(o)), raw_after_(std::move(raw_after)) {
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
    if (fd >= 0 && opt_.close_in_hello) {
      hello_then_close_notify(ssl, fd);
    } else if (fd >= 0 && SSL_connect(ssl) == 1) {
      handshake_ok_ = true;
      for (int i = 0; i < opt_.key_updates; ++i) {
        if (SSL_key_update(ssl, SSL_KEY_UPDATE_NOT_REQUESTED) != 1 || SSL_do_handshake(ssl) != 1) {
          break;
        }
      }
      if (!raw_after_.empty()) (void)::write(fd, raw_after_.data(), raw_after_.size());
      char b[256];
      while (SSL_read(ssl, b, sizeof b) > 0) {
      }
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    if (fd >= 0) ::close(fd);
    finished_ = true;
  }

  // The ClientHello is written into a memory BIO, then goes out with the alert in one write.
  static void hello_then_close_notify(SSL* ssl, int fd) {
    BIO* mem = BIO_new(BIO_s_mem());
    SSL_set0_wbio(ssl, mem);
    BIO* rmem = BIO_new(BIO_s_mem());
    SSL_set0_rbio(ssl, rmem);  // nothing to read: SSL_connect stops after the ClientHello
    (void)SSL_connect(ssl);
    char* p = nullptr;
    const long n = BIO_get_mem_data(mem, &p);  // NOLINT(google-runtime-int): OpenSSL's type
    std::string out(p, static_cast<size_t>(n));
    out += std::string("\x15\x03\x03\x00\x02\x01\x00", 7);  // alert: warning, close_notify
    (void)::write(fd, out.data(), out.size());
    char b[256];
    while (::read(fd, b, sizeof b) > 0) {
    }
  }

  options opt_;
  std::string raw_after_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> handshake_ok_{false};
  std::thread thread_;
};

// A TLS 1.3 server of our own (OpenSSL directly, its own thread, blocking sockets) that accepts one
// connection with a certificate and no PSK: an impostor for a PSK client. It reads until the
// connection ends or `wanted` arrived, then closes. With ticket_cut, it instead sends a
// NewSessionTicket of about 50 KB after the handshake, only its whole records within the first
// ticket_cut bytes (the rest of the message comes at send_rest(), or never), and waits for the
// client to close.
class raw_tls_server {
 public:
  raw_tls_server(const test_pki::pair& id, std::string wanted, size_t ticket_cut = 0)
      : wanted_(std::move(wanted)), ticket_cut_(ticket_cut) {
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
  // With ticket_cut: the ciphertext of the ticket that was sent.
  [[nodiscard]] size_t ticket_sent() const { return ticket_sent_.load(); }
  // With ticket_cut: sends the rest of the ticket, then reads until `wanted` (otherwise the rest
  // never comes).
  // with_close_notify: our close_notify follows the rest in the same write (one read for the
  // client: the message completed, then the end).
  void send_rest(bool with_close_notify = false) {
    close_with_rest_ = with_close_notify;
    send_rest_ = true;
  }
  // With send_rest(): whether the client's end came as a close_notify (valid once finished()).
  [[nodiscard]] bool close_notified() const { return close_notified_.load(); }
  // With ticket_cut: the rest never comes; the server shuts its write side instead (a FIN, no
  // close_notify), then reads until the client closes.
  void close_instead() { close_instead_ = true; }

 private:
  void run(const test_pki::pair& id) {
    const int c = fd_ < 0 ? -1 : ::accept(fd_, nullptr, nullptr);
    timeval tv{30, 0};
    if (c >= 0) setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_use_certificate_chain_file(ctx, id.cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx, id.key.c_str(), SSL_FILETYPE_PEM);
    if (ticket_cut_ != 0) {
      SSL_CTX_set_num_tickets(ctx, 0);  // only the one sent below
      SSL_CTX_set_session_ticket_cb(
          ctx,
          [](SSL* s, void*) {
            const std::string big(50000, 't');  // carried inside the ticket
            return SSL_SESSION_set1_ticket_appdata(SSL_get0_session(s), big.data(), big.size());
          },
          nullptr, nullptr);
    }
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, c);
    if (c >= 0 && SSL_accept(ssl) == 1 && ticket_cut_ != 0) {
      handshake_ok_ = true;
      send_partial_ticket(ssl, c);
    } else if (c >= 0 && SSL_is_init_finished(ssl) == 1) {
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

  // The ticket is encrypted into a memory BIO; its first whole records go to the socket.
  void send_partial_ticket(SSL* ssl, int c) {
    BIO* mem = BIO_new(BIO_s_mem());
    SSL_set0_wbio(ssl, mem);  // the socket stays the read side
    if (SSL_new_session_ticket(ssl) == 1) (void)SSL_do_handshake(ssl);
    char* p = nullptr;
    const long n = BIO_get_mem_data(mem, &p);  // NOLINT(google-runtime-int): OpenSSL's type
    const auto* u = reinterpret_cast<const uint8_t*>(p);
    size_t off = 0;
    while (off + 5 <= static_cast<size_t>(n)) {
      const size_t rec = 5 + (size_t{u[off + 3]} << 8 | u[off + 4]);
      if (off + rec > ticket_cut_) break;
      off += rec;
    }
    ticket_sent_ = off;
    if (off != 0) (void)::write(c, p, off);
    char b[256];
    timeval tv{0, 10000};  // 10 ms: send_rest() is looked at between reads
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (bool fin = false;;) {
      if (close_instead_ && !fin) fin = ::shutdown(c, SHUT_WR) == 0;
      const ssize_t got = ::recv(c, b, sizeof b, 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return;
      if (send_rest_ && !fin) break;
    }
    long all = n;  // NOLINT(google-runtime-int): OpenSSL's type
    if (close_with_rest_) {
      (void)SSL_shutdown(ssl);  // into the memory BIO, after the ticket
      all = BIO_get_mem_data(mem, &p);
    }
    (void)::write(c, p + off, static_cast<size_t>(all) - off);
    tv = timeval{30, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int k = 0;
    while (received_.find(wanted_) == std::string::npos && (k = SSL_read(ssl, b, sizeof b)) > 0) {
      received_.append(b, static_cast<size_t>(k));
    }
    close_notified_ = k <= 0 && SSL_get_error(ssl, k) == SSL_ERROR_ZERO_RETURN;
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::string wanted_;
  size_t ticket_cut_ = 0;
  std::atomic<size_t> ticket_sent_{0};
  std::atomic<bool> send_rest_{false};
  std::atomic<bool> close_with_rest_{false};
  std::atomic<bool> close_instead_{false};
  std::atomic<bool> close_notified_{false};
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

  // A fresh server recorder and a server in clear text (tls_mode::off) or psk mode: the tests that
  // compare the two. Returns that config (a client's too).
  tls_config serve_in(tls_mode mode) {
    srec_ = recorder{};
    tls_config t = psk_config();
    t.mode = mode;
    serve(t);
    return t;
  }

  // Connects a new client channel with `tls`; returns its connection id (0 if connect() failed).
  connection_id dial_with(recorder* rec, const tls_config& tls, const stream_config& cfg = {}) {
    stream_channel* ch = make_channel(rec, cfg);
    connection_id c;
    EXPECT_EQ(ch->connect(url_, tls, &c), errc::ok) << ch->last_error().detail;
    return c;
  }

  // Dials the server with tls (its events into crec) and runs until the connection is up at both
  // ends (a failure if not); the client's channel.
  stream_channel* dial_accepted(recorder* crec, const tls_config& tls, connection_id* c) {
    const size_t before = srec_.accepted.size();
    *c = dial_with(crec, tls);
    EXPECT_TRUE(run(
        [&] { return crec->connected.count(c->value) != 0 && srec_.accepted.size() > before; }));
    return channels_.back().get();
  }

  // Dials with tls (its events into crec) and runs until the server has counted one TLS failure
  // and the client's connection failed or closed.
  void expect_refused_dial(recorder* crec, const tls_config& tls) {
    const connection_id c = dial_with(crec, tls);
    ASSERT_TRUE(run([&] { return server_->metrics().tls_failed == 1; }));
    ASSERT_TRUE(run([&] {
      return crec->disconnected.count(c.value) != 0 ||
             (crec->connected.count(c.value) != 0 && crec->connected[c.value] != errc::ok);
    }));
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

  // Dials `server` (a raw_tls_server sending part of a ticket) with the client certificate and
  // runs until the client has read that part (fatal failures); the client's channel.
  stream_channel* dial_cut_ticket(raw_tls_server* server, recorder* crec, connection_id* c,
                                  const stream_config& cfg = {}) {
    url_ = "ipv4://127.0.0.1:" + std::to_string(server->port());
    *c = dial_with(crec, client_config(), cfg);
    stream_channel* ch = channels_.back().get();
    EXPECT_TRUE(run([&] {
      return crec->connected.count(c->value) != 0 && server->ticket_sent() != 0 &&
             ch->metrics().totals.read_calls != 0;
    }));
    return ch;
  }

  [[nodiscard]] bool logged(const std::string& what) const {
    for (const auto& l : srec_.logs) {
      if (l.second.find(what) != std::string::npos) return true;
    }
    return false;
  }

  static inline test_pki* pki_ = nullptr;
  recorder srec_;
  stream_channel* server_ = nullptr;
  listener_id listener_;
  std::string url_;
  size_t accepted_before_ = 0;
};

}  // namespace uvbus::test
