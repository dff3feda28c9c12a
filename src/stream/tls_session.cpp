// TLS sessions over memory: the OpenSSL SSL object, its custom BIO (ciphertext from the caller's
// read chunk, ciphertext to a per-connection buffer), peer checks and KeyUpdate accounting.
#include "stream/tls_session.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "core/utf8.h"

namespace uvbus::detail {

bool byte_buf::append(const uint8_t* p, size_t n) noexcept {
  if (end_ + n > cap_) {
    const size_t live = size();
    if (off_ != 0 && live + n <= cap_) {
      std::memmove(mem_.get(), data(), live);
    } else {
      size_t want = std::max<size_t>(cap_ * 2, size_t{16} * 1024);
      while (want < live + n) want *= 2;
      std::unique_ptr<uint8_t[]> m(new (std::nothrow) uint8_t[want]);
      if (!m) return false;
      if (live != 0) std::memcpy(m.get(), data(), live);
      mem_ = std::move(m);
      cap_ = want;
    }
    off_ = 0;
    end_ = live;
  }
  std::memcpy(mem_.get() + end_, p, n);
  end_ += n;
  return true;
}

void byte_buf::consume(size_t n) noexcept {
  off_ += std::min(n, size());
  if (off_ == end_) off_ = end_ = 0;
}

void byte_buf::release() noexcept {
  if (!empty()) return;
  mem_.reset();
  cap_ = off_ = end_ = 0;
}

void byte_buf::swap(byte_buf& o) noexcept {
  std::swap(mem_, o.mem_);
  std::swap(cap_, o.cap_);
  std::swap(off_, o.off_);
  std::swap(end_, o.end_);
}

bool hello_guard::scan(const uint8_t* p, size_t n, std::string* detail) {
  constexpr uint8_t kHandshake = 22;  // the record content type of a plaintext handshake
  size_t i = 0;
  while (i < n) {
    if (rec_got_ < sizeof rec_) {
      rec_[rec_got_++] = p[i++];
      if (rec_got_ < sizeof rec_) continue;
      rec_handshake_ = rec_[0] == kHandshake;
      rec_left_ = size_t{rec_[3]} << 8 | rec_[4];
      if (rec_left_ == 0) rec_got_ = 0;
      continue;
    }
    const size_t take = std::min(rec_left_, n - i);
    for (size_t j = 0; rec_handshake_ && j < take;) {
      if (hs_left_ != 0) {
        const size_t k = std::min(hs_left_, take - j);
        hs_left_ -= k;
        j += k;
        continue;
      }
      hs_[hs_got_++] = p[i + j++];
      if (hs_got_ < sizeof hs_) continue;
      hs_got_ = 0;
      hs_left_ = size_t{hs_[1]} << 16 | size_t{hs_[2]} << 8 | hs_[3];
      if (hs_left_ > kMaxPeerHello) {
        *detail = "tls: the peer's handshake message (type " + std::to_string(hs_[0]) +
                  ", a ClientHello is 1) announces " + std::to_string(hs_left_) +
                  " bytes, more than the " + std::to_string(kMaxPeerHello) + " accepted";
        return false;
      }
    }
    i += take;
    rec_left_ -= take;
    if (rec_left_ == 0) rec_got_ = 0;
  }
  return true;
}

namespace {

// The BIO type shared by every session: its data pointer is the session.
BIO_METHOD* bio_method(int (*wr)(BIO*, const char*, size_t, size_t*),
                       int (*rd)(BIO*, char*, size_t, size_t*)) {
  static BIO_METHOD* const m = [&] {
    BIO_METHOD* b = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "uvbus stream");
    if (b == nullptr) return b;
    BIO_meth_set_write_ex(b, wr);
    BIO_meth_set_read_ex(b, rd);
    // NOLINTNEXTLINE(google-runtime-int): OpenSSL's signature
    BIO_meth_set_ctrl(
        b, [](BIO*, int cmd, long, void*) -> long { return cmd == BIO_CTRL_FLUSH ? 1 : 0; });
    return b;
  }();
  return m;
}

// True when OpenSSL's reason says a certificate was refused, by us or by the peer (an alert).
bool about_certificates(const std::string& why) {
  return why.find("certificate") != std::string::npos ||
         why.find("unknown ca") != std::string::npos;
}

std::string cert_names(X509* cert, const std::string& expected, bool* match) {
  // The first common name, whole (a fixed buffer once cut it at 255 bytes, so a name that only
  // started with the expected one matched).
  std::string cn;
  const X509_NAME* subject = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  const ASN1_STRING* d =
      at < 0 ? nullptr : X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
  // As UTF-8 whatever its string type: a BMPString's bytes compared raw made U+4142 match "AB".
  unsigned char* u = nullptr;
  const int n = d == nullptr ? -1 : ASN1_STRING_to_UTF8(&u, d);
  if (n > 0) cn.assign(reinterpret_cast<const char*>(u), static_cast<size_t>(n));
  OPENSSL_free(u);
  *match = cn == expected;
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans != nullptr && !*match && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type != GEN_DNS && g->type != GEN_URI && g->type != GEN_EMAIL) continue;
    const ASN1_STRING* s = g->d.ia5;
    const auto len = static_cast<size_t>(ASN1_STRING_length(s));
    *match =
        len == expected.size() && std::memcmp(ASN1_STRING_get0_data(s), expected.data(), len) == 0;
  }
  GENERAL_NAMES_free(sans);
  return cn;
}

}  // namespace

