// Broadcast from a node whose own next hops cannot take a copy (a full queue: the call returns
// queue_full and on_writable follows, or the targets behind that hop fail at once; a link below
// version 6), the bound on the targets awaiting acknowledgement (broadcast_max_targets), and
// acknowledgements a hand-made child forges (duplicates, nodes not targeted or not known): one
// report per accepted broadcast, each target counted once.
#include <gtest/gtest.h>
#include <uv.h>

#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "uvbus/shm.h"

// The sanitizers' allocator (ASan, TSan): the bytes the program holds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UVBUS_ALLOCATED_BYTES 1
extern "C" size_t
__sanitizer_get_current_allocated_bytes();  // NOLINT(bugprone-reserved-identifier)
#endif

namespace uvbus::node_broadcast_test {
namespace {

using test::bus_node;

constexpr bus_id kRoot = 0x1000;
constexpr bus_id kSink = 0x1800;  // the hand-made child (subnet 0x1800/11: 2048 ids)
constexpr bus_id kL1 = 0x1200;
constexpr bus_id kSibling = 0x9000;  // a hand-made sibling of the root

class NodeBroadcast : public test::bus_fixture {
 protected:
  // The root (type "root", next-hop delivery so that a send meets a full link at once) and a
  // hand-made child kSink announcing, for each of `logic`, a node of type "logic" in its subnet.
  void build(const std::vector<bus_id>& logic, bool pause, node_config rc = {}) {
    if (rc.listen.empty()) rc = test::typed_config("root");
    rc.delivery = delivery_mode::next_hop;
    rc.link_queue_bytes = size_t{256} << 10;
    root_ = make_root(kRoot, {subnet{kRoot, 12}}, rc);
    sink_.subnets = {subnet{kSink, 11}};
    sink_.compress = false;  // what it is sent must fill the socket
    sink_.pause_after_register = pause;
    connect_sink(logic);
  }
  // The sink registers to root_ (again) and announces `logic`.
  void connect_sink(const std::vector<bus_id>& logic) {
    sink_.registered = false;
    sink_.start(&loop_, root_->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return sink_.registered; }));
    announce(logic, "logic");
    ASSERT_TRUE(wait([&] { return root_->n->find("logic").size() == logic.size(); }));
  }
  void announce(const std::vector<bus_id>& ids, const std::string& type) {
    proto::directory_body up;
    for (const bus_id id : ids) {
      directory_entry e;
      e.id = id;
      e.type = type;
      e.protocol_version = proto::kMaxVersion;
      up.entries.push_back(e);
    }
    std::vector<uint8_t> body;
    proto::encode_directory(up, &body);
    sink_.send(proto::msg_type::directory, body);
  }
  // An acknowledgement of broadcast `id` claiming to come from `source`.
  void ack(uint64_t id, bus_id source) {
    sink_.send(proto::msg_type::broadcast_ack, {}, 0, source, id);
  }
  // Copies of broadcasts the sink has read.
  [[nodiscard]] size_t copies() const {
    size_t k = 0;
    for (const auto& m : sink_.got) k += m.hd.type == proto::msg_type::broadcast ? 1 : 0;
    return k;
  }
  // Messages the root's link to the sink refused (its queue full).
  [[nodiscard]] bool refused_to_sink() const {
    const std::string key = "uvbus_peer_queue_refused_total{peer=\"0x1800\"";
    const std::string text = root_->n->metrics_text();
    const size_t at = text.find(key);
    if (at == std::string::npos) return false;
    const size_t end = text.find('\n', at);
    const size_t sp = text.rfind(' ', end);
    return sp != std::string::npos && text.compare(sp + 1, end - sp - 1, "0") != 0;
  }
  void TearDown() override {
    if (sink_.ch) {
      sink_.ch->close();
      EXPECT_TRUE(wait([&] { return sink_.ch->closed(); }));
    }
    test::bus_fixture::TearDown();
    if (!ring_.empty()) (void)shm_remove(ring_);
  }
  // A logic root with a logic child kL1, and a hand-made sibling kSibling that sends a broadcast
  // to every logic node: over its link, or (over_ring: with access tokens, the root's host id)
  // written into the root's ring with its true tag. The root, which matches, gets it; L1 must not.
  void expect_a_sibling_copy_goes_no_further(bool over_ring) {
    node_config rc = test::typed_config("logic");
    node_config lc = test::typed_config("logic");
    if (over_ring) {
      ring_ = "shm://" + test::unique_name("bcast-sibling");
      rc.enable_shm = true;
      rc.shm_ring_bytes = size_t{1} << 20;
      rc.listen.push_back(ring_);
      rc.host_id = "bcast-host";
      rc.access_tokens = lc.access_tokens = {"secret"};
    }
    bus_node* root = make_root(kRoot, {subnet{kRoot, 12}}, rc);
    bus_node* l1 = make_child(kL1, root, {}, lc);
    ASSERT_TRUE(wait([&] { return root->n->find("logic").size() == 1; }));
    test::raw_child sib(kSibling, kRoot);
    sib.role = proto::link_role::sibling;
    if (over_ring) {
      sib.token = "secret";
      sib.host_id = rc.host_id;
    }
    sib.start(&loop_, root->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return sib.registered || sib.closed; }));
    ASSERT_TRUE(sib.registered) << sib.reply_message;
    std::vector<uint8_t> body;
    proto::encode_broadcast_head(broadcast_target::of_type("logic"), 7, &body);
    body.push_back('s');
    shm_writer w;
    if (over_ring) {
      proto::header h;
      h.type = proto::msg_type::broadcast;
      h.source = kSibling;
      h.target = kRoot;
      h.sequence = 77;
      const std::vector<uint8_t> rec = test::enveloped(proto::build(h, body), kSibling,
                                                       test::true_tag("secret", kRoot, kSibling));
      ASSERT_EQ(w.open(ring_), errc::ok);
      ASSERT_EQ(w.send(rec.data(), rec.size()), errc::ok);
    } else {
      sib.send(proto::msg_type::broadcast, body, 0, 0, 77);
    }
    ASSERT_TRUE(wait([&] { return root->got.size() == 1; }));
    EXPECT_EQ(root->got[0].bytes, "s");
    // A message after it: once it is in, a copy sent on would have been too (the same link).
    ASSERT_EQ(test::send_str(root, kL1, 2, "after"), errc::ok);
    ASSERT_TRUE(wait([&] { return !l1->got.empty() && l1->got.back().bytes == "after"; }));
    std::printf("[ sibling  ] L1 got %zu message(s)\n", l1->got.size());
    EXPECT_EQ(l1->got.size(), 1U) << "the sibling's copy went on into the tree";
    EXPECT_EQ(root->n->counters().broadcasts_forwarded, 0U);
    w.close();
    sib.ch->close();
    ASSERT_TRUE(wait([&] { return sib.ch->closed(); }));
  }
  // The root, a logic child kL1 and the version 5 logic node kSink: the root's child, or below a
  // version 6 relay kRelay (*relay) when `behind_relay`. Returns the report of a broadcast to
  // logic.
  broadcast_report run_v5(bool behind_relay, bus_node** relay = nullptr) {
    bus_node* root = make_root(kRoot, {subnet{kRoot, 12}}, test::typed_config("root"));
    bus_node* via = root;
    if (behind_relay) {
      via = make_child(kRelay, root, {subnet{kRelay, 8}}, test::typed_config("relay"));
      *relay = via;
    }
    node_config old = test::typed_config("logic");
    old.protocol_max = 5;
    make_child(behind_relay ? kRelay + 1 : kSink, via, {}, old);
    l1_ = make_child(kL1, root, {}, test::typed_config("logic"));
    EXPECT_TRUE(wait([&] { return root->n->find("logic").size() == 2; }));
    std::optional<broadcast_report> rep;
    EXPECT_EQ(root->n->broadcast(broadcast_target::of_type("logic"), 1, "x", 1, 120000,
                                 [&](const broadcast_report& r) { rep = r; }),
              errc::ok);
    EXPECT_TRUE(wait([&] { return rep.has_value(); }, std::chrono::seconds(20)))
        << "the target behind the version 5 link waits for timeout_ms";
    return rep.value_or(broadcast_report{});
  }
  static constexpr bus_id kRelay = 0x1300;
  bus_node* root_ = nullptr;
  bus_node* l1_ = nullptr;
  test::raw_child sink_{kSink, kRoot};
  std::string ring_;  // a ring a test made (removed at the end)
};

