// TLS contexts: an OpenSSL SSL_CTX built from a tls_config (TLS 1.3 only, certificates or PSK).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "uvbus/error.h"
#include "uvbus/tls.h"

typedef struct ssl_ctx_st SSL_CTX;  // NOLINT(modernize-use-using): matches OpenSSL's declaration

namespace uvbus::detail {

// One SSL_CTX shared by every connection of a listener (or by one dial); it serves both roles.
// Immutable once built, so sessions may outlive the listener that created them.
class tls_context {
 public:
  // Checks cfg and builds the context: reads the certificate, key and CA files or derives the PSK.
  // Errors: invalid_argument (a missing or inconsistent setting: *detail names it), not_found /
  // permission_denied (a file: *detail names it), tls_handshake_failed (OpenSSL refused a file or
  // setting: *detail has OpenSSL's reason), no_memory.
  static errc create(const tls_config& cfg, std::shared_ptr<const tls_context>* out,
                     std::string* detail);
  // The settings, then what only OpenSSL can judge (a cipher suite name, a file's content): the
  // context is built once and dropped (stream_channel::validate(), node::validate()). Refuses as
  // create() does, except that a file that cannot be read now (not_found, permission_denied,
  // io_error) and no_memory pass: listen() and connect() read the files again and name them.
  static errc check(const tls_config& cfg, std::string* detail);

  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;
  ~tls_context();

  [[nodiscard]] SSL_CTX* ctx() const noexcept { return ctx_; }
  [[nodiscard]] const tls_config& config() const noexcept { return cfg_; }
  [[nodiscard]] const uint8_t* psk() const noexcept { return psk_; }
  static constexpr size_t kPskBytes = 32;

  // Certificate mode: whether the certificate, key or CA file changed on disk (device, inode,
  // size, mtime or ctime, as stat(2) follows a symlink) since this context read them. A channel's
  // default context is built again at the next listen() or connect() when they did.
  [[nodiscard]] bool files_changed() const;
  struct file_stamp {
    uint64_t dev = 0, ino = 0;
    int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
    bool operator!=(const file_stamp& o) const noexcept {
      return dev != o.dev || ino != o.ino || size != o.size || mtime_ns != o.mtime_ns ||
             ctime_ns != o.ctime_ns;
    }
  };

 private:
  tls_context() = default;
  // create() after the settings were checked.
  static errc build(const tls_config& cfg, std::shared_ptr<const tls_context>* out,
                    std::string* detail);
  errc load_certificates(std::string* detail);
  // The certificate chain and its key; *asked: our passphrase callback was called (encrypted).
  errc load_pair(const bool* asked, std::string* detail);
  errc setup_psk(std::string* detail);
  void stamp_files();

  SSL_CTX* ctx_ = nullptr;
  tls_config cfg_;
  uint8_t psk_[kPskBytes] = {};
  file_stamp stamps_[3];  // cert_file, key_file, ca_file when they were read
};

// OpenSSL's queued errors as one line ("error:...: reason; ..."), clearing the queue.
std::string openssl_errors();

}  // namespace uvbus::detail
