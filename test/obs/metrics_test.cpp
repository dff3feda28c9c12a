// Metrics: prom_text's format (checked by promtool; numbers exact in any locale, labels made
// UTF-8), the HTTP endpoint (curl from a helper thread while the loop serves; 404, 405, stalled and
// garbage clients), and a node's scraped figures against its own counters after known traffic.
#include <sys/socket.h>
#include <unistd.h>

#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "bus/bus_harness.h"
#include "core/utf8.h"
#include "obs/http_endpoint.h"
#include "obs/prom_text.h"

namespace uvbus::metrics_test {
namespace {

using obs::label;
using obs::metric_type;
using obs::prom_text;
using test::bus_fixture;
using test::fast_config;

// `promtool check metrics` on text: its complaints (empty: clean).
std::string promtool_problems(const std::string& text) {
  const std::string path = "/tmp/" + test::unique_name("metrics") + ".txt";
  std::ofstream(path) << text;
  const std::string out =
      test::command_output("promtool check metrics < " + path + " 2>&1; echo rc=$?");
  ::unlink(path.c_str());
  return out == "rc=0\n" ? std::string() : out;
}

struct http_result {
  int status = 0;
  std::string body;
};

// Fetches url with curl on a helper thread while `loop` runs (the endpoint serves from it).
http_result fetch(uv_loop_t* loop, const std::string& url, const std::string& extra = "") {
  http_result r;
  bool done = false;
  std::thread t([&] {
    const std::string out =
        test::command_output("curl -s -m 20 " + extra + " -w '\\n%{http_code}' '" + url + "'");
    const size_t nl = out.rfind('\n');
    r.body = nl == std::string::npos ? out : out.substr(0, nl);
    r.status = nl == std::string::npos
                   ? 0
                   : static_cast<int>(std::strtol(out.c_str() + nl + 1, nullptr, 10));
  });
  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    t.join();
    finished = true;
  });
  test::run_until(
      loop, [&] { return finished.load(); }, test::kWait);
  watcher.join();
  done = finished;
  EXPECT_TRUE(done);
  return r;
}

// The value of the first sample line starting with `series ` in text (-1 if none).
double value_of(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + key.size(), nullptr);
}

TEST(PromText, EscapesAndValidatesAndPassesPromtool) {
  prom_text t;
  t.family("demo_requests_total", "Requests, with \"quotes\" and a \\ and\na newline.",
           metric_type::counter);
  const label l[] = {{"path", "/a\"b\\c\nd"}, {"code", "200"}};
  t.sample(l, 2, 42);
  t.family("demo_temperature_celsius", "A gauge.", metric_type::gauge);
  t.sample(-1.5);
  t.family("9bad name", "skipped", metric_type::gauge);
  t.sample(1);
  t.family("demo_latency_seconds", "A histogram.", metric_type::histogram);
  const std::pair<double, uint64_t> b[] = {{0.001, 3}, {0.01, 7}, {0.1, 9}};
  t.histogram(nullptr, 0, b, 3, 0.25, 10);
  EXPECT_EQ(t.bad_names(), 1u);
  const std::string s = t.text();
  EXPECT_NE(s.find(R"(demo_requests_total{path="/a\"b\\c\nd",code="200"} 42)"), std::string::npos)
      << s;
  EXPECT_NE(s.find("demo_latency_seconds_bucket{le=\"+Inf\"} 10"), std::string::npos) << s;
  EXPECT_EQ(s.find("9bad"), std::string::npos);
  EXPECT_EQ(promtool_problems(s), "");
}

// The one sample of a one-family text: a gauge demo_value holding v.
std::string one_sample(double v) {
  prom_text t;
  t.family("demo_value", "A value.", metric_type::gauge);
  t.sample(v);
  return t.text();
}