// The root's only link with a target behind it (a child that stopped reading) is full: the
// broadcast was accepted all the same, its copy refused, and its target failed only at the
// broadcast's timeout, as timeout; the application, never told queue_full, got no on_writable.
// Now the call returns queue_full (nothing accepted, never reported) naming the hop, and
// on_writable(hop) follows once the child reads again; every accepted broadcast has one report.
TEST_F(NodeBroadcast, AFullFirstHopRefusesTheBroadcastAndOnWritableFollows) {
  ASSERT_NO_FATAL_FAILURE(build({kSink}, true));
  std::map<uint64_t, int> reports;
  const auto cb = [&](const broadcast_report& r) { ++reports[r.broadcast_id]; };
  const std::string big(60000, 'b');
  size_t accepted = 0;
  errc last = errc::ok;
  ASSERT_TRUE(wait([&] {
    sink_.ping();
    for (int i = 0; i < 8 && last == errc::ok; ++i) {
      last = root_->n->broadcast(broadcast_target::of_type("logic"), 1, big.data(), big.size(),
                                 3000, cb);
      accepted += last == errc::ok ? 1 : 0;
    }
    return last != errc::ok || refused_to_sink();
  }));
  std::printf("[ refused  ] broadcast() returned %s after %zu accepted; on_writable %llu\n",
              to_string(last), accepted, static_cast<unsigned long long>(root_->writable));
  ASSERT_EQ(last, errc::queue_full) << "a broadcast whose only copy was refused was accepted";
  const std::string detail = root_->n->last_error().detail;
  EXPECT_NE(detail.find("0x1800"), std::string::npos) << detail;
  sink_.resume_reading();
  ASSERT_TRUE(wait([&] {
    sink_.ping();
    return root_->writable >= 1;
  })) << "on_writable did not follow the queue_full";
  // The sink acknowledges none: each accepted one is reported once, at its timeout.
  ASSERT_TRUE(wait([&] {
    sink_.ping();
    return reports.size() == accepted && copies() >= accepted;
  }));
  EXPECT_EQ(copies(), accepted);  // the refused one never went out
  for (const auto& [id, k] : reports) EXPECT_EQ(k, 1) << id;
  EXPECT_EQ(root_->n->counters().broadcasts_sent, accepted);
}

