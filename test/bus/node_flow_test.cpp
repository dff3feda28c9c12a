// End-to-end delivery (flows, the default): ok means delivered, a parent or target restart loses
// nothing, per-flow order holds, duplicates are dropped, refusals and deadlines are reported; a
// target stopping from on_data acknowledges what it got (next hop with require_response too).
#include <gtest/gtest.h>
#include <uv.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "bus/flow_harness.h"
#include "bus/wire.h"
#include "uvbus/node.h"

namespace uvbus::node_flow_test {
namespace {

using namespace std::chrono_literals;
using test::bus_node;
using test::flow_config;

class NodeFlowTest : public test::flow_fixture {
 protected:
  // Root 0x100 and children A 0x101 (sender), B 0x102 (receiver).
  // ac: A's config; b_tweak: B's callbacks.
  void make_tree(node_config pc = flow_config(), node_config bc = flow_config(),
                 node_config ac = flow_config(), const tweak_fn& b_tweak = {}) {
    pc.subnets = {{0x100, 8}};
    p_ = make(0x100, pc);
    url_ = p_->n->listen_urls().at(0);
    pc_ = pc;
    ac.parent_urls = {url_};
    a_ = make(0x101, ac);
    bc.parent_urls = {url_};
    bc_ = bc;
    b_ = make(0x102, bc, true, b_tweak);
    ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up(); }));
  }
  // make_tree() with A's config ac, B stopping its node from on_data (after recording the data).
  void make_tree_b_stopping_in_on_data(const node_config& ac) {
    make_tree(flow_config(), flow_config(), ac, [this](node_callbacks* cb) {
      auto record = cb->on_data;
      cb->on_data = [this, record](bus_id src, uint32_t type, const uint8_t* d, size_t n) {
        record(src, type, d, n);
        b_->n->stop();
      };
    });
  }
  // Sends numbers [next_, next_ + n) from A to B.
  void send_some(int n) {
    for (int i = 0; i < n; ++i) {
      uint64_t id = 0;
      const uint64_t v = next_;
      const errc e = a_->n->send_data(0x102, 1, &v, sizeof v, {}, &id);
      ASSERT_EQ(e, errc::ok) << to_string(e);
      value_of_[id] = v;
      ++next_;
    }
  }
  // B dies (destroyed), 300 more are sent meanwhile, a new B with cfg comes back and 300 more
  // follow; then every report must be in and ok. The old B object stays for its deliveries.
  void replace_target(const node_config& cfg) {
    destroy(b_);
    send_some(300);
    b_ = restart(0x102, cfg);
    ASSERT_TRUE(wait([&] { return b_->n->up(); }));
    send_some(300);
    expect_all_ok();
  }
  // Every message: exactly one report, ok, end to end.
  void expect_all_ok() {
    ASSERT_TRUE(wait([&] { return a_->reports.size() == value_of_.size(); }, 2 * test::kWait))
        << a_->reports.size() << " of " << value_of_.size();
    std::set<uint64_t> ids;
    for (const auto& r : a_->reports) {
      EXPECT_TRUE(ids.insert(r.message_id).second) << "two reports for " << r.message_id;
      EXPECT_EQ(r.status, errc::ok) << value_of_[r.message_id] << ": " << to_string(r.status);
      EXPECT_TRUE(r.end_to_end);
    }
  }
  // Numbers one incarnation of B got: strictly increasing (in order, no duplicate).
  static std::vector<uint64_t> in_order(const bus_node* t) {
    std::vector<uint64_t> v;
    for (const auto& r : t->got) {
      if (!v.empty()) {
        EXPECT_GT(r.value(), v.back()) << "out of order or twice";
      }
      v.push_back(r.value());
    }
    return v;
  }

  bus_node* p_ = nullptr;
  bus_node* a_ = nullptr;
  bus_node* b_ = nullptr;
  std::string url_;
  node_config pc_;
  node_config bc_;
  uint64_t next_ = 0;
  std::map<uint64_t, uint64_t> value_of_;  // message id -> number
};