errc tls_session::create(std::shared_ptr<const tls_context> ctx, bool server,
                         std::unique_ptr<tls_session>* out, std::string* detail) {
  std::unique_ptr<tls_session> s(new (std::nothrow) tls_session);
  if (!s) return errc::no_memory;
  ERR_clear_error();
  BIO_METHOD* m = bio_method(bio_write, bio_read);
  s->ssl_ = m == nullptr ? nullptr : SSL_new(ctx->ctx());
  BIO* b = s->ssl_ == nullptr ? nullptr : BIO_new(m);
  if (b == nullptr) {
    *detail = "tls: cannot create a session: " + openssl_errors();
    return errc::no_memory;
  }
  BIO_set_data(b, s.get());
  BIO_set_init(b, 1);
  SSL_set_bio(s->ssl_, b, b);
  SSL_set_app_data(s->ssl_, s.get());
  SSL_set_read_ahead(s->ssl_, 1);
  SSL_set_msg_callback(s->ssl_, on_message);
  SSL_set_msg_callback_arg(s->ssl_, s.get());
  if (ctx->config().mode == tls_mode::certificate) {
    const int mode = server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER;
    SSL_set_verify(s->ssl_, mode, verify);
  } else if (!server) {
    // PSK mode: knowing the token is the only proof. TLS 1.3 lets a server that does not know it
    // ignore the offered PSK and authenticate with a certificate instead; any certificate is
    // refused, so such a handshake aborts before our Finished. A PSK server has no certificate,
    // so a client without the PSK cannot finish; handshake() checks both sides again at the end.
    SSL_set_verify(s->ssl_, SSL_VERIFY_PEER, refuse_certificate);
  }
  s->server_ = server;
  if (server) {
    SSL_set_accept_state(s->ssl_);
  } else {
    SSL_set_connect_state(s->ssl_);
  }
  s->ctx_ = std::move(ctx);
  *out = std::move(s);
  return errc::ok;
}

tls_session::~tls_session() {
  SSL_free(ssl_);
}

int tls_session::bio_write(BIO* b, const char* data, size_t len, size_t* written) {
  auto* s = static_cast<tls_session*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  if (!s->out_.append(reinterpret_cast<const uint8_t*>(data), len)) {
    s->oom_ = true;
    return 0;
  }
  *written = len;
  return 1;
}

int tls_session::bio_read(BIO* b, char* data, size_t len, size_t* read) {
  auto* s = static_cast<tls_session*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  if (s->in_len_ == 0) {
    BIO_set_retry_read(b);
    return 0;
  }
  const size_t n = std::min(len, s->in_len_);
  // A server in its handshake: the headers of what OpenSSL is about to read are checked first
  // (refused: a read error without retry, which failure() reports with hello_detail_).
  if (s->server_ && !s->done_ && !s->hello_.scan(s->in_, n, &s->hello_detail_)) return 0;
  std::memcpy(data, s->in_, n);
  s->in_ += n;
  s->in_len_ -= n;
  *read = n;
  return 1;
}

