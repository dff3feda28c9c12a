// Registration authentication: HMAC-SHA256 challenge-response, computed with OpenSSL's libcrypto.
//
// The accepting side sends a fresh random nonce; the connector answers with
// HMAC-SHA256(token, proto::auth_input(nonce, id, role)). The acceptor recomputes the MAC for every
// token it accepts (several at once, so tokens can be rotated without a flag day) and compares in
// constant time. A captured proof is useless later: the next registration gets another nonce.
// From protocol version 6 the acceptor proves itself too: the connector sends a nonce of its own
// in the registration and the acceptor answers with HMAC-SHA256(token, accept_auth_input(...))
// using the token the connector's proof matched; the connector checks it against its tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/utf8.h"  // printable(), which the users of this header take from it

namespace uvbus::detail {

inline constexpr size_t kMacSize = 32;

// Fills out with cryptographically random bytes (RAND_bytes). False if the generator failed.
[[nodiscard]] bool random_bytes(uint8_t* out, size_t n) noexcept;

// out = HMAC-SHA256(key, data). False only if libcrypto failed.
[[nodiscard]] bool hmac_sha256(const std::string& key, const uint8_t* data, size_t n,
                               uint8_t out[kMacSize]) noexcept;

// True if proof equals HMAC-SHA256(t, data) for some t in tokens. Every token is tried (no early
// exit) and each comparison is constant-time, so timing says nothing about which token or byte
// matched. An empty token list matches nothing: the caller decides whether auth is required.
// *which (if given) gets the index of the first matching token (the acceptor answers with it).
[[nodiscard]] bool verify_proof(const std::vector<std::string>& tokens, const uint8_t* data,
                                size_t n, const uint8_t proof[kMacSize],
                                size_t* which = nullptr) noexcept;

// A stable identity of the machine (kernel instance) this process runs on, equal for two processes
// exactly when they can share memory through /dev/shm in the usual setups: the kernel's boot_id
// (/proc/sys/kernel/random/boot_id, fresh per boot, the same in every container on the kernel)
// joined with the hostname (containers in separate UTS namespaces, which usually also have separate
// /dev/shm, differ there). Falls back to /etc/machine-id, then the hostname alone.
[[nodiscard]] std::string host_identity();
// gethostname(), or "unknown".
[[nodiscard]] std::string host_name();

// What is wrong with an acceptance a connector got (empty: nothing): the protocol version the
// acceptor chose must lie in the connector's [min_version, max_version] and its bus id must not be
// 0 ("no node"). With access tokens the acceptor's proof binds its id; without them this is all
// that keeps a broken or hostile acceptor from registering us under a version we never offered.
[[nodiscard]] std::string reply_fault(uint8_t version, uint64_t acceptor_id, uint8_t min_version,
                                      uint8_t max_version);

}  // namespace uvbus::detail
