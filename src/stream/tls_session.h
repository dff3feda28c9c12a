// A TLS session over memory: ciphertext in, plaintext out, plaintext in, ciphertext out. Knows
// nothing of sockets or libuv (src/stream/stream_tls.cpp drives it from a connection).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "stream/tls_context.h"
#include "uvbus/error.h"

typedef struct ssl_st SSL;  // NOLINT(modernize-use-using): matches OpenSSL's declaration
typedef struct bio_st BIO;  // NOLINT(modernize-use-using): matches OpenSSL's declaration
struct x509_store_ctx_st;

namespace uvbus::detail {

// A growable byte buffer with a read offset: written at the back, consumed from the front. Keeps
// its memory when emptied, so a connection in steady state allocates nothing, until release().
class byte_buf {
 public:
  byte_buf() = default;
  byte_buf(const byte_buf&) = delete;
  byte_buf& operator=(const byte_buf&) = delete;
  // Appends n bytes; false when memory ran out (nothing appended).
  bool append(const uint8_t* p, size_t n) noexcept;
  [[nodiscard]] const uint8_t* data() const noexcept { return mem_.get() + off_; }
  [[nodiscard]] size_t size() const noexcept { return end_ - off_; }
  [[nodiscard]] bool empty() const noexcept { return end_ == off_; }
  [[nodiscard]] size_t capacity() const noexcept { return cap_; }
  void consume(size_t n) noexcept;
  void clear() noexcept { off_ = end_ = 0; }
  // Keeps the first n bytes (all if fewer): what was appended after them is dropped.
  void keep(size_t n) noexcept { end_ = off_ + std::min(n, size()); }
  void swap(byte_buf& o) noexcept;
  // Frees the memory of an empty buffer (a non-empty one is left as it is); the next append()
  // allocates again.
  void release() noexcept;

 private:
  std::unique_ptr<uint8_t[]> mem_;
  size_t cap_ = 0;
  size_t off_ = 0;
  size_t end_ = 0;
};

// A server's look at the peer's plaintext handshake messages before OpenSSL sees them (its
// ClientHello, and a second one after a HelloRetryRequest): OpenSSL grows its handshake buffer to
// the length a ClientHello announces, up to 131 396 bytes (about 175 KB allocated), for 9 bytes
// of input. A message announcing more than kMaxPeerHello is refused before OpenSSL gets it.
// Records are followed across reads of any size; encrypted records are skipped (OpenSSL bounds
// the messages inside them: a certificate chain by max_cert_list).
class hello_guard {
 public:
  // One full record (16 KiB) plus 4 KiB: a ClientHello with a post-quantum key share is about
  // 1.2 to 2 KB today.
  static constexpr size_t kMaxPeerHello = size_t{20} * 1024;
  // Looks at [p, p + n), the next bytes of the peer's stream. False (and *detail says why) when a
  // plaintext handshake message announces more than kMaxPeerHello.
  bool scan(const uint8_t* p, size_t n, std::string* detail);

 private:
  uint8_t rec_[5] = {};
  uint8_t rec_got_ = 0;
  size_t rec_left_ = 0;  // payload bytes of the current record still to come
  bool rec_handshake_ = false;
  uint8_t hs_[4] = {};
  uint8_t hs_got_ = 0;
  size_t hs_left_ = 0;  // body bytes of the current handshake message still to come
};

class tls_session {
 public:
  // server: the accepting side (it requires the client's certificate in certificate mode).
  static errc create(std::shared_ptr<const tls_context> ctx, bool server,
                     std::unique_ptr<tls_session>* out, std::string* detail);
  ~tls_session();
  tls_session(const tls_session&) = delete;
  tls_session& operator=(const tls_session&) = delete;

  // Ciphertext received: consumed by the next handshake() / read() calls, which leave nothing of
  // it behind once they report that they need more (TLS keeps a partial record itself).
  void set_input(const uint8_t* p, size_t n) noexcept {
    in_ = p;
    in_len_ = n;
  }
  // The current time, for the KeyUpdate window.
  void set_now(uint64_t now_ms) noexcept { now_ms_ = now_ms; }

  // Advances the handshake with the input given. ok: finished (done() is true) or waiting for more
  // input; otherwise tls_handshake_failed or peer_not_authenticated (*detail says why). A server
  // refuses a plaintext handshake message (a ClientHello) announcing more than
  // hello_guard::kMaxPeerHello bytes with tls_handshake_failed, naming the announced length,
  // before OpenSSL sees it (it would hold a buffer of that size until the handshake ends). In psk
  // mode a handshake that did not use the PSK (the peer authenticated with a certificate) is
  // peer_not_authenticated.
  errc handshake(std::string* detail);
  [[nodiscard]] bool done() const noexcept { return done_; }