// A root with two links behind which targets lie, one of them full: the broadcast goes out over
// the other, and the targets behind the full one were failed only at timeout_ms (120 s here). They
// fail at once now: not_connected, with a detail naming the hop and queue_full.
TEST_F(NodeBroadcast, ACopyAFullLinkRefusesFailsItsTargetsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(build({kSink}, true));
  node_config lc = test::typed_config("logic");
  bus_node* l1 = make_child(kL1, root_, {subnet{kL1, 8}}, lc);
  ASSERT_TRUE(wait([&] { return root_->n->find("logic").size() == 2; }));
  const std::string big(60000, 'b');
  std::optional<broadcast_report> rep;
  errc sent = errc::ok;
  auto t0 = std::chrono::steady_clock::now();
  // Until a send to the sink meets its full link, then the broadcast at once (the loop would let
  // the link drain into the socket).
  ASSERT_TRUE(wait([&] {
    sink_.ping();
    for (int i = 0; i < 8; ++i) {
      if (test::send_str(root_, kSink, 1, big) != errc::queue_full) continue;
      t0 = std::chrono::steady_clock::now();
      sent = root_->n->broadcast(broadcast_target::of_type("logic"), 1, big.data(), big.size(),
                                 120000, [&](const broadcast_report& r) { rep = r; });
      return true;
    }
    return false;
  }));
  ASSERT_EQ(sent, errc::ok) << root_->n->last_error().detail;
  EXPECT_FALSE(rep.has_value()) << "never from inside broadcast()";
  const bool came = wait(
      [&] {
        sink_.ping();
        return rep.has_value();
      },
      std::chrono::seconds(20));
  std::printf("[ summary  ] %s after %lld ms\n", came ? to_string(rep->status) : "none",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count()));
  ASSERT_TRUE(came) << "the target behind the full link waits for timeout_ms";
  EXPECT_EQ(rep->status, errc::not_connected);
  EXPECT_EQ(rep->reached, (std::vector<bus_id>{kL1}));
  EXPECT_EQ(rep->failed, (std::vector<bus_id>{kSink}));
  EXPECT_NE(rep->detail.find("1 of 2 targets got no copy"), std::string::npos) << rep->detail;
  EXPECT_NE(rep->detail.find("0x1800"), std::string::npos) << rep->detail;
  EXPECT_NE(rep->detail.find("queue_full"), std::string::npos) << rep->detail;
  ASSERT_EQ(l1->got.size(), 1U);
}

