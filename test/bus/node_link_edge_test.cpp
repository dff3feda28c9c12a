// Links and routing at their edges: a sibling registering again over a new link, a parent link
// flushing more than its queue takes, an impostor of the parent's id during its outage or of a
// node elsewhere in the tree, messages held for a grandchild (its own or its child's restart),
// flow messages a parent's refusal for good fails, queueing turned off, and the registration
// refusals' reasons.
#include <gtest/gtest.h>
#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "bus/relay_harness.h"
#include "uvbus/node.h"

namespace uvbus::node_link_edge_test {
namespace {

using namespace std::chrono_literals;
using test::bus_node;
using test::send_str;

class NodeLinkEdge : public test::bus_fixture {
 protected:
  void TearDown() override {
    for (test::raw_child& r : raws_) {
      if (!r.ch) continue;
      r.ch->close();
      EXPECT_TRUE(wait([&] { return r.ch->closed(); }));
    }
    test::bus_fixture::TearDown();
  }
  // A hand-made peer `id` registering with the node at `url` as `role`, uncompressed (what it is
  // sent fills its link's queue), started at once.
  test::raw_child& raw(bus_id id, bus_id to, proto::link_role role, const std::string& url,
                       bool paused = false) {
    test::raw_child& r = raws_.emplace_back(id, to);
    r.role = role;
    r.compress = false;
    r.pause_after_register = paused;
    r.start(&loop_, url);
    return r;
  }
  // Sends `t`'s link to `peer` refused because its queue was full (metrics_text()).
  static uint64_t refused_to(const bus_node* t, const std::string& peer) {
    const std::string key = "uvbus_peer_queue_refused_total{peer=\"" + peer + "\"";
    const std::string text = t->n->metrics_text();
    const size_t at = text.find(key);
    if (at == std::string::npos) return 0;
    const size_t end = text.find('\n', at);
    const size_t sp = text.rfind(' ', end);
    return std::stoull(text.substr(sp + 1, end - sp - 1));
  }
  // Starts node `id` on `url` again (the old socket may still be closing: tried until it binds).
  bus_node* restart_at(bus_id id, node_config c, const std::string& url) {
    c.listen = {url};
    return restart(id, c);
  }

  // Root 0x100 (rc), relay C 0x110 owning 0x110/4, grandchild G 0x111 below C and sender S 0x101
  // (through the root, require_response answered late only), all up; once the root's own start
  // grace is over, C is destroyed and the root sees it go. C's config and address are kept to
  // start it again.
  struct subtree {
    bus_node* root;
    bus_node* g;
    bus_node* s;
    node_config cc;
    std::string curl;
  };
  subtree lose_relay_c(node_config rc) {
    subtree t{};
    t.root = make_root(0x100, {{0x100, 8}}, std::move(rc));
    t.cc = test::hop_config();
    t.cc.child_grace_ms = 30000;  // G, back after C, is held for there
    bus_node* c = make_child(0x110, t.root, {{0x110, 4}}, t.cc);
    t.curl = c->n->listen_urls().at(0);
    t.g = make_child(0x111, c, {}, test::hop_config());
    node_config sc = test::hop_config();
    sc.sibling_direct = false;
    sc.response_timeout_ms = 30000;  // a timeout would be a late wrong answer
    t.s = make_child(0x101, t.root, {}, sc);
    EXPECT_TRUE(wait([&] { return c->n->up() && t.g->n->up() && t.s->n->up(); }));
    // The root holds for every id of its subnets for child_grace_ms after its start: a message
    // for an id no child ever had comes back refused once that is over.
    send_options o;
    o.require_response = true;
    EXPECT_EQ(send_str(t.s, 0x1f0, 1, "probe", o), errc::ok);
    EXPECT_TRUE(wait([&] { return !t.s->reports.empty(); }));
    EXPECT_EQ(t.s->reports.at(0).status, errc::unknown_route);
    t.s->reports.clear();
    destroy(c);
    EXPECT_TRUE(wait([&] {
      return std::any_of(t.root->removed.begin(), t.root->removed.end(),
                         [](const auto& r) { return r.first == 0x110; });
    }));
    return t;
  }
  // S sends `count` require_response messages to G; true once the root holds them all (false:
  // some were reported first, refused).
  bool send_held_for_g(const subtree& t, int count) {
    send_options o;
    o.require_response = true;
    const uint64_t all = t.root->n->counters().held_for_child + static_cast<uint64_t>(count);
    for (int i = 0; i < count; ++i) EXPECT_EQ(send_str(t.s, 0x111, 1, "to G", o), errc::ok);
    EXPECT_TRUE(
        wait([&] { return !t.s->reports.empty() || t.root->n->counters().held_for_child == all; }));
    return t.s->reports.empty() && t.root->n->counters().held_for_child == all;
  }

