// Test certificates made at runtime with OpenSSL (no committed keys): a CA, server and client
// certificates (one server's for 127.0.0.1), an expired one, one for the wrong name and one from a
// rogue CA, as PEM files in a temporary directory that is removed afterwards.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace uvbus::test {

class test_pki {
 public:
  struct pair {
    std::string cert;
    std::string key;
  };

  test_pki() {
    char tmpl[] = "/tmp/uvbus-tls-XXXXXX";
    const char* d = mkdtemp(tmpl);
    dir_ = d != nullptr ? d : "/tmp";
    EVP_PKEY* ca_key = EVP_EC_gen("P-256");
    X509* ca = make("uvbus test CA", "", ca_key, nullptr, nullptr, true, -3600, 86400);
    ca_file = save(ca, ca_key, "ca").cert;
    server = issue("server.test", "server.test", ca, ca_key, -3600, 86400, "server");
    client = issue("node-42", "client.test", ca, ca_key, -3600, 86400, "client");
    loopback = issue("localhost", "IP:127.0.0.1", ca, ca_key, -3600, 86400, "loopback");
    long_cn = issue(kLongName.c_str(), "", ca, ca_key, -3600, 86400, "long-cn");
    expired = issue("node-42", "client.test", ca, ca_key, -172800, -86400, "expired");
    wrong_name = issue("mallory", "mallory.test", ca, ca_key, -3600, 86400, "wrong-name");
    // A common name with a line break (a careless CA), and one whose raw bytes are "AB" as a
    // BMPString (two bytes a character: U+4142), which a raw compare took for "AB".
    newline_cn = issue("node-42\nforged line", "", ca, ca_key, -3600, 86400, "newline-cn",
                       V_ASN1_UTF8STRING);
    bmp_cn = issue("AB", "", ca, ca_key, -3600, 86400, "bmp-cn", V_ASN1_BMPSTRING);
    renewed = issue("new", "", ca, ca_key, -3600, 86400, "renewed");
    EVP_PKEY* rogue_key = EVP_EC_gen("P-256");
    X509* rogue = make("rogue CA", "", rogue_key, nullptr, nullptr, true, -3600, 86400);
    rogue_client = issue("node-42", "client.test", rogue, rogue_key, -3600, 86400, "rogue");
    X509_free(rogue);
    EVP_PKEY_free(rogue_key);
    X509_free(ca);
    EVP_PKEY_free(ca_key);
  }
  ~test_pki() {
    for (const std::string& f : files_) std::remove(f.c_str());
    ::rmdir(dir_.c_str());
  }
  test_pki(const test_pki&) = delete;
  test_pki& operator=(const test_pki&) = delete;

  std::string ca_file;
  // A file with p's certificate followed by `copies` copies of the CA's: a chain about 0.6 KB
  // longer for each copy (p's key goes with it).
  std::string chain_file(const pair& p, int copies, const char* name) {
    std::string text = read(p.cert);
    const std::string ca = read(ca_file);
    for (int i = 0; i < copies; ++i) text += ca;
    return write((std::string(name) + ".crt").c_str(), text);
  }
  // A copy of the file at `from`, as `name` in the directory (removed with it).
  std::string copy(const std::string& from, const char* name) { return write(name, read(from)); }
  // p's private key, encrypted with AES-256-CBC under `pass`, as `name` in the directory.
  std::string encrypted_key(const pair& p, const char* pass, const char* name) {
    std::FILE* in = std::fopen(p.key.c_str(), "r");
    EVP_PKEY* key = in != nullptr ? PEM_read_PrivateKey(in, nullptr, nullptr, nullptr) : nullptr;
    if (in != nullptr) std::fclose(in);
    std::string text;
    BIO* mem = BIO_new(BIO_s_mem());
    if (key != nullptr && PEM_write_bio_PrivateKey(mem, key, EVP_aes_256_cbc(), nullptr, 0, nullptr,
                                                   const_cast<char*>(pass)) == 1) {
      char* d = nullptr;
      const long n = BIO_get_mem_data(mem, &d);  // NOLINT(google-runtime-int): OpenSSL's type
      text.assign(d, static_cast<size_t>(n));
    }
    BIO_free(mem);
    EVP_PKEY_free(key);
    return write(name, text);
  }
  // loopback: a server certificate for 127.0.0.1 (an IP subjectAltName), as etcd's in the tests.
  // long_cn: a client certificate whose common name is kLongName, 255 'n' and then "-evil".
  inline static const std::string kLongName = std::string(255, 'n') + "-evil";
  // renewed: a client certificate whose common name is "new" (a renewal written over another).
  pair server, client, expired, wrong_name, rogue_client, loopback, long_cn, newline_cn, bmp_cn,
      renewed;

