// Any node of a type and broadcast on a live tree: root, two gateways, three logic nodes and a
// chat node. pick() round robin (a bounded set of cursors), least loaded (load hints through the
// directory, those of departed nodes pruned) and consistent hashing (stable keys, only a dead
// node's keys move, every node picks alike); broadcast by type and by subnet with one copy per
// link, its summary report, targets that cannot be reached or leave (the summary comes then), stop.
#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"

namespace uvbus::node_fanout_test {
namespace {

using test::bus_node;

constexpr bus_id kRoot = 0x1000;
constexpr bus_id kG1 = 0x1100;
constexpr bus_id kL1 = 0x1101;
constexpr bus_id kL2 = 0x1102;
constexpr bus_id kG2 = 0x1200;
constexpr bus_id kL3 = 0x1201;
constexpr bus_id kChat = 0x1202;

// Shared memory between the tree's nodes as well (every node a ring of its own): set by a test.
bool g_shm = false;

node_config typed(const std::string& type, uint8_t protocol_max = proto::kMaxVersion) {
  node_config c = test::typed_config(type);
  c.protocol_max = protocol_max;
  if (g_shm) {
    c.enable_shm = true;
    c.shm_ring_bytes = 1 << 20;
    c.listen.push_back("shm://" + test::unique_name("fanout"));
  }
  return c;
}

// An unlabelled series of t's metrics (-1: not there).
double metric(bus_node* t, const std::string& name) {
  const std::string text = t->n->metrics_text();
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::strtod(text.c_str() + at + key.size(), nullptr);
}

class NodeFanout : public test::bus_fixture {
 protected:
  // The tree; l3_max is L3's highest protocol version (5: broadcasts cannot reach it).
  void build(uint8_t l3_max = proto::kMaxVersion) {
    root_ = make_root(kRoot, {subnet{0x1000, 12}}, typed("root"));
    g1_ = make_child(kG1, root_, {subnet{0x1100, 8}}, typed("gateway"));
    g2_ = make_child(kG2, root_, {subnet{0x1200, 8}}, typed("gateway"));
    ASSERT_TRUE(wait([&] { return g1_->ups == 1 && g2_->ups == 1; }))
        << (g1_->registration_details.empty() ? "" : g1_->registration_details.back())
        << (g1_->error_texts.empty() ? "" : g1_->error_texts.back())
        << (root_->error_texts.empty() ? "" : root_->error_texts.back());
    l1_ = make_child(kL1, g1_, {}, typed("logic"));
    l2_ = make_child(kL2, g1_, {}, typed("logic"));
    l3_ = make_child(kL3, g2_, {}, typed("logic", l3_max));
    chat_ = make_child(kChat, g2_, {}, typed("chat"));
    for (bus_node* t : {root_, g1_, g2_, l1_, l2_, l3_, chat_}) {
      ASSERT_TRUE(wait([&] { return t->n->directory().size() == 7; })) << t->n->id();
    }
  }
  void TearDown() override {
    g_shm = false;
    test::bus_fixture::TearDown();
  }
  // A hand-made child of root_ owning kG1/8, registered.
  void register_raw(test::raw_child* c) {
    c->subnets = {subnet{kG1, 8}};
    c->start(&loop_, root_->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return c->registered; }));
  }
  bus_id pick(bus_node* from, const pick_options& how) {
    bus_id id = 0;
    EXPECT_EQ(from->n->pick("logic", {}, how, &id), errc::ok);
    return id;
  }
  bus_node* root_ = nullptr;
  bus_node* g1_ = nullptr;
  bus_node* g2_ = nullptr;
  bus_node* l1_ = nullptr;
  bus_node* l2_ = nullptr;
  bus_node* l3_ = nullptr;
  bus_node* chat_ = nullptr;
};