TEST_F(NodeFlowTest, OkMeansDeliveredAndReportsAreEndToEnd) {
  make_tree();
  send_some(100);
  expect_all_ok();
  EXPECT_EQ(in_order(b_).size(), 100u);
  EXPECT_GE(a_->n->counters().flow_acks_received, 1u);
  EXPECT_LT(a_->n->counters().flow_acks_received, 100u);  // cumulative, not one per message
  EXPECT_EQ(a_->n->counters().flow_unacked_now, 0u);
}

// A sender without on_report: acknowledgements settle whole runs of messages at once, and the
// counters still say every message was delivered and nothing is held.
TEST_F(NodeFlowTest, WithoutOnReportAcknowledgementsCountEveryMessage) {
  make_tree();
  node_config cc = flow_config();
  cc.parent_urls = {url_};
  bus_node* c = make(0x103, cc, true, [](node_callbacks* cb) { cb->on_report = nullptr; });
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  b_->keep_bytes = false;
  constexpr uint64_t kCount = 3000;
  std::vector<uint8_t> payload(200, 0x42);
  for (uint64_t i = 0; i < kCount; ++i) {
    const size_t n = 1 + i % payload.size();
    ASSERT_EQ(c->n->send_data(0x102, 1, payload.data(), n), errc::ok) << i;
  }
  ASSERT_TRUE(wait([&] {
    const node_counters k = c->n->counters();
    return b_->got_count == kCount && k.flow_unacked_now == 0;
  }));
  const node_counters k = c->n->counters();
  EXPECT_EQ(k.reports_ok, kCount);
  EXPECT_EQ(k.reports_failed, 0u);
  EXPECT_EQ(k.flow_unacked_bytes, 0u);
  EXPECT_GE(k.flow_acks_received, 1u);
  EXPECT_LT(k.flow_acks_received, kCount);  // runs of messages, not one at a time
  EXPECT_TRUE(c->reports.empty());
}

// The parent relay dies with messages in flight and comes back: every message is delivered
// exactly once, in order, and reported ok; none fails because a link blinked.
// What a burst grows (the byte buffer, the ring of entries) goes back once the flow has been
// acknowledged and quiet for a second; the flow itself (its sequence) stays for flow_idle_ms.
TEST_F(NodeFlowTest, AQuietFlowGivesBackWhatABurstGrew) {
  make_tree();
  b_->keep_bytes = false;
  std::vector<uint8_t> payload(200, 0x42);
  for (int i = 0; i < 3000; ++i)
    ASSERT_EQ(a_->n->send_data(0x102, 1, payload.data(), 200), errc::ok);
  const node_counters burst = a_->n->counters();
  EXPECT_EQ(burst.flow_targets, 1u);
  EXPECT_GT(burst.flow_buffer_bytes, 3000u * 200u);
  ASSERT_TRUE(wait([&] { return a_->n->counters().flow_buffer_bytes == 0; }));
  EXPECT_EQ(b_->got_count, 3000u);
  EXPECT_EQ(a_->n->counters().flow_targets, 1u);
  ASSERT_EQ(a_->n->send_data(0x102, 1, payload.data(), 200), errc::ok);  // the flow goes on
  ASSERT_TRUE(wait([&] { return b_->got_count == 3001; }));
}

// A flow idle for flow_idle_ms is forgotten by its source while the target still holds its
// position; the next message starts a new flow above every sequence sent before, so the target
// takes nothing for a duplicate (a flow restarted from 1 would be dropped and reported ok).
TEST_F(NodeFlowTest, AForgottenFlowStartsAboveItsOldSequences) {
  make_tree();
  node_config cc = flow_config();
  cc.parent_urls = {url_};
  cc.flow_idle_ms = 200;
  bus_node* c = make(0x103, cc);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  for (uint64_t v = 0; v < 100; ++v) {
    if (v == 50) {
      ASSERT_TRUE(wait([&] { return c->n->counters().flow_targets == 0; }));
      EXPECT_EQ(b_->n->counters().flow_sources, 1u);  // B keeps C's position for 40 s
    }
    ASSERT_EQ(c->n->send_data(0x102, 1, &v, sizeof v), errc::ok);
    if (v == 49) {
      ASSERT_TRUE(wait([&] { return c->reports.size() == 50; }));
    }
  }
  ASSERT_TRUE(wait([&] { return c->reports.size() == 100; }));
  for (const auto& r : c->reports) {
    EXPECT_EQ(r.status, errc::ok);
  }
  ASSERT_TRUE(wait([&] { return b_->got.size() == 100; })) << b_->got.size() << " of 100";
  EXPECT_EQ(in_order(b_).size(), 100u);
  EXPECT_EQ(b_->n->counters().flow_duplicates, 0u);
}

