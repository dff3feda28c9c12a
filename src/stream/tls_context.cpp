// TLS contexts: SSL_CTX building from a tls_config (files, PSK derivation, protocol limits), with
// errors that name the bad file or setting.
#include "stream/tls_context.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string_view>

#include "core/utf8.h"
#include "stream/tls_session.h"

namespace uvbus::detail {

namespace {

constexpr const char kPskSalt[] = "uvbus tls 1.3 psk";
constexpr size_t kMinTokenBytes = 16;
// The identity travels in every ClientHello, whose handshake message a server refuses above
// 20 480 bytes (hello_guard): far below that, and far above any real identity.
constexpr size_t kMaxPskIdentity = 1024;
constexpr uint32_t kMinCertChainBytes = 1024;
// The fastest link a byte budget is checked against (10 Gbit/s, in bytes per millisecond): above
// what one core encrypts with AES-GCM on a bus link in practice.
constexpr uint64_t kFastestLinkBytesPerMs = 1250000;
// TLS_AES_128_GCM_SHA256: the PSK's cipher suite (its hash, SHA-256, is the PSK's hash).
constexpr unsigned char kPskCipher[2] = {0x13, 0x01};
constexpr const char kPskSuites[] = "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256";

errc file_error(const char* what, const std::string& path, std::string* detail) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f != nullptr) {
    std::fclose(f);
    return errc::ok;
  }
  const int e = errno;
  *detail = std::string("tls: cannot read ") + what + " " + path + ": " + std::strerror(e);
  if (e == ENOENT) return errc::not_found;
  if (e == EACCES || e == EPERM) return errc::permission_denied;
  return errc::io_error;
}

// OpenSSL refused something: a setting or file of ours (e = invalid_argument, a config error) or
// the library itself (tls_handshake_failed: no context, no TLS 1.3, no HKDF).
errc ssl_error(const std::string& what, std::string* detail, errc e = errc::tls_handshake_failed) {
  *detail = "tls: " + what + ": " + openssl_errors();
  return e;
}

// The first name of a suite list (OpenSSL's syntax: ':'-separated, blanks around a name ignored,
// empty names skipped) for which bad(name) holds; empty if none.
template <typename Bad>
std::string_view first_suite(const std::string& suites, Bad bad) {
  const auto blank = [](char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r'); };
  size_t from = 0;
  while (from < suites.size()) {
    size_t end = suites.find(':', from);
    if (end == std::string::npos) end = suites.size();
    std::string_view one(suites.data() + from, end - from);
    from = end + 1;
    while (!one.empty() && blank(one.front())) one.remove_prefix(1);
    while (!one.empty() && blank(one.back())) one.remove_suffix(1);
    if (!one.empty() && bad(one)) return one;
  }
  return {};
}

// A psk-mode key is bound to SHA-256: the first suite of the list that is not a *_SHA256 one
// (empty if none). A server that prefers such a suite picks it and skips the PSK, whose hash does
// not match, so every handshake would fail ("no suitable signature algorithm").
std::string_view non_sha256_suite(const std::string& suites) {
  constexpr std::string_view kTail = "_SHA256";
  return first_suite(suites, [&](std::string_view one) {
    return one.size() < kTail.size() || one.substr(one.size() - kTail.size()) != kTail;
  });
}

// The first name of `suites` that is not one of RFC 8446's TLS 1.3 suites (empty if none). OpenSSL
// 3.0 takes a TLS 1.2 suite's standard name (TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256) into the TLS
// 1.3 list, after which every handshake fails ("no ciphers available"), and drops an unknown name
// inside a list silently. The names, not this build's cipher list: a suite the build lacks
// (ChaCha20 under a FIPS provider) is dropped by OpenSSL as before, and the psk default list still
// works.
std::string_view foreign_suite(const std::string& suites) {
  constexpr std::string_view kTls13[] = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                                         "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_CCM_SHA256",
                                         "TLS_AES_128_CCM_8_SHA256"};
  return first_suite(suites, [&](std::string_view one) {
    return std::find(std::begin(kTls13), std::end(kTls13), one) == std::end(kTls13);
  });
}

SSL_SESSION* psk_session(SSL* ssl, const tls_context* tc) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kPskCipher);
  SSL_SESSION* s = cipher == nullptr ? nullptr : SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(s, tc->psk(), tls_context::kPskBytes) != 1 ||
      SSL_SESSION_set_cipher(s, cipher) != 1 ||
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

const tls_context* context_of(SSL* ssl) {
  return static_cast<const tls_context*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
}

