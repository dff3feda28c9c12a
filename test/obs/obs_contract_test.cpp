// Promises of the observability layer no other test checks: latency_histogram's nearest rank at
// the edges of floating point (p99.9 of 1 000 values), and parse_http_url's HOST (a literal or
// localhost, refused by node::validate() too) and PATH (no query, fragment or %: never served), and
// docs/observability.md's family table naming every family a node renders, the flow latency
// series past metrics_max_peers summed under target="other", and peer="other"'s counters and the
// target="other" histogram, which only grow.
#include <gtest/gtest.h>

#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "obs/http_endpoint.h"
#include "uvbus/histogram.h"
#include "uvbus/node.h"

namespace uvbus::obs_contract_test {
namespace {

using test::bus_fixture;
using test::fast_config;

// histogram.h: "the nearest-rank percentile q: the upper bound of the bucket holding the value of
// rank ceil(q/100 * count)". 99.9 % of 1 000 is rank 999 exactly; 0.999 * 1000 in doubles is a
// hair above 999, whose ceiling was rank 1 000 (the maximum).
TEST(ObsContract, HistogramP999OfAThousandIsRank999) {
  latency_histogram h;
  h.record(10, 999);
  h.record(1000000);
  EXPECT_EQ(h.value_at_percentile(99.9), 10u);
  EXPECT_EQ(h.percentiles().p999, 10u);
  EXPECT_EQ(h.value_at_percentile(100), 1000000u);
}

// The same for every count up to 5 000 and the four percentiles the node reports, against the
// rank computed in integers.
TEST(ObsContract, HistogramRanksMatchIntegerNearestRank) {
  struct pct {
    double q;
    uint64_t num;  // q = num / den
    uint64_t den;
  };
  const pct ps[] = {{50, 1, 2}, {90, 9, 10}, {99, 99, 100}, {99.9, 999, 1000}};
  for (uint64_t n = 1; n <= 5000; ++n) {
    for (const pct& p : ps) {
      const uint64_t rank = (p.num * n + p.den - 1) / p.den;  // ceil(q/100 * n)
      // A histogram whose first `rank` values are 1 and the rest 40: the answer says on which
      // side of the rank the code landed.
      latency_histogram h;
      h.record(1, rank);
      if (n > rank) h.record(40, n - rank);
      ASSERT_EQ(h.value_at_percentile(p.q), 1u) << "q=" << p.q << " n=" << n;
    }
  }
}

// http_endpoint.h: HOST is an IPv4 literal, a bracketed IPv6 literal or localhost. A name passed
// parse_http_url (so node::validate()) and failed only at start().
TEST(ObsContract, MetricsUrlHostMustBeALiteral) {
  obs::http_url u;
  std::string why;
  EXPECT_EQ(obs::parse_http_url("http://example.com:9464/metrics", &u, &why), errc::bad_url);
  EXPECT_NE(why.find("example.com"), std::string::npos) << why;
  EXPECT_EQ(obs::parse_http_url("http://:9464/metrics", &u, &why), errc::bad_url);
  EXPECT_EQ(obs::parse_http_url("http://[127.0.0.1]:9464/metrics", &u, &why), errc::bad_url);
  EXPECT_NE(why.find("IPv6"), std::string::npos) << why;
  EXPECT_EQ(obs::parse_http_url("http://localhost:0/metrics", &u, &why), errc::ok);
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(obs::parse_http_url("http://[::1]:0/m", &u, &why), errc::ok);
  node_config c;
  c.metrics_url = "http://metrics.example:9464/metrics";
  EXPECT_EQ(node::validate(1, c, &why), errc::bad_url);
  EXPECT_NE(why.find("metrics_url"), std::string::npos) << why;
}

// The served path is compared with the request's path, which never holds a query or a fragment:
// a URL whose path has one would answer every request 404.
TEST(ObsContract, MetricsUrlPathWithQueryIsRefused) {
  obs::http_url u;
  std::string why;
  EXPECT_EQ(obs::parse_http_url("http://127.0.0.1:0/metrics?x=1", &u, &why), errc::bad_url);
  EXPECT_NE(why.find("?x=1"), std::string::npos) << why;
  EXPECT_EQ(obs::parse_http_url("http://127.0.0.1:0/metrics#top", &u, &why), errc::bad_url);
  EXPECT_EQ(obs::parse_http_url("http://127.0.0.1:0/a/b", &u, &why), errc::ok);
  EXPECT_EQ(u.path, "/a/b");
}

// libmicrohttpd decodes %XX in a request's path before the endpoint compares it, while the URL's
// path was kept as written: http://127.0.0.1:9464/a%20b passed validate() and every scrape of
// /a%20b (seen as "/a b") was answered 404.
TEST(ObsContract, MetricsUrlPathWithPercentIsRefused) {
  obs::http_url u;
  std::string why;
  EXPECT_EQ(obs::parse_http_url("http://127.0.0.1:0/a%20b", &u, &why), errc::bad_url);
  EXPECT_NE(why.find("\"/a%20b\""), std::string::npos) << why;
  node_config c;
  c.metrics_url = "http://127.0.0.1:9464/metrics%2f";
  EXPECT_EQ(node::validate(1, c, &why), errc::bad_url);
  EXPECT_NE(why.find("metrics_url"), std::string::npos) << why;
}

// The families of docs/observability.md's table: `uvbus_x_y` names and `_z` abbreviations that
// replace what follows the row's first name's second component (`uvbus_node_a_total`, `_b_total`).
std::set<std::string> documented_families() {
  std::ifstream f(std::string(UVBUS_SOURCE_DIR) + "/docs/observability.md");
  std::set<std::string> names;
  std::string line;
  const std::regex tick("`([a-z_]+)`");
  while (std::getline(f, line)) {
    if (line.rfind("| `uvbus_", 0) != 0) continue;
    const std::string cell = line.substr(1, line.find('|', 1) - 1);
    std::string base;
    for (std::sregex_iterator it(cell.begin(), cell.end(), tick), end; it != end; ++it) {
      const std::string t = (*it)[1];
      if (t.rfind("uvbus_", 0) == 0) {
        names.insert(t);
        base = t.substr(0, t.find('_', 6));  // uvbus_node
      } else if (t[0] == '_' && !base.empty()) {
        names.insert(base + t);
      }
    }
  }
  return names;
}

// "## Families": every family a node renders is in the table (15 were not: calls, compression,
// broadcast, shm_rejected, pick_cursor_bytes).
TEST(ObsContract, EveryRenderedFamilyIsDocumented) {
  const std::set<std::string> doc = documented_families();
  ASSERT_GT(doc.size(), 40u);
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  std::string text;
  {
    node_config c;
    c.latency_histograms = true;
    node n(&loop, 0x101, c);
    text = n.metrics_text();
  }
  while (uv_loop_close(&loop) == UV_EBUSY) uv_run(&loop, UV_RUN_NOWAIT);
  std::istringstream in(text);
  std::string line;
  size_t families = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    const std::string name = line.substr(7, line.find(' ', 7) - 7);
    ++families;
    EXPECT_EQ(doc.count(name), 1u) << name << " is not in docs/observability.md's table";
  }
  EXPECT_GT(families, 40u) << text;
}

// The value of the sample line that begins with `key ` in text (-1: none).
double value_of(const std::string& text, const std::string& key) {
  const size_t at = text.find("\n" + key + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size() + 2));
}