  std::deque<test::raw_child> raws_;  // a deque: they never move (their callbacks hold this)
};

// Sibling 0x101 registers again over a new connection while its old link to B is still open (it
// restarted behind a half-open connection). B moved the peer onto the new link but left behind
// what waited in its overflow and its application's wait for on_writable: neither moved again,
// the paused relay link stayed paused, and the stall check later closed the healthy new link.
// Now the overflow goes out over the new link and on_writable(0x101) comes.
TEST_F(NodeLinkEdge, ASiblingRegisteringAgainGetsItsBacklogAndTheBlockedSenderItsWritable) {
  node_config bc = test::hop_config();
  bc.link_queue_bytes = size_t{128} << 10;
  bus_node* b = make_root(0x200, {{0x200, 8}}, bc);
  const std::string url = b->n->listen_urls().at(0);
  test::raw_child& old_link = raw(0x101, 0x200, proto::link_role::sibling, url, true);
  node_config cc = test::hop_config();
  cc.sibling_direct = false;
  bus_node* c = make_child(0x201, b, {}, cc);
  ASSERT_TRUE(wait([&] { return old_link.registered && c->n->up(); }));
  // B's own sends until its link to the sibling refuses one.
  const std::string payload(60000, 'b');
  ASSERT_TRUE(wait([&] {
    for (int i = 0; i < 8; ++i) {
      if (send_str(b, 0x101, 1, payload) == errc::queue_full) return true;
    }
    return false;
  }));
  // C's messages through B until one met the full queue: it waits in B's overflow for 0x101.
  const uint64_t before = refused_to(b, "0x101");
  ASSERT_TRUE(wait([&] {
    (void)send_str(c, 0x101, 7, payload);
    return refused_to(b, "0x101") > before;
  }));
  // Refused again just before the sibling comes back (its old link may have told of room since).
  const uint64_t told = b->writable;
  for (int i = 0; i < 64 && send_str(b, 0x101, 1, payload) == errc::ok; ++i) {
  }
  test::raw_child& again = raw(0x101, 0x200, proto::link_role::sibling, url);
  const auto from_c = [&] {
    for (const auto& m : again.got) {
      if (m.hd.source == 0x201) return true;
    }
    return false;
  };
  ASSERT_TRUE(wait([&] { return again.registered && from_c() && b->writable > told; }))
      << "registered " << again.registered << ", C's message " << from_c() << ", on_writable "
      << b->writable;
  // B's link to C reads again: a message C sends B itself arrives.
  ASSERT_EQ(send_str(c, 0x200, 2, "after"), errc::ok);
  ASSERT_TRUE(wait([&] { return !b->got.empty() && b->got.back().bytes == "after"; }));
  EXPECT_FALSE(again.closed);
}

// A child's messages queued while its parent was away went out in one call when it registered
// again: what the link's queue did not take was refused (queue_full) although send_data had
// accepted it. Now every one of them goes, in order, and is reported ok.
TEST_F(NodeLinkEdge, AReconnectFlushLargerThanTheLinkQueueSendsEverything) {
  node_config rc = test::hop_config();
  bus_node* root = make_root(0x100, {{0x100, 8}}, rc);
  const std::string url = root->n->listen_urls().at(0);
  node_config ac = test::hop_config();
  ac.link_queue_bytes = size_t{256} << 10;
  ac.pending_timeout_ms = 30000;
  bus_node* a = make_child(0x101, root, {}, ac);
  ASSERT_TRUE(wait([&] { return a->n->up(); }));
  destroy(root);
  ASSERT_TRUE(wait([&] { return !a->n->up(); }));
  constexpr size_t kCount = 3000;  // 3 MB: more than the link's queue and the socket's buffers
  std::string payload(1000, 'p');
  for (size_t i = 0; i < kCount; ++i) {
    std::memcpy(payload.data(), &i, sizeof i);
    ASSERT_EQ(send_str(a, 0x100, 1, payload), errc::ok) << i;
  }
  rc.subnets = {{0x100, 8}};
  bus_node* back = restart_at(0x100, rc, url);
  ASSERT_TRUE(wait([&] { return a->reports.size() == kCount; }))
      << a->reports.size() << " reports, " << a->ok_reports() << " ok";
  EXPECT_EQ(a->ok_reports(), kCount);
  ASSERT_TRUE(wait([&] { return back->got.size() == kCount; })) << back->got.size();
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(back->got[i].value(), i) << "out of order";
}

// While a node's parent link is down a peer could register with it as a sibling or a tool under
// the parent's id: every acceptance of the real parent was refused from then on (its id a
// registered peer's) and messages to the parent went to the impostor. A sibling with an id of its
// own could declare a subnet holding the parent's id, and then send as the parent (acks, command
// replies, data) while its link stayed up. Both are refused now, naming the parent, and the parent
// comes back.
TEST_F(NodeLinkEdge, NoPeerTakesTheParentsIdDuringItsOutage) {
  node_config rc = test::fast_config();
  bus_node* root = make_root(0x100, {{0x100, 8}}, rc);
  const std::string url = root->n->listen_urls().at(0);
  bus_node* c = make_child(0x101, root);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  destroy(root);
  ASSERT_TRUE(wait([&] { return !c->n->up(); }));
  const std::string curl = c->n->listen_urls().at(0);
  const struct {
    bus_id id;
    proto::link_role role;
    std::vector<subnet> nets;
  } cases[] = {{0x100, proto::link_role::tool, {}},
               {0x100, proto::link_role::sibling, {}},
               {0x130, proto::link_role::sibling, {{0x100, 0}}}};
  for (const auto& k : cases) {
    test::raw_child& imp = raw(k.id, 0x101, k.role, curl);
    imp.subnets = k.nets;  // declared when the challenge comes, on the loop
    ASSERT_TRUE(wait([&] { return imp.registered || imp.closed; }));
    EXPECT_FALSE(imp.registered) << "an impostor took the parent's id";
    EXPECT_NE(imp.reply_message.find("parent"), std::string::npos) << imp.reply_message;
  }
  rc.subnets = {{0x100, 8}};
  bus_node* back = restart_at(0x100, rc, url);
  ASSERT_TRUE(wait([&] { return c->ups == 2; }));
  ASSERT_EQ(send_str(c, 0x100, 1, "home"), errc::ok);
  ASSERT_TRUE(wait([&] { return !back->got.empty(); }));
}

// Root R 0x100/8 with children A (0x110/4) and B (0x120/4), grandchild G (0x111) below A. A peer
// registering at A as a tool, or at G as a sibling, under B's id (outside their subnets, not their
// parent's) was accepted: A's messages for B, and what A relayed for B, went to the impostor. A
// tool is never announced and an honest sibling in the tree is its parent's child, so an id the
// directory places elsewhere is refused now (duplicate_id, naming the id), and B still gets A's.
TEST_F(NodeLinkEdge, NoToolOrSiblingTakesTheIdOfANodeElsewhereInTheTree) {
  bus_node* root = make_root(0x100, {{0x100, 8}});
  bus_node* a = make_child(0x110, root, {{0x110, 4}});
  bus_node* b = make_child(0x120, root, {{0x120, 4}});
  bus_node* g = make_child(0x111, a);
  directory_entry e;
  ASSERT_TRUE(wait([&] { return a->n->lookup(0x120, &e) && g->n->lookup(0x120, &e); }));
  const struct {
    bus_node* at;
    proto::link_role role;
  } cases[] = {{a, proto::link_role::tool}, {g, proto::link_role::sibling}};
  for (const auto& c : cases) {
    test::raw_child& imp = raw(0x120, c.at->n->id(), c.role, c.at->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return imp.registered || imp.closed; }));
    EXPECT_FALSE(imp.registered) << "an impostor took B's id at 0x" << std::hex << c.at->n->id();
    EXPECT_EQ(imp.reply_status, proto::reason::duplicate_id);
    EXPECT_NE(imp.reply_message.find("id 0x120 "), std::string::npos) << imp.reply_message;
    ASSERT_EQ(send_str(c.at, 0x120, 1, "for B"), errc::ok);
    ASSERT_TRUE(wait([&] { return !b->got.empty() || !imp.got.empty(); }));
    EXPECT_TRUE(imp.got.empty()) << "the impostor got a message for B";
    b->got.clear();
  }
}

