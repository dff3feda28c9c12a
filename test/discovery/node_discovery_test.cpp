// node_config::discovery: nodes without any static URL find each other through etcd (in
// directory(), lookup(), find() and on_directory), a stopped node leaves everyone's directory,
// also when destroyed in on_down(closed) right after stop() (the revoke is not cancelled), an
// entry left out of a full directory is taken in once room frees, an entry kept as etcd's when
// its link goes is picked by its new labels, a bad discovery config is
// refused naming the field, and a node picks its parent by type and labels from the directory,
// registers to it and exchanges data, chooses again when that parent crashes (its lease expires)
// without losing what was sent meanwhile, follows a lower id, and leaves a parent whose entry no
// longer matches for one that does (logging its name escaped);
// nodes in no common tree reach each other (data, calls, broadcasts) over direct links dialled
// from their etcd entries;
// killing etcd's leader under load loses nothing on the bus and the directories converge;
// a node applying the parent rule does not copy etcd's whole directory per entry of a range.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bus/node_discovery.h"
#include "discovery/discovery_harness.h"
#include "discovery/etcd_codec.h"
#include "discovery/scripted_etcd.h"
#include "uvbus/node.h"

namespace uvbus::node_discovery_test {
namespace {

using std::chrono::seconds;

struct watched_node {
  std::unique_ptr<node> n;
  std::vector<std::pair<directory_event, bus_id>> events;
  std::vector<std::string> data;
  std::vector<errc> reports;
  std::vector<errc> registrations;                 // on_registration's results
  std::function<void(const std::string&)> on_log;  // a test's hook, if set
};

class NodeDiscoveryTest : public test::discovery_fixture {
 protected:
  void TearDown() override {
    nodes_.clear();
    for (int i = 0; i < 5; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    discovery_fixture::TearDown();
  }
  // eps: etcd's endpoints (empty: the fixture's etcd).
  node_config base(const std::string& name, const std::string& type,
                   std::vector<node_label> labels = {}, std::vector<std::string> eps = {}) {
    node_config c;
    c.listen = {"ipv4://127.0.0.1:0"};
    c.enable_shm = false;
    c.reconnect_min_ms = 10;
    c.reconnect_max_ms = 100;
    c.name = name;
    c.type = type;
    c.labels = std::move(labels);
    c.discovery = config(std::move(eps));
    return c;
  }
  watched_node* make_node(bus_id id, node_config c) {
    auto& w = nodes_.emplace_back(std::make_unique<watched_node>());
    watched_node* raw = w.get();
    node_callbacks cb;
    cb.on_directory = [raw](directory_event ev, const directory_entry& e) {
      raw->events.emplace_back(ev, e.id);
    };
    cb.on_data = [raw](bus_id, uint32_t, const uint8_t* d, size_t n) {
      raw->data.emplace_back(reinterpret_cast<const char*>(d), n);
    };
    cb.on_report = [raw](const delivery_report& r) { raw->reports.push_back(r.status); };
    cb.on_registration = [raw](errc e, const std::string&) { raw->registrations.push_back(e); };
    cb.on_log = [raw](log_level, const std::string& m) {
      if (raw->on_log) raw->on_log(m);
    };
    raw->n = std::make_unique<node>(&loop_, id, std::move(c), std::move(cb));
    EXPECT_EQ(raw->n->start(), errc::ok) << raw->n->last_error().detail;
    return raw;
  }
  // A gateway that owns the children's subnet 0x1000/8 (listening on `port`; 0: one from the OS).
  watched_node* make_gateway(bus_id id, const std::string& name,
                             std::vector<node_label> labels = {}, int port = 0) {
    node_config g = base(name, "gateway", std::move(labels));
    g.subnets = {{0x1000, 8}};
    g.listen = {"ipv4://127.0.0.1:" + std::to_string(port)};
    return make_node(id, g);
  }
  // Node 0x1001, which chooses its parent among the gateways carrying `labels`.
  watched_node* make_child(std::vector<node_label> labels = {}, std::vector<std::string> eps = {}) {
    node_config lc = base("logic-1", "logic", {}, std::move(eps));
    lc.discovery_parent_type = "gateway";
    lc.discovery_parent_labels = std::move(labels);
    return make_node(0x1001, lc);
  }
  std::vector<std::unique_ptr<watched_node>> nodes_;
};

TEST_F(NodeDiscoveryTest, NodesWithoutUrlsSeeEachOtherThroughEtcd) {
  start_etcd(1);
  node_config ac = base("a", "logic", {{"zone", "a"}});
  ac.discovery.ttl_s = 60;  // a quick removal below can only come from stop()'s revoke
  watched_node* a = make_node(0x10, ac);
  watched_node* b = make_node(0x20, base("b", "chat"));
  ASSERT_TRUE(wait([&] { return a->n->directory().size() == 2 && b->n->directory().size() == 2; }));
  directory_entry e;
  ASSERT_TRUE(b->n->lookup(0x10, &e));
  EXPECT_EQ(e.name, "a");
  EXPECT_EQ(e.type, "logic");
  EXPECT_EQ(e.parent, 0U);
  EXPECT_EQ(e.listen, a->n->listen_urls());
  EXPECT_EQ(e.pid, static_cast<uint32_t>(getpid()));
  ASSERT_EQ(b->n->find("logic", {{"zone", "a"}}).size(), 1U);
  EXPECT_TRUE(b->n->lookup_name("a", &e));
  ASSERT_EQ(b->events.size(), 1U);
  EXPECT_EQ(b->events[0], std::make_pair(directory_event::added, bus_id{0x10}));

  a->n->stop();  // revokes: b sees it leave long before the 60 s TTL
  ASSERT_TRUE(wait([&] { return b->n->directory().size() == 1; }, seconds(20)));
  EXPECT_EQ(b->events.back(), std::make_pair(directory_event::removed, bus_id{0x10}));
}

// The documented orderly exit: stop(), then destroy the node in on_down(closed). The lease revoke
// stop() sends must not be cancelled by that destruction: on_down waits for its answer, and a
// watcher sees the entry leave long before the 60 s TTL.
TEST_F(NodeDiscoveryTest, DestroyingInOnDownAfterStopStillRevokes) {
  start_etcd(1);
  test::disc_instance* watcher = make(directory_entry{}, config());  // watch only
  node_config ac = base("a", "logic");
  ac.discovery.ttl_s = 60;  // a quick removal below can only come from stop()'s revoke
  std::unique_ptr<node> a;
  int downs = 0;
  node_callbacks cb;
  cb.on_down = [&](errc why) {
    EXPECT_EQ(why, errc::closed);
    ++downs;
    a.reset();  // destroyed inside its own callback
  };
  a = std::make_unique<node>(&loop_, 0x10, std::move(ac), std::move(cb));
  ASSERT_EQ(a->start(), errc::ok) << a->last_error().detail;
  ASSERT_TRUE(wait([&] { return watcher->ids() == std::set<bus_id>{0x10}; }));
  a->stop();
  ASSERT_TRUE(wait([&] { return a == nullptr; }, seconds(10)));
  EXPECT_EQ(downs, 1);
  ASSERT_TRUE(wait([&] { return watcher->ids().empty(); }, seconds(10)))
      << "the entry stayed in etcd: the revoke was cancelled";
  EXPECT_EQ(watcher->count(directory_event::removed, 0x10), 1U);
}

// Two roots (no parent, no static URL): data, a call and the end-to-end reports go over a
// direct link dialled from the etcd entry; once the target has stopped (revoked), sends to it are
// refused as unknown_route at once, and a message to a crashed one is reported failed.
TEST_F(NodeDiscoveryTest, NodesInNoCommonTreeTalkOverADirectLink) {
  start_etcd(1);
  node_config ac = base("a", "logic");
  ac.delivery_timeout_ms = 2000;
  watched_node* a = make_node(0x10, ac);
  watched_node* b = make_node(0x20, base("b", "chat"));
  ASSERT_TRUE(wait([&] { return a->n->directory().size() == 2 && b->n->directory().size() == 2; }));
  ASSERT_EQ(a->n->send_data(0x20, 3, "one", 3), errc::ok);
  ASSERT_EQ(a->n->send_data(0x20, 3, "two", 3), errc::ok);
  ASSERT_TRUE(wait([&] { return b->data.size() == 2 && a->reports.size() == 2; }));
  EXPECT_EQ(b->data[0], "one");
  EXPECT_EQ(b->data[1], "two");
  EXPECT_EQ(a->reports, (std::vector<errc>{errc::ok, errc::ok}));
  endpoint_info p;
  ASSERT_TRUE(a->n->peer(0x20, &p));
  EXPECT_EQ(p.role, peer_role::sibling);
  ASSERT_EQ(b->n->send_data(0x10, 3, "back", 4), errc::ok);
  ASSERT_TRUE(wait([&] { return a->data.size() == 1; }));
  EXPECT_EQ(a->data[0], "back");

  b->n->stop();
  ASSERT_TRUE(wait([&] { return a->n->directory().size() == 1; }, seconds(20)));
  EXPECT_EQ(a->n->send_data(0x20, 3, "gone", 4), errc::unknown_route);

  // A crashed node stays in etcd until its lease (60 s here) expires: every dial is refused, and
  // the message is reported failed when its delivery deadline passes (2 s here).
  node_config cc = base("c", "chat");
  cc.discovery.ttl_s = 60;
  watched_node* c = make_node(0x30, cc);
  ASSERT_TRUE(wait([&] { return a->n->directory().size() == 2; }));
  c->n.reset();
  ASSERT_EQ(a->n->send_data(0x30, 3, "dead", 4), errc::ok);
  ASSERT_TRUE(wait([&] { return a->reports.size() == 3; }, seconds(20)));
  EXPECT_EQ(a->reports[2], errc::timeout);
  directory_entry e;
  EXPECT_TRUE(a->n->lookup(0x30, &e));  // still listed: the failure came from the dial
}

// A broadcast goes along the tree links, and a node known only from etcd (in no tree of ours)
// lies behind none: it never got the broadcast, and every summary naming it waited for timeout_ms
// and said timeout. From a root it now gets a copy of its own over the direct link a send to it
// takes (dialled at the first), once, and acknowledges it.
TEST_F(NodeDiscoveryTest, ABroadcastReachesNodesInNoCommonTreeOverADirectLink) {
  start_etcd(1);
  watched_node* a = make_node(0x10, base("a", "logic"));
  watched_node* b = make_node(0x20, base("b", "logic"));
  watched_node* c = make_node(0x30, base("c", "chat"));
  ASSERT_TRUE(wait([&] {
    return a->n->directory().size() == 3 && b->n->directory().size() == 3 &&
           c->n->directory().size() == 3;
  }));
  for (int round = 0; round < 2; ++round) {  // the link dialled by the first, then up
    std::optional<broadcast_report> rep;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(a->n->broadcast(broadcast_target::of_type("logic"), 1, "bc", 2, 10000,
                              [&](const broadcast_report& r) { rep = r; }),
              errc::ok)
        << a->n->last_error().detail;
    ASSERT_TRUE(wait([&] { return rep.has_value(); }, seconds(30)));
    std::printf("[ summary  ] %s after %lld ms, b got %zu\n", to_string(rep->status),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - t0)
                                           .count()),
                b->data.size());
    EXPECT_EQ(rep->status, errc::ok);
    EXPECT_EQ(rep->expected, 1u);
    EXPECT_EQ(rep->reached, (std::vector<bus_id>{0x20}));
    ASSERT_EQ(b->data.size(), static_cast<size_t>(round + 1));  // once each
    EXPECT_EQ(b->data.back(), "bc");
  }
  EXPECT_TRUE(c->data.empty());
  // Without direct links nothing can carry it to them: the summary says so at once.
  node_config dc = base("d", "chat");
  dc.sibling_direct = false;
  watched_node* d = make_node(0x40, dc);
  ASSERT_TRUE(wait([&] { return d->n->directory().size() == 4; }));
  std::optional<broadcast_report> rep;
  ASSERT_EQ(d->n->broadcast(broadcast_target::of_type("logic"), 1, "bc", 2, 60000,
                            [&](const broadcast_report& r) { rep = r; }),
            errc::ok);
  EXPECT_FALSE(rep.has_value()) << "never from inside broadcast()";
  ASSERT_TRUE(wait([&] { return rep.has_value(); }, seconds(30)));
  EXPECT_EQ(rep->status, errc::not_connected);
  EXPECT_EQ(rep->failed, (std::vector<bus_id>{0x10, 0x20}));
  EXPECT_EQ(b->data.size(), 2u);
}

// An etcd entry left out because the directory was full (directory_max_entries) is taken in once
// room frees: etcd's watch reports only changes, so before, it stayed out until its node
// re-registered in etcd.
TEST_F(NodeDiscoveryTest, AnEntryLeftOutForWantOfRoomIsTakenInOnceRoomFrees) {
  start_etcd(1);
  watched_node* a = make_node(0x10, base("a", "logic"));
  watched_node* b = make_node(0x20, base("b", "logic"));
  ASSERT_TRUE(wait([&] { return a->n->directory().size() == 2 && b->n->directory().size() == 2; }));
  node_config cc = base("c", "chat");
  cc.directory_max_entries = 1;
  watched_node* c = make_node(0x30, cc);
  ASSERT_TRUE(wait(
      [&] { return c->n->directory().size() == 2 && c->n->counters().directory_skipped == 1; }));
  const bus_id in = c->n->directory().at(1).id;
  const bus_id out = in == 0x10 ? 0x20 : 0x10;
  (in == 0x10 ? a : b)->n->stop();  // revokes its entry: room for one at c
  directory_entry e;
  ASSERT_TRUE(wait([&] { return c->n->lookup(out, &e); }, seconds(20)));
  EXPECT_FALSE(c->n->lookup(in, &e));
  EXPECT_EQ(c->events.back(), std::make_pair(directory_event::added, out));
  EXPECT_EQ(c->n->counters().directory_skipped, 1u);
}

// A tree entry that etcd still lists is kept as etcd's when its link goes (disc_keep); when
// etcd's differs (here: the node came back with other labels, outside the tree, within its old
// lease) the entry changes, and pick()'s cached matches must see it: the change did not bump the
// directory's generation, so pick() kept answering from the old labels (zone a: the node).
TEST_F(NodeDiscoveryTest, AnEntryKeptAsEtcdsWhenItsLinkGoesIsPickedByItsNewLabels) {
  start_etcd(1);
  watched_node* g = make_gateway(0x1000, "gw");
  node_config xc = base("x", "logic", {{"zone", "a"}});
  xc.parent_urls = {g->n->listen_urls().at(0)};
  watched_node* x = make_node(0x1001, xc);
  watched_node* o = make_node(0x2000, base("o", "chat"));  // outside the tree: etcd's view
  ASSERT_TRUE(wait([&] { return x->n->up() && g->n->directory().size() == 3; }));
  bus_id got = 0;
  ASSERT_EQ(g->n->pick("logic", {{"zone", "a"}}, {}, &got), errc::ok);  // cached: {0x1001}
  EXPECT_EQ(got, 0x1001u);
  // The same id again, outside the tree, with zone b: etcd's entry changes, the gateway keeps the
  // tree's (zone a) while the link to the first one lives.
  node_config x2c = base("x", "logic", {{"zone", "b"}});
  watched_node* x2 = make_node(0x1001, x2c);
  directory_entry e;
  ASSERT_TRUE(wait(
      [&] { return o->n->lookup(0x1001, &e) && !e.labels.empty() && e.labels[0].second == "b"; },
      seconds(20)));
  const size_t events = g->events.size();
  x->n.reset();  // gone without a revoke: the gateway's link to it ends, etcd lists the new one
  ASSERT_TRUE(wait(
      [&] {
        return g->events.size() > events && g->n->lookup(0x1001, &e) && !e.labels.empty() &&
               e.labels[0].second == "b";
      },
      seconds(20)));
  got = 0;
  EXPECT_EQ(g->n->pick("logic", {{"zone", "a"}}, {}, &got), errc::unknown_route) << got;
  ASSERT_EQ(g->n->pick("logic", {{"zone", "b"}}, {}, &got), errc::ok);
  EXPECT_EQ(got, 0x1001u);
  (void)x2;
}

TEST_F(NodeDiscoveryTest, BadDiscoveryConfigIsRefusedNamingTheField) {
  node_config c;
  c.discovery.etcd_endpoints = {"http://127.0.0.1:1"};
  c.discovery.ttl_s = 0;
  std::string why;
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("node_config.discovery.ttl_s"), std::string::npos) << why;
}