// Every value is written with as many digits as read back exactly (at least %.9g's nine): %.9g
// cut a counter of 1e16 + 2 to 1e+16 and a _sum of 1234567.891 to 1234567.89. Integers stay
// integers, up to 2^64.
TEST(PromText, NumbersReadBackExactly) {
  const double values[] = {1e16 + 2,
                           1234567.891,
                           0.1 + 0.2,
                           18446744073709549568.0,
                           -9007199254740993e3,
                           1e300,
                           5e-324,
                           -2.5e-300,
                           42,
                           -1.5,
                           0.000128,
                           1e25};
  for (const double v : values) {
    const std::string s = one_sample(v);
    const std::string key = "\ndemo_value ";
    const size_t at = s.find(key);
    ASSERT_NE(at, std::string::npos) << s;
    char* end = nullptr;
    EXPECT_EQ(std::strtod(s.c_str() + at + key.size(), &end), v) << s;
    EXPECT_EQ(*end, '\n') << s;
  }
  EXPECT_NE(one_sample(1e16 + 2).find(" 10000000000000002\n"), std::string::npos);
  EXPECT_NE(one_sample(18446744073709549568.0).find(" 18446744073709549568\n"), std::string::npos);
  EXPECT_NE(one_sample(1234567.891).find(" 1234567.891\n"), std::string::npos);
  EXPECT_NE(one_sample(-0.0).find(" 0\n"), std::string::npos);
  EXPECT_NE(one_sample(std::nan("")).find(" NaN\n"), std::string::npos);
  EXPECT_NE(one_sample(-HUGE_VAL).find(" -Inf\n"), std::string::npos);
}

// The le labels of a node's latency buckets (1 us to 8.388608 s, doubling) are what %.9g wrote:
// a label's value names the series, a changed spelling would start new ones.
TEST(PromText, DefaultBucketLabelsKeepTheirSpelling) {
  std::pair<double, uint64_t> b[24];
  uint64_t ns = 1000;
  for (auto& x : b) {
    x = {static_cast<double>(ns) / 1e9, 0};
    ns *= 2;
  }
  prom_text t;
  t.family("demo_latency_seconds", "A histogram.", metric_type::histogram);
  t.histogram(nullptr, 0, b, 24, 0, 0);
  for (const auto& x : b) {
    char le[32];
    std::snprintf(le, sizeof le, "%.9g", x.first);  // this test runs in the "C" locale
    EXPECT_NE(t.text().find("{le=\"" + std::string(le) + "\"} 0\n"), std::string::npos) << le;
  }
  EXPECT_NE(t.text().find("{le=\"1.6e-05\"}"), std::string::npos);
  EXPECT_NE(t.text().find("{le=\"0.000128\"}"), std::string::npos);
  EXPECT_NE(t.text().find("{le=\"8.388608\"}"), std::string::npos);
}

// The process's locale set to one whose decimal point is a comma (de_DE.UTF-8) while this lives,
// as a Qt application sets it: the installed one, else one compiled by localedef from the sources
// of Debian's `locales` package into a directory removed at the end. ok(): false when neither is
// there.
class comma_locale {
 public:
  comma_locale() : old_(std::setlocale(LC_ALL, nullptr)) {
    ok_ = std::setlocale(LC_ALL, "de_DE.UTF-8") != nullptr;
    if (ok_) return;
    dir_ = "/tmp/" + test::unique_name("locale");
    (void)test::command_output("mkdir -p '" + dir_ + "' && localedef -i de_DE -f UTF-8 '" + dir_ +
                               "/de_DE.UTF-8' 2>&1");
    ::setenv("LOCPATH", dir_.c_str(), 1);
    ok_ = std::setlocale(LC_ALL, "de_DE.UTF-8") != nullptr;
    ::unsetenv("LOCPATH");
  }
  ~comma_locale() {
    std::setlocale(LC_ALL, old_.c_str());
    if (!dir_.empty()) test::command_output("rm -rf '" + dir_ + "'");
  }
  comma_locale(const comma_locale&) = delete;
  comma_locale& operator=(const comma_locale&) = delete;
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  std::string old_;
  std::string dir_;
  bool ok_ = false;
};

// Numbers are written the same in every locale: after setlocale(LC_ALL, "de_DE.UTF-8") (a Qt
// application does it) printf wrote `12,345` and le="1,6e-05", and every scrape failed.
TEST(PromText, NumbersIgnoreTheLocale) {
  const comma_locale de;
  if (!de.ok()) {
    GTEST_SKIP() << "no de_DE.UTF-8 locale, and localedef could not build one (the Debian "
                    "package `locales` holds its sources)";
  }
  char probe[8];
  std::snprintf(probe, sizeof probe, "%.1f", 0.5);
  ASSERT_STREQ(probe, "0,5");  // the locale is in effect
  prom_text t;
  t.family("demo_uptime_seconds", "A gauge.", metric_type::gauge);
  t.sample(12.345);
  t.family("demo_latency_seconds", "A histogram.", metric_type::histogram);
  const std::pair<double, uint64_t> b[] = {{1.6e-5, 1}, {0.25, 2}};
  t.histogram(nullptr, 0, b, 2, 0.5, 3);
  const std::string s = t.text();
  EXPECT_NE(s.find("demo_uptime_seconds 12.345\n"), std::string::npos) << s;
  EXPECT_NE(s.find("{le=\"1.6e-05\"} 1\n"), std::string::npos) << s;
  EXPECT_NE(s.find("demo_latency_seconds_sum 0.5\n"), std::string::npos) << s;
  EXPECT_EQ(s.find(','), std::string::npos) << s;
  EXPECT_EQ(promtool_problems(s), "");
}