// A restarted root held messages for grandchild G (of child C's subnet) under G's id; C's
// registration released only what was held under C's own id: G's waited out child_grace_ms and
// were refused (unknown_route) although G was reachable. They go to C when it registers now.
TEST_F(NodeLinkEdge, MessagesHeldForAGrandchildGoWhenItsChildRegisters) {
  node_config rc = test::hop_config();
  rc.child_grace_ms = 5000;
  bus_node* root = make_root(0x100, {{0x100, 8}}, rc);
  const std::string url = root->n->listen_urls().at(0);
  node_config cc = test::hop_config();
  cc.reconnect_min_ms = cc.reconnect_max_ms = 2500;  // back well after S, within the grace
  cc.reconnect_jitter = 0;
  bus_node* c = make_child(0x110, root, {{0x110, 4}}, cc);
  bus_node* g = make_child(0x111, c, {}, test::hop_config());
  node_config sc = test::hop_config();
  sc.sibling_direct = false;
  sc.response_timeout_ms = 30000;  // a timeout would be a late wrong answer
  bus_node* s = make_child(0x101, root, {}, sc);
  ASSERT_TRUE(wait([&] { return c->n->up() && g->n->up() && s->n->up(); }));
  destroy(root);
  ASSERT_TRUE(wait([&] { return !s->n->up() && !c->n->up(); }));
  rc.subnets = {{0x100, 8}};
  (void)restart_at(0x100, rc, url);
  ASSERT_TRUE(wait([&] { return s->n->up(); }));
  ASSERT_FALSE(c->n->up()) << "C came back before S: nothing was held";
  send_options o;
  o.require_response = true;
  for (int i = 0; i < 10; ++i) ASSERT_EQ(send_str(s, 0x111, 1, "to G", o), errc::ok);
  ASSERT_TRUE(wait([&] { return s->reports.size() == 10; })) << s->reports.size();
  for (const auto& r : s->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  EXPECT_EQ(g->got.size(), 10u);
}

// Root -> relay C (0x110/4) -> grandchild G (0x111), and C restarts. The root held what came for
// C's own id meanwhile, but a message for G (an id of C's subnets) found no route and was refused
// (unknown_route) at once. The root remembers a lost child's subnets now: G's messages wait for C
// within child_grace_ms and reach G once C and G are back.
TEST_F(NodeLinkEdge, MessagesForAGrandchildWaitWhileItsChildRestarts) {
  node_config rc = test::hop_config();
  rc.child_grace_ms = 5000;  // C comes back well within it
  subtree t = lose_relay_c(rc);
  ASSERT_TRUE(send_held_for_g(t, 10)) << t.s->reports.size() << " refused at once";
  t.cc.subnets = {{0x110, 4}};
  t.cc.parent_urls = {t.root->n->listen_urls().at(0)};
  (void)restart_at(0x110, t.cc, t.curl);
  ASSERT_TRUE(wait([&] { return t.s->reports.size() == 10; })) << t.s->reports.size();
  for (const auto& r : t.s->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  EXPECT_EQ(t.g->got.size(), 10u);
}

// ... and when C does not come back within child_grace_ms, what was held for G is refused then
// (unknown_route, its source told), not kept.
TEST_F(NodeLinkEdge, MessagesHeldForAGrandchildFailWhenItsChildStaysAway) {
  node_config rc = test::hop_config();
  rc.child_grace_ms = 1000;
  subtree t = lose_relay_c(rc);
  ASSERT_TRUE(send_held_for_g(t, 3)) << t.s->reports.size() << " refused at once";
  ASSERT_TRUE(wait([&] { return t.s->reports.size() == 3; })) << t.s->reports.size();
  for (const auto& r : t.s->reports)
    EXPECT_EQ(r.status, errc::unknown_route) << to_string(r.status);
  EXPECT_EQ(t.root->n->counters().pending_now, 0u);
  EXPECT_TRUE(t.root->logged("no child came back within child_grace_ms"));
}

// End-to-end messages sent before a parent refused this node for good (its id outside the
// parent's subnets) waited in the parent queue as flow copies, which the refusal did not report:
// their flows kept them until delivery_timeout_ms and reported timeout. They are reported with
// the refusal now (out_of_subnet), as next-hop messages are, and the flow's sender that met a
// full flow hears on_writable.
TEST_F(NodeLinkEdge, FlowMessagesQueuedForARefusingParentReportTheRefusal) {
  bus_node* root = make_root(0x100, {{0x100, 8}});
  node_config oc = test::fast_config();
  oc.delivery_timeout_ms = 5000;  // before: timeout then
  oc.retransmit_max_messages = 4;
  bus_node* out = make_child(0x300, root, {}, oc);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(send_str(out, 0x100, 1, "early"), errc::ok);
  ASSERT_EQ(send_str(out, 0x100, 1, "full"), errc::queue_full);
  ASSERT_EQ(send_str(out, 0x105, 1, "early"), errc::ok);
  ASSERT_TRUE(wait([&] { return out->reports.size() == 5; })) << out->reports.size();
  for (const auto& r : out->reports)
    EXPECT_EQ(r.status, errc::out_of_subnet) << to_string(r.status);
  EXPECT_EQ(out->registrations, std::vector<errc>{errc::out_of_subnet});
  EXPECT_EQ(out->writable, 1u);
  EXPECT_EQ(send_str(out, 0x100, 1, "after"), errc::out_of_subnet);
}

// With queueing off (pending_max_messages = 0) a send to a node outside our subnets went into the
// direct-sibling lookup's queue, which refused it (not_connected) although the parent was up.
// It goes through the parent now.
TEST_F(NodeLinkEdge, QueueingOffSendsThroughTheParentWhileTheSiblingIsLookedUp) {
  bus_node* root = make_root(0x100, {{0x100, 8}});
  node_config ac = test::fast_config();
  ac.pending_max_messages = 0;
  bus_node* a = make_child(0x101, root, {}, ac);
  bus_node* b = make_child(0x102, root);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  ASSERT_EQ(send_str(a, 0x102, 1, "first"), errc::ok);
  ASSERT_EQ(send_str(a, 0x102, 1, "second"), errc::ok);
  ASSERT_TRUE(wait([&] { return b->got.size() == 2; }));
  EXPECT_EQ(b->got[0].bytes, "first");
  // A pending queue that cannot hold one message of message_limit would refuse every one.
  node_config small = test::fast_config();
  small.pending_max_bytes = 1000;
  std::string detail;
  EXPECT_EQ(node::validate(0x300, small, &detail), errc::invalid_argument);
  EXPECT_NE(detail.find("pending_max_bytes (1000)"), std::string::npos) << detail;
  EXPECT_NE(detail.find("message_limit"), std::string::npos) << detail;
  small.pending_max_messages = 0;  // queueing off: no bound to check
  EXPECT_EQ(node::validate(0x300, small, &detail), errc::ok) << detail;
}

// A sibling or tool registering with the acceptor's own id was told "id ... is already
// registered"; it is named as a child's is now: "id ... is ours".
TEST_F(NodeLinkEdge, APeerWithOurIdIsToldItIsOurs) {
  bus_node* root = make_root(0x100, {{0x100, 8}});
  for (const proto::link_role role : {proto::link_role::tool, proto::link_role::sibling}) {
    test::raw_child& r = raw(0x100, 0x100, role, root->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return r.registered || r.closed; }));
    EXPECT_FALSE(r.registered);
    EXPECT_EQ(r.reply_status, proto::reason::duplicate_id);
    EXPECT_EQ(r.reply_message, "id 0x100 is ours");
  }
}

