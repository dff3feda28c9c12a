// Relays that drop a message tell its source (a drop notice, or the negative ack of a
// require_response message), rate-limit their log lines, and keep talking to version-1 peers;
// early messages to a sibling that has not registered yet wait for it instead of being lost.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <string>
#include <tuple>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "bus/relay_harness.h"

namespace uvbus::node_relay_test {
namespace {

using namespace std::chrono_literals;
using test::bus_node;
using test::send_str;

using test::dropped_event;
using test::hop_config;

// These tests are about next-hop delivery (the drop notices tell a source whose report was
// already ok); end-to-end delivery turns the same refusals into reports (node_flow_test.cpp).
class NodeRelayTest : public test::relay_fixture {
 protected:
  // Root and child A (relay_fixture), both with next-hop delivery unless child_cfg says otherwise.
  void make_root_and_sender(node_config child_cfg = hop_config()) {
    relay_fixture::make_root_and_sender(hop_config(), std::move(child_cfg));
  }
};

send_options rr() {
  send_options o;
  o.require_response = true;
  return o;
}

TEST_F(NodeRelayTest, DropToUnknownIdIsNoticedWithoutSecondReport) {
  make_root_and_sender();
  uint64_t id = 0;
  ASSERT_EQ(send_str(a_, 0x9999, 1, "lost", {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return !a_drops().empty(); }));
  EXPECT_EQ(a_drops()[0].target, 0x9999u);
  EXPECT_EQ(a_drops()[0].id, id);
  EXPECT_EQ(a_drops()[0].why, errc::unknown_route);
  ASSERT_TRUE(wait([&] { return a_->report_for(id) != nullptr; }));
  run_for(50ms);
  ASSERT_EQ(a_->reports.size(), 1u);  // the next-hop report, and no second one
  EXPECT_EQ(a_->reports[0].status, errc::ok);
  EXPECT_EQ(root_->n->counters().drop_notices_sent, 1u);
  EXPECT_EQ(a_->n->counters().drop_notices_received, 1u);
  EXPECT_TRUE(root_->logged("dropping data message"));
}

TEST_F(NodeRelayTest, DropToUnknownIdWithRequireResponseIsTheReport) {
  make_root_and_sender();
  uint64_t id = 0;
  ASSERT_EQ(send_str(a_, 0x9999, 1, "lost", rr(), &id), errc::ok);
  ASSERT_TRUE(wait([&] { return a_->report_for(id) != nullptr; }));
  run_for(50ms);
  ASSERT_EQ(a_->reports.size(), 1u);
  EXPECT_EQ(a_->reports[0].status, errc::unknown_route);
  EXPECT_TRUE(a_drops().empty());
  EXPECT_EQ(root_->n->counters().drop_notices_sent, 0u);  // the ack told it
}

TEST_F(NodeRelayTest, DropToDeadChildIsNoticed) {
  make_root_and_sender();
  bus_node* b = make_child(0x102, root_);
  ASSERT_TRUE(wait([&] { return b->n->up(); }));
  destroy(b);
  ASSERT_TRUE(wait([&] { return root_->removed.size() == 1; }));
  uint64_t plain = 0;
  uint64_t acked = 0;
  ASSERT_EQ(send_str(a_, 0x102, 1, "plain", {}, &plain), errc::ok);
  ASSERT_EQ(send_str(a_, 0x102, 1, "acked", rr(), &acked), errc::ok);
  ASSERT_TRUE(wait([&] { return a_drops().size() == 1 && a_->reports.size() == 2; }));
  run_for(50ms);
  EXPECT_EQ(a_drops()[0].id, plain);
  EXPECT_EQ(a_drops()[0].why, errc::unknown_route);
  EXPECT_EQ(a_->report_for(plain)->status, errc::ok);
  EXPECT_EQ(a_->report_for(acked)->status, errc::unknown_route);
  EXPECT_EQ(a_->reports.size(), 2u);
}

TEST_F(NodeRelayTest, TtlExpiryAtASecondRelayIsNoticed) {
  make_root_and_sender();
  node_config cc = hop_config();
  bus_node* c = make_child(0x130, root_, {{0x130, 4}}, cc);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  send_options one_hop;
  one_hop.ttl = 1;  // the root passes it on with ttl 0, C drops it
  send_options one_hop_rr = one_hop;
  one_hop_rr.require_response = true;
  uint64_t plain = 0;
  uint64_t acked = 0;
  ASSERT_EQ(send_str(a_, 0x131, 1, "plain", one_hop, &plain), errc::ok);
  ASSERT_EQ(send_str(a_, 0x131, 1, "acked", one_hop_rr, &acked), errc::ok);
  ASSERT_TRUE(wait([&] { return a_drops().size() == 1 && a_->reports.size() == 2; }));
  run_for(50ms);
  EXPECT_EQ(a_drops()[0].id, plain);
  EXPECT_EQ(a_drops()[0].target, 0x131u);
  EXPECT_EQ(a_drops()[0].why, errc::ttl_expired);
  EXPECT_EQ(a_->report_for(plain)->status, errc::ok);
  EXPECT_EQ(a_->report_for(acked)->status, errc::ttl_expired);
  EXPECT_EQ(c->n->counters().ttl_expired, 2u);
  EXPECT_EQ(c->n->counters().drop_notices_sent, 1u);
  EXPECT_EQ(a_->reports.size(), 2u);
}

TEST_F(NodeRelayTest, VersionOnePeerGetsNoNoticeAndKeepsItsLink) {
  node_config old = hop_config();
  old.protocol_max = 1;
  make_root_and_sender(old);
  uint64_t id = 0;
  ASSERT_EQ(send_str(a_, 0x9999, 1, "lost", {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return root_->n->counters().forward_dropped == 1; }));
  // The link still works: a message to the root arrives after the drop.
  ASSERT_EQ(send_str(a_, 0x100, 1, "after"), errc::ok);
  ASSERT_TRUE(wait([&] { return root_->got.size() == 1; }));
  EXPECT_EQ(root_->n->counters().drop_notices_sent, 0u);
  EXPECT_EQ(root_->n->counters().protocol_errors, 0u);
  EXPECT_EQ(a_->n->counters().protocol_errors, 0u);
  EXPECT_TRUE(a_drops().empty());
}

TEST_F(NodeRelayTest, RelayDropLogIsRateLimited) {
  make_root_and_sender();
  constexpr int kSends = 20;
  for (int i = 0; i < kSends; ++i) ASSERT_EQ(send_str(a_, 0x9999, 1, "x"), errc::ok);
  ASSERT_TRUE(wait([&] { return a_drops().size() == kSends; }));
  size_t lines = 0;
  for (const auto& [lv, m] : root_->logs) lines += m.find("dropping data message") == 0 ? 1 : 0;
  EXPECT_EQ(lines, 5u);
  // The summary comes once the second is over, from the timer (no further drop needed).
  ASSERT_TRUE(wait([&] { return root_->logged("15 more relayed messages dropped"); }));
}

// Regression: a message to a sibling that had not registered with the parent yet was routed
// through the parent, which dropped it, and reported ok: lost. It now waits for the sibling.
TEST_F(NodeRelayTest, EarlyMessageToUnregisteredSiblingWaitsForIt) {
  node_config rc = hop_config();
  rc.subnets = {{0x100, 8}};
  root_ = make(0x100, rc);
  bus_node* a = make_child(0x101, root_);
  ASSERT_TRUE(wait([&] { return a->n->up(); }));
  uint64_t id = 0;
  ASSERT_EQ(send_str(a, 0x102, 1, "early", {}, &id), errc::ok);
  run_for(300ms);  // the lookup is answered: not registered
  EXPECT_EQ(a->report_for(id), nullptr);
  bus_node* b = make_child(0x102, root_);
  ASSERT_TRUE(wait([&] { return b->got.size() == 1; }));
  EXPECT_EQ(b->got[0].bytes, "early");
  ASSERT_TRUE(wait([&] { return a->report_for(id) != nullptr; }));
  EXPECT_EQ(a->report_for(id)->status, errc::ok);
  EXPECT_EQ(a->reports.size(), 1u);
}

// ... and bounded: a sibling that never comes fails the message with timeout (one report).
TEST_F(NodeRelayTest, EarlyMessageToSiblingThatNeverComesTimesOut) {
  node_config rc = hop_config();
  rc.subnets = {{0x100, 8}};
  root_ = make(0x100, rc);
  node_config ac = hop_config();
  ac.pending_timeout_ms = 300;
  bus_node* a = make_child(0x101, root_, {}, ac);
  ASSERT_TRUE(wait([&] { return a->n->up(); }));
  uint64_t id = 0;
  ASSERT_EQ(send_str(a, 0x102, 1, "early", {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return a->report_for(id) != nullptr; }));
  EXPECT_EQ(a->report_for(id)->status, errc::timeout);
  run_for(200ms);
  EXPECT_EQ(a->reports.size(), 1u);
  EXPECT_EQ(root_->n->counters().forward_dropped, 0u);
}

// A next hop that stops reading fills the relay's overflow for it; when it then goes, what waited
// there is dropped as every relay drop is: each source is told (a drop notice), none silently.
TEST_F(NodeRelayTest, OverflowForANextHopThatGoesIsDroppedWithNotices) {
  make_root_and_sender();
  test::raw_child sink(0x102, 0x100);
  sink.compress = false;
  sink.pause_after_register = true;
  sink.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return sink.registered; }));
  // Until A's own link queue is full: the root stopped reading A, its overflow for the sink full.
  const std::string payload(60000, 'x');
  ASSERT_TRUE(wait([&] {
    for (int i = 0; i < 8; ++i) {
      if (send_str(a_, 0x102, 1, payload) == errc::queue_full) return true;
    }
    return false;
  }));
  sink.ch->close();
  ASSERT_TRUE(wait([&] {
    const uint64_t dropped = root_->n->counters().forward_dropped;
    return dropped > 0 && a_drops().size() == dropped;
  })) << root_->n->counters().forward_dropped
      << " dropped, " << a_drops().size() << " told";
  // (The reasons vary with timing: the overflow full, the hop gone, no route once it is gone.)
}