// A target forgets a silent source after max(flow_idle_ms, 2 x its own delivery_timeout_ms):
// D (deadline 20 ms) after its flow_idle_ms of 50 ms, B (deadline 20 s) not while C forgets its
// side after 400 ms.
TEST_F(NodeFlowTest, ATargetForgetsASilentSourceOnlyAfterTwiceItsDeadline) {
  node_config bc = flow_config();
  bc.flow_idle_ms = 50;
  make_tree(flow_config(), bc);
  node_config dc = bc;
  dc.delivery_timeout_ms = 20;
  dc.parent_urls = {url_};
  bus_node* d = make(0x104, dc);
  node_config cc = flow_config();
  cc.parent_urls = {url_};
  cc.flow_idle_ms = 400;
  bus_node* c = make(0x103, cc);
  ASSERT_TRUE(wait([&] { return c->n->up() && d->n->up(); }));
  const uint64_t v = 7;
  ASSERT_EQ(c->n->send_data(0x102, 1, &v, sizeof v), errc::ok);
  ASSERT_EQ(c->n->send_data(0x104, 1, &v, sizeof v), errc::ok);
  ASSERT_TRUE(wait([&] { return c->reports.size() == 2; }));
  EXPECT_EQ(b_->n->counters().flow_sources, 1u);
  EXPECT_EQ(d->n->counters().flow_sources, 1u);
  ASSERT_TRUE(wait([&] { return d->n->counters().flow_sources == 0; }));
  ASSERT_TRUE(wait([&] { return c->n->counters().flow_targets == 0; }));
  EXPECT_EQ(b_->n->counters().flow_sources, 1u);
}

TEST_F(NodeFlowTest, ParentRestartLosesNothing) {
  make_tree();
  send_some(300);
  destroy(p_);
  send_some(300);
  ASSERT_TRUE(wait([&] { return !a_->n->up() && !b_->n->up(); }));
  send_some(300);  // wait in A's pending queue and retransmit buffer
  p_ = restart(0x100, [&] {
    node_config c = pc_;
    c.listen = {url_};
    return c;
  }());
  ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up(); }));
  send_some(300);
  expect_all_ok();
  const std::vector<uint64_t> got = in_order(b_);
  EXPECT_EQ(got.size(), next_);
  EXPECT_EQ(b_->n->counters().data_received, next_);
}

// The target dies and a new process of the same id comes back: everything is delivered (at least
// once: the new incarnation may get again what the old one delivered but had not acknowledged),
// each incarnation in order without duplicates, and every report is ok.
TEST_F(NodeFlowTest, TargetRestartGetsEverythingAtLeastOnce) {
  make_tree();
  send_some(300);
  ASSERT_TRUE(wait([&] { return b_->got.size() >= 100; }));
  bus_node* old = b_;
  replace_target(bc_);
  const std::vector<uint64_t> first = in_order(old);
  const std::vector<uint64_t> second = in_order(b_);
  std::set<uint64_t> all(first.begin(), first.end());
  all.insert(second.begin(), second.end());
  EXPECT_EQ(all.size(), next_) << "a number never arrived";
  const size_t dups = first.size() + second.size() - all.size();
  // The duplicate window: what the old incarnation delivered after its last acknowledgement.
  EXPECT_LE(dups, 300u);
  std::printf("target restart: %zu + %zu delivered, %zu duplicates across the restart\n",
              first.size(), second.size(), dups);
}