int tls_session::verify(int ok, x509_store_ctx_st* store) {
  SSL* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* s = static_cast<tls_session*>(SSL_get_app_data(ssl));
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  char subject[256] = "?";
  if (cert != nullptr) X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof subject);
  if (ok == 0) {
    if (s->verify_detail_.empty()) {
      s->verify_detail_ = std::string("tls: peer certificate '") + subject + "' rejected: " +
                          X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
    }
    return 0;
  }
  const std::string& expected = s->ctx_->config().expected_peer;
  if (X509_STORE_CTX_get_error_depth(store) != 0 || expected.empty() || cert == nullptr) return 1;
  bool match = false;
  const std::string cn = cert_names(cert, expected, &match);
  if (match) return 1;
  // The name is the peer's text: escaped, so that it cannot add lines of its own to a log.
  s->verify_detail_ = "tls: peer certificate CN '" + detail::printable(cn) +
                      "' (nor any subjectAltName) does not match expected '" + expected + "'";
  X509_STORE_CTX_set_error(store, X509_V_ERR_HOSTNAME_MISMATCH);
  return 0;
}

int tls_session::refuse_certificate(int, x509_store_ctx_st* store) {
  SSL* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* s = static_cast<tls_session*>(SSL_get_app_data(ssl));
  if (s->verify_detail_.empty()) {
    X509* cert = X509_STORE_CTX_get0_cert(store);
    char subject[256] = "?";
    if (cert != nullptr) X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof subject);
    s->verify_detail_ = std::string("tls: psk mode: the peer presented a certificate ('") +
                        subject + "') instead of using the PSK: it does not know the access token";
  }
  X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
  return 0;
}

void tls_session::on_message(int write_p, int, int type, const void* buf, size_t len, SSL*,
                             void* arg) {
  auto* s = static_cast<tls_session*>(arg);
  if (write_p != 0 || type != SSL3_RT_HANDSHAKE || len == 0 ||
      *static_cast<const uint8_t*>(buf) != SSL3_MT_KEY_UPDATE) {
    return;
  }
  ++s->updates_total_;
  const tls_config& cfg = s->ctx_->config();
  if (cfg.max_peer_key_updates == 0) return;
  if (s->now_ms_ - s->window_start_ms_ >= cfg.key_update_window_ms) {
    s->window_start_ms_ = s->now_ms_;
    s->window_updates_ = 0;
  }
  if (++s->window_updates_ > cfg.max_peer_key_updates) s->storm_ = true;
}

errc tls_session::failure(int ret, const char* what, std::string* detail) {
  const int e = SSL_get_error(ssl_, ret);
  std::string why = e == SSL_ERROR_SSL ? openssl_errors() : "";
  ERR_clear_error();
  if (oom_) {
    *detail = std::string("tls: ") + what + ": out of memory";
    return errc::no_memory;
  }
  if (!hello_detail_.empty()) {
    *detail = hello_detail_;
    return errc::tls_handshake_failed;
  }
  if (!verify_detail_.empty()) {
    *detail = verify_detail_;
    return errc::peer_not_authenticated;
  }
  if (why.empty() && e == SSL_ERROR_ZERO_RETURN) {  // only read() takes it for a graceful end
    why = done_ ? "the peer closed the connection (close_notify)"
                : "the peer closed the connection (close_notify) during the handshake";
  }
  if (why.empty())
    why = e == SSL_ERROR_SYSCALL ? "unexpected end of data" : "SSL error " + std::to_string(e);
  *detail = std::string("tls: ") + what + " failed: " + why;
  if (why.find("excessive message size") != std::string::npos) {
    // OpenSSL's only bound of that kind we set: the peer's certificate chain (tls_context).
    *detail +=
        " (the peer's certificate chain is longer than tls_config::max_peer_cert_chain_bytes, " +
        std::to_string(ctx_->config().max_peer_cert_chain_bytes) + ")";
    return errc::tls_handshake_failed;
  }
  if (about_certificates(why)) return errc::peer_not_authenticated;
  return done_ ? errc::protocol_error : errc::tls_handshake_failed;
}