TEST_F(NodeDiscoveryTest, ParentChosenByTypeAndLabels) {
  start_etcd(1);
  node_config g = base("gw-b", "gateway", {{"zone", "b"}});
  g.subnets = {{0x100, 8}};
  make_node(0x100, g);  // lower id, wrong zone
  node_config g2 = base("gw-a", "gateway", {{"zone", "a"}});
  g2.subnets = {{0x200, 8}};
  watched_node* gw = make_node(0x200, g2);
  node_config lc = base("logic-1", "logic", {{"zone", "a"}});
  lc.discovery_parent_type = "gateway";
  lc.discovery_parent_labels = {{"zone", "a"}};
  watched_node* lg = make_node(0x201, lc);
  EXPECT_FALSE(lg->n->up());
  ASSERT_TRUE(wait([&] { return lg->n->up(); }));
  endpoint_info p;
  ASSERT_TRUE(lg->n->peer(0x200, &p));
  EXPECT_EQ(p.role, peer_role::parent);
  ASSERT_EQ(lg->n->send_data(0x200, 1, "hi", 2), errc::ok);
  ASSERT_TRUE(wait([&] { return gw->data.size() == 1; }));
  EXPECT_EQ(gw->data[0], "hi");
}

// An entry's name and type are whatever its writer put in etcd: the line that logs the chosen
// parent escapes them (they used to reach on_log raw, a terminal's escape sequences included).
TEST_F(NodeDiscoveryTest, TheChosenParentsNameIsEscapedInTheLog) {
  start_etcd(1);
  node_config g = base("gw\x1b[2J\xc2\x9bx", "gateway");
  g.subnets = {{0x200, 8}};
  make_node(0x200, g);
  node_config lc = base("logic-1", "logic");
  lc.discovery_parent_type = "gateway";
  watched_node* lg = make_node(0x201, lc);  // it chooses once etcd answers, from the loop
  std::vector<std::string> lines;
  lg->on_log = [&lines](const std::string& m) { lines.push_back(m); };
  ASSERT_TRUE(wait([&] { return lg->n->up(); }));
  bool chosen = false;
  for (const std::string& l : lines) {
    EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
    EXPECT_EQ(l.find("\xc2\x9b"), std::string::npos) << l;
    chosen =
        chosen || l.find(R"((gw\x1b[2J\xc2\x9bx, type gateway) chosen at)") != std::string::npos;
  }
  EXPECT_TRUE(chosen) << "no line named the parent";
}