 private:
  static X509* make(const char* cn, const char* dns, EVP_PKEY* key, X509* issuer,
                    EVP_PKEY* issuer_key, bool ca, long not_before_s, long not_after_s,
                    int cn_type = 0) {
    X509* x = X509_new();
    X509_set_version(x, 2);
    static long serial = 1;
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
    X509_gmtime_adj(X509_getm_notBefore(x), not_before_s);
    X509_gmtime_adj(X509_getm_notAfter(x), not_after_s);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    // Above 64 characters (the limit OpenSSL applies to a converted common name) as a raw
    // UTF8String, as a careless CA might sign it.
    const int type = cn_type != 0           ? cn_type
                     : std::strlen(cn) > 64 ? V_ASN1_UTF8STRING
                                            : MBSTRING_ASC;
    X509_NAME_add_entry_by_txt(name, "CN", type, reinterpret_cast<const unsigned char*>(cn), -1, -1,
                               0);
    X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
    add_ext(x, &v3, NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
    if (ca) add_ext(x, &v3, NID_key_usage, "critical,keyCertSign,cRLSign");
    add_ext(x, &v3, NID_subject_key_identifier, "hash");
    if (dns[0] != '\0') {  // a host name, or "IP:<address>" as given
      const std::string san =
          std::string(dns).rfind("IP:", 0) == 0 ? dns : std::string("DNS:") + dns;
      add_ext(x, &v3, NID_subject_alt_name, san.c_str());
    }
    X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
    return x;
  }
  static std::string read(const std::string& path) {
    std::string text;
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return text;
    char b[4096];
    for (size_t n = 0; (n = std::fread(b, 1, sizeof b, f)) != 0;) text.append(b, n);
    std::fclose(f);
    return text;
  }
  // Writes text as `name` in the directory (replacing it), removed with it.
  std::string write(const char* name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f != nullptr) {
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
    if (std::find(files_.begin(), files_.end(), path) == files_.end()) files_.push_back(path);
    return path;
  }
  static void add_ext(X509* x, X509V3_CTX* v3, int nid, const char* value) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, v3, nid, value);
    if (e == nullptr) return;
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
  }
  pair issue(const char* cn, const char* dns, X509* ca, EVP_PKEY* ca_key, long nb, long na,
             const char* file, int cn_type = 0) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* x = make(cn, dns, key, ca, ca_key, false, nb, na, cn_type);
    pair p = save(x, key, file);
    X509_free(x);
    EVP_PKEY_free(key);
    return p;
  }
  pair save(X509* x, EVP_PKEY* key, const char* name) {
    pair p{dir_ + "/" + name + ".crt", dir_ + "/" + name + ".key"};
    std::FILE* f = std::fopen(p.cert.c_str(), "w");
    if (f != nullptr) {
      PEM_write_X509(f, x);
      std::fclose(f);
    }
    f = std::fopen(p.key.c_str(), "w");
    if (f != nullptr) {
      PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
      std::fclose(f);
    }
    files_.push_back(p.cert);
    files_.push_back(p.key);
    return p;
  }

  std::string dir_;
  std::vector<std::string> files_;
};

}  // namespace uvbus::test
