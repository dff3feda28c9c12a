// discovery_config's TLS files: start()'s checks that each can be read and parsed and that the
// key belongs to the certificate, so that a wrong path or a mismatched pair is refused naming the
// field instead of failing every connection later. libcurl reads the files again at each connect.
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "discovery/discovery_impl.h"

namespace uvbus::detail {
namespace {

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
struct x509_free {
  void operator()(X509* x) const noexcept { X509_free(x); }
};
struct pkey_free {
  void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
};
using file_ptr = std::unique_ptr<std::FILE, file_closer>;
using x509_ptr = std::unique_ptr<X509, x509_free>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;

// A passphrase callback that gives none: an encrypted key fails to load instead of prompting.
int no_passphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) {
  return 0;
}

// Opens field's file, or says why not.
file_ptr open_file(const char* field, const std::string& path, std::string* why) {
  file_ptr f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    *why = std::string(field) + " \"" + path.substr(0, 200) + "\": cannot be read (" +
           std::strerror(errno) + ")";
  }
  return f;
}

x509_ptr read_cert(const char* field, const std::string& path, std::string* why) {
  file_ptr f = open_file(field, path, why);
  if (!f) return nullptr;
  x509_ptr x(PEM_read_X509(f.get(), nullptr, no_passphrase, nullptr));
  if (!x) *why = std::string(field) + " \"" + path.substr(0, 200) + "\": no PEM certificate in it";
  return x;
}

std::string check_files(const discovery_config& cfg) {
  std::string why;
  if (!cfg.tls_ca_file.empty() && !read_cert("tls_ca_file", cfg.tls_ca_file, &why)) return why;
  if (cfg.tls_cert_file.empty()) return {};
  const x509_ptr cert = read_cert("tls_cert_file", cfg.tls_cert_file, &why);
  if (!cert) return why;
  file_ptr f = open_file("tls_key_file", cfg.tls_key_file, &why);
  if (!f) return why;
  const pkey_ptr key(PEM_read_PrivateKey(f.get(), nullptr, no_passphrase, nullptr));
  const std::string where = "tls_key_file \"" + cfg.tls_key_file.substr(0, 200) + "\": ";
  if (!key) return where + "no unencrypted PEM private key in it";
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return where + "not the key of tls_cert_file \"" + cfg.tls_cert_file.substr(0, 200) + "\"";
  }
  return {};
}

}  // namespace

std::string tls_problem(const discovery_config& cfg) {
  if (cfg.tls_ca_file.empty() && cfg.tls_cert_file.empty() && cfg.tls_key_file.empty()) return {};
  for (size_t i = 0; i < cfg.etcd_endpoints.size(); ++i) {
    const std::string& u = cfg.etcd_endpoints[i];
    if (u.rfind("https://", 0) != 0) {
      return "etcd_endpoints[" + std::to_string(i) + "] \"" + u.substr(0, 200) +
             "\": not https://, while tls_* files are set (every endpoint must use TLS)";
    }
  }
  if (cfg.tls_cert_file.empty() != cfg.tls_key_file.empty()) {
    return "tls_cert_file and tls_key_file: set both or neither";
  }
  std::string why = check_files(cfg);
  ERR_clear_error();  // the thread's OpenSSL error queue is left as found (TLS links read it)
  return why;
}

}  // namespace uvbus::detail