// A next hop that stops reading: the relay stops reading the link that feeds it (back-pressure),
// so that link's pings go unread; it is not dropped as silent for that. The hop that does not read
// is the one closed, once its overflow has not moved for heartbeat_timeout_ms, and every message
// that waited there is refused to its source: nothing is lost silently. (It used to drop the
// upstream link for heartbeat timeout and keep the stalled hop for ever.)
TEST_F(NodeRelayTest, StalledNextHopIsClosedAndTheUpstreamLinkSurvives) {
  node_config rc = hop_config();
  rc.heartbeat_timeout_ms = 1500;
  rc.link_queue_bytes = size_t{256} << 10;
  rc.forward_overflow_bytes = size_t{512} << 10;
  node_config ac = hop_config();
  ac.link_queue_bytes = size_t{256} << 10;
  relay_fixture::make_root_and_sender(rc, ac);
  test::raw_child y(0x102, 0x100);
  y.compress = false;  // what it is sent must fill the socket, not shrink to nothing
  y.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return y.registered; }));
  y.pause_reading();
  const std::string payload(60000, 'x');
  uint64_t sent = 0;
  auto next_ping = std::chrono::steady_clock::now();
  // A sends to Y as fast as its link takes it and Y keeps pinging, until the root drops someone.
  ASSERT_TRUE(wait([&] {
    for (int i = 0; i < 16 && send_str(a_, 0x102, 1, payload) == errc::ok; ++i) ++sent;
    if (std::chrono::steady_clock::now() >= next_ping) {
      y.ping();
      next_ping = std::chrono::steady_clock::now() + 100ms;
    }
    return !root_->removed.empty();
  }));
  ASSERT_EQ(root_->removed.size(), 1u);
  EXPECT_EQ(root_->removed[0].first, 0x102u);  // the hop that did not read, not its feeder
  EXPECT_EQ(root_->removed[0].second, errc::queue_full);
  EXPECT_TRUE(root_->logged("has not read for"));
  EXPECT_EQ(root_->n->counters().heartbeat_timeouts, 0u);
  EXPECT_TRUE(a_->downs.empty());
  // A's link is read again: its queue drains, so it takes a message for the root, which arrives.
  ASSERT_TRUE(wait([&] { return send_str(a_, 0x100, 2, "after") == errc::ok; }));
  ASSERT_TRUE(wait([&] { return root_->got.size() == 1; }));
  EXPECT_EQ(root_->got[0].bytes, "after");
  // Every relayed message the root dropped (the overflow, then what came for the gone hop) was
  // told to A with a drop notice; none waits any more.
  ASSERT_TRUE(wait([&] {
    const node_counters c = root_->n->counters();
    return c.pending_now == 0 && c.forward_dropped > 0 && c.forward_dropped == a_drops().size();
  })) << "root dropped "
      << root_->n->counters().forward_dropped << ", A was told of " << a_drops().size() << " (sent "
      << sent << ")";
  EXPECT_EQ(root_->n->counters().drop_notices_sent, root_->n->counters().forward_dropped);
  EXPECT_TRUE(a_->n->up());
  y.ch->close();
  ASSERT_TRUE(wait([&] { return y.ch->closed(); }));
}