TEST_F(NodeFlowTest, SharedMemoryTargetRestartGetsEverything) {
  node_config pc = flow_config();
  pc.enable_shm = true;
  pc.shm_ring_bytes = 1 << 20;
  pc.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name("fp")};
  node_config bc = flow_config();
  bc.enable_shm = true;
  bc.shm_ring_bytes = 1 << 20;
  bc.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name("fb")};
  make_tree(pc, bc);
  endpoint_info e;
  ASSERT_TRUE(p_->n->peer(0x102, &e));
  EXPECT_EQ(e.data_channel, channel_kind::shm);
  send_some(300);
  bus_node* old = b_;
  replace_target(bc_);
  std::set<uint64_t> all;
  for (const auto& r : old->got) all.insert(r.value());
  for (const auto& r : b_->got) all.insert(r.value());
  EXPECT_EQ(all.size(), next_);
  (void)in_order(old);
  (void)in_order(b_);
}

// A target that stops from on_data (a consumer done with its work) acknowledges what it was
// handed: the acknowledgements wait for the end of the loop turn, and stop() closed the links
// before that, so the source resent and reported timeout for a message that was delivered.
TEST_F(NodeFlowTest, ATargetStoppingFromOnDataAcknowledgesWhatItGot) {
  node_config ac = flow_config();
  ac.delivery_timeout_ms = 3000;  // the report without the acknowledgement: timeout
  ASSERT_NO_FATAL_FAILURE(make_tree_b_stopping_in_on_data(ac));
  send_some(1);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 1; }));
  EXPECT_EQ(b_->got.size(), 1U);
  EXPECT_EQ(a_->reports[0].status, errc::ok) << to_string(a_->reports[0].status);
}

// The same under next hop with require_response: the target acknowledged after on_data returned,
// when stop() from on_data had closed its links, so the source reported timeout for a message its
// target got. Now stop() sends that acknowledgement before the links close.
TEST_F(NodeFlowTest, ANextHopTargetStoppingFromOnDataAcknowledgesWhatItGot) {
  node_config ac = flow_config();
  ac.delivery = delivery_mode::next_hop;
  ac.response_timeout_ms = 3000;  // the report without the acknowledgement: timeout
  ASSERT_NO_FATAL_FAILURE(make_tree_b_stopping_in_on_data(ac));
  send_options opt;
  opt.require_response = true;
  ASSERT_EQ(a_->n->send_data(0x102, 1, "x", 1, opt), errc::ok);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 1; }));
  EXPECT_EQ(b_->got.size(), 1U);
  EXPECT_EQ(a_->reports[0].status, errc::ok) << to_string(a_->reports[0].status);
}

// A message of message_limit with a trace context fits the smallest retransmit buffer validate()
// allows.
TEST_F(NodeFlowTest, ATracedMessageOfTheLimitFitsTheSmallestRetransmitBuffer) {
  node_config ac = flow_config();
  ac.message_limit = 1000;
  ac.retransmit_max_bytes = 1000 + 44 + 25;
  make_tree(flow_config(), flow_config(), ac);
  trace_context t;
  t.trace_id[0] = 1;
  t.span_id[0] = 2;
  send_options opt;
  opt.trace = &t;
  const std::string big(1000, 't');
  ASSERT_EQ(a_->n->send_data(0x102, 1, big.data(), big.size(), opt), errc::ok);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 1; }));
  EXPECT_EQ(a_->reports[0].status, errc::ok);
  ASSERT_EQ(b_->got.size(), 1U);
  EXPECT_EQ(b_->got[0].bytes, big);
}

TEST_F(NodeFlowTest, UnknownTargetIsReportedUnknownRoute) {
  make_tree();
  uint64_t id = 0;
  ASSERT_EQ(test::send_str(a_, 0x150, 1, "nobody", {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return a_->report_for(id) != nullptr; }));
  EXPECT_EQ(a_->report_for(id)->status, errc::unknown_route);
  EXPECT_TRUE(a_->report_for(id)->end_to_end);
}