// Client: offer the PSK (only for a SHA-256 suite, the PSK's hash).
int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen,
            SSL_SESSION** sess) {
  const tls_context* tc = context_of(ssl);
  *sess = nullptr;
  if (md != nullptr && EVP_MD_get_type(md) != NID_sha256) return 1;
  *sess = psk_session(ssl, tc);
  if (*sess == nullptr) return 0;
  *id = reinterpret_cast<const unsigned char*>(tc->config().psk_identity.data());
  *idlen = tc->config().psk_identity.size();
  return 1;
}

// Server: the PSK for our identity; any other identity finds none (and the handshake fails, as
// there is no certificate to fall back to: the session reports the identity, escaped, as why).
int find_psk(SSL* ssl, const unsigned char* id, size_t idlen, SSL_SESSION** sess) {
  const tls_context* tc = context_of(ssl);
  *sess = nullptr;
  const std::string& mine = tc->config().psk_identity;
  if (idlen != mine.size() || std::memcmp(id, mine.data(), idlen) != 0) {
    constexpr size_t kShown = 64;
    auto* s = static_cast<tls_session*>(SSL_get_app_data(ssl));
    const std::string theirs(reinterpret_cast<const char*>(id), std::min(idlen, kShown));
    if (s != nullptr) {
      s->refuse_peer("tls: psk identity '" + printable(theirs) + (idlen > kShown ? "..." : "") +
                     "' (" + std::to_string(idlen) + " bytes) offered by the peer is not ours, '" +
                     printable(mine.substr(0, kShown)) + "' (psk_identity)");
    }
    return 1;
  }
  *sess = psk_session(ssl, tc);
  return *sess == nullptr ? 0 : 1;
}

// A passphrase callback that gives none and notes that one was asked for (*asked): an encrypted
// key fails to load, named, instead of OpenSSL's default prompt reading the terminal or stdin.
int no_passphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* asked) {
  if (asked != nullptr) *static_cast<bool*>(asked) = true;
  return 0;
}

}  // namespace

std::string openssl_errors() {
  std::string out;
  unsigned long e = 0;  // NOLINT(google-runtime-int): OpenSSL's type
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error queued" : out;
}

namespace {

// Both ends of a bus link use one config: our renewals must stay within the storm guard of a
// peer with our settings, at any rate a link carries (or it closes a healthy link).
errc check_key_updates(const tls_config& cfg, std::string* detail) {
  auto bad = [detail](const std::string& why) {
    if (detail != nullptr) *detail = why;
    return errc::invalid_argument;
  };
  const uint64_t limit = cfg.max_peer_key_updates;
  const uint64_t window = cfg.key_update_window_ms;
  if (limit == 0) return errc::ok;
  if (window == 0) {
    return bad("tls: key_update_window_ms must be > 0 when max_peer_key_updates is set");
  }
  const std::string guard = "max_peer_key_updates " + std::to_string(limit);
  const std::string storm =
      ": our own renewals would look like a KeyUpdate storm to a peer with "
      "these settings";
  if (cfg.key_update_interval_ms != 0 && cfg.key_update_interval_ms * limit <= window) {
    return bad("tls: key_update_interval_ms " + std::to_string(cfg.key_update_interval_ms) + " x " +
               guard + " is not above key_update_window_ms " + std::to_string(window) + storm);
  }
  const uint64_t min_bytes = (window * kFastestLinkBytesPerMs + limit - 1) / limit;
  if (cfg.key_update_bytes != 0 && cfg.key_update_bytes < min_bytes) {
    return bad("tls: key_update_bytes " + std::to_string(cfg.key_update_bytes) + " is below " +
               std::to_string(min_bytes) + ", the least that keeps a 10 Gbit/s link to " + guard +
               " within key_update_window_ms " + std::to_string(window) + storm +
               " (raise key_update_bytes or max_peer_key_updates, 0 turns either off)");
  }
  return errc::ok;
}

errc check_settings(const tls_config& cfg, std::string* detail) {
  auto bad = [detail](const std::string& why) {
    if (detail != nullptr) *detail = why;
    return errc::invalid_argument;
  };
  switch (cfg.mode) {
    case tls_mode::off:
      return errc::ok;
    case tls_mode::certificate:
      if (cfg.cert_file.empty() || cfg.key_file.empty() || cfg.ca_file.empty()) {
        return bad("tls: certificate mode needs cert_file, key_file and ca_file");
      }
      if (cfg.max_peer_cert_chain_bytes < kMinCertChainBytes) {
        return bad("tls: max_peer_cert_chain_bytes " +
                   std::to_string(cfg.max_peer_cert_chain_bytes) + " is below " +
                   std::to_string(kMinCertChainBytes) + " (no certificate chain is that short)");
      }
      break;
    case tls_mode::psk:
      if (cfg.psk_token.size() < kMinTokenBytes) {
        return bad("tls: psk mode needs psk_token of at least 16 bytes");
      }
      if (cfg.psk_identity.empty()) return bad("tls: psk_identity must not be empty");
      if (const std::string_view other = non_sha256_suite(cfg.ciphersuites); !other.empty()) {
        return bad("tls: ciphersuites '" + cfg.ciphersuites + "' holds " + std::string(other) +
                   ": psk mode takes only *_SHA256 suites (the PSK's hash; a server preferring "
                   "another skips the PSK and every handshake fails)");
      }
      if (cfg.psk_identity.size() > kMaxPskIdentity) {
        return bad("tls: psk_identity is " + std::to_string(cfg.psk_identity.size()) +
                   " bytes, more than " + std::to_string(kMaxPskIdentity) +
                   " (it travels in every ClientHello)");
      }
      break;
    default:
      return bad("tls: unknown mode");
  }
  if (cfg.handshake_timeout_ms == 0) return bad("tls: handshake_timeout_ms must be > 0");
  return check_key_updates(cfg, detail);
}

}  // namespace