// A child's refusal names what collides: the subnet and the child that owns it (it was "id ... is
// already registered" for an id inside another child's subnet).
TEST_F(NodeLinkEdge, AChildRefusalNamesTheSubnetAndItsChild) {
  bus_node* root = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x110, root, {{0x110, 4}});
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  test::raw_child& inside = raw(0x111, 0x100, proto::link_role::child, root->n->listen_urls()[0]);
  ASSERT_TRUE(wait([&] { return inside.closed; }));
  EXPECT_FALSE(inside.registered);
  EXPECT_EQ(inside.reply_message, "id 0x111 lies in subnet 0x110/4 of registered child 0x110");
}

// Root R2 (0x100/8), relay R1 (0x110/4) below it, source S (0x111) below R1, target V (0x101)
// below R2, and R2 restarts. R1, its parent reconnecting, had no route for V and refused what S
// sent it (unknown_route, final for a target S never heard from) although its own messages waited
// for the parent. It holds the relayed message for the parent now, and V gets it when R2 is back.
TEST_F(NodeLinkEdge, ARelayWhoseParentReconnectsHoldsWhatItsChildrenSendUp) {
  node_config rc = test::hop_config();
  bus_node* root = make_root(0x100, {{0x100, 8}}, rc);
  const std::string url = root->n->listen_urls().at(0);
  bus_node* r1 = make_child(0x110, root, {{0x110, 4}}, test::hop_config());
  node_config sc = test::hop_config();
  sc.sibling_direct = false;
  sc.response_timeout_ms = 30000;  // a timeout would be a late wrong answer
  bus_node* s = make_child(0x111, r1, {}, sc);
  bus_node* v = make_child(0x101, root, {}, test::hop_config());
  ASSERT_TRUE(wait([&] { return r1->n->up() && s->n->up() && v->n->up(); }));
  destroy(root);
  ASSERT_TRUE(wait([&] { return !r1->n->up(); }));
  send_options o;
  o.require_response = true;
  ASSERT_EQ(send_str(s, 0x101, 1, "to V", o), errc::ok);
  // One for R2 itself too: once R2 registers it is a direct peer of R1's routing table, and that
  // message stayed held until it expired (not_connected) while newer ones went past it.
  ASSERT_EQ(send_str(s, 0x100, 1, "to R2", o), errc::ok);
  // Held, not refused: nothing is reported while R2 is away.
  ASSERT_TRUE(wait([&] { return r1->n->counters().held_for_child == 2 || !s->reports.empty(); }));
  ASSERT_TRUE(s->reports.empty()) << to_string(s->reports.at(0).status);
  rc.subnets = {{0x100, 8}};
  bus_node* r2 = restart_at(0x100, rc, url);
  ASSERT_TRUE(wait([&] { return s->reports.size() == 2; }));
  for (const delivery_report& r : s->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  ASSERT_TRUE(wait([&] { return !v->got.empty() && !r2->got.empty(); }));
  EXPECT_EQ(r1->n->counters().pending_now, 0u);
}

// The same, but R2 comes back with subnets that no longer hold R1 (out_of_subnet: a refusal for
// good): what S sent up meanwhile is refused unknown_route then, not told not_connected ("try
// again") after pending_timeout_ms.
TEST_F(NodeLinkEdge, ARelayRefusedForGoodByItsParentRefusesWhatItHeldForIt) {
  node_config rc = test::hop_config();
  bus_node* root = make_root(0x100, {{0x100, 8}}, rc);
  const std::string url = root->n->listen_urls().at(0);
  node_config r1c = test::hop_config();
  r1c.pending_timeout_ms = 60000;  // the refusal, not the expiry, must end the hold
  bus_node* r1 = make_child(0x110, root, {{0x110, 4}}, r1c);
  node_config sc = test::hop_config();
  sc.sibling_direct = false;
  sc.response_timeout_ms = 60000;
  bus_node* s = make_child(0x111, r1, {}, sc);
  ASSERT_TRUE(wait([&] { return r1->n->up() && s->n->up(); }));
  destroy(root);
  ASSERT_TRUE(wait([&] { return !r1->n->up(); }));
  send_options o;
  o.require_response = true;
  ASSERT_EQ(send_str(s, 0x101, 1, "to V", o), errc::ok);
  ASSERT_TRUE(wait([&] { return r1->n->counters().held_for_child == 1; }));
  rc.subnets = {{0x100, 4}};  // 0x100 .. 0x10f: R1 (0x110) is outside now
  (void)restart_at(0x100, rc, url);
  ASSERT_TRUE(wait([&] { return !s->reports.empty(); }));
  EXPECT_EQ(s->reports.at(0).status, errc::unknown_route) << to_string(s->reports.at(0).status);
  EXPECT_EQ(r1->registrations.back(), errc::out_of_subnet);
  EXPECT_EQ(r1->n->counters().pending_now, 0u);
}

// The same relay, but the message is plain next-hop data and R2 stays away longer than R1's
// pending_timeout_ms: the held message expires, and S is told (a drop notice, on_dropped, saying
// not_connected: the target may be there) instead of it vanishing (held in the parent queue, it
// ended there silently, untagged).
TEST_F(NodeLinkEdge, ARelayedMessageThatExpiresInTheParentQueueIsNoticedToItsSource) {
  bus_node* root = make_root(0x100, {{0x100, 8}}, test::hop_config());
  node_config r1c = test::hop_config();
  r1c.pending_timeout_ms = 200;
  bus_node* r1 = make_child(0x110, root, {{0x110, 4}}, r1c);
  node_config sc = test::hop_config();
  sc.sibling_direct = false;
  bus_node* s = make_child(0x111, r1, {}, sc);
  ASSERT_TRUE(wait([&] { return r1->n->up() && s->n->up(); }));
  destroy(root);
  ASSERT_TRUE(wait([&] { return !r1->n->up(); }));
  ASSERT_EQ(send_str(s, 0x101, 1, "to V"), errc::ok);
  ASSERT_TRUE(wait([&] { return r1->n->counters().held_for_child == 1; }));  // held, not refused
  ASSERT_TRUE(wait([&] { return !s->drops.empty(); }));
  EXPECT_EQ(s->drops.at(0), errc::not_connected) << to_string(s->drops.at(0));
  EXPECT_EQ(s->n->counters().drop_notices_received, 1u);
  EXPECT_EQ(r1->n->counters().pending_now, 0u);
  EXPECT_EQ(r1->n->counters().drop_notices_sent, 1u);
}

// A relay holds a message for a child lost in its own start-up window for child_grace_ms after
// that loss, not only until its start-up window ends (which cut the child's grace short: the
// message was refused, unknown_route, at start + child_grace_ms).
TEST_F(NodeLinkEdge, AChildLostDuringTheStartUpWindowGetsItsWholeGrace) {
  using clock = std::chrono::steady_clock;
  constexpr auto kGrace = std::chrono::milliseconds(3000);
  node_config rc = test::hop_config();
  rc.child_grace_ms = static_cast<uint32_t>(kGrace.count());
  const clock::time_point t0 = clock::now();  // at or before the root's start
  bus_node* root = make_root(0x100, {{0x100, 8}}, rc);
  bus_node* b = make_child(0x102, root, {}, test::hop_config());
  node_config sc = test::hop_config();
  sc.sibling_direct = false;
  sc.response_timeout_ms = 30000;
  bus_node* s = make_child(0x101, root, {}, sc);
  ASSERT_TRUE(wait([&] { return b->n->up() && s->n->up(); }));
  // B is lost halfway through the root's start-up window, so its grace ends after the window's.
  ASSERT_TRUE(wait([&] { return clock::now() - t0 >= kGrace / 2; }));
  destroy(b);
  ASSERT_TRUE(wait([&] { return !root->removed.empty(); }));
  send_options o;
  o.require_response = true;
  ASSERT_EQ(send_str(s, 0x102, 1, "to B", o), errc::ok);
  clock::time_point told{};
  ASSERT_TRUE(wait([&] {
    if (!s->reports.empty() && told == clock::time_point{}) told = clock::now();
    return !s->reports.empty();
  }));
  EXPECT_EQ(s->reports.at(0).status, errc::unknown_route);
  // Held at least until B's loss + child_grace_ms (>= t0 + 1.5 grace), not refused at t0 + grace.
  const auto ms = [](clock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  EXPECT_GE(ms(told - t0), ms(kGrace + kGrace / 3));
}

// A next hop that goes silent with messages queued for it: the heartbeat check closes its link
// (on_endpoint_removed: timeout), and what the link still held is reported timeout too under
// next-hop delivery. It was reported cancelled (the stream's word for the forced close), a reason
// node.h's report list does not name.
TEST_F(NodeLinkEdge, MessagesQueuedForASilentNextHopAreReportedTimeout) {
  node_config pc = test::fast_config();
  pc.heartbeat_timeout_ms = 1000;
  pc.delivery = delivery_mode::next_hop;
  bus_node* p = make_root(0x100, {{0x100, 8}}, pc);
  test::raw_child& c = raw(0x101, 0x100, proto::link_role::child, p->n->listen_urls()[0], true);
  ASSERT_TRUE(wait([&] { return c.registered; }));
  const size_t accepted = test::fill_unread_link(&loop_, p, &c, false);
  ASSERT_TRUE(wait([&] { return !p->removed.empty() && p->reports.size() == accepted; }));
  EXPECT_EQ(p->removed.at(0).second, errc::timeout);
  EXPECT_GT(test::failed_reports(*p, errc::timeout), 0u);  // the link held messages when closed
}

}  // namespace
}  // namespace uvbus::node_link_edge_test