// A node applying the parent rule reads etcd_discovery's whole directory (a copy of every entry)
// only when the rule may choose anew. Before, every etcd event copied it: a range of N entries
// made N copies of up to N entries (2 000: 1.8 s of loop time, 5 000: 15 s, stalling heartbeats
// and the node's own keep-alives). A range of 2 000 gateways (a scripted etcd) copies now at most
// a few entries per entry, and the rule still chooses the lowest id.
TEST_F(NodeDiscoveryTest, ARangeOfThousandsOfEntriesIsNotCopiedOncePerEntry) {
  test::scripted_etcd fake(&loop_);
  ASSERT_TRUE(fake.ok());
  constexpr bus_id kEntries = 2000;
  const std::string prefix = config({fake.url()}).prefix;
  std::string range = R"({"header":{"revision":"5"},"kvs":[)";
  for (bus_id i = 0; i < kEntries; ++i) {
    const directory_entry g = test::test_entry(0x2000 + i, "gateway");
    range += std::string(i == 0 ? "" : ",") + R"({"key":")" +
             detail::etcd::base64_encode(detail::etcd::node_key(prefix, g.id)) + R"(","value":")" +
             detail::etcd::base64_encode(detail::etcd::encode_entry(g)) +
             R"(","mod_revision":"3"})";
  }
  range += "]}";
  fake.on_post = [&](const std::string& path, size_t nth) {
    test::reply r = test::scripted_etcd::healthy_post(path, nth);
    if (path == "/v3/kv/range" && fake.body().find("count_only") == std::string::npos) {
      r.body = range;
    }
    return r;
  };
  fake.on_watch = [](size_t) { return std::make_pair(test::kCreated, false); };
  const uint64_t before = detail::disc_entries_copied();
  watched_node* c = make_child({}, {fake.url()});
  std::string chosen;
  c->on_log = [&chosen](const std::string& m) {
    if (m.find(" chosen at ") != std::string::npos) chosen = m;
  };
  ASSERT_TRUE(wait([&] { return c->n->directory().size() == kEntries + 1 && !chosen.empty(); }));
  EXPECT_LE(detail::disc_entries_copied() - before, 4 * kEntries);
  EXPECT_EQ(chosen.rfind("discovery: parent 0x2000 (node-8192, type gateway) chosen at", 0), 0U)
      << chosen;
  nodes_.clear();  // before the fake etcd it talks to
}

