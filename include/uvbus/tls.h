// Encrypted, mutually authenticated stream links: the TLS settings of a listener or a dial.
//
// TLS 1.3 only (OpenSSL 3), in one of two modes:
//   * certificate: each side presents a certificate chain signed by ca_file and checks the peer's
//     (the accepting side requires one: a client without a certificate is refused), optionally
//     also that the peer's certificate names expected_peer (its CN or a subjectAltName entry).
//   * psk: TLS 1.3 external pre-shared key derived from a shared access token (HKDF-SHA256), for
//     clusters without a PKI. Knowing the token is what authenticates each side: a peer that
//     offers a certificate instead (a TLS 1.3 server may ignore the PSK) is refused with
//     errc::peer_not_authenticated. The handshake still runs (EC)DHE, so a token leaked later does
//     not decrypt recorded traffic.
// The stream frames (MurmurHash3 + length) travel unchanged inside the TLS records. Settings are
// checked (and the files read) when listen() or connect() is called; errors name the file or the
// setting (stream_channel::last_error()). The channel's default (stream_config::tls) is read at
// the first call and again at a later one whenever a file changed on disk (stat(2): device,
// inode, size, mtime, ctime), so a renewed certificate is used by the next dial or listen;
// connections made before keep what their call read. A listener checks its files the same way at
// each accept, so connections it accepts after a renewal present the new certificate. A key file
// must be unencrypted (one needing a passphrase is invalid_argument, "... is encrypted"; nothing
// prompts or reads stdin). stream_channel::validate() checks them too, building
// the TLS context once (a suite name or a file's content OpenSSL refuses is invalid_argument
// there); only a file it cannot read at that moment is left to listen() and connect().
#pragma once

#include <cstdint>
#include <string>

namespace uvbus {

enum class tls_mode : uint8_t {
  off,          // clear text (the default)
  certificate,  // TLS 1.3 with X.509 certificates on both sides
  psk,          // TLS 1.3 with an external PSK derived from psk_token
};

inline constexpr uint64_t kDefaultKeyUpdateBytes = uint64_t{1} << 30;
inline constexpr uint32_t kDefaultKeyUpdateIntervalMs = 3600U * 1000U;
inline constexpr uint32_t kDefaultMaxPeerCertChainBytes = 100U * 1024U;

struct tls_config {
  tls_mode mode = tls_mode::off;

  // Certificate mode: PEM files. cert_file holds our certificate followed by its intermediates;
  // key_file its private key; ca_file the CA certificate(s) the peer's chain must lead to.
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  // When not empty, the peer's certificate must carry exactly this string as its subject CN or as
  // a subjectAltName (DNS, URI or e-mail) entry: a host name, or a bus node id written into the
  // certificate. Empty: any certificate the CA signed is accepted.
  std::string expected_peer;

  // PSK mode: the shared access token (at least 16 bytes) and the PSK identity both sides use
  // (1 to 1024 bytes: it travels in every ClientHello). The key is HKDF-SHA256(token, salt
  // "uvbus tls 1.3 psk", info identity), 32 bytes.
  std::string psk_token;
  std::string psk_identity = "uvbus";

  // TLS 1.3 cipher suites (OpenSSL's syntax). Empty: OpenSSL's default list in certificate mode;
  // TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256 in psk mode, whose key is bound to SHA-256
  // (a psk-mode list holding any suite that is not *_SHA256 is refused with invalid_argument: a
  // server preferring that suite would skip the key and fail every handshake). A list OpenSSL
  // refuses is invalid_argument too, from validate() or when a listen or dial builds the context
  // (the detail names the list), and so is one holding any name that is not one of RFC 8446's
  // five TLS 1.3 suites (the detail names it): OpenSSL would drop an unknown name silently, and
  // take a TLS 1.2 suite's standard name (TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256), failing every
  // handshake ("no ciphers available"). A TLS 1.3 suite this OpenSSL lacks (ChaCha20 under a FIPS
  // provider) is dropped by OpenSSL, as before.
  std::string ciphersuites;

  // A connection that has not finished its handshake within this time is closed with
  // errc::timeout (a peer that stalls mid-handshake holds at most one TLS record meanwhile).
  uint32_t handshake_timeout_ms = 10000;
  // Our sending key is renewed (TLS 1.3 KeyUpdate) when this much time has passed or this many
  // plaintext bytes were sent under it, whichever comes first; checked on each flush. 0: never.
  uint32_t key_update_interval_ms = kDefaultKeyUpdateIntervalMs;
  uint64_t key_update_bytes = kDefaultKeyUpdateBytes;
  // A peer that sends more than max_peer_key_updates KeyUpdate messages within
  // key_update_window_ms is closed with errc::protocol_error (a KeyUpdate storm). 0: no limit.
  // Our replies wait behind a write the peer does not read: once they hold more than the send
  // queue's bound (stream_config::queue.ring_bytes, max_bytes in dynamic mode), the connection is
  // closed with errc::protocol_error too (counted in tls_failed, logged), whatever this limit.
  // Both ends of a link are taken to use one config: when max_peer_key_updates is not 0, our own
  // renewals must stay within it (errc::invalid_argument otherwise, "...KeyUpdate storm to a peer
  // with these settings"): key_update_interval_ms x max_peer_key_updates above
  // key_update_window_ms, and key_update_bytes at least key_update_window_ms x 1 250 000 /
  // max_peer_key_updates (the renewals of a 10 Gbit/s link), unless 0.
  uint32_t max_peer_key_updates = 32;
  uint32_t key_update_window_ms = 10000;
  // Certificate mode: the largest certificate chain (the TLS Certificate message, in bytes) taken
  // from the peer, on either side. A longer one fails the handshake with
  // errc::tls_handshake_failed, the detail naming this setting. Until its handshake ends or
  // handshake_timeout_ms passes, a peer can make us hold about this much: lower it where chains
  // are known to be short (one P-256 certificate is about 0.5 KB; post-quantum chains reach tens
  // of KB). At least 1024 (errc::invalid_argument below). The default is OpenSSL's own.
  uint32_t max_peer_cert_chain_bytes = kDefaultMaxPeerCertChainBytes;
};

}  // namespace uvbus