class ObsContractBus : public bus_fixture {
 protected:
  // A sender's config under root *p (made here): every flow sample in the latency histograms, one
  // target series before the rest go to target="other".
  node_config latency_sender(test::bus_node** p) {
    node_config c = make_root_for_sender(p);
    c.latency_histograms = true;
    c.latency_sample_every = 1;
    c.metrics_max_peers = 1;
    return c;
  }
};

// "Cardinality": past metrics_max_peers peers are summed under peer="other", "latency series
// likewise per target". The flow histograms of the targets past the cap were left out: 20 of 30
// samples were in no uvbus_flow_ack_latency_seconds series (while the type series had all 30).
TEST_F(ObsContractBus, FlowLatencyPastTheCapIsSummedAsOther) {
  test::bus_node* p = nullptr;
  node_config ac = latency_sender(&p);
  test::bus_node* a = make(0x101, ac);
  test::bus_node* b = make_child(0x102, p);
  test::bus_node* c = make_child(0x103, p);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up() && c->n->up(); }));
  for (uint64_t v = 0; v < 30; ++v) {
    ASSERT_EQ(a->n->send_data(v < 10 ? 0x102 : 0x103, 7, &v, sizeof v), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return a->reports.size() == 30; }));
  const std::string text = a->n->metrics_text();
  EXPECT_EQ(value_of(text, "uvbus_flow_ack_latency_seconds_count{target=\"0x102\"}"), 10) << text;
  EXPECT_EQ(value_of(text, "uvbus_flow_ack_latency_seconds_count{target=\"other\"}"), 20) << text;
  EXPECT_EQ(value_of(text, "uvbus_flow_ack_latency_seconds_bucket{target=\"other\",le=\"+Inf\"}"),
            20);
  EXPECT_EQ(value_of(text, "uvbus_flow_ack_latency_seconds_count{target=\"0x103\"}"), -1);
  EXPECT_EQ(value_of(text, "uvbus_type_ack_latency_seconds_count{type=\"7\"}"), 30);
}