TEST_F(NodeFanout, RoundRobinVisitsEveryLogicNodeAndSendAnyDelivers) {
  ASSERT_NO_FATAL_FAILURE(build());
  std::map<bus_id, int> seen;
  for (int i = 0; i < 6; ++i) ++seen[pick(chat_, {})];
  EXPECT_EQ(seen, (std::map<bus_id, int>{{kL1, 2}, {kL2, 2}, {kL3, 2}}));
  bus_id chosen = 0;
  ASSERT_EQ(chat_->n->send_any("logic", {}, 5, "hi", 2, {}, {}, &chosen), errc::ok);
  bus_node* target = chosen == kL1 ? l1_ : chosen == kL2 ? l2_ : l3_;
  ASSERT_TRUE(wait([&] { return target->got.size() == 1; }));
  EXPECT_EQ(target->got[0].source, kChat);
  bus_id none = 0;
  EXPECT_EQ(chat_->n->pick("match", {}, {}, &none), errc::unknown_route);
  EXPECT_EQ(chat_->n->send_any("logic", {{"zone", "eu"}}, 5, "x", 1), errc::unknown_route);
}

// pick() keeps each selector's matching nodes between calls (no directory scan, no allocation per
// send_any): they are taken again whenever the directory changed, so a node that joins is picked
// from the next call on and one that leaves never again, whatever the policy.
TEST_F(NodeFanout, ThePickedNodesFollowTheDirectoryAsNodesComeAndGo) {
  ASSERT_NO_FATAL_FAILURE(build());
  std::map<bus_id, int> seen;
  for (int i = 0; i < 6; ++i) ++seen[pick(chat_, {})];
  EXPECT_EQ(seen.size(), 3U);
  constexpr bus_id kL4 = 0x1203;
  bus_node* l4 = make_child(kL4, g2_, {}, typed("logic"));
  ASSERT_TRUE(wait([&] { return l4->ups == 1 && chat_->n->find("logic").size() == 4; }));
  seen.clear();
  for (int i = 0; i < 8; ++i) ++seen[pick(chat_, {})];
  EXPECT_EQ(seen, (std::map<bus_id, int>{{kL1, 2}, {kL2, 2}, {kL3, 2}, {kL4, 2}}));
  pick_options hash;
  hash.policy = pick_policy::consistent_hash;
  bool l4_holds_a_key = false;
  for (uint64_t k = 1; k <= 64; ++k) {
    hash.key = k;
    l4_holds_a_key = l4_holds_a_key || pick(chat_, hash) == kL4;
  }
  EXPECT_TRUE(l4_holds_a_key) << "the joined node takes its share of the keys";
  destroy(l4);
  ASSERT_TRUE(wait([&] { return chat_->n->find("logic").size() == 3; }));
  for (int i = 0; i < 6; ++i) EXPECT_NE(pick(chat_, {}), kL4);
  for (uint64_t k = 1; k <= 64; ++k) {
    hash.key = k;
    EXPECT_NE(pick(chat_, hash), kL4);
  }
}

TEST_F(NodeFanout, ConsistentHashKeepsKeysAndMovesOnlyTheDeadNodes) {
  ASSERT_NO_FATAL_FAILURE(build());
  pick_options how;
  how.policy = pick_policy::consistent_hash;
  std::map<uint64_t, bus_id> before;
  std::map<bus_id, int> load;
  for (uint64_t k = 1; k <= 300; ++k) {
    how.key = k;
    before[k] = pick(chat_, how);
    ++load[before[k]];
    EXPECT_EQ(pick(l1_, how), before[k]) << "every node with the same directory picks alike";
  }
  for (const auto& [id, n] : load) EXPECT_GT(n, 50) << id;  // spread over all three
  destroy(l3_);
  ASSERT_TRUE(wait([&] { return chat_->n->find("logic").size() == 2; }));
  for (uint64_t k = 1; k <= 300; ++k) {
    how.key = k;
    const bus_id now = pick(chat_, how);
    if (before[k] != kL3) {
      EXPECT_EQ(now, before[k]) << "key " << k << " moved although its node lives";
    } else {
      EXPECT_TRUE(now == kL1 || now == kL2);
    }
  }
}