// Relayed messages still in a next hop's link queue when that link dies had been taken from their
// source as forwarded: each source is told. Over a unix socket the kernel holds at most about
// twice unix_send_buffer (1 MiB) of what the root wrote, so of A's 60 000-byte messages only the
// few the kernel took may go untold (they count as written under next-hop delivery), never the
// ~140 of the root's 8 MiB queue.
TEST_F(NodeRelayTest, ADyingNextHopsQueuedMessagesAreToldToTheirSources) {
  const std::string sock = "/tmp/uvbus-unsent-" + std::to_string(getpid()) + ".sock";
  node_config rc = hop_config();
  rc.listen = {"unix://" + sock};
  rc.link_queue_bytes = size_t{8} << 20;
  relay_fixture::make_root_and_sender(rc, hop_config());
  test::raw_child y(0x102, 0x100);
  y.compress = false;
  y.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return y.registered; }));
  y.pause_reading();
  const std::string payload(60000, 'q');
  uint64_t sent = 0;
  int refused = 0;  // A's link stays full once the root's overflow for Y holds messages
  ASSERT_TRUE(wait([&] {
    for (int i = 0; i < 16; ++i) {
      if (send_str(a_, 0x102, 1, payload) != errc::ok) return ++refused > 50;
      ++sent;
    }
    refused = 0;
    return false;
  }));
  ASSERT_GT(sent, 200u);
  y.ch->close();
  ASSERT_TRUE(wait([&] { return y.ch->closed() && !root_->removed.empty(); }));
  // What A's link still held reaches the root (before A's next message to the root), which has
  // no route for it any more: told too, once the grace for the lost child ends.
  ASSERT_TRUE(wait([&] { return send_str(a_, 0x100, 2, "after") == errc::ok; }));
  ASSERT_TRUE(wait([&] {
    const node_counters c = root_->n->counters();
    return root_->got.size() == 1 && c.pending_now == 0 && c.forward_dropped == a_drops().size();
  }));
  const uint64_t untold = sent - a_drops().size();
  EXPECT_LE(untold, uint64_t{(2u << 20) / 60000 + 2}) << "sent " << sent;
  EXPECT_TRUE(root_->logged("were never written"));
  ::unlink(sock.c_str());
}