// Gateway failover: two gateways own the same child subnet; the child registers to the lower id.
// That gateway crashes (destroyed without stop(): its lease expires by itself); the child keeps
// retrying its URLs until the entry leaves etcd, then registers to the other gateway, and the
// message sent meanwhile is delivered there once. When the first gateway comes back the child
// moves back to it (the lowest id wins, so nodes choosing at different times never split).
TEST_F(NodeDiscoveryTest, ACrashedParentIsReplacedByTheNextLiveOne) {
  start_etcd(1);
  watched_node* gw1 = make_gateway(0x100, "gw-1");
  watched_node* gw2 = make_gateway(0x200, "gw-2");
  watched_node* lg = make_child();
  endpoint_info p;
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));
  EXPECT_EQ(p.role, peer_role::parent);

  gw1->n.reset();  // a crash: no goodbye, no revoke
  ASSERT_TRUE(wait([&] { return !lg->n->up(); }));
  ASSERT_EQ(lg->n->send_data(0x200, 7, "meanwhile", 9), errc::ok);
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x200, &p); }));
  EXPECT_EQ(p.role, peer_role::parent);
  EXPECT_FALSE(lg->n->peer(0x100, &p));
  ASSERT_TRUE(wait([&] { return gw2->data.size() == 1 && lg->reports.size() == 1; }));
  EXPECT_EQ(gw2->data[0], "meanwhile");
  EXPECT_EQ(lg->reports[0], errc::ok);

  watched_node* again = make_gateway(0x100, "gw-1");
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));
  EXPECT_EQ(p.role, peer_role::parent);
  EXPECT_FALSE(lg->n->peer(0x200, &p));
  ASSERT_EQ(lg->n->send_data(0x100, 7, "back", 4), errc::ok);
  ASSERT_TRUE(wait([&] { return again->data.size() == 1 && lg->reports.size() == 2; }));
  EXPECT_EQ(again->data[0], "back");
  EXPECT_EQ(lg->reports[1], errc::ok);
  EXPECT_EQ(gw2->data.size(), 1U);
}