TEST_F(NodeFanout, LeastLoadedFollowsTheLoadHints) {
  ASSERT_NO_FATAL_FAILURE(build());
  pick_options how;
  how.policy = pick_policy::least_loaded;
  l1_->n->set_load(50);
  l2_->n->set_load(10);
  l3_->n->set_load(30);
  ASSERT_TRUE(wait([&] { return pick(chat_, how) == kL2 && pick(l1_, how) == kL2; }));
  l2_->n->set_load(90);
  ASSERT_TRUE(wait([&] { return pick(chat_, how) == kL3; }));
}

// pick() keeps a round-robin cursor per type and labels asked for: a caller asking with ever-new
// label sets (here the subsets of 13 labels both nodes carry) grew that map without bound. At
// most kMaxCursors (4096) are kept; a key asked for all along keeps its turn meanwhile.
TEST_F(NodeFanout, RoundRobinCursorsAreBoundedAndASteadyKeyKeepsItsTurn) {
  node_config c = typed("logic");
  for (int i = 0; i < 13; ++i) c.labels.emplace_back("k" + std::to_string(i), "v");
  root_ = make_root(kRoot, {subnet{0x1000, 12}}, c);
  l1_ = make_child(kL1, root_, {}, c);
  ASSERT_TRUE(wait([&] { return root_->n->find("logic").size() == 2; }));
  std::vector<bus_id> steady;
  for (uint32_t i = 1; i <= 6000; ++i) {
    std::vector<node_label> subset;
    for (uint32_t b = 0; b < 13; ++b) {
      if ((i >> b & 1) != 0) subset.push_back(c.labels[b]);
    }
    bus_id id = 0;
    ASSERT_EQ(root_->n->pick("logic", subset, {}, &id), errc::ok);
    if (i % 8 == 0) steady.push_back(pick(root_, {}));
  }
  const double cursors = metric(root_, "uvbus_node_pick_cursors");
  EXPECT_LE(cursors, 4096);
  EXPECT_GE(cursors, 2048);
  for (size_t i = 1; i < steady.size(); ++i) {
    ASSERT_NE(steady[i], steady[i - 1]) << "the steady key lost its turn at pick " << i;
  }
}

// A selector nothing matches any more (the node carrying its label left) keeps no cursor.
TEST_F(NodeFanout, RoundRobinForgetsTheCursorOfASelectorNothingMatches) {
  root_ = make_root(kRoot, {subnet{0x1000, 12}}, typed("root"));
  node_config pod = typed("logic");
  pod.labels = {{"pod", "p-1"}};
  l1_ = make_child(kL1, root_, {}, pod);
  ASSERT_TRUE(wait([&] { return root_->n->find("logic").size() == 1; }));
  bus_id id = 0;
  ASSERT_EQ(root_->n->pick("logic", pod.labels, {}, &id), errc::ok);
  EXPECT_EQ(id, kL1);
  EXPECT_EQ(metric(root_, "uvbus_node_pick_cursors"), 1);
  destroy(l1_);
  ASSERT_TRUE(wait([&] { return root_->n->find("logic").empty(); }));
  EXPECT_EQ(root_->n->pick("logic", pod.labels, {}, &id), errc::unknown_route);
  EXPECT_EQ(metric(root_, "uvbus_node_pick_cursors"), 0);
}