errc tls_session::handshake(std::string* detail) {
  if (done_) return errc::ok;
  ERR_clear_error();
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) {
    if (ctx_->config().mode == tls_mode::psk &&
        (SSL_session_reused(ssl_) != 1 || SSL_get0_peer_certificate(ssl_) != nullptr)) {
      // Not authenticated by the PSK, however it got here: what the handshake queued for the
      // peer (a client's Finished) is dropped, so that a server never sees the link up.
      out_.clear();
      *detail =
          "tls: psk mode: the handshake finished without the PSK: the peer is not "
          "authenticated";
      return errc::peer_not_authenticated;
    }
    done_ = true;
    last_update_ms_ = now_ms_;
    window_start_ms_ = now_ms_;
    return errc::ok;
  }
  if (SSL_get_error(ssl_, r) == SSL_ERROR_WANT_READ && !oom_) return errc::ok;
  return failure(r, "handshake", detail);
}

errc tls_session::read(uint8_t* buf, size_t cap, size_t* n, std::string* detail) {
  *n = 0;
  ERR_clear_error();
  const int r = SSL_read_ex(ssl_, buf, cap, n);
  if (storm_) {
    ERR_clear_error();  // what the refused read queued is not for the next caller to report
    *detail = "tls: peer sent more than " + std::to_string(ctx_->config().max_peer_key_updates) +
              " KeyUpdate messages within " + std::to_string(ctx_->config().key_update_window_ms) +
              " ms";
    return errc::protocol_error;
  }
  if (r == 1) return errc::ok;
  *n = 0;
  const int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_WANT_READ && !oom_) return errc::ok;
  if (e == SSL_ERROR_ZERO_RETURN) return errc::closed;
  return failure(r, "read", detail);
}

void tls_session::maybe_key_update() {
  const tls_config& cfg = ctx_->config();
  const bool by_bytes = cfg.key_update_bytes != 0 && bytes_since_update_ >= cfg.key_update_bytes;
  const bool by_time =
      cfg.key_update_interval_ms != 0 && now_ms_ - last_update_ms_ >= cfg.key_update_interval_ms;
  if (!by_bytes && !by_time) return;
  if (break_at_renewal_) {
    break_writes();
    return;
  }
  // Sent ahead of the next record SSL_write produces. Refused while a peer's post-handshake
  // message is incomplete (writes wait then, writes_wait()): the budget stays used up, so the
  // renewal comes with the next write.
  if (SSL_key_update(ssl_, SSL_KEY_UPDATE_NOT_REQUESTED) != 1) return;
  ++updates_sent_;
  bytes_since_update_ = 0;
  last_update_ms_ = now_ms_;
}

errc tls_session::write(const uint8_t* p, size_t n, std::string* detail) {
  if (n == 0) return errc::ok;
  maybe_key_update();
  ERR_clear_error();
  size_t w = 0;
  const int r = SSL_write_ex(ssl_, p, n, &w);
  if (r != 1 || w != n || oom_) return failure(r, "write", detail);
  bytes_since_update_ += n;
  return errc::ok;
}

void tls_session::close_notify() {
  if (closed_notify_ || !done_) return;
  closed_notify_ = true;
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

void tls_session::release_buffers() noexcept {
  out_.release();
  flight_.release();
  // OpenSSL allocates them again at the next read or write; it refuses while they hold data.
  static const bool safe = OpenSSL_version_num() >= 0x300000e0UL;  // 3.0.14
  if (safe) (void)SSL_free_buffers(ssl_);
}

bool tls_session::writes_wait() noexcept {
  const bool wait = done_ && SSL_in_init(ssl_) == 1;
  writes_waited_ = writes_waited_ || wait;
  return wait;
}

bool tls_session::input_freed_writes() noexcept {
  if (!writes_waited_ || SSL_in_init(ssl_) == 1) return false;
  writes_waited_ = false;
  return true;
}

bool tls_session::holds_partial_input() const noexcept {
  // In init after the handshake: a post-handshake message has begun and not ended (our own
  // KeyUpdate leaves it at once: write() sends it in the same call).
  return SSL_has_pending(ssl_) == 1 || (done_ && SSL_in_init(ssl_) == 1);
}

void tls_session::break_writes() noexcept {
  const size_t before = out_.size();
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
  out_.keep(before);  // the close_notify it queued never leaves
}

const char* tls_session::cipher() const noexcept {
  const SSL_CIPHER* c = SSL_get_current_cipher(ssl_);
  return c == nullptr ? "none" : SSL_CIPHER_get_name(c);
}

}  // namespace uvbus::detail
