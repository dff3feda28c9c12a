// Registration authentication: HMAC-SHA256 proofs, random nonces, the host identity and the
// fields of a registration reply a connector checks (peer text made safe for logs: core/utf8.h).
#include "bus/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <fstream>

#include "core/utf8.h"

namespace uvbus::detail {

bool random_bytes(uint8_t* out, size_t n) noexcept {
  return n <= INT_MAX && RAND_bytes(out, static_cast<int>(n)) == 1;
}

bool hmac_sha256(const std::string& key, const uint8_t* data, size_t n,
                 uint8_t out[kMacSize]) noexcept {
  unsigned int len = 0;
  if (key.size() > INT_MAX) return false;
  static const uint8_t kEmpty = 0;
  const uint8_t* in = n == 0 ? &kEmpty : data;
  return HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), in, n, out, &len) !=
             nullptr &&
         len == kMacSize;
}

bool verify_proof(const std::vector<std::string>& tokens, const uint8_t* data, size_t n,
                  const uint8_t proof[kMacSize], size_t* which) noexcept {
  int matched = 0;
  size_t first = 0;
  for (const std::string& t : tokens) {
    uint8_t mac[kMacSize] = {};
    const bool ok = hmac_sha256(t, data, n, mac);
    const int hit = ok && CRYPTO_memcmp(mac, proof, kMacSize) == 0 ? 1 : 0;
    // Branch-free: the first matching index, without an early exit.
    first += static_cast<size_t>(matched == 0 && hit == 0 ? 1 : 0);
    matched |= hit;
  }
  if (which != nullptr) *which = first;
  return matched != 0;
}

namespace {
std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!f || !std::getline(f, s)) return {};
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}
}  // namespace

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string host_identity() {
  std::string id = first_line("/proc/sys/kernel/random/boot_id");
  if (id.empty()) id = first_line("/etc/machine-id");
  std::string out = id + "/" + host_name();
  if (out.size() > 128) out.resize(128);
  return out;
}

std::string reply_fault(uint8_t version, uint64_t acceptor_id, uint8_t min_version,
                        uint8_t max_version) {
  char buf[128];
  if (version < min_version || version > max_version) {
    std::snprintf(buf, sizeof buf,
                  "the acceptor negotiated protocol version %u, outside ours (%u..%u)",
                  static_cast<unsigned>(version), static_cast<unsigned>(min_version),
                  static_cast<unsigned>(max_version));
    return buf;
  }
  if (acceptor_id == 0) return "the acceptor answered with bus id 0 (reserved: \"no node\")";
  return {};
}

}  // namespace uvbus::detail