// The cursors' keys are bounded in bytes as well as in number (1 MiB): here 3000 label sets of
// about 8 labels of 120-byte values each, some 3 MB of keys kept before. One selector written
// in another order takes the same turns, and one no entry could match (a label given 17 times,
// which a node could not carry) is refused instead of kept.
TEST_F(NodeFanout, RoundRobinCursorKeysAreBoundedInBytesAndIgnoreLabelOrder) {
  node_config c = typed("logic");
  for (int i = 0; i < 16; ++i)
    c.labels.emplace_back("k" + std::to_string(i), std::string(120, 'v'));
  root_ = make_root(kRoot, {subnet{0x1000, 12}}, c);
  l1_ = make_child(kL1, root_, {}, c);
  ASSERT_TRUE(wait([&] { return root_->n->find("logic").size() == 2; }));
  bus_id id = 0;
  for (uint32_t i = 1; i <= 3000; ++i) {
    std::vector<node_label> subset;
    for (uint32_t b = 0; b < 16; ++b) {
      if ((i * 2654435761U >> b & 1) != 0) subset.push_back(c.labels[b]);
    }
    ASSERT_EQ(root_->n->pick("logic", subset, {}, &id), errc::ok);
  }
  EXPECT_LE(metric(root_, "uvbus_node_pick_cursor_bytes"), 1 << 20);
  EXPECT_GE(metric(root_, "uvbus_node_pick_cursor_bytes"), 1 << 18);
  const std::vector<node_label> ab = {c.labels[0], c.labels[1]};
  const std::vector<node_label> ba = {c.labels[1], c.labels[0], c.labels[1]};
  bus_id first = 0;
  bus_id second = 0;
  ASSERT_EQ(root_->n->pick("logic", ab, {}, &first), errc::ok);
  ASSERT_EQ(root_->n->pick("logic", ba, {}, &second), errc::ok);
  EXPECT_NE(first, second) << "the same selector in another order took the same turn";
  const std::vector<node_label> many(17, c.labels[0]);
  EXPECT_EQ(root_->n->pick("logic", many, {}, &id), errc::invalid_argument);
  EXPECT_NE(root_->n->last_error().detail.find("17 labels, at most 16"), std::string::npos)
      << root_->n->last_error().detail;
  // A policy outside the enum (an integer from a config file) is refused, not taken as a hash.
  pick_options odd;
  odd.policy = static_cast<pick_policy>(7);
  EXPECT_EQ(root_->n->pick("logic", ab, odd, &id), errc::invalid_argument);
  EXPECT_NE(root_->n->last_error().detail.find("policy 7"), std::string::npos)
      << root_->n->last_error().detail;
}

// Load hints of nodes that left the directory are dropped once they outnumber it (more than
// twice the directory plus 64), at the next load message; those of nodes still there stay. A
// hand-made child announces itself and 200 nodes below it, each with a hint, then takes the 200
// away and sends one more hint.
TEST_F(NodeFanout, LoadHintsOfDepartedNodesArePrunedOnceTheyOutnumberTheDirectory) {
  root_ = make_root(kRoot, {subnet{0x1000, 12}}, typed("root"));
  test::raw_child c(kG1, kRoot);
  ASSERT_NO_FATAL_FAILURE(register_raw(&c));
  const auto send = [&](const proto::directory_body& b) {
    std::vector<uint8_t> body;
    proto::encode_directory(b, &body);
    c.send(proto::msg_type::directory, body);
  };
  proto::directory_body up;
  proto::directory_body loads;
  proto::directory_body gone;
  loads.op = proto::dir_op::load;
  gone.op = proto::dir_op::remove;
  for (bus_id id = kG1; id <= kG1 + 200; ++id) {
    directory_entry e;
    e.id = id;
    e.type = "logic";
    up.entries.push_back(e);
    loads.loads.emplace_back(id, 5);
    if (id != kG1) gone.ids.push_back(id);
  }
  send(up);
  send(loads);
  ASSERT_TRUE(wait([&] { return metric(root_, "uvbus_node_load_hints") == 201; }));
  send(gone);
  ASSERT_TRUE(wait([&] { return root_->n->directory().size() == 2; }));  // the root and kG1
  EXPECT_EQ(metric(root_, "uvbus_node_load_hints"), 201);  // nothing prunes them until a hint
  loads.loads = {{kG1, 3}};
  send(loads);
  // An entry after the hint on the same link: once it is in, the hint has been handled.
  up.entries.resize(1);
  up.entries[0].id = kG1 + 255;
  send(up);
  ASSERT_TRUE(wait([&] { return root_->n->directory().size() == 3; }));
  EXPECT_EQ(metric(root_, "uvbus_node_load_hints"), 1);  // kG1's own, the 200 others dropped
  pick_options how;
  how.policy = pick_policy::least_loaded;
  root_->n->set_load(4);
  bus_id id = 0;
  ASSERT_EQ(root_->n->pick("", {}, how, &id), errc::ok);
  EXPECT_EQ(id, kG1 + 255);  // no hint: 0 (kG1 kept its 3, the root has 4)
}