// The parent the rule chose refuses the child for good (its subnets do not cover it), then stops:
// the rule chooses the next candidate, and the child registers there. Before, the refusal's
// parent_failed stayed set: the child logged the new choice but never dialled it.
TEST_F(NodeDiscoveryTest, AParentThatRefusedForGoodAndLeftGivesWayToTheNext) {
  start_etcd(1);
  node_config a = base("gw-a", "gateway");
  a.subnets = {{0x2000, 8}};
  watched_node* gwa = make_node(0x100, a);
  (void)make_gateway(0x200, "gw-b");
  watched_node* lg = make_child();
  const auto refused = [&] {
    const std::vector<errc>& r = lg->registrations;
    return std::find(r.begin(), r.end(), errc::out_of_subnet) != r.end();
  };
  ASSERT_TRUE(wait(refused));
  EXPECT_FALSE(lg->n->up());
  gwa->n->stop();  // its entry leaves etcd at once
  endpoint_info p;
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x200, &p); }));
  EXPECT_EQ(p.role, peer_role::parent);
  EXPECT_EQ(lg->registrations.back(), errc::ok);
}

// The chosen parent's entry changes so that it no longer matches the rule (a gateway restarted
// with other labels: a crash, then the same id and URL back in zone b, its entry replacing the
// old one):
// with no other candidate the child keeps it and says so; once a matching gateway appears the
// child moves there, and data flows through it. (The entry is not written over in etcd behind the
// live gateway's back: the gateway puts its own entry again.)
TEST_F(NodeDiscoveryTest, AParentThatNoLongerMatchesGivesWayToOneThatDoes) {
  start_etcd(1);
  const int port = test::free_ports(1)[0];
  watched_node* gw = make_gateway(0x100, "gw-1", {{"zone", "a"}}, port);
  watched_node* lg = make_child({{"zone", "a"}});
  std::vector<std::string> logs;
  lg->on_log = [&logs](const std::string& m) { logs.push_back(m); };
  endpoint_info p;
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));

  gw->n.reset();  // a crash: no revoke
  (void)make_gateway(0x100, "gw-1", {{"zone", "b"}}, port);
  const auto said = [&](const std::string& what) {
    for (const std::string& l : logs) {
      if (l.find(what) != std::string::npos) return true;
    }
    return false;
  };
  ASSERT_TRUE(wait([&] { return said("parent 0x100 no longer matches the rule"); }));
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));  // back, and kept

  watched_node* gw2 = make_gateway(0x200, "gw-2", {{"zone", "a"}});
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x200, &p); }));
  EXPECT_EQ(p.role, peer_role::parent);
  EXPECT_FALSE(lg->n->peer(0x100, &p));
  EXPECT_TRUE(said("(the current parent no longer matches the rule)"));
  ASSERT_EQ(lg->n->send_data(0x200, 7, "moved", 5), errc::ok);
  ASSERT_TRUE(wait([&] { return gw2->data.size() == 1 && lg->reports.size() == 1; }));
  EXPECT_EQ(gw2->data[0], "moved");
  EXPECT_EQ(lg->reports[0], errc::ok);
}