// A target behind a link to a node of protocol version 5 (which takes no broadcast) got no copy
// and was failed only at timeout_ms; it fails at once now, named in the detail: behind the
// sender's own link, or one hop further down (root -> relay of version 6 -> the version 5 node),
// where the relay, which cannot pass its copy on, counts it (forward_dropped) and logs it.
TEST_F(NodeBroadcast, ATargetBehindAVersion5LinkFailsAtOnce) {
  const broadcast_report rep = run_v5(false);
  EXPECT_EQ(rep.status, errc::not_connected);
  EXPECT_EQ(rep.reached, (std::vector<bus_id>{kL1}));
  EXPECT_EQ(rep.failed, (std::vector<bus_id>{kSink}));
  EXPECT_NE(rep.detail.find("below protocol version 6"), std::string::npos) << rep.detail;
  EXPECT_EQ(l1_->got.size(), 1U);
}

TEST_F(NodeBroadcast, ATargetBehindAVersion5LinkOfARelayFailsAtOnce) {
  bus_node* relay = nullptr;
  const broadcast_report rep = run_v5(true, &relay);
  EXPECT_EQ(rep.status, errc::not_connected);
  EXPECT_EQ(rep.reached, (std::vector<bus_id>{kL1}));
  EXPECT_EQ(rep.failed, (std::vector<bus_id>{kRelay + 1}));
  EXPECT_NE(rep.detail.find("0x1301"), std::string::npos) << rep.detail;
  EXPECT_NE(rep.detail.find("protocol version 5"), std::string::npos) << rep.detail;
  EXPECT_EQ(l1_->got.size(), 1U);
  // The relay got its copy (its own link to the root is version 6) and drops it, counted and
  // logged.
  ASSERT_TRUE(wait([&] { return relay->n->counters().forward_dropped == 1; }))
      << "forward_dropped " << relay->n->counters().forward_dropped;
  bool logged = false;
  for (const auto& l : relay->logs) {
    logged = logged || (l.second.find("dropping broadcast") != std::string::npos &&
                        l.second.find("version_mismatch") != std::string::npos);
  }
  EXPECT_TRUE(logged) << "the relay logged no drop";
}

// A broadcast id names one broadcast of one incarnation: a node started again with the same id
// numbered its broadcasts from 1 again, so a late acknowledgement of the dead incarnation's
// broadcast counted a target of the new one's as reached. Now the ids differ, and such an
// acknowledgement leaves the target waiting.
TEST_F(NodeBroadcast, ALateAcknowledgementOfAnEarlierIncarnationCountsForNothing) {
  std::vector<bus_id> logic{kSink + 1};
  ASSERT_NO_FATAL_FAILURE(build(logic, false));
  std::optional<broadcast_report> rep;
  const auto cb = [&](const broadcast_report& r) { rep = r; };
  uint64_t first = 0;
  ASSERT_EQ(
      root_->n->broadcast(broadcast_target::of_type("logic"), 1, "x", 1, 120000, cb, {}, &first),
      errc::ok);
  // The root dies before the acknowledgement; its next incarnation (same id) gets the sink again.
  destroy(root_);
  ASSERT_TRUE(wait([&] { return sink_.closed; }));
  sink_.ch->close();
  ASSERT_TRUE(wait([&] { return sink_.ch->closed(); }));
  node_config rc = test::typed_config("root");
  rc.delivery = delivery_mode::next_hop;
  root_ = make_root(kRoot, {subnet{kRoot, 12}}, rc);
  ASSERT_NO_FATAL_FAILURE(connect_sink(logic));
  uint64_t second = 0;
  ASSERT_EQ(
      root_->n->broadcast(broadcast_target::of_type("logic"), 1, "x", 1, 120000, cb, {}, &second),
      errc::ok);
  EXPECT_NE(second, first);
  ack(first, kSink + 1);  // the dead incarnation's
  run_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(rep.has_value()) << "reached by the acknowledgement of broadcast " << first;
  ack(second, kSink + 1);
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  EXPECT_EQ(rep->status, errc::ok);
}