// A send_any() message to a node that restarts before acknowledging it, where the sender learns
// of the restart from the flow's acknowledgement (the new incarnation's) or from a *change* of
// its directory entry (another pid and start time: a restart within an etcd lease, or a removal
// and re-add a relay coalesced) rather than from its removal: it was resent to the new
// incarnation, against "never sent again — not to the node's next incarnation". Now it fails with
// not_connected and is not sent again. A hand-made lobby kG1 plays both incarnations.
class NodeFanoutRestart : public NodeFanout {
 protected:
  void SetUp() override {
    NodeFanout::SetUp();
    node_config rc = typed("root");
    rc.delivery_timeout_ms = 120000;  // a report within the wait is not the timeout
    root_ = make_root(kRoot, {subnet{0x1000, 12}}, rc);
    ASSERT_NO_FATAL_FAILURE(register_raw(&c_));
    announce(1);
    ASSERT_TRUE(wait([&] { return root_->n->find("lobby").size() == 1; }));
    ASSERT_EQ(root_->n->send_any("lobby", {}, 1, "once", 4, {}, {}, nullptr, &id_), errc::ok);
    ASSERT_TRUE(wait([&] { return copies() != 0; }));
  }
  // The lobby's own entry, as incarnation `pid`.
  void announce(uint32_t pid) {
    proto::directory_body up;
    directory_entry e;
    e.id = kG1;
    e.type = "lobby";
    e.protocol_version = proto::kMaxVersion;
    e.pid = pid;
    e.start_time_ms = 1000 + pid;
    up.entries.push_back(e);
    std::vector<uint8_t> body;
    proto::encode_directory(up, &body);
    c_.send(proto::msg_type::directory, body);
  }
  // The copies of the message the lobby has read (epoch_: the flow's).
  size_t copies() {
    size_t k = 0;
    for (const auto& m : c_.got) {
      proto::data_body d;
      k += m.hd.type == proto::msg_type::data &&
           proto::parse_flow_data(m.body.data(), m.body.size(), &d, &epoch_) == errc::ok;
    }
    return k;
  }
  void flow_ack(uint64_t incarnation, proto::ack_kind kind) {
    std::vector<uint8_t> a(proto::kFlowAckSize);
    proto::encode_flow_ack({epoch_, incarnation, 0, kind}, a.data());
    c_.send(proto::msg_type::flow_ack, a);
  }
  // The message fails at once and no copy follows (a ping's answer comes after any resend).
  void expect_failed_not_resent() {
    ASSERT_TRUE(wait([&] { return !root_->reports.empty(); }))
        << "no report; copies read by the lobby: " << copies();
    EXPECT_EQ(root_->reports[0].message_id, id_);
    EXPECT_EQ(root_->reports[0].status, errc::not_connected);
    flow_ack(0x2222, proto::ack_kind::resync);  // the new incarnation asks for what is owed
    const size_t before = copies();
    const size_t got = c_.got.size();
    c_.ping();
    ASSERT_TRUE(wait([&] { return c_.got.size() > got; }));
    EXPECT_EQ(copies(), before) << "sent again after the restart";
  }
  void TearDown() override {
    if (c_.ch) c_.ch->close();  // before the loop closes
    EXPECT_TRUE(wait([&] { return !c_.ch || c_.ch->closed(); }));
    NodeFanout::TearDown();
  }
  test::raw_child c_{kG1, kRoot};
  uint64_t id_ = 0;
  uint64_t epoch_ = 0;
};