// A target that acknowledged before and then vanished for good: its messages are retried until
// their deadline (not failed with "unknown_route" at the first refusal); a target that never
// acknowledged this source is refused at once.
TEST_F(NodeFlowTest, VanishedTargetIsRetriedNeverAcknowledgedIsRefused) {
  node_config ac = flow_config();
  node_config pc = flow_config();
  pc.child_grace_ms = 0;  // the parent refuses at once (no wait for the child to come back)
  make_tree(pc);
  send_some(10);
  expect_all_ok();
  destroy(b_);
  ASSERT_TRUE(wait([&] {
    endpoint_info e;
    return !p_->n->peer(0x102, &e);
  }));
  // A new sender config with a short deadline: a fresh node as A2.
  ac.parent_urls = {url_};
  ac.delivery_timeout_ms = 300;
  bus_node* a2 = make(0x103, ac);
  ASSERT_TRUE(wait([&] { return a2->n->up(); }));
  uint64_t id = 0;
  ASSERT_EQ(test::send_str(a2, 0x102, 1, "gone", {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return a2->report_for(id) != nullptr; }));
  // Never acknowledged by 0x102: the parent's refusal is final for it.
  EXPECT_EQ(a2->report_for(id)->status, errc::unknown_route);
  // A, which had acknowledgements from 0x102, keeps trying until the deadline.
  uint64_t id2 = 0;
  ASSERT_EQ(test::send_str(a_, 0x102, 1, "gone", {}, &id2), errc::ok);
  run_for(100ms);
  EXPECT_EQ(a_->report_for(id2), nullptr);
}

// Next-hop delivery has no resend: the parent's grace is what saves messages sent while a child
// restarts. They wait at the parent and reach the new incarnation; nothing is dropped.
TEST_F(NodeFlowTest, ParentHoldsMessagesForARestartingChild) {
  node_config ac = flow_config();
  ac.delivery = delivery_mode::next_hop;
  make_tree();
  ac.parent_urls = {url_};
  bus_node* a2 = make(0x103, ac);
  ASSERT_TRUE(wait([&] { return a2->n->up(); }));
  destroy(b_);
  ASSERT_TRUE(wait([&] {
    endpoint_info e;
    return !p_->n->peer(0x102, &e);
  }));
  for (uint64_t v = 0; v < 100; ++v) ASSERT_EQ(a2->n->send_data(0x102, 1, &v, sizeof v), errc::ok);
  ASSERT_TRUE(wait([&] { return p_->n->counters().held_for_child == 100; }));
  b_ = restart(0x102, bc_);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 100; }));
  EXPECT_EQ(in_order(b_).size(), 100u);
  EXPECT_EQ(p_->n->counters().forward_dropped, 0u);
  EXPECT_EQ(a2->n->counters().drop_notices_received, 0u);
}