errc tls_context::check(const tls_config& cfg, std::string* detail) {
  errc e = check_settings(cfg, detail);
  if (e != errc::ok || cfg.mode == tls_mode::off) return e;
  // What only OpenSSL can judge (a suite name, a file's content) is refused here too: the context
  // is built once and dropped. A file that cannot be read now (it may be there by the first
  // listen or dial, which name it) and no memory are left to create().
  std::shared_ptr<const tls_context> built;
  std::string why;
  e = build(cfg, &built, &why);
  if (e == errc::ok || e == errc::not_found || e == errc::permission_denied ||
      e == errc::io_error || e == errc::no_memory) {
    return errc::ok;
  }
  if (detail != nullptr) *detail = why;
  return e;
}

errc tls_context::create(const tls_config& cfg, std::shared_ptr<const tls_context>* out,
                         std::string* detail) {
  const errc e = check_settings(cfg, detail);
  return e != errc::ok ? e : build(cfg, out, detail);
}

errc tls_context::build(const tls_config& cfg, std::shared_ptr<const tls_context>* out,
                        std::string* detail) {
  std::shared_ptr<tls_context> tc(new (std::nothrow) tls_context);
  if (!tc) return errc::no_memory;
  tc->cfg_ = cfg;
  // ssl_error() reports the whole error queue: only what these calls leave in it (another
  // library on this thread, libcurl's for one, may have left its own).
  ERR_clear_error();
  tc->ctx_ = SSL_CTX_new(TLS_method());
  if (tc->ctx_ == nullptr) return ssl_error("SSL_CTX_new", detail);
  SSL_CTX* c = tc->ctx_;
  SSL_CTX_set_app_data(c, tc.get());
  // TLS 1.3 only: an older ClientHello is refused with protocol_version (no downgrade).
  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) != 1) {
    return ssl_error("cannot restrict the protocol to TLS 1.3", detail);
  }
  // No resumption (a bus link is long-lived): no tickets, no session cache.
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // The peer's Certificate message: OpenSSL refuses a longer one ("excessive message size").
  SSL_CTX_set_max_cert_list(c, static_cast<long>(cfg.max_peer_cert_chain_bytes));
  // A PSK is bound to one hash (SHA-256 here): only the suites using it can select the PSK.
  const std::string suites = !cfg.ciphersuites.empty()   ? cfg.ciphersuites
                             : cfg.mode == tls_mode::psk ? kPskSuites
                                                         : std::string();
  if (!suites.empty() && SSL_CTX_set_ciphersuites(c, suites.c_str()) != 1) {
    return ssl_error("ciphersuites '" + suites + "' rejected", detail, errc::invalid_argument);
  }
  if (const std::string_view bad = foreign_suite(suites); !bad.empty()) {
    *detail = "tls: ciphersuites '" + suites + "' holds " + std::string(bad) +
              ", not a TLS 1.3 suite (TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, "
              "TLS_CHACHA20_POLY1305_SHA256, TLS_AES_128_CCM_SHA256, TLS_AES_128_CCM_8_SHA256): "
              "OpenSSL would drop it, or fail every handshake";
    return errc::invalid_argument;
  }
  const errc e =
      cfg.mode == tls_mode::certificate ? tc->load_certificates(detail) : tc->setup_psk(detail);
  if (e != errc::ok) return e;
  *out = std::move(tc);
  return errc::ok;
}

