// node_config::discovery: nodes without any static URL find each other through etcd (in
// directory(), lookup(), find() and on_directory), a stopped node leaves everyone's directory,
// a bad discovery config is refused naming the field, and a node picks its parent by type and
// labels from the directory, registers to it and exchanges data, chooses again when that parent
// crashes (its lease expires) without losing what was sent meanwhile, and follows a lower id.
#include <memory>
#include <string>
#include <vector>

#include "discovery/discovery_harness.h"
#include "uvbus/node.h"

namespace uvbus {
namespace {

using std::chrono::seconds;

struct watched_node {
  std::unique_ptr<node> n;
  std::vector<std::pair<directory_event, bus_id>> events;
  std::vector<std::string> data;
  std::vector<errc> reports;
};

class NodeDiscoveryTest : public test::discovery_fixture {
 protected:
  void TearDown() override {
    nodes_.clear();
    for (int i = 0; i < 5; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    discovery_fixture::TearDown();
  }
  node_config base(const std::string& name, const std::string& type,
                   std::vector<node_label> labels = {}) {
    node_config c;
    c.listen = {"ipv4://127.0.0.1:0"};
    c.enable_shm = false;
    c.reconnect_min_ms = 10;
    c.reconnect_max_ms = 100;
    c.name = name;
    c.type = type;
    c.labels = std::move(labels);
    c.discovery = config();
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
    raw->n = std::make_unique<node>(&loop_, id, std::move(c), std::move(cb));
    EXPECT_EQ(raw->n->start(), errc::ok) << raw->n->last_error().detail;
    return raw;
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

// Gateway failover: two gateways own the same child subnet; the child registers to the lower id.
// That gateway crashes (destroyed without stop(): its lease expires by itself); the child keeps
// retrying its URLs until the entry leaves etcd, then registers to the other gateway, and the
// message sent meanwhile is delivered there once. When the first gateway comes back the child
// moves back to it (the lowest id wins, so nodes choosing at different times never split).
TEST_F(NodeDiscoveryTest, ACrashedParentIsReplacedByTheNextLiveOne) {
  start_etcd(1);
  node_config g = base("gw-1", "gateway");
  g.subnets = {{0x1000, 8}};
  watched_node* gw1 = make_node(0x100, g);
  g.name = "gw-2";
  watched_node* gw2 = make_node(0x200, g);
  node_config lc = base("logic-1", "logic");
  lc.discovery_parent_type = "gateway";
  watched_node* lg = make_node(0x1001, lc);
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

  node_config back = base("gw-1", "gateway");
  back.subnets = {{0x1000, 8}};
  watched_node* again = make_node(0x100, back);
  ASSERT_TRUE(wait([&] { return lg->n->up() && lg->n->peer(0x100, &p); }));
  EXPECT_EQ(p.role, peer_role::parent);
  EXPECT_FALSE(lg->n->peer(0x200, &p));
  ASSERT_EQ(lg->n->send_data(0x100, 7, "back", 4), errc::ok);
  ASSERT_TRUE(wait([&] { return again->data.size() == 1 && lg->reports.size() == 2; }));
  EXPECT_EQ(again->data[0], "back");
  EXPECT_EQ(lg->reports[1], errc::ok);
  EXPECT_EQ(gw2->data.size(), 1U);
}

}  // namespace
}  // namespace uvbus