// flag_sync tells the target that every sequence before it is settled (acknowledged, or reported
// failed), so that it may skip what it never got. Message 1 refused for good while message 2 is
// unacknowledged must not put the flag on the new message 3: a target that missed 2 would skip it,
// drop its resend as a duplicate and acknowledge it, and 2 would be reported delivered. The flag
// may go on 2, the first unsettled message, and nowhere after it. The target is a hand-made child
// that acknowledges nothing.
TEST_F(NodeFlowTest, SyncGoesOnlyOnTheFirstUnsettledMessage) {
  test::raw_child raw(0x101, 0x100);
  bus_node* root = root_with(&raw);
  ASSERT_TRUE(raw.registered);
  const auto flow_data = [&raw](size_t k) {  // the k-th first transmission of flow data
    std::vector<const test::raw_child::message*> v;
    for (const auto& m : raw.got) {
      if (m.hd.type == proto::msg_type::data && (m.hd.flags & proto::flag_flow) != 0) {
        bool seen = false;
        for (const auto* p : v) seen = seen || p->hd.sequence == m.hd.sequence;
        if (!seen) v.push_back(&m);
      }
    }
    return k < v.size() ? v[k] : nullptr;
  };
  uint64_t id[3] = {};
  ASSERT_EQ(test::send_str(root, 0x101, 1, "one", {}, &id[0]), errc::ok);
  ASSERT_EQ(test::send_str(root, 0x101, 1, "two", {}, &id[1]), errc::ok);
  ASSERT_TRUE(wait([&] { return flow_data(1) != nullptr; }));
  const uint64_t seq1 = flow_data(0)->hd.sequence;
  const uint64_t seq2 = flow_data(1)->hd.sequence;
  raw.send_flow_drop_notice(seq1, proto::reason::ttl_expired);
  ASSERT_TRUE(wait([&] { return root->report_for(id[0]) != nullptr; }));
  EXPECT_EQ(root->report_for(id[0])->status, errc::ttl_expired);
  ASSERT_EQ(test::send_str(root, 0x101, 1, "three", {}, &id[2]), errc::ok);
  ASSERT_TRUE(wait([&] { return flow_data(2) != nullptr; }));
  EXPECT_EQ(root->report_for(id[1]), nullptr) << "2 is neither acknowledged nor failed";
  for (const auto& m : raw.got) {
    if (m.hd.type != proto::msg_type::data || (m.hd.flags & proto::flag_sync) == 0) continue;
    EXPECT_TRUE(m.hd.sequence == seq1 || m.hd.sequence == seq2)
        << "flag_sync on " << m.hd.sequence << " while " << seq2 << " is unsettled";
  }
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A relay's drop notice names a flow sequence, not an epoch. Each incarnation of a node starts its
// flows at a random sequence, so a notice meant for a dead incarnation's message does not settle
// the new incarnation's message (before, both started at 1: the new message was reported failed).
TEST_F(NodeFlowTest, ADropNoticeForADeadIncarnationSettlesNothing) {
  node_config rc = flow_config();
  rc.subnets = {{0x100, 8}};
  uint64_t seq[2] = {};
  uint64_t id = 0;
  bus_node* root = nullptr;
  std::unique_ptr<test::raw_child> raw;
  for (uint64_t& s : seq) {
    if (root != nullptr) destroy(root);
    root = make(0x100, rc);
    raw = std::make_unique<test::raw_child>(0x101, 0x100);
    raw->compress = false;
    raw->start(&loop_, root->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return raw->registered; }));
    ASSERT_EQ(test::send_str(root, 0x101, 1, "one", {}, &id), errc::ok);
    const auto flow_data = [&raw]() -> const test::raw_child::message* {
      for (const auto& m : raw->got) {
        if (m.hd.type == proto::msg_type::data && (m.hd.flags & proto::flag_flow) != 0) return &m;
      }
      return nullptr;
    };
    ASSERT_TRUE(wait([&] { return flow_data() != nullptr; }));
    s = flow_data()->hd.sequence;
  }
  EXPECT_NE(seq[0], seq[1]);
  raw->send_flow_drop_notice(seq[0], proto::reason::ttl_expired);
  ASSERT_TRUE(wait([&] { return root->n->counters().drop_notices_received == 1; }));
  EXPECT_EQ(root->report_for(id), nullptr) << "settled by the old incarnation's notice";
  raw->send_flow_drop_notice(seq[1], proto::reason::ttl_expired);  // its own: settles it
  ASSERT_TRUE(wait([&] { return root->report_for(id) != nullptr; }));
  EXPECT_EQ(root->report_for(id)->status, errc::ttl_expired);
  raw->ch->close();
  ASSERT_TRUE(wait([&] { return raw->ch->closed(); }));
}