// The grace hold of a relay that just started is bounded in total, not only per child id: messages
// to many distinct unregistered ids stop being held at pending_max_messages, and the rest are
// refused at once with unknown_route, as if no grace applied. A release makes room again.
TEST_F(NodeRelayTest, GraceHoldIsBoundedAcrossChildIds) {
  node_config rc = hop_config();
  rc.child_grace_ms = 60000;  // the whole test runs inside the window
  rc.pending_max_messages = 8;
  relay_fixture::make_root_and_sender(rc, hop_config());
  constexpr uint64_t kIds = 40;
  for (uint64_t i = 0; i < kIds; ++i) ASSERT_EQ(send_str(a_, 0x110 + i, 1, "held?"), errc::ok);
  ASSERT_TRUE(wait([&] { return root_->n->counters().held_for_child + a_drops().size() == kIds; }));
  EXPECT_EQ(root_->n->counters().held_for_child, 8u);
  EXPECT_EQ(root_->n->counters().pending_now, 8u);
  ASSERT_EQ(a_drops().size(), kIds - 8);
  for (const auto& d : a_drops()) {
    EXPECT_GE(d.target, 0x110u + 8);
    EXPECT_EQ(d.why, errc::unknown_route);
  }
  // The first held child registers: its message is delivered and frees room for one more.
  bus_node* b = make_child(0x110, root_);
  ASSERT_TRUE(wait([&] { return b->got.size() == 1; }));
  EXPECT_EQ(b->got[0].bytes, "held?");
  ASSERT_EQ(send_str(a_, 0x1f0, 1, "held?"), errc::ok);
  ASSERT_TRUE(wait([&] { return root_->n->counters().held_for_child == 9; }));
  ASSERT_EQ(send_str(a_, 0x1f1, 1, "held?"), errc::ok);
  ASSERT_TRUE(wait([&] { return a_drops().size() == kIds - 8 + 1; }));
  EXPECT_EQ(a_drops().back().target, 0x1f1u);
  EXPECT_EQ(root_->n->counters().held_for_child, 9u);
}

}  // namespace
}  // namespace uvbus::node_relay_test