errc tls_context::load_certificates(std::string* detail) {
  errc e = file_error("certificate file", cfg_.cert_file, detail);
  if (e == errc::ok) e = file_error("key file", cfg_.key_file, detail);
  if (e == errc::ok) e = file_error("CA file", cfg_.ca_file, detail);
  if (e != errc::ok) return e;
  stamp_files();
  bool asked = false;
  SSL_CTX_set_default_passwd_cb(ctx_, no_passphrase);
  SSL_CTX_set_default_passwd_cb_userdata(ctx_, &asked);
  e = load_pair(&asked, detail);
  SSL_CTX_set_default_passwd_cb_userdata(ctx_, nullptr);
  if (e != errc::ok) return e;
  if (SSL_CTX_load_verify_locations(ctx_, cfg_.ca_file.c_str(), nullptr) != 1) {
    return ssl_error("ca_file: cannot load CA file " + cfg_.ca_file, detail,
                     errc::invalid_argument);
  }
  return errc::ok;
}

errc tls_context::load_pair(const bool* asked, std::string* detail) {
  if (SSL_CTX_use_certificate_chain_file(ctx_, cfg_.cert_file.c_str()) != 1) {
    return ssl_error("cert_file: cannot load certificate file " + cfg_.cert_file, detail,
                     errc::invalid_argument);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx_, cfg_.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (*asked) {
      ERR_clear_error();
      *detail = "tls: key_file " + cfg_.key_file +
                " is encrypted (a passphrase is needed): an unencrypted key is required";
      return errc::invalid_argument;
    }
    return ssl_error("key_file: cannot load key file " + cfg_.key_file, detail,
                     errc::invalid_argument);
  }
  if (SSL_CTX_check_private_key(ctx_) != 1) {
    return ssl_error("key_file " + cfg_.key_file + " does not match cert_file " + cfg_.cert_file,
                     detail, errc::invalid_argument);
  }
  return errc::ok;
}

namespace {

tls_context::file_stamp stamp_of(const std::string& path) {
  tls_context::file_stamp s;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return s;  // all zero: "missing", a change if it appears
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = st.st_size;
  s.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  return s;
}

}  // namespace

void tls_context::stamp_files() {
  stamps_[0] = stamp_of(cfg_.cert_file);
  stamps_[1] = stamp_of(cfg_.key_file);
  stamps_[2] = stamp_of(cfg_.ca_file);
}

bool tls_context::files_changed() const {
  if (cfg_.mode != tls_mode::certificate) return false;
  return stamp_of(cfg_.cert_file) != stamps_[0] || stamp_of(cfg_.key_file) != stamps_[1] ||
         stamp_of(cfg_.ca_file) != stamps_[2];
}

errc tls_context::setup_psk(std::string* detail) {
  EVP_PKEY_CTX* k = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t len = kPskBytes;
  const bool ok =
      k != nullptr && EVP_PKEY_derive_init(k) == 1 &&
      EVP_PKEY_CTX_set_hkdf_md(k, EVP_sha256()) == 1 &&
      EVP_PKEY_CTX_set1_hkdf_salt(k, reinterpret_cast<const unsigned char*>(kPskSalt),
                                  sizeof kPskSalt - 1) == 1 &&
      EVP_PKEY_CTX_set1_hkdf_key(k, reinterpret_cast<const unsigned char*>(cfg_.psk_token.data()),
                                 static_cast<int>(cfg_.psk_token.size())) == 1 &&
      EVP_PKEY_CTX_add1_hkdf_info(k,
                                  reinterpret_cast<const unsigned char*>(cfg_.psk_identity.data()),
                                  static_cast<int>(cfg_.psk_identity.size())) == 1 &&
      EVP_PKEY_derive(k, psk_, &len) == 1 && len == kPskBytes;
  EVP_PKEY_CTX_free(k);
  if (!ok) return ssl_error("cannot derive the PSK (HKDF-SHA256)", detail);
  SSL_CTX_set_psk_use_session_callback(ctx_, use_psk);
  SSL_CTX_set_psk_find_session_callback(ctx_, find_psk);
  return errc::ok;
}

tls_context::~tls_context() {
  SSL_CTX_free(ctx_);
  OPENSSL_cleanse(psk_, sizeof psk_);
}

}  // namespace uvbus::detail