// A source's incarnations are random numbers, so a target cannot tell which of two epochs is the
// newer. A sync message of a dead incarnation that arrives late (by another path) after the new
// incarnation's must not switch the flow back to the old epoch: the target would then ask the
// live source to resync, and take its resent messages again (before: the stale message was
// delivered, the new epoch's next message refused for a resync).
TEST_F(NodeFlowTest, ALateSyncOfADeadIncarnationDoesNotTakeTheFlowBack) {
  test::raw_child raw(0x101, 0x100);
  bus_node* root = root_with(&raw);
  ASSERT_TRUE(raw.registered);
  constexpr uint64_t kOld = 0x5eed1, kNew = 0x5eed2;
  raw.send_flow(0x101, 10, "old", kOld);
  raw.send_flow(0x101, 500, "new", kNew);
  raw.send_flow(0x101, 11, "late", kOld);          // the dead incarnation's, delayed
  raw.send_flow(0x101, 501, "next", kNew, false);  // the live flow goes on in order
  raw.send_flow(0x101, 12, "later", kOld);         // and another one, after it
  raw.send_flow(0x101, 502, "last", kNew, false);
  ASSERT_TRUE(wait([&] { return root->got.size() >= 4; }));
  std::vector<std::string> got;
  got.reserve(root->got.size());
  for (const auto& g : root->got) got.push_back(g.bytes);
  EXPECT_EQ(got, (std::vector<std::string>{"old", "new", "next", "last"}));
  EXPECT_EQ(root->n->counters().flow_stale, 2u);
  EXPECT_EQ(root->n->counters().flow_resyncs, 0u);
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// stop() waits up to stop_flush_ms for acknowledgements, and a same-host target sends them
// through the stopping node's ring: they count (before, the ring was read and its records
// dropped while stopping, so delivered messages were reported closed after the whole wait).
TEST_F(NodeFlowTest, StopTakesAcknowledgementsThatComeThroughItsRing) {
  node_config pc = flow_config();
  pc.subnets = {{0x100, 8}};
  pc.enable_shm = true;
  pc.shm_ring_bytes = 1 << 20;
  pc.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name("flow-stop")};
  pc.stop_flush_ms = 60000;
  p_ = make(0x100, pc);
  node_config bc = flow_config();
  bc.enable_shm = true;
  bc.parent_urls = {p_->n->listen_urls().at(0)};
  b_ = make(0x102, bc);
  ASSERT_TRUE(wait([&] { return b_->n->up(); }));
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 50; ++i) {
    uint64_t id = 0;
    ASSERT_EQ(p_->n->send_data(0x102, 1, &i, sizeof i, {}, &id), errc::ok);
    ids.push_back(id);
  }
  p_->n->stop();
  ASSERT_TRUE(wait([&] { return p_->reports.size() == ids.size(); }));
  for (const auto& r : p_->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  EXPECT_EQ(b_->got.size(), ids.size());
}

TEST_F(NodeFlowTest, FullRetransmitBufferIsQueueFull) {
  node_config ac = flow_config();
  ac.retransmit_max_messages = 10;
  make_tree();
  ac.parent_urls = {url_};
  bus_node* a2 = make(0x103, ac);
  ASSERT_TRUE(wait([&] { return a2->n->up(); }));
  // Without running the loop no acknowledgement can come back.
  for (int i = 0; i < 10; ++i) ASSERT_EQ(test::send_str(a2, 0x102, 1, "x"), errc::ok);
  EXPECT_EQ(test::send_str(a2, 0x102, 1, "x"), errc::queue_full);
  EXPECT_EQ(a2->n->counters().flow_unacked_now, 10u);
  ASSERT_TRUE(wait([&] { return a2->reports.size() == 10; }));
  EXPECT_GE(a2->writable, 1u);  // on_writable(target): the buffer drained
  EXPECT_EQ(test::send_str(a2, 0x102, 1, "again"), errc::ok);
}

TEST_F(NodeFlowTest, StopWaitsForAcknowledgementsThenReportsTheRestClosed) {
  make_tree();
  send_some(50);
  a_->n->stop();
  ASSERT_TRUE(wait([&] { return !a_->downs.empty(); }));
  ASSERT_EQ(a_->reports.size(), 50u);
  for (const auto& r : a_->reports) EXPECT_EQ(r.status, errc::ok);
  EXPECT_EQ(b_->got.size(), 50u);
}