TEST_F(NodeFanoutRestart, ASendAnyMessageIsNotResentToANewIncarnationItsFlowNames) {
  flow_ack(0x1111, proto::ack_kind::ack);     // the first incarnation, nothing delivered yet
  flow_ack(0x2222, proto::ack_kind::resync);  // the next one, without state for the flow
  expect_failed_not_resent();
}

TEST_F(NodeFanoutRestart, ASendAnyMessageIsNotResentToANewIncarnationItsEntryNames) {
  flow_ack(0x1111, proto::ack_kind::ack);
  announce(2);  // the same id, another pid and start time: a change, no removal
  expect_failed_not_resent();
}

TEST_F(NodeFanout, BroadcastByTypeReachesEachTargetOnceWithOneCopyPerLink) {
  ASSERT_NO_FATAL_FAILURE(build());
  std::optional<broadcast_report> rep;
  uint64_t id = 0;
  ASSERT_EQ(chat_->n->broadcast(
                broadcast_target::of_type("logic"), 9, "all", 3, 30000,
                [&](const broadcast_report& r) { rep = r; }, {}, &id),
            errc::ok);
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->status, errc::ok);
  EXPECT_EQ(rep->broadcast_id, id);
  EXPECT_EQ(rep->expected, 3u);
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kL1, kL2, kL3}));
  EXPECT_TRUE(rep->failed.empty());
  for (bus_node* t : {l1_, l2_, l3_}) {
    ASSERT_EQ(t->got.size(), 1u);
    EXPECT_EQ(t->got[0].source, kChat);
    EXPECT_EQ(t->got[0].type, 9u);
    EXPECT_EQ(t->got[0].bytes, "all");
  }
  for (bus_node* t : {root_, g1_, g2_, chat_}) EXPECT_TRUE(t->got.empty()) << t->n->id();
  // chat -> g2; g2 -> l3 and the root; the root -> g1 only; g1 -> l1 and l2.
  EXPECT_EQ(g2_->n->counters().broadcasts_forwarded, 2u);
  EXPECT_EQ(root_->n->counters().broadcasts_forwarded, 1u);
  EXPECT_EQ(g1_->n->counters().broadcasts_forwarded, 2u);
  EXPECT_EQ(chat_->n->counters().broadcasts_sent, 1u);
}

// The same over shared memory: a copy read from a ring has no link, and went back to where it
// came from (the root and the gateways sent it to each other until its TTL ran out: 2^8 copies
// delivered to each target). It must not go back to the tree neighbour towards its source.
TEST_F(NodeFanout, BroadcastOverSharedMemoryNeverGoesBackWhereItCameFrom) {
  g_shm = true;
  ASSERT_NO_FATAL_FAILURE(build());
  std::optional<broadcast_report> rep;
  ASSERT_EQ(chat_->n->broadcast(broadcast_target::of_type("logic"), 9, "all", 3, 30000,
                                [&](const broadcast_report& r) { rep = r; }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->status, errc::ok);
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kL1, kL2, kL3}));
  // A message after it on every path: once it is in, a copy sent back would have been too.
  for (bus_node* t : {l1_, l2_, l3_}) {
    ASSERT_EQ(test::send_str(chat_, t->n->id(), 2, "after"), errc::ok);
  }
  ASSERT_TRUE(
      wait([&] { return l1_->got.size() >= 2 && l2_->got.size() >= 2 && l3_->got.size() >= 2; }));
  for (bus_node* t : {l1_, l2_, l3_}) {
    EXPECT_EQ(t->got.size(), 2u) << t->n->id();
    EXPECT_EQ(t->got[0].bytes, "all");
  }
  EXPECT_EQ(g2_->n->counters().broadcasts_forwarded, 2u);
  EXPECT_EQ(root_->n->counters().broadcasts_forwarded, 1u);
  EXPECT_EQ(g1_->n->counters().broadcasts_forwarded, 2u);
}