// The same, but the gateway comes back in zone b on another port: no other gateway matches, so
// the child keeps it, and dials it at its new URL (it dialled the old one for ever).
TEST_F(NodeDiscoveryTest, AParentKeptThoughItNoLongerMatchesIsDialledAtItsNewUrls) {
  start_etcd(1);
  watched_node* gw = make_gateway(0x100, "gw-1", {{"zone", "a"}});
  watched_node* lg = make_child({{"zone", "a"}});
  endpoint_info p;
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));
  const std::vector<std::string> old_urls = gw->n->listen_urls();

  gw->n.reset();  // a crash: no revoke
  ASSERT_TRUE(wait([&] { return !lg->n->up(); }));
  watched_node* back = make_gateway(0x100, "gw-1", {{"zone", "b"}});  // port 0: another port
  ASSERT_NE(back->n->listen_urls(), old_urls);
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));
  ASSERT_EQ(lg->n->send_data(0x100, 7, "kept", 4), errc::ok);
  ASSERT_TRUE(wait([&] { return back->data.size() == 1 && lg->reports.size() == 1; }));
  EXPECT_EQ(lg->reports[0], errc::ok);
}

// The parent crashes and comes back at once on another port (its new registration replaces the
// entry before the old lease expires, so the entry never leaves): the child dials the new URLs
// instead of the dead ones, and the message sent meanwhile arrives.
TEST_F(NodeDiscoveryTest, AParentBackAtOtherUrlsIsDialledThere) {
  start_etcd(1);
  watched_node* gw = make_gateway(0x100, "gw-1");
  watched_node* lg = make_child();
  endpoint_info p;
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));
  const std::vector<std::string> old_urls = gw->n->listen_urls();

  gw->n.reset();  // a crash: no revoke
  ASSERT_TRUE(wait([&] { return !lg->n->up(); }));
  ASSERT_EQ(lg->n->send_data(0x100, 7, "meanwhile", 9), errc::ok);
  watched_node* back = make_gateway(0x100, "gw-1");  // port 0: another port
  ASSERT_NE(back->n->listen_urls(), old_urls);
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));
  ASSERT_TRUE(wait([&] { return back->data.size() == 1 && lg->reports.size() == 1; }));
  EXPECT_EQ(back->data[0], "meanwhile");
  EXPECT_EQ(lg->reports[0], errc::ok);
}