// stop() waits up to stop_flush_ms for acknowledgements only while a registered link is left
// (none could come otherwise): with the parent gone before stop(), or gone during the wait, the
// rest is reported closed at once instead of after the whole wait (10 minutes here).
TEST_F(NodeFlowTest, StopWithoutALinkLeftDoesNotWaitForAcknowledgements) {
  make_tree();
  node_config cc = flow_config();
  cc.parent_urls = {url_};
  cc.stop_flush_ms = 600000;
  bus_node* before = make(0x103, cc);
  bus_node* during = make(0x104, cc);
  test::raw_child silent(0x105, 0x100);  // registers, never acknowledges flow data
  silent.compress = false;
  silent.start(&loop_, url_);
  ASSERT_TRUE(wait([&] { return before->n->up() && during->n->up() && silent.registered; }));
  for (bus_node* t : {before, during}) {
    for (int i = 0; i < 5; ++i) ASSERT_EQ(test::send_str(t, 0x105, 1, "unacked"), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return silent.got.size() >= 10; }));
  during->n->stop();  // waits: its link to the parent is up
  destroy(p_);
  p_ = nullptr;
  ASSERT_TRUE(wait([&] { return !before->n->up(); }));
  before->n->stop();
  ASSERT_TRUE(wait([&] { return !before->downs.empty() && !during->downs.empty(); }));
  for (bus_node* t : {before, during}) {
    ASSERT_EQ(t->reports.size(), 5u) << t->n->id();
    for (const auto& r : t->reports) EXPECT_EQ(r.status, errc::closed);
  }
  silent.ch->close();
  ASSERT_TRUE(wait([&] { return silent.ch->closed(); }));
}

// A planned restart of the target: the old process stops (its links close; what was in flight to
// it is resent), hands its flow positions to the new one, which drops what the old one delivered.
// Exactly once across the restart, every report ok.
TEST_F(NodeFlowTest, PlannedRestartWithInheritedPositionsDeliversExactlyOnce) {
  make_tree();
  send_some(300);
  ASSERT_TRUE(wait([&] { return b_->got.size() >= 100; }));
  bus_node* old = b_;
  old->n->stop();
  ASSERT_TRUE(wait([&] { return !old->downs.empty(); }));
  node_config bc = bc_;
  bc.inherit_flow_positions = old->n->flow_positions();
  EXPECT_FALSE(bc.inherit_flow_positions.empty());
  replace_target(bc);
  std::set<uint64_t> all;
  for (const auto& r : old->got) all.insert(r.value());
  for (const auto& r : b_->got) {
    EXPECT_TRUE(all.insert(r.value()).second) << r.value() << " delivered by both processes";
  }
  EXPECT_EQ(all.size(), next_);
}

TEST(NodeFlowConfig, MalformedInheritedPositionsAreRefused) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    node_config c = test::fast_config();
    c.inherit_flow_positions = {1, 2, 3};
    node n(&loop, 0x42, c);
    EXPECT_EQ(n.start(), errc::invalid_argument);
    EXPECT_NE(n.last_error().detail.find("inherit_flow_positions"), std::string::npos);
  }
  EXPECT_EQ(test::close_loop(&loop), 0);
}

TEST(NodeFlowConfig, RetransmitLimitsAreValidated) {
  node_config c;
  c.retransmit_max_bytes = 100;
  std::string why;
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("retransmit_max_bytes"), std::string::npos) << why;
  // One message of message_limit with a trace context must fit: its 44 bytes of header and flow
  // prefix and 25 of trace (at + 44 a traced message of the limit was queue_full for good).
  c.message_limit = 1000;
  c.retransmit_max_bytes = 1000 + 44;
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("1069 bytes"), std::string::npos) << why;
  c.retransmit_max_bytes = 1000 + 44 + 25;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = node_config{};
  c.delivery_timeout_ms = 0;
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("delivery_timeout_ms"), std::string::npos) << why;
  c = node_config{};
  c.ack_every = 0;
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
}

}  // namespace
}  // namespace uvbus::node_flow_test