TEST_F(NodeFanout, BroadcastBySubnetIncludesTheGatewayItself) {
  ASSERT_NO_FATAL_FAILURE(build());
  std::optional<broadcast_report> rep;
  ASSERT_EQ(l3_->n->broadcast(broadcast_target::in_subnet(subnet{0x1100, 8}), 1, "s", 1, 30000,
                              [&](const broadcast_report& r) { rep = r; }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kG1, kL1, kL2}));
  EXPECT_EQ(g1_->got.size(), 1u);
  EXPECT_TRUE(chat_->got.empty());
}

// L3 speaks version 5 behind its relay G2: no copy reaches it. It is failed at once (its
// directory entry says version 5), not at timeout_ms (120 s here) as timeout.
TEST_F(NodeFanout, ATargetThatCannotBeReachedIsReportedFailed) {
  ASSERT_NO_FATAL_FAILURE(build(5));
  std::optional<broadcast_report> rep;
  ASSERT_EQ(l1_->n->broadcast(broadcast_target::of_type("logic"), 1, "x", 1, 120000,
                              [&](const broadcast_report& r) { rep = r; }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->status, errc::not_connected);
  EXPECT_NE(rep->detail.find("protocol version 5"), std::string::npos) << rep->detail;
  EXPECT_EQ(rep->expected, 2u);  // L2 and L3 (the sender is not a target)
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kL2}));
  EXPECT_EQ(rep->failed, (std::vector<bus_id>{kL3}));
  EXPECT_TRUE(l3_->got.empty());
}

// A target that will never acknowledge (a frozen process: a node whose loop the test holds
// still once it is in every directory) leaves the sender's directory when its relay dies: nothing
// more can come, yet the summary waited for timeout_ms (20 s here) and said timeout. It comes at
// once: not_connected, the frozen node in failed.
TEST_F(NodeFanout, ABroadcastEndsAtOnceWhenItsSilentTargetsRelayDies) {
  ASSERT_NO_FATAL_FAILURE(build());
  constexpr bus_id kFrozen = 0x1203;
  test::own_loop_node frozen;
  node_config fc = typed("logic");
  fc.parent_urls = {g2_->n->listen_urls().at(0)};
  ASSERT_NO_FATAL_FAILURE(frozen.start(kFrozen, fc));
  for (bus_node* t : {root_, g1_, g2_, l1_, l2_, l3_, chat_}) {
    ASSERT_TRUE(wait([&] {
      frozen.turn();
      return t->n->directory().size() == 8;
    })) << t->n->id();
  }
  std::optional<broadcast_report> rep;
  ASSERT_EQ(l1_->n->broadcast(broadcast_target::of_type("logic"), 1, "x", 1, 20000,
                              [&](const broadcast_report& r) { rep = r; }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return l2_->got.size() == 1 && l3_->got.size() == 1; }));
  const auto t0 = std::chrono::steady_clock::now();
  destroy(g2_);  // L3, the chat node and the frozen one leave every directory with it
  ASSERT_TRUE(wait([&] { return rep.has_value(); }, std::chrono::seconds(60)));
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::printf("[ summary  ] %s %lld ms after the relay died (timeout_ms 20000)\n",
              to_string(rep->status), static_cast<long long>(ms));
  EXPECT_EQ(rep->status, errc::not_connected);
  EXPECT_EQ(rep->expected, 3u);
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kL2, kL3}));
  EXPECT_EQ(rep->failed, (std::vector<bus_id>{kFrozen}));
  // The next broadcast expects L2 alone (L3 and the frozen node left the directory).
  rep.reset();
  ASSERT_EQ(l1_->n->broadcast(broadcast_target::of_type("logic"), 1, "y", 1, 20000,
                              [&](const broadcast_report& r) { rep = r; }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->status, errc::ok);
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kL2}));
}