  // Decrypts into [buf, buf + cap): *n bytes (0: the input is used up). closed: the peer sent
  // close_notify. protocol_error: a KeyUpdate storm or a TLS error (*detail).
  errc read(uint8_t* buf, size_t cap, size_t* n, std::string* detail);
  // Encrypts all of [p, p + n) into out() (records of at most 16 KiB). Renews our key first when
  // the interval or the byte budget of tls_config is used up.
  errc write(const uint8_t* p, size_t n, std::string* detail);
  // Queues close_notify into out() (once).
  void close_notify();

  // Ciphertext to send: what handshake(), read() (post-handshake replies), write() and
  // close_notify() produced. The owner sends it and consume()s what went out.
  byte_buf& out() noexcept { return out_; }
  // A second buffer for a write in flight: swap_out() moves out() here (out() then collects new
  // ciphertext while flight() is being written), the owner clear()s it when the write completes.
  byte_buf& flight() noexcept { return flight_; }
  void swap_out() noexcept { out_.swap(flight_); }
  // Memory the two ciphertext buffers hold now (each up to a write batch's ciphertext).
  [[nodiscard]] size_t buffer_bytes() const noexcept {
    return out_.capacity() + flight_.capacity();
  }
  // A quiet connection gives that memory back: each buffer that is empty is freed (the owner
  // calls it with no write in flight; the next write allocates again), and so are OpenSSL's own
  // record buffers when they hold nothing (about 17 KiB each way in OpenSSL 3.0; SSL_free_buffers,
  // used only with an OpenSSL of 3.0.14 or later, whose SSL_free_buffers is safe: CVE-2024-4741).
  void release_buffers() noexcept;

  // True while OpenSSL holds part of what the peer sends (after read() has used up the input):
  // the start of a record whose rest has not come (its record buffers stay pinned), or, once the
  // handshake is done, part of a post-handshake message such as a NewSessionTicket (kept in a
  // buffer grown to the size the message announces, up to about 128 KiB).
  [[nodiscard]] bool holds_partial_input() const noexcept;
  // Writes wait for the peer while OpenSSL holds part of a post-handshake message: until its rest
  // arrives, SSL_write only asks for input (SSL_ERROR_WANT_READ). writes_wait() says so and
  // remembers it; input_freed_writes(), after a read, says whether writes may go on again.
  [[nodiscard]] bool writes_wait() noexcept;
  [[nodiscard]] bool input_freed_writes() noexcept;

  // Why the peer is refused (the first reason given): a failed handshake reports it, as
  // peer_not_authenticated, instead of OpenSSL's reason. The PSK callback's (tls_context): an
  // identity that is not ours, whose handshake OpenSSL fails as "no suitable signature algorithm".
  void refuse_peer(std::string why) {
    if (verify_detail_.empty()) verify_detail_ = std::move(why);
  }

  // Tests only (detail::stream_access): shuts the session down without sending close_notify, so
  // that every later write() fails. break_writes_at_renewal(): the same, at the next key renewal a
  // write() is about to make (that write fails, the ones before it stand).
  void break_writes() noexcept;
  void break_writes_at_renewal() noexcept { break_at_renewal_ = true; }

  [[nodiscard]] uint64_t key_updates_sent() const noexcept { return updates_sent_; }
  [[nodiscard]] uint64_t key_updates_received() const noexcept { return updates_total_; }
  [[nodiscard]] const char* cipher() const noexcept;

 private:
  tls_session() = default;
  static int bio_write(BIO* b, const char* data, size_t len, size_t* written);
  static int bio_read(BIO* b, char* data, size_t len, size_t* read);
  static int verify(int ok, x509_store_ctx_st* store);
  // PSK mode: every certificate is refused (the PSK is the only way to authenticate).
  static int refuse_certificate(int ok, x509_store_ctx_st* store);
  static void on_message(int write_p, int version, int type, const void* buf, size_t len, SSL* ssl,
                         void* arg);
  errc failure(int ret, const char* what, std::string* detail);
  void maybe_key_update();

  std::shared_ptr<const tls_context> ctx_;
  SSL* ssl_ = nullptr;
  bool server_ = false;
  bool done_ = false;
  hello_guard hello_;         // server, until the handshake is done
  std::string hello_detail_;  // why hello_ refused the peer's bytes
  bool oom_ = false;          // appending ciphertext ran out of memory
  bool closed_notify_ = false;
  bool writes_waited_ = false;  // writes_wait() said yes since the last input_freed_writes()
  const uint8_t* in_ = nullptr;
  size_t in_len_ = 0;
  byte_buf out_;
  byte_buf flight_;
  std::string verify_detail_;  // why our verify callback refused the peer's certificate
  uint64_t now_ms_ = 0;
  // KeyUpdate accounting: ours (renewal), the peer's (storm limit).
  uint64_t last_update_ms_ = 0;
  uint64_t bytes_since_update_ = 0;
  uint64_t updates_sent_ = 0;
  uint64_t window_start_ms_ = 0;
  uint32_t window_updates_ = 0;
  uint64_t updates_total_ = 0;
  bool storm_ = false;
  bool break_at_renewal_ = false;  // tests only
};

}  // namespace uvbus::detail