// uvbus_flow_ack_latency_seconds{target="other"} is a histogram (counters) too: it was summed at
// each render from the flows open now, so an idle flow forgotten after flow_idle_ms took its
// counts out (0x104, inside "other"), and one forgotten below the cap (0x102) moved the next
// target (0x103) to a series of its own: "other" fell from 20 to nothing.
TEST_F(ObsContractBus, FlowLatencyOtherOnlyGrowsWhenFlowsAreForgotten) {
  test::bus_node* p = nullptr;
  node_config ac = latency_sender(&p);
  ac.flow_idle_ms = 200;
  test::bus_node* a = make(0x101, ac);
  std::vector<test::bus_node*> to;
  for (const bus_id id : {0x102, 0x103, 0x104}) to.push_back(make_child(id, p));
  ASSERT_TRUE(wait([&] {
    return a->n->up() && std::all_of(to.begin(), to.end(), [](auto* t) { return t->n->up(); });
  }));
  for (uint64_t v = 0; v < 30; ++v) {
    ASSERT_EQ(a->n->send_data(static_cast<bus_id>(0x102 + v / 10), 7, &v, sizeof v), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return a->reports.size() == 30; }));
  const std::string key = "uvbus_flow_ack_latency_seconds_count{target=\"other\"}";
  const double before = value_of(a->n->metrics_text(), key);
  ASSERT_EQ(before, 20);
  // 0x103 stays busy (one message at a time) while 0x102 and 0x104 go idle and are forgotten.
  latency_percentiles lp;
  uint64_t more = 0;
  ASSERT_TRUE(wait([&] {
    if (a->reports.size() == 30 + more) {
      const uint64_t v = more++;
      EXPECT_EQ(a->n->send_data(0x103, 7, &v, sizeof v), errc::ok);
    }
    return !a->n->latency_to(0x102, &lp) && !a->n->latency_to(0x104, &lp);
  }));
  ASSERT_TRUE(a->n->latency_to(0x103, &lp));
  const std::string text = a->n->metrics_text();
  EXPECT_GE(value_of(text, key), before) << text;
  EXPECT_GE(value_of(text, "uvbus_flow_ack_latency_seconds_bucket{target=\"other\",le=\"+Inf\"}"),
            before)
      << text;
}

// "Cardinality": the peers past metrics_max_peers are summed under peer="other", whose counters
// must only grow (Prometheus reads a drop as a reset and rate() as a burst). They were the sum of
// the links open now: a peer that left (or moved to a series of its own) took its bytes out of
// "other": 6 748 bytes received from two children fell to 3 374 when one of them left, and the
// series went away when the other moved to a series of its own.
TEST_F(ObsContractBus, PeerOtherCountersOnlyGrowWhenPeersLeaveOrMoveOut) {
  node_config rc = fast_config();
  rc.subnets = {{0x100, 8}};
  rc.metrics_max_peers = 1;
  test::bus_node* p = make(0x100, rc);
  test::bus_node* a = make_child(0x101, p);
  test::bus_node* b = make_child(0x102, p);
  test::bus_node* c = make_child(0x103, p);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up() && c->n->up(); }));
  const std::string key =
      R"(uvbus_peer_received_bytes_total{peer="other",role="any",channel="any"})";
  for (test::bus_node* from : {b, c}) {
    for (uint64_t v = 0; v < 40; ++v) {
      const uint64_t body[4] = {v, v, v, v};
      ASSERT_EQ(from->n->send_data(0x100, 1, body, sizeof body), errc::ok);
    }
  }
  ASSERT_TRUE(wait([&] { return p->got.size() == 80; }));
  const double both = value_of(p->n->metrics_text(), key);
  ASSERT_GT(both, 0);
  destroy(c);  // leaves: "other" keeps what it had
  ASSERT_TRUE(wait([&] { return p->removed.size() == 1; }));
  const double after_leave = value_of(p->n->metrics_text(), key);
  EXPECT_GE(after_leave, both);
  destroy(a);  // b moves to a series of its own: "other" still keeps what it had
  ASSERT_TRUE(wait([&] { return p->removed.size() == 2; }));
  const std::string text = p->n->metrics_text();
  EXPECT_GE(value_of(text, key), after_leave) << text;
  EXPECT_GT(
      value_of(text,
               R"(uvbus_peer_received_bytes_total{peer="0x102",role="child",channel="stream"})"),
      0)
      << text;
}

}  // namespace
}  // namespace uvbus::obs_contract_test
