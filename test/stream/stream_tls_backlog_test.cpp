// TLS replies behind a stuck write: a peer that stops reading but keeps asking for KeyUpdates.
#include <openssl/ssl.h>

#include <atomic>
#include <string>
#include <thread>

#include "stream/stream_tls_harness.h"

namespace uvbus::test::stream_tls_backlog_test {
namespace {

// A TLS client of our own (OpenSSL directly, its own thread, blocking socket) with a small receive
// buffer that never reads: it sends KeyUpdate(update_requested) up to `updates` times, each of
// which makes our side queue a KeyUpdate of its own, until its connection is closed.
class key_update_pest {
 public:
  key_update_pest(uint16_t port, const test_pki::pair& id, const std::string& ca, int updates) {
    thread_ = std::thread([=] { run(port, id, ca, updates); });
  }
  ~key_update_pest() { thread_.join(); }
  key_update_pest(const key_update_pest&) = delete;
  key_update_pest& operator=(const key_update_pest&) = delete;
  [[nodiscard]] bool finished() const { return finished_.load(); }
  [[nodiscard]] int sent() const { return sent_.load(); }

 private:
  void run(uint16_t port, const test_pki::pair& id, const std::string& ca, int updates) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;  // set before connecting: the window stays small
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{30, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr);
    SSL_CTX_use_certificate_chain_file(ctx, id.cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx, id.key.c_str(), SSL_FILETYPE_PEM);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && SSL_connect(ssl) == 1) {
      for (int i = 0; i < updates; ++i) {
        if (SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) != 1 || SSL_do_handshake(ssl) != 1) {
          break;
        }
        ++sent_;
      }
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
    finished_ = true;
  }

  std::atomic<bool> finished_{false};
  std::atomic<int> sent_{0};
  std::thread thread_;
};

// The server fills the link (the peer does not read), so its write is stuck; then every KeyUpdate
// request adds a reply behind it. Past the bound (the send queue's ring_bytes) the connection is
// closed, counted once as a TLS failure and logged; the memory it held never grew past the bound.
TEST_F(StreamTls, RepliesBehindAStuckWriteAreBounded) {
  stream_config cfg;
  cfg.message_limit = size_t{16} * 1024;
  cfg.queue.ring_bytes = size_t{64} * 1024;
  cfg.queue.max_bytes = size_t{64} * 1024;
  cfg.tls = server_config();
  cfg.tls.max_peer_key_updates = 0;  // within the storm limit, whatever it is
  // A listening socket with a small send buffer, which its connections inherit: the kernel holds
  // a few KiB of what the node sends, not megabytes, so the replies pile up in the node soon.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int small = 4096;
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  server_ = make_channel(&srec_, cfg);
  ASSERT_EQ(server_->listen_fd("ipv4://127.0.0.1:0", fd, &listener_), errc::ok)
      << server_->last_error().detail;
  url_ = server_->listener_url(listener_);
  const std::string chunk(cfg.message_limit, 'x');
  srec_.on_accepted_hook = [&](connection_id c) {
    while (server_->send(c, chunk.data(), chunk.size()) == errc::ok) {
    }
  };
  key_update_pest pest(server_->listener_port(listener_), pki_->client, pki_->ca_file, 100000);
  ASSERT_TRUE(run([&] { return srec_.accepted.size() == 1; }));
  const connection_id c = srec_.accepted[0];
  // The send ring (64 KiB), OpenSSL's and our ciphertext buffers for one write batch, and the
  // bound on the replies: anything beyond means the replies grow without a bound.
  const size_t bound = 4 * cfg.queue.ring_bytes;
  size_t most = 0;
  ASSERT_TRUE(run([&] {
    most = std::max<size_t>(most, cm(server_, c).queue_memory_bytes);
    return srec_.disconnected.count(c.value) != 0 || most > bound || pest.finished();
  }));
  EXPECT_LE(most, bound) << pest.sent() << " KeyUpdate requests sent";
  ASSERT_TRUE(run([&] { return srec_.disconnected.count(c.value) != 0; }));
  EXPECT_EQ(srec_.disconnected[c.value], errc::protocol_error);
  EXPECT_EQ(server_->metrics().tls_failed, 1u);
  EXPECT_TRUE(logged("not reading")) << (srec_.logs.empty() ? "" : srec_.logs.back().second);
  ASSERT_TRUE(run([&] { return pest.finished(); }));
  srec_.on_accepted_hook = nullptr;
  accepted_before_ = 1;
  expect_honest_peer_works(client_config());
}

}  // namespace
}  // namespace uvbus::test::stream_tls_backlog_test