// A 3-member etcd loses its leader while two logic nodes exchange 2000 end-to-end messages through
// their discovered gateway: every message arrives once, in order, reported ok (the bus does not
// depend on etcd once the tree is up), and a node started after the kill is seen by everyone.
TEST_F(NodeDiscoveryTest, EtcdLeaderKilledUnderLoadLosesNothingOnTheBus) {
  start_etcd(3);
  const size_t leader = etcd_->leader();
  ASSERT_LT(leader, etcd_->size());
  auto conf = [&](const std::string& name, const std::string& type, size_t first) {
    node_config c = base(name, type);
    const std::vector<std::string> eps = etcd_->endpoints();
    c.discovery.etcd_endpoints.clear();
    for (size_t k = 0; k < eps.size(); ++k)
      c.discovery.etcd_endpoints.push_back(eps[(first + k) % 3]);
    if (type == "logic") c.discovery_parent_type = "gateway";
    return c;
  };
  node_config g = conf("gw", "gateway", leader);
  g.subnets = {{0x1000, 8}};
  watched_node* gw = make_node(0x100, g);
  watched_node* l1 = make_node(0x1001, conf("l1", "logic", leader + 1));
  watched_node* l2 = make_node(0x1002, conf("l2", "logic", leader));
  ASSERT_TRUE(wait([&] {
    return l1->n->up() && l2->n->up() && l1->n->directory().size() == 3 &&
           l2->n->directory().size() == 3 && gw->n->directory().size() == 3;
  }));
  constexpr size_t kTotal = 2000;
  for (size_t i = 0; i < kTotal; ++i) {
    if (i == kTotal / 2) etcd_->kill_member(leader);
    const std::string m = std::to_string(i);
    ASSERT_EQ(l1->n->send_data(0x1002, 1, m.data(), m.size()), errc::ok) << i;
    if (i % 100 == 99) {
      ASSERT_TRUE(wait([&] { return l1->reports.size() == i + 1; })) << i;
    }
  }
  ASSERT_TRUE(wait([&] { return l2->data.size() == kTotal; }));
  for (size_t i = 0; i < kTotal; ++i) ASSERT_EQ(l2->data[i], std::to_string(i));
  for (errc e : l1->reports) ASSERT_EQ(e, errc::ok);
  watched_node* l3 = make_node(0x1003, conf("l3", "logic", leader));
  ASSERT_TRUE(wait([&] {
    for (watched_node* w : {gw, l1, l2, l3}) {
      if (w->n->directory().size() != 4) return false;
    }
    return l3->n->up();
  }));
}