// Label values and HELP text go out as UTF-8 whatever bytes they came from: a shm ring named
// "shm://caf\xe9" (Latin-1) went into ring="..." as it was, and Prometheus refuses a scrape with a
// label value that is not UTF-8. Each byte of no well-formed sequence becomes U+FFFD.
TEST(PromText, LabelValuesAreMadeUtf8) {
  prom_text t;
  t.family("demo_ring_bytes", "Bytes of caf\xe9.", metric_type::gauge);
  const label l[] = {{"ring", "shm://caf\xe9"}, {"name", "\xe6\x97\xa5 \xed\xa0\x80|\xc3"}};
  t.sample(l, 2, 1);
  const std::string s = t.text();
  EXPECT_TRUE(detail::valid_utf8(s)) << s;
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_NE(s.find("ring=\"shm://caf" + fffd + "\""), std::string::npos) << s;
  EXPECT_NE(s.find("name=\"\xe6\x97\xa5 " + fffd + fffd + fffd + "|" + fffd + "\""),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("Bytes of caf" + fffd + ".\n"), std::string::npos) << s;
  EXPECT_EQ(promtool_problems(s), "");
}

TEST(HttpEndpoint, BadUrlsAreRefusedWithTheReason) {
  obs::http_url u;
  std::string why;
  EXPECT_EQ(obs::parse_http_url("ftp://x:1", &u, &why), errc::bad_url);
  EXPECT_EQ(obs::parse_http_url("http://127.0.0.1", &u, &why), errc::bad_url);
  EXPECT_NE(why.find("port"), std::string::npos);
  EXPECT_EQ(obs::parse_http_url("http://127.0.0.1:70000/", &u, &why), errc::bad_url);
  EXPECT_EQ(obs::parse_http_url("http://[::1:9", &u, &why), errc::bad_url);
  ASSERT_EQ(obs::parse_http_url("http://[::1]:9464", &u, &why), errc::ok);
  EXPECT_TRUE(u.ipv6);
  EXPECT_EQ(u.path, "/metrics");
  node_config c;
  c.metrics_url = "http://nowhere";
  EXPECT_EQ(node::validate(1, c, &why), errc::bad_url);
  EXPECT_NE(why.find("metrics_url"), std::string::npos) << why;
  c = node_config{};
  c.latency_sample_every = 12;
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("latency_sample_every"), std::string::npos) << why;
}

class NodeMetricsTest : public bus_fixture {};

TEST_F(NodeMetricsTest, ScrapedFiguresMatchTheCountersAndPassPromtool) {
  node_config pc = fast_config();
  pc.subnets = {{0x100, 8}};
  pc.metrics_url = "http://127.0.0.1:0/metrics";
  pc.metrics_max_peers = 1;  // the second child is summed into peer="other"
  test::bus_node* p = make(0x100, pc);
  const std::string url = p->n->metrics_url();
  ASSERT_FALSE(url.empty());
  EXPECT_EQ(url.find(":0/"), std::string::npos) << url;
  node_config ac = fast_config(p->n->listen_urls().at(0));
  ac.sibling_direct = false;
  test::bus_node* a = make(0x101, ac);
  test::bus_node* b = make(0x102, fast_config(p->n->listen_urls().at(0)));
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  for (uint64_t v = 0; v < 100; ++v) ASSERT_EQ(a->n->send_data(0x102, 1, &v, sizeof v), errc::ok);
  ASSERT_TRUE(wait([&] { return a->reports.size() == 100; }));

  const http_result r = fetch(&loop_, url);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(promtool_problems(r.body), "");
  const node_counters c = p->n->counters();
  EXPECT_EQ(value_of(r.body, "uvbus_node_forwarded_total"), static_cast<double>(c.forwarded));
  EXPECT_GE(c.forwarded, 100u);
  EXPECT_EQ(value_of(r.body, "uvbus_node_peers"), 2);
  EXPECT_NE(r.body.find("uvbus_peer_sent_bytes_total{peer=\"0x101\",role=\"child\""),
            std::string::npos);
  EXPECT_NE(r.body.find("peer=\"other\""), std::string::npos);
  EXPECT_EQ(r.body.find("peer=\"0x102\""), std::string::npos);  // over the cap: summed
  // The endpoint's own closes (request deadline, out of descriptors) are series too.
  EXPECT_EQ(value_of(r.body, "uvbus_metrics_deadline_closes_total"), 0);
  EXPECT_EQ(value_of(r.body, "uvbus_metrics_shed_clients_total"), 0);
  // The sender's own text (no endpoint): its reports.
  const std::string at = a->n->metrics_text();
  EXPECT_EQ(value_of(at, "uvbus_node_reports_total{status=\"ok\"}"), 100);
  EXPECT_EQ(value_of(b->n->metrics_text(), "uvbus_node_messages_delivered_total"), 100);
  EXPECT_EQ(promtool_problems(at), "");

  const http_result missing = fetch(&loop_, url + "x");
  EXPECT_EQ(missing.status, 404);
  const http_result post = fetch(&loop_, url, "-X POST");
  EXPECT_EQ(post.status, 405);
}