// Every broadcast awaiting its summary kept a state per expected node, up to 4096 of them (330 MB
// with 10 000 matching nodes). broadcast_max_targets bounds their sum: 200 targets each, a cap of
// 500 takes two; the third is refused with queue_full naming the field, and taken once the first
// two are reported. A cap of 0 is refused by validate().
TEST_F(NodeBroadcast, BroadcastMaxTargetsBoundsTheTargetsAwaitingAcknowledgement) {
  node_config rc = test::typed_config("root");
  rc.broadcast_max_targets = 0;
  std::string why;
  EXPECT_EQ(node::validate(kRoot, rc, &why), errc::invalid_argument);
  EXPECT_NE(why.find("broadcast_max_targets"), std::string::npos) << why;
  rc.broadcast_max_targets = 500;
  std::vector<bus_id> logic;
  for (bus_id id = kSink + 1; id <= kSink + 200; ++id) logic.push_back(id);
  ASSERT_NO_FATAL_FAILURE(build(logic, false, rc));
  size_t reported = 0;
  const auto cb = [&](const broadcast_report& r) {
    ++reported;
    EXPECT_EQ(r.status, errc::timeout);
    EXPECT_EQ(r.failed.size(), 200U);
  };
  const broadcast_target to = broadcast_target::of_type("logic");
  ASSERT_EQ(root_->n->broadcast(to, 1, "a", 1, 1000, cb), errc::ok);
  ASSERT_EQ(root_->n->broadcast(to, 1, "b", 1, 1000, cb), errc::ok);
  const errc third = root_->n->broadcast(to, 1, "c", 1, 1000, cb);
  std::printf("[ bound    ] third broadcast of 200 targets under a cap of 500: %s\n",
              to_string(third));
  EXPECT_EQ(third, errc::queue_full);
  const std::string detail = root_->n->last_error().detail;
  EXPECT_NE(detail.find("broadcast_max_targets (500)"), std::string::npos) << detail;
  ASSERT_TRUE(wait([&] { return reported == (third == errc::ok ? 3U : 2U); }));
  EXPECT_EQ(root_->n->broadcast(to, 1, "d", 1, 60000, cb), errc::ok);
}

// What a target awaiting acknowledgement costs (the bound broadcast_max_targets states: 9 bytes,
// its id and state): 1100 targets, 40 broadcasts, the bytes the sanitizer's allocator holds more.
// The id list grew by doubling: 2048 places for 1100 targets, 16 bytes a target.
TEST_F(NodeBroadcast, ATargetAwaitingAcknowledgementCostsNineBytes) {
#ifndef UVBUS_ALLOCATED_BYTES
  GTEST_SKIP() << "no sanitizer allocator to ask";
#else
  std::vector<bus_id> logic;
  for (bus_id id = kSink + 1; id <= kSink + 1100; ++id) logic.push_back(id);
  ASSERT_NO_FATAL_FAILURE(build(logic, false));
  const broadcast_target to = broadcast_target::of_type("logic");
  const auto cb = [](const broadcast_report&) {};
  ASSERT_EQ(root_->n->broadcast(to, 1, "w", 1, 600000, cb), errc::ok);  // warm the buffers
  ASSERT_TRUE(wait([&] { return copies() == 1; }));
  const size_t before = __sanitizer_get_current_allocated_bytes();
  for (int i = 0; i < 40; ++i) ASSERT_EQ(root_->n->broadcast(to, 1, "x", 1, 600000, cb), errc::ok);
  const size_t after = __sanitizer_get_current_allocated_bytes();
  const double per = static_cast<double>(after - before) / (40.0 * 1100.0);
  std::printf("[ memory   ] %.2f bytes per target awaiting acknowledgement\n", per);
  // 9 bytes of data a target; the sanitizer's allocator rounds on top (ASan 9.25, TSan 10.8). The
  // list that grew by doubling cost 16.15.
  EXPECT_LT(per, 13.0);
#endif
}

// A child may claim any source of its subnets: acknowledgements of one broadcast from the 245
// ids of its subnet that no directory lists, from a listed node the selector does not match, and
// twice from each target, each put a node in `reached` (256 there for 10 targets). Now only a
// node the directory lists as matching counts (a target once; one that joined since, once).
TEST_F(NodeBroadcast, ForgedAndDuplicateAcknowledgementsCountOnlyMatchingListedNodes) {
  std::vector<bus_id> logic;
  for (bus_id id = kSink + 1; id <= kSink + 10; ++id) logic.push_back(id);
  ASSERT_NO_FATAL_FAILURE(build(logic, false));
  announce({kSink}, "gateway");
  ASSERT_TRUE(wait([&] { return root_->n->find("gateway").size() == 1; }));
  std::optional<broadcast_report> rep;
  uint64_t id = 0;
  ASSERT_EQ(root_->n->broadcast(
                broadcast_target::of_type("logic"), 1, "x", 1, 60000,
                [&](const broadcast_report& r) { rep = r; }, {}, &id),
            errc::ok);
  for (bus_id s = kSink; s <= kSink + 255; ++s) {
    if (s < kSink + 1 || s > kSink + 10) ack(id, s);  // not a target
  }
  announce({kSink + 20}, "logic");  // joins since: its acknowledgement counts
  ack(id, kSink + 20);
  ack(id, kSink + 20);
  for (int twice = 0; twice < 2; ++twice) {
    for (bus_id s = kSink + 1; s <= kSink + 9; ++s) ack(id, s);
  }
  ack(id, kSink + 10);  // the last target: the summary comes
  ASSERT_TRUE(wait([&] { return rep.has_value(); }));
  std::printf("[ reached  ] %zu nodes for 10 targets\n", rep->reached.size());
  EXPECT_EQ(rep->status, errc::ok);
  std::vector<bus_id> want = logic;
  want.push_back(kSink + 20);
  EXPECT_EQ(rep->reached, want);
  EXPECT_TRUE(rep->failed.empty());
}