// The first send to a node in no common tree starts the direct link from inside send_data(): its
// log lines ("... direct link", and "no stream address" for a target without a listen URL) come
// from the loop, never from inside the call (no callback fires inside a member function; an
// on_log that sent to the target re-entered the sibling entry being set up).
TEST_F(NodeDiscoveryTest, StartingADirectLinkLogsFromTheLoopNotInsideSendData) {
  start_etcd(1);
  watched_node* a = make_node(0x10, base("a", "logic"));
  node_config bc = base("b", "chat");
  bc.listen.clear();  // no address to dial: the direct link fails at once
  watched_node* b = make_node(0x20, bc);
  ASSERT_TRUE(wait([&] { return a->n->directory().size() == 2 && b->n->directory().size() == 2; }));
  bool inside = false;
  std::vector<std::string> lines;
  std::vector<std::string> inside_lines;
  a->on_log = [&](const std::string& m) {
    lines.push_back(m);
    if (inside) inside_lines.push_back(m);
  };
  inside = true;
  const errc e = a->n->send_data(0x20, 3, "one", 3);
  inside = false;
  EXPECT_EQ(e, errc::unknown_route) << to_string(e);
  EXPECT_TRUE(inside_lines.empty())
      << inside_lines.size()
      << " lines inside send_data, the first: " << (inside_lines.empty() ? "" : inside_lines[0]);
  ASSERT_TRUE(wait([&] { return lines.size() >= 2; }));
  EXPECT_NE(lines[0].find("direct link"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("no stream address"), std::string::npos) << lines[1];
}

}  // namespace
}  // namespace uvbus::node_discovery_test
