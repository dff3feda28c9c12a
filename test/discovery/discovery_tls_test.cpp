// etcd_discovery over TLS against a real etcd that serves https and requires client certificates:
// a node with the CA and its certificate registers and watches; one without a client certificate,
// without the CA, or facing a certificate for another host never gets a session and logs why; bad
// TLS settings are refused by start() naming the field.
#include <curl/curl.h>

#include <string>

#include "discovery/discovery_harness.h"
#include "discovery/etcd_client.h"
#include "stream/tls_test_pki.h"

namespace uvbus::discovery_tls_test {
namespace {

using test::disc_instance;
using test::test_entry;

class DiscoveryTls : public test::discovery_fixture {
 protected:
  // etcd's files: its certificate (for 127.0.0.1 unless told otherwise) and the test CA.
  [[nodiscard]] test::etcd_tls_files etcd_files(const test::test_pki::pair& server) const {
    return {pki_.ca_file, server.cert, server.key, pki_.client.cert, pki_.client.key};
  }
  // A client configured with the CA and the client certificate.
  discovery_config tls_config() {
    discovery_config c = config();
    c.tls_ca_file = pki_.ca_file;
    c.tls_cert_file = pki_.client.cert;
    c.tls_key_file = pki_.client.key;
    return c;
  }
  // Runs until `in` failed `n` sessions; it must never have been connected.
  void expect_refused(disc_instance* in, size_t n = 2) {
    ASSERT_TRUE(wait([&] { return in->d->stats().failures >= n; })) << in->d->last_error().detail;
    EXPECT_EQ(in->ups, 0);
    EXPECT_FALSE(in->d->connected());
    EXPECT_TRUE(in->ids().empty());
    EXPECT_EQ(in->d->stats().registrations, 0U);
    EXPECT_TRUE(test::logged(in, "etcd https://127.0.0.1:")) << in->d->last_error().detail;
  }
  static std::string refusal(const discovery_config& c) {
    std::string why;
    return validate(c, &why) == errc::invalid_argument ? why : "accepted";
  }