// A relay that could not pass a broadcast on (its TTL spent, as here, or the next link refusing
// the copy) dropped it without a trace: the targets behind it were reported failed at the
// sender's timeout, while the relay counted nothing and logged nothing, where a relayed message
// dropped the same way counts ttl_expired and forward_dropped and is logged at warn. TTL 1 from
// L1: G1 passes it on with 0, so the root cannot send it on towards L3.
TEST_F(NodeFanout, ARelayThatCannotPassABroadcastOnCountsAndLogsTheDrop) {
  ASSERT_NO_FATAL_FAILURE(build());
  std::optional<broadcast_report> rep;
  send_options one_hop;
  one_hop.ttl = 1;
  ASSERT_EQ(l1_->n->broadcast(
                broadcast_target::of_type("logic"), 1, "x", 1, 300,
                [&](const broadcast_report& r) { rep = r; }, one_hop),
            errc::ok);
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->status, errc::timeout);
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kL2}));
  EXPECT_EQ(rep->failed, (std::vector<bus_id>{kL3}));
  EXPECT_EQ(g1_->n->counters().ttl_expired, 0u);  // it passed it on
  EXPECT_EQ(root_->n->counters().ttl_expired, 1u);
  EXPECT_EQ(root_->n->counters().forward_dropped, 1u);
  EXPECT_EQ(root_->n->counters().broadcasts_forwarded, 0u);
  bool logged = false;
  for (const auto& [lv, m] : root_->logs) {
    logged = logged || (lv == log_level::warn && m.find("broadcast") != std::string::npos &&
                        m.find("ttl") != std::string::npos);
  }
  EXPECT_TRUE(logged) << "no warning at the root naming the broadcast and its TTL";
  // A copy whose TTL runs out where no target lies further on is no drop: L2 (TTL 0) counts none.
  EXPECT_EQ(l2_->n->counters().ttl_expired, 0u);
}

TEST_F(NodeFanout, StopReportsAnOpenBroadcastClosedAndBadCallsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(build(5));
  std::optional<broadcast_report> rep;
  const auto cb = [&](const broadcast_report& r) { rep = r; };
  const broadcast_target logic = broadcast_target::of_type("logic");
  EXPECT_EQ(l1_->n->broadcast(logic, 1, "x", 1, 0, cb), errc::invalid_argument);
  EXPECT_EQ(l1_->n->broadcast(logic, 1, "x", 1, 100, nullptr), errc::invalid_argument);
  EXPECT_EQ(l1_->n->broadcast(broadcast_target::of_type("none"), 1, "x", 1, 100, cb),
            errc::unknown_route);
  const std::string big(70000, 'b');
  EXPECT_EQ(l1_->n->broadcast(logic, 1, big.data(), big.size(), 100, cb), errc::message_too_large);
  EXPECT_NE(l1_->n->last_error().detail.find("selector"), std::string::npos);
  // A selector the wire cannot carry whole is refused, not cut (the relays would match another).
  EXPECT_EQ(l1_->n->broadcast(broadcast_target::of_type(std::string(129, 't')), 1, "x", 1, 100, cb),
            errc::invalid_argument);
  EXPECT_NE(l1_->n->last_error().detail.find("the type is 129 bytes"), std::string::npos);
  std::vector<node_label> many(17, node_label{"k", "v"});
  EXPECT_EQ(l1_->n->broadcast(broadcast_target::of_type("logic", many), 1, "x", 1, 100, cb),
            errc::invalid_argument);
  EXPECT_NE(l1_->n->last_error().detail.find("17 labels"), std::string::npos);
  const std::vector<node_label> long_value{{"zone", std::string(200, 'z')}};
  EXPECT_EQ(l1_->n->broadcast(broadcast_target::of_type("logic", long_value), 1, "x", 1, 100, cb),
            errc::invalid_argument);
  EXPECT_NE(l1_->n->last_error().detail.find("label \"zone\""), std::string::npos);
  ASSERT_EQ(l1_->n->broadcast(logic, 1, "x", 1, 60000, cb), errc::ok);
  l1_->n->stop();
  EXPECT_FALSE(rep.has_value()) << "never from inside stop()";
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->status, errc::closed);
  EXPECT_EQ(rep->expected, 2u);
  ASSERT_FALSE(rep->failed.empty());
  EXPECT_EQ(rep->failed.back(), kL3);  // L2's acknowledgement may or may not have come first
}

}  // namespace
}  // namespace uvbus::node_fanout_test