// A copy over a sibling link is one a root sends a node in no common tree, addressed to it alone.
// One with a wider selector (a hand-made sibling's) was fanned out into the receiver's whole tree
// on the sibling's word: L1 got it. It goes no further now; the root, which matches, still gets it.
TEST_F(NodeBroadcast, ACopyFromASiblingGoesNoFurther) {
  expect_a_sibling_copy_goes_no_further(false);
}

// The same copy written into the root's shared-memory ring by a same-host sibling, whose writer
// access tokens prove: it came through no sibling link, so it was fanned out (L1 got it). Now it
// is taken as the sibling's: delivered to the root, not sent on.
TEST_F(NodeBroadcast, ACopyASiblingWroteIntoTheRingGoesNoFurther) {
  expect_a_sibling_copy_goes_no_further(true);
}

// A broadcast's timeout came with the node's tick (every 250 ms here), not at timeout_ms (20), and
// an acknowledgement read after timeout_ms but before that tick still counted: ok. Each broadcast
// starts inside the previous one's summary, which before came from a tick (the next a whole
// period away). The summary comes at timeout_ms now, by the loop's clock well before the next
// tick could fire, and an acknowledgement after the deadline counts for nothing.
TEST_F(NodeBroadcast, ABroadcastTimesOutAtTimeoutMsNotAtTheTick) {
  node_config rc = test::typed_config("root");
  rc.heartbeat_interval_ms = 2000;   // the tick: the smallest of these / 4, at most 250 ms
  rc.heartbeat_timeout_ms = 120000;  // the sink never pings
  rc.handshake_timeout_ms = rc.pending_timeout_ms = rc.response_timeout_ms = 5000;
  constexpr uint64_t kTickMs = 250;
  ASSERT_NO_FATAL_FAILURE(build({kSink + 1}, false, rc));
  struct run {
    uint64_t id = 0;
    uint64_t started = 0;  // the loop's clock
    uint64_t reported = 0;
    std::optional<broadcast_report> rep;
  };
  std::array<run, 3> runs;
  std::function<void(size_t)> start = [&](size_t i) {
    runs[i].started = uv_now(&loop_);
    const auto cb = [&, i](const broadcast_report& r) {
      runs[i].reported = uv_now(&loop_);
      runs[i].rep = r;
      if (i + 1 < runs.size()) start(i + 1);
    };
    EXPECT_EQ(
        root_->n->broadcast(broadcast_target::of_type("logic"), 1, "x", 1, 20, cb, {}, &runs[i].id),
        errc::ok);
  };
  start(0);
  // The third one: the sink acknowledges it once its deadline has passed.
  ASSERT_TRUE(wait([&] { return copies() == 3 && uv_now(&loop_) >= runs[2].started + 20; }));
  ack(runs[2].id, kSink + 1);
  ASSERT_TRUE(wait([&] { return runs[2].rep.has_value(); }));
  for (size_t i = 1; i < 3; ++i) {
    SCOPED_TRACE(i);
    std::printf("[ summary  ] %s %" PRIu64 " ms after the broadcast (timeout_ms 20)\n",
                to_string(runs[i].rep->status), runs[i].reported - runs[i].started);
    EXPECT_EQ(runs[i].rep->status, errc::timeout);
    EXPECT_EQ(runs[i].rep->failed, std::vector<bus_id>{kSink + 1});
    EXPECT_LT(runs[i].reported - runs[i].started, kTickMs);
  }
}

}  // namespace
}  // namespace uvbus::node_broadcast_test