TEST_F(NodeMetricsTest, StalledAndGarbageClientsDoNotStopTheScrape) {
  node_config pc = fast_config();
  pc.metrics_url = "http://127.0.0.1:0/metrics";
  test::bus_node* p = make(0x100, pc);
  const std::string url = p->n->metrics_url();
  const uint16_t port = static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
  std::vector<int> fds;
  // Connect and say nothing, or garbage, each from an address of its own (127.0.0.10 ..): from
  // curl's 127.0.0.1 they would meet the per-address limit (4), and whether curl got in then
  // depended on the endpoint reading the garbage before accepting curl.
  for (int i = 0; i < 6; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 9 + static_cast<uint32_t>(i));
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << errno;
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(port);
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&in), sizeof in), 0);
    if (i % 2 == 1) {
      const char junk[] = "\x16\x03\x01 not http at all\r\n\r\n";
      ASSERT_GT(::send(fd, junk, sizeof junk, MSG_NOSIGNAL), 0);
    }
    fds.push_back(fd);
  }
  const http_result r = fetch(&loop_, url);
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("uvbus_node_info"), std::string::npos);
  for (const int fd : fds) ::close(fd);
  // Taken port: the second node's start fails and says why.
  node_config qc = fast_config();
  qc.metrics_url = url;
  test::bus_node* q = make(0x200, qc, false);
  EXPECT_EQ(q->n->start(), errc::address_in_use);
  EXPECT_NE(q->n->last_error().detail.find("metrics_url"), std::string::npos)
      << q->n->last_error().detail;
}

TEST_F(NodeMetricsTest, LatencyHistogramsPerTargetAndTypeWhenAskedFor) {
  test::bus_node* p = nullptr;
  node_config ac = make_root_for_sender(&p);
  ac.latency_histograms = true;
  ac.latency_sample_every = 1;  // every message: exact counts below
  test::bus_node* a = make(0x101, ac);
  test::bus_node* b = make_child(0x102, p);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  for (uint64_t v = 0; v < 200; ++v) {
    ASSERT_EQ(a->n->send_data(0x102, v < 150 ? 7 : 8, &v, sizeof v), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return a->reports.size() == 200; }));
  latency_percentiles lp;
  ASSERT_TRUE(a->n->latency_to(0x102, &lp));
  EXPECT_EQ(lp.count, 200u);
  EXPECT_GT(lp.p50, 0u);
  EXPECT_LE(lp.p50, lp.p99);
  EXPECT_LE(lp.p99, lp.max);
  ASSERT_TRUE(a->n->latency_of_type(7, &lp));
  EXPECT_EQ(lp.count, 150u);
  ASSERT_TRUE(a->n->latency_of_type(8, &lp));
  EXPECT_EQ(lp.count, 50u);
  EXPECT_FALSE(a->n->latency_of_type(9, &lp));
  EXPECT_FALSE(b->n->latency_to(0x101, &lp));  // not asked for there
  const std::string text = a->n->metrics_text();
  EXPECT_EQ(value_of(text, "uvbus_flow_ack_latency_seconds_count{target=\"0x102\"}"), 200);
  EXPECT_EQ(value_of(text, "uvbus_type_ack_latency_seconds_count{type=\"7\"}"), 150);
  EXPECT_EQ(value_of(text, "uvbus_flow_ack_latency_seconds_bucket{target=\"0x102\",le=\"+Inf\"}"),
            200);
  EXPECT_EQ(promtool_problems(text), "");
}

}  // namespace
}  // namespace uvbus::metrics_test