  test::test_pki pki_;
};

TEST_F(DiscoveryTls, RegistersAndWatchesOverHttpsWithAClientCertificate) {
  const test::etcd_tls_files files = etcd_files(pki_.loopback);
  start_etcd(1, &files);
  ASSERT_EQ(etcd_->endpoint(0).rfind("https://", 0), 0U);
  const auto two = make_two(tls_config());  // a lambda cannot capture a structured binding in C++17
  disc_instance* a = two.first;
  disc_instance* b = two.second;
  ASSERT_FALSE(HasFailure());
  // A change travels over the TLS watch stream too.
  directory_entry moved = test_entry(0x10);
  moved.labels = {{"zone", "c"}};
  ASSERT_EQ(a->d->update_self(moved), errc::ok);
  ASSERT_TRUE(wait([&] { return b->count(directory_event::changed, 0x10) == 1; }));
}

TEST_F(DiscoveryTls, WithoutAClientCertificateEtcdRefusesEverySession) {
  const test::etcd_tls_files files = etcd_files(pki_.loopback);
  start_etcd(1, &files);
  discovery_config c = tls_config();
  c.tls_cert_file.clear();
  c.tls_key_file.clear();
  disc_instance* a = make(test_entry(0x10), c);
  expect_refused(a);
  // etcd's refusal. Under TLS 1.3 the client's handshake ends before the server has checked for a
  // certificate, so the refusal reaches the client either as the server's alert or, when the
  // server has closed before the client's first request went out, as a reset on that send
  // (seen under ThreadSanitizer's timing).
  EXPECT_TRUE(test::logged(a, "SSL", "alert") ||
              test::logged(a, "connection_reset", "Failed sending data"))
      << a->d->last_error().detail;
}

TEST_F(DiscoveryTls, WithoutTheCaEtcdsCertificateIsNotTrusted) {
  const test::etcd_tls_files files = etcd_files(pki_.loopback);
  start_etcd(1, &files);
  discovery_config c = tls_config();
  c.tls_ca_file.clear();  // the system's CA store does not know the test CA
  disc_instance* a = make(test_entry(0x10), c);
  expect_refused(a);
  EXPECT_TRUE(test::logged(a, "peer_not_authenticated", "unable to get local issuer certificate"))
      << a->d->last_error().detail;
}

TEST_F(DiscoveryTls, ACertificateForAnotherHostIsRefused) {
  const test::etcd_tls_files files = etcd_files(pki_.server);  // for server.test, not 127.0.0.1
  start_etcd(1, &files);
  disc_instance* a = make(test_entry(0x10), tls_config());
  expect_refused(a);
  EXPECT_TRUE(test::logged(a, "peer_not_authenticated", "target host name '127.0.0.1'"))
      << a->d->last_error().detail;
}

// tls_ca_file is the only CA trusted: Debian's libcurl also keeps its built-in CA directory
// (/etc/ssl/certs) beside CURLOPT_CAINFO unless told not to, so a certificate from any public CA
// for etcd's host name was accepted. A test cannot put a CA into that directory: it checks what
// curl reports using for the connection (its verbose text) with etcd_client's TLS options.
TEST_F(DiscoveryTls, TheCaFileIsTheOnlyTrustAnchor) {
  const test::etcd_tls_files files = etcd_files(pki_.loopback);
  start_etcd(1, &files);
  CURL* e = curl_easy_init();
  ASSERT_NE(e, nullptr);
  detail::set_tls_options(e, {pki_.ca_file, pki_.client.cert, pki_.client.key});
  std::string text;
  const std::string url = etcd_->endpoint(0) + "/version";
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 30000L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_VERBOSE, 1L);
  curl_easy_setopt(
      e, CURLOPT_DEBUGFUNCTION, +[](CURL*, curl_infotype t, char* d, size_t n, void* u) {
        if (t == CURLINFO_TEXT) static_cast<std::string*>(u)->append(d, n);
        return 0;
      });
  curl_easy_setopt(e, CURLOPT_DEBUGDATA, &text);
  curl_easy_setopt(
      e, CURLOPT_WRITEFUNCTION, +[](char*, size_t s, size_t n, void*) { return s * n; });
  const CURLcode rc = curl_easy_perform(e);
  curl_easy_cleanup(e);
  EXPECT_EQ(rc, CURLE_OK) << curl_easy_strerror(rc) << "\n" << text;  // the CA file is trusted
  EXPECT_NE(text.find("CAfile: " + pki_.ca_file), std::string::npos) << text;
  EXPECT_NE(text.find("CApath: none"), std::string::npos) << text;
}

TEST_F(DiscoveryTls, BadSettingsAreRefusedNamingTheField) {
  discovery_config c;
  c.etcd_endpoints = {"https://127.0.0.1:2379"};
  c.tls_ca_file = pki_.ca_file;
  c.tls_cert_file = pki_.client.cert;
  c.tls_key_file = pki_.client.key;
  std::string why;
  ASSERT_EQ(validate(c, &why), errc::ok) << why;

  discovery_config bad = c;
  bad.tls_ca_file = "/nonexistent/uvbus-ca.pem";
  EXPECT_NE(refusal(bad).find("tls_ca_file \"/nonexistent/uvbus-ca.pem\": cannot be read"),
            std::string::npos)
      << refusal(bad);
  bad = c;
  bad.tls_ca_file = pki_.client.key;  // a key, no certificate
  EXPECT_NE(refusal(bad).find("tls_ca_file"), std::string::npos) << refusal(bad);
  EXPECT_NE(refusal(bad).find("no PEM certificate"), std::string::npos) << refusal(bad);
  bad = c;
  bad.tls_key_file.clear();
  EXPECT_NE(refusal(bad).find("set both or neither"), std::string::npos) << refusal(bad);
  bad = c;
  bad.tls_cert_file.clear();
  EXPECT_NE(refusal(bad).find("set both or neither"), std::string::npos) << refusal(bad);
  bad = c;
  bad.tls_key_file = pki_.loopback.key;  // another certificate's key
  EXPECT_NE(refusal(bad).find("not the key of tls_cert_file"), std::string::npos) << refusal(bad);
  bad = c;
  bad.tls_key_file = pki_.client.cert;  // a certificate, no key
  EXPECT_NE(refusal(bad).find("no unencrypted PEM private key"), std::string::npos) << refusal(bad);
  bad = c;
  bad.etcd_endpoints = {"https://127.0.0.1:2379", "http://127.0.0.1:2380"};
  EXPECT_NE(refusal(bad).find("etcd_endpoints[1] \"http://127.0.0.1:2380\": not https://"),
            std::string::npos)
      << refusal(bad);

  // start() refuses the same way and keeps the reason.
  bad = c;
  bad.tls_cert_file = "/nonexistent/uvbus-client.pem";
  etcd_discovery d(&loop_, bad, {});
  EXPECT_EQ(d.start(test_entry(0x10)), errc::invalid_argument);
  EXPECT_NE(d.last_error().detail.find("tls_cert_file"), std::string::npos)
      << d.last_error().detail;
}

}  // namespace
}  // namespace uvbus::discovery_tls_test
