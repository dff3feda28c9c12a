// End-to-end delivery at its edges: forged source ids and sequences against a target's table of
// positions, late messages of a source's dead incarnations against its live flow (with and
// without a hand-over of the positions), and what a restart (planned, or of a relay) leaves to the
// next process.
#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bus/flow_harness.h"
#include "bus/wire.h"
#include "uvbus/node.h"

namespace uvbus::node_flow_edge_test {
namespace {

using namespace std::chrono_literals;
using test::bus_node;
using test::flow_config;

class NodeFlowEdgeTest : public test::flow_fixture {
 protected:
  // What `t` delivered, as text, in order.
  static std::vector<std::string> texts(const bus_node* t) {
    std::vector<std::string> v;
    v.reserve(t->got.size());
    for (const auto& g : t->got) v.push_back(g.bytes);
    return v;
  }
  // The messages of type `type` the raw child got.
  static size_t count(const test::raw_child& raw, proto::msg_type type) {
    size_t n = 0;
    for (const auto& m : raw.got) n += static_cast<size_t>(m.hd.type == type);
    return n;
  }
  // The raw child acknowledges the flow from the root `times` times in one burst: `kind`, naming
  // the root's flow epoch (from the first flow message it got) and the incarnation
  // incarnations[i % size].
  static void send_acks(test::raw_child& raw, proto::ack_kind kind,
                        const std::vector<uint64_t>& incarnations, size_t times) {
    uint64_t epoch = 0;
    for (const auto& m : raw.got) {
      proto::data_body d;
      if (m.hd.type == proto::msg_type::data && (m.hd.flags & proto::flag_flow) != 0 &&
          proto::parse_flow_data(m.body.data(), m.body.size(), &d, &epoch) == errc::ok) {
        break;
      }
    }
    std::vector<uint8_t> body(proto::kFlowAckSize);
    for (size_t i = 0; i < times; ++i) {
      proto::encode_flow_ack({epoch, incarnations[i % incarnations.size()], 0, kind}, body.data());
      raw.send(proto::msg_type::flow_ack, body);
    }
  }
};

// A target asking for resyncs without end (or naming two incarnations in turn, each ack a
// "restart"): each request resent the whole unacknowledged window, so 200 acks of 57 bytes put
// 200 windows on the next hop's link, and the application's other sends met queue_full. Now one
// resend per kResendIntervalMs whatever asks: the first request is served at once, and again once
// the interval has passed.
TEST_F(NodeFlowEdgeTest, ATargetsResyncFloodResendsTheWindowOncePerInterval) {
  test::raw_child raw(0x101, 0x100);
  node_config rc = flow_config();
  rc.resend_timeout_ms = 10000;  // no probes meanwhile: every resend is one an ack asked for
  bus_node* root = root_with(&raw, rc);
  ASSERT_TRUE(raw.registered);
  constexpr size_t kWindow = 20, kAcks = 200;
  for (size_t i = 0; i < kWindow; ++i) ASSERT_EQ(test::send_str(root, 0x101, 1, "m"), errc::ok);
  ASSERT_TRUE(wait([&] { return count(raw, proto::msg_type::data) == kWindow; }));
  // What a burst of acks made the root resend: the flow messages the raw child got after it
  // (flow_resent does not count a message's first resend when its first send was the fast path).
  const auto burst = [&](proto::ack_kind kind, const std::vector<uint64_t>& inc, size_t times) {
    const size_t before = count(raw, proto::msg_type::data);
    const uint64_t acks = root->n->counters().flow_acks_received;
    send_acks(raw, kind, inc, times);
    EXPECT_TRUE(wait([&] {
      return root->n->counters().flow_acks_received == acks + times &&
             count(raw, proto::msg_type::data) >= before + kWindow;  // the first is served
    }));
    run_for(100ms);  // the copies any later request asked for arrive too
    return count(raw, proto::msg_type::data) - before;
  };
  EXPECT_LE(burst(proto::ack_kind::resync, {0xa1}, kAcks), 3 * kWindow);  // today 200 windows
  EXPECT_GE(burst(proto::ack_kind::resync, {0xa1}, 1), kWindow) << "served again later";
  EXPECT_LE(burst(proto::ack_kind::ack, {0xa2, 0xa1}, kAcks), 3 * kWindow);
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A child owning 64 ids sends flow data from each of them. Messages that are not sync make no
// state (each is answered with a resync request); sync ones make positions up to
// max_flow_sources, and the rest are refused: counted, their sources told (a drop notice,
// access_denied), so a real node refused reports its message failed instead of losing it. A flow
// that had its position goes on. Before: a position per forged id, however many.
TEST_F(NodeFlowEdgeTest, ForgedSourcesCannotGrowTheTargetsPositionsBeyondItsLimit) {
  test::raw_child raw(0x180, 0x100);
  raw.subnets = {{0x180, 6}};  // 0x180 .. 0x1bf
  node_config rc = flow_config();
  rc.max_flow_sources = 8;
  bus_node* root = root_with(&raw, rc);
  ASSERT_TRUE(raw.registered);
  node_config ac = flow_config();
  ac.parent_urls = {root->n->listen_urls().at(0)};
  bus_node* a = make(0x101, ac);  // a real source with a position before the flood
  ASSERT_TRUE(wait([&] { return a->n->up(); }));
  ASSERT_EQ(test::send_str(a, 0x100, 1, "a1"), errc::ok);
  ASSERT_TRUE(wait([&] { return a->reports.size() == 1; }));

  constexpr uint64_t kForged = 63;
  for (bus_id s = 0x181; s < 0x181 + kForged; ++s) raw.send_flow(s, 7, "no sync", 0x77, false);
  ASSERT_TRUE(wait([&] { return count(raw, proto::msg_type::flow_ack) == kForged; }))
      << count(raw, proto::msg_type::flow_ack) << " resync requests";
  EXPECT_EQ(root->n->counters().flow_resyncs, kForged);
  EXPECT_EQ(root->n->counters().flow_sources, 1u) << "state made for a message that is not sync";

  for (bus_id s = 0x181; s < 0x181 + kForged; ++s) raw.send_flow(s, 7, "sync", 0x77);
  const uint64_t taken = rc.max_flow_sources - 1;  // A holds one
  ASSERT_TRUE(wait([&] { return count(raw, proto::msg_type::dropped) == kForged - taken; }));
  const node_counters k = root->n->counters();
  EXPECT_EQ(k.flow_sources, rc.max_flow_sources);
  EXPECT_EQ(k.flow_sources_refused, kForged - taken);
  EXPECT_NE(root->n->metrics_text().find("uvbus_node_flow_sources_refused_total " +
                                         std::to_string(kForged - taken) + "\n"),
            std::string::npos);
  for (const auto& m : raw.got) {
    if (m.hd.type != proto::msg_type::dropped) continue;
    proto::dropped_body d;
    ASSERT_EQ(proto::parse_dropped(m.body.data(), m.body.size(), &d), errc::ok);
    EXPECT_EQ(d.why, proto::reason::access_denied);
  }

  // A keeps its flow; a new real source is refused, and reports it.
  ASSERT_EQ(test::send_str(a, 0x100, 1, "a2"), errc::ok);
  bus_node* c = make(0x102, ac);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  uint64_t id = 0;
  ASSERT_EQ(test::send_str(c, 0x100, 1, "c1", {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return a->reports.size() == 2 && c->report_for(id) != nullptr; }));
  EXPECT_EQ(a->reports[1].status, errc::ok);
  EXPECT_EQ(c->report_for(id)->status, errc::access_denied);
  EXPECT_EQ(texts(root).front(), "a1");
  EXPECT_EQ(texts(root).back(), "a2");
  EXPECT_EQ(root->n->counters().flow_sources, rc.max_flow_sources);
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A target handed over with its positions keeps the epochs its flows left: a late sync message of
// a source's dead incarnation, arriving at the new process after the new incarnation's, is stale
// there too. Before: the blob carried no left epochs, the late message took the flow, and every
// later message of the live incarnation was dropped as stale (never delivered, never
// acknowledged).
TEST_F(NodeFlowEdgeTest, AHandedOverFlowStillKnowsTheEpochsItLeft) {
  auto raw = std::make_unique<test::raw_child>(0x101, 0x100);
  bus_node* root = root_with(raw.get());
  ASSERT_TRUE(raw->registered);
  constexpr uint64_t kOld = 0x5eed1, kNew = 0x5eed2;
  raw->send_flow(0x101, 10, "old", kOld);
  raw->send_flow(0x101, 500, "new", kNew);
  ASSERT_TRUE(wait([&] { return root->got.size() == 2; }));
  root->n->stop();
  ASSERT_TRUE(wait([&] { return !root->downs.empty() && raw->closed; }));
  node_config rc = flow_config();
  rc.inherit_flow_positions = root->n->flow_positions();
  raw = std::make_unique<test::raw_child>(0x101, 0x100);
  bus_node* next = root_with(raw.get(), rc);
  ASSERT_TRUE(raw->registered);
  raw->send_flow(0x101, 11, "late", kOld);          // the dead incarnation's, delayed
  raw->send_flow(0x101, 501, "next", kNew, false);  // the live flow goes on in order
  ASSERT_TRUE(wait([&] {
    const node_counters k = next->n->counters();
    return k.flow_stale + k.data_received >= 2;
  }));
  EXPECT_EQ(texts(next), std::vector<std::string>{"next"});
  EXPECT_EQ(next->n->counters().flow_stale, 1u);
  raw->ch->close();
  ASSERT_TRUE(wait([&] { return raw->ch->closed(); }));
}

// A source restarted more often than a target remembers left epochs (two), then a late sync
// message of its first incarnation: that epoch is no longer known, so it takes the flow. The live
// incarnation's messages are stale then, but it keeps sending its first unacknowledged one
// flagged sync (the resend timer): once the taken epoch has sent nothing for resend_timeout_ms
// since such a message, the live epoch is taken back at its position (nothing twice). Before:
// stale for ever, the live flow wedged until every message timed out.
TEST_F(NodeFlowEdgeTest, ALiveIncarnationTakesItsFlowBackFromALateForgottenOne) {
  test::raw_child raw(0x101, 0x100);
  bus_node* root = root_with(&raw);
  ASSERT_TRUE(raw.registered);
  constexpr uint64_t kEpoch[4] = {0xe1, 0xe2, 0xe3, 0xe4};
  for (uint64_t i = 0; i < 4; ++i)
    raw.send_flow(0x101, 100 * (i + 1), "e" + std::to_string(i), kEpoch[i]);
  raw.send_flow(0x101, 101, "late", kEpoch[0]);         // forgotten: takes the flow
  raw.send_flow(0x101, 401, "next", kEpoch[3], false);  // stale now
  // The live source's resend timer: its front, flagged sync, every 5 ms until acknowledged.
  auto last = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait([&] {
    if (!root->got.empty() && root->got.back().bytes == "next") return true;
    if (std::chrono::steady_clock::now() - last >= 5ms) {
      raw.send_flow(0x101, 401, "next", kEpoch[3]);
      last = std::chrono::steady_clock::now();
    }
    return false;
  })) << root->n->counters().flow_stale
      << " stale";
  raw.send_flow(0x101, 401, "next", kEpoch[3]);  // one more copy: a duplicate now
  raw.send_flow(0x101, 402, "after", kEpoch[3], false);
  ASSERT_TRUE(wait([&] { return root->got.back().bytes == "after"; }));
  EXPECT_EQ(texts(root),
            (std::vector<std::string>{"e0", "e1", "e2", "e3", "late", "next", "after"}));
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A flow message numbered 0 (sequences start at 1), flagged sync: taken, it put the flow at the
// last sequence there is (sequence - 1), and every later message of that source and epoch was
// dropped as a duplicate — acknowledged, never delivered. Refused now: relayed, counted; from the
// peer itself, a protocol error that closes its link.
TEST_F(NodeFlowEdgeTest, ASequenceZeroCannotWedgeAFlow) {
  test::raw_child raw(0x180, 0x100);
  raw.subnets = {{0x180, 6}};  // 0x181 is its descendant's: relayed by it
  bus_node* root = root_with(&raw);
  ASSERT_TRUE(raw.registered);
  raw.send_flow(0x181, 0, "zero", 7);
  raw.send_flow(0x181, 1, "one", 7);
  raw.send_flow(0x181, 2, "two", 7, false);
  ASSERT_TRUE(wait([&] {
    const node_counters k = root->n->counters();
    return k.flow_duplicates + k.data_received >= 2;
  }));
  EXPECT_EQ(texts(root), (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(root->n->counters().protocol_errors, 1u);
  EXPECT_FALSE(raw.closed);
  raw.send_flow(0x180, 0, "zero", 7);
  ASSERT_TRUE(wait([&] { return raw.closed; }));
  EXPECT_EQ(root->n->counters().protocol_errors, 2u);
  EXPECT_EQ(texts(root).size(), 2u);
}

// A relay whose loop's cached clock went stale before start() (its process blocked in
// handover_receive(), or retried start() while the old process held the port) holds a message
// for a child that has not registered yet for child_grace_ms from start(). Before: its start was
// stamped with the stale clock, the grace had run out at once, and the message was refused
// (unknown_route: final for a target never heard from, reported failed).
TEST_F(NodeFlowEdgeTest, ARelayStartedOnAStaleLoopClockStillHoldsForItsChildren) {
  node_config rc = flow_config();
  rc.child_grace_ms = 2000;
  // On purpose (the scenario, not a wait for an event): the loop's cached time goes stale.
  std::this_thread::sleep_for(std::chrono::milliseconds(rc.child_grace_ms + 100));
  bus_node* root = make_root(0x100, {{0x100, 8}}, rc);
  bus_node* a = make_child(0x101, root, {}, flow_config());
  ASSERT_TRUE(wait([&] { return a->n->up(); }));
  ASSERT_EQ(test::send_str(a, 0x1aa, 1, "held"), errc::ok);
  run_for(100ms);
  bus_node* x = make_child(0x1aa, root, {}, flow_config());
  ASSERT_TRUE(wait([&] { return a->reports.size() == 1; }));
  EXPECT_EQ(a->reports[0].status, errc::ok) << to_string(a->reports[0].status);
  EXPECT_EQ(texts(x), std::vector<std::string>{"held"});
}

// Planned restart: a request reaching the old process while it waits for its own messages'
// acknowledgements (stop_flush_ms) is answered by the new one. Before: delivered and taken into
// the positions handed over, but the answer was refused (the node was stopping): the new process
// dropped the resent request as a duplicate, and the call timed out.
TEST_F(NodeFlowEdgeTest, ARequestReachingAStoppingNodeIsAnsweredByItsSuccessor) {
  test::raw_child raw(0x180, 0x100);  // silent: it acknowledges nothing
  node_config rc = flow_config();
  rc.child_grace_ms = 20000;  // the root holds what comes for B between the two processes
  bus_node* root = root_with(&raw, rc);
  node_config bc = flow_config();
  bc.parent_urls = {root->n->listen_urls().at(0)};
  bc.stop_flush_ms = 1000;
  // B, then its successor: each answers every request with "pong" (what reply() returned kept).
  bus_node* current = nullptr;
  std::vector<errc> answers;
  const auto answering = [&](node_callbacks* cb) {
    cb->on_data = [&](bus_id, uint32_t, const uint8_t*, size_t) {
      const reply_handle* req = current->n->incoming_request();
      if (req == nullptr) return;
      reply_handle h = *req;
      answers.push_back(current->n->reply(h, "pong", 4));
    };
  };
  bus_node* b = current = make(0x102, bc, true, answering);
  node_config ac = flow_config();
  ac.parent_urls = bc.parent_urls;
  bus_node* a = make(0x101, ac);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  ASSERT_EQ(test::send_str(b, 0x180, 1, "never acknowledged"), errc::ok);
  ASSERT_TRUE(wait([&] { return !raw.got.empty(); }));
  b->n->stop();  // waits stop_flush_ms for that acknowledgement, its links open
  std::vector<errc> status;
  std::string got;
  ASSERT_EQ(a->n->call(0x102, 5, "ping", 4, 20000,
                       [&](const call_result& r) {
                         status.push_back(r.status);
                         got.assign(reinterpret_cast<const char*>(r.data), r.size);
                       }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return !b->downs.empty(); }));
  bc.inherit_flow_positions = b->n->flow_positions();
  current = make(0x102, bc, true, answering);
  ASSERT_TRUE(wait([&] { return !status.empty(); }));
  EXPECT_EQ(status, std::vector<errc>{errc::ok}) << to_string(status[0]);
  EXPECT_EQ(got, "pong");
  EXPECT_EQ(answers, std::vector<errc>{errc::ok});
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A successor keeps no more sources' positions than max_flow_sources: more, inherited, would have
// every new source refused (access_denied) until the inherited ones went idle. Refused by
// validate() (and so start()), naming both numbers.
TEST(NodeFlowEdgeConfig, InheritedPositionsBeyondMaxFlowSourcesAreRefused) {
  node_config c = flow_config();
  c.max_flow_sources = 2;
  c.inherit_flow_positions = test::positions_blob(1, 2);
  std::string why;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c.inherit_flow_positions = test::positions_blob(1, 3);
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("holds 3 sources' positions, more than max_flow_sources (2)"),
            std::string::npos)
      << why;
}

TEST(NodeFlowEdgeConfig, MaxFlowSourcesIsAtLeastOne) {
  node_config c;
  c.max_flow_sources = 0;
  std::string why;
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("max_flow_sources"), std::string::npos) << why;
  c.max_flow_sources = 1;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
}

}  // namespace
}  // namespace uvbus::node_flow_edge_test
