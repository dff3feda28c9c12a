// send_any() when the chosen node has just left: a root, a game node sending through it (or over
// direct sibling links) and two lobby nodes. A lobby stops cleanly, is destroyed (its connection
// closed) or freezes (its link dropped by the root's heartbeat timeout) just before or just after
// the send, or the game node's own parent goes. A send_any message still owed its report then
// fails at once with not_connected, under end-to-end delivery and under next-hop delivery with
// require_response, never after its timeout (configured at 60 s: a report within the 30 s wait
// is not the timeout); pick() never returns a departed node; a plain send_data() to a node that
// restarts is still resent to its next incarnation. call_any(): a call to the node picked ends at
// once with not_connected when that node leaves before answering.
#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bus/bus_harness.h"

namespace uvbus::node_any_test {
namespace {

using test::bus_node;
using test::typed_config;

// The root owns kRoot/8; the game node and the two lobbies take the ids after it.
constexpr bus_id kRoot = 0x3000;
constexpr bus_id kGame = kRoot + 1;
constexpr bus_id kL1 = kRoot + 2;
constexpr bus_id kL2 = kRoot + 3;
// delivery_timeout_ms and response_timeout_ms: twice the harness's wait, so a report within the
// wait cannot be the timeout.
constexpr uint32_t kLongMs = 60000;

node_config lobby_config() {
  node_config c = typed_config("lobby");
  c.delivery_timeout_ms = kLongMs;
  return c;
}

// least_loaded with every load 0 picks the lowest id: L1 while the directory lists it.
const pick_options kLeast{pick_policy::least_loaded, 0};

class NodeAny : public test::bus_fixture {
 protected:
  // The root (its child grace: how long it holds messages for a child that left) and the game
  // node (delivery mode; sending through the root unless sibling_direct); the lobbies are added
  // by add_lobbies().
  void build(delivery_mode mode, uint32_t grace_ms = 300, uint32_t root_heartbeat_timeout = 5000,
             bool sibling_direct = false) {
    node_config rc = typed_config("root");
    rc.subnets = {{kRoot, 8}};
    rc.child_grace_ms = grace_ms;
    rc.heartbeat_timeout_ms = root_heartbeat_timeout;
    rc.delivery_timeout_ms = kLongMs;
    root_ = make(kRoot, rc);
    node_config gc = typed_config("game", root_->n->listen_urls().at(0));
    gc.delivery = mode;
    gc.delivery_timeout_ms = kLongMs;
    gc.response_timeout_ms = kLongMs;
    gc.sibling_direct = sibling_direct;
    game_ = make(kGame, gc, true, [this](node_callbacks* cb) {
      cb->on_dropped = [this](bus_id, uint64_t m, errc e) { dropped_.emplace_back(m, e); };
    });
    ASSERT_TRUE(wait([&] { return game_->n->up(); }));
  }
  void add_lobbies() {
    l1_ = make_child(kL1, root_, {}, lobby_config());
    l2_ = make_child(kL2, root_, {}, lobby_config());
    ASSERT_TRUE(wait([&] { return knows(kL1) && knows(kL2); }));
  }
  [[nodiscard]] bool knows(bus_id id) const {
    directory_entry e;
    return game_->n->lookup(id, &e);
  }
  // send_any to the least loaded lobby; *chosen gets the node picked.
  uint64_t send_any(bus_id* chosen, const send_options& o = {}) {
    uint64_t id = 0;
    const std::string s = "to any lobby";
    const errc e = game_->n->send_any("lobby", {}, 1, s.data(), s.size(), kLeast, o, chosen, &id);
    EXPECT_EQ(e, errc::ok) << to_string(e);
    return id;
  }
  // A first message L1 acknowledges: the game node's flow to it has an acknowledged past, so a
  // relay's unknown_route for it is "may be restarting", not final.
  void warm_up() {
    bus_id chosen = 0;
    const uint64_t id = send_any(&chosen);
    ASSERT_EQ(chosen, kL1);
    ASSERT_TRUE(wait([&] { return game_->report_for(id) != nullptr; }));
    ASSERT_EQ(game_->report_for(id)->status, errc::ok);
  }
  // Waits for message id's report; prints how long it took (the figure docs/bus.md quotes).
  const delivery_report* report_after(uint64_t id, const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool came = wait([&] { return game_->report_for(id) != nullptr; });
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    const delivery_report* r = game_->report_for(id);
    std::printf("[ report   ] %s: %s after %lld ms\n", what, came ? to_string(r->status) : "none",
                static_cast<long long>(ms));
    EXPECT_TRUE(came) << what << ": no report within the wait (the timeout is " << kLongMs
                      << " ms)";
    return r;
  }

  // send_any to the least loaded lobby, which must be L1 (fatal otherwise); *id gets the message.
  void send_any_to_l1(uint64_t* id, const send_options& o = {}) {
    bus_id chosen = 0;
    *id = send_any(&chosen, o);
    ASSERT_EQ(chosen, kL1);
  }
  // report_after(id, what), which must come (fatal otherwise) with status `want`.
  void expect_report(uint64_t id, const char* what, errc want) {
    const delivery_report* r = report_after(id, what);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->status, want);
  }

  // L1 on a loop of its own (the caller's comment says why), L2 on the fixture's.
  void frozen_lobby(const send_options& o, const char* what, errc* status, bool* came) {
    test::own_loop_node l1;
    node_config lc = lobby_config();
    lc.parent_urls = {root_->n->listen_urls().at(0)};
    ASSERT_NO_FATAL_FAILURE(l1.start(kL1, lc));
    l2_ = make_child(kL2, root_, {}, lobby_config());
    // Both loops run until L1 has acknowledged a first message.
    const auto both = [&](const std::function<bool()>& p) {
      return wait([&] {
        l1.turn();
        return p();
      });
    };
    bus_id chosen = 0;
    uint64_t first = 0;
    if (both([&] { return knows(kL1) && knows(kL2); })) {
      first = send_any(&chosen, o);
      EXPECT_EQ(chosen, kL1);
    }
    if (first != 0 && both([&] { return game_->report_for(first) != nullptr; })) {
      EXPECT_EQ(game_->report_for(first)->status, errc::ok);
      // From here L1's loop is never run again.
      const uint64_t id = send_any(&chosen, o);
      EXPECT_EQ(chosen, kL1);
      const delivery_report* r = report_after(id, what);
      *came = r != nullptr;
      if (r != nullptr) *status = r->status;
    }
    l1.finish();
  }

  // call_any() from the game node (through the root) and from the root itself (the lobbies'
  // relay) both pick L1, which takes the requests and never answers; then L1 goes. Both calls end
  // at once with not_connected, not after their 60 s timeout (a plain call() waits for it: the
  // request was delivered, and only the caller knows it picked a node that may go). With no lobby
  // left, call_any() is unknown_route at once and its callback is never called.
  void call_any_to_a_node_that_leaves(delivery_mode mode) {
    build(mode);
    add_lobbies();
    auto got = std::make_shared<std::vector<errc>>();
    const auto record = [got](const call_result& r) { got->push_back(r.status); };
    for (bus_node* from : {game_, root_}) {
      bus_id chosen = 0;
      uint64_t call = 0;
      ASSERT_EQ(
          from->n->call_any("lobby", {}, 1, "q", 1, kLongMs, record, kLeast, {}, &chosen, &call),
          errc::ok);
      EXPECT_EQ(chosen, kL1);
      EXPECT_NE(call, 0U);
    }
    ASSERT_TRUE(wait([&] { return l1_->got.size() == 2; }));
    destroy(l1_);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(wait([&] { return got->size() == 2; })) << "a call waited for its timeout";
    std::printf("[ call_any ] both calls ended after %lld ms\n",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - t0)
                                           .count()));
    for (const errc e : *got) EXPECT_EQ(e, errc::not_connected) << to_string(e);
    destroy(l2_);
    ASSERT_TRUE(wait([&] { return !knows(kL1) && !knows(kL2); }));
    EXPECT_EQ(game_->n->call_any("lobby", {}, 1, "q", 1, kLongMs, record, kLeast),
              errc::unknown_route);
    run_for(std::chrono::milliseconds(100));
    EXPECT_EQ(got->size(), 2U);
  }

  bus_node* root_ = nullptr;
  bus_node* game_ = nullptr;
  bus_node* l1_ = nullptr;
  bus_node* l2_ = nullptr;
  std::vector<std::pair<uint64_t, errc>> dropped_;  // the game node's on_dropped
};

// Clean stop just after the send: the message is still in the game node's queue when L1 says
// goodbye; the root holds it for L1 (child grace), L1's directory entry leaves at once.
TEST_F(NodeAny, EndToEndChosenNodeStopsJustAfterTheSendFailsAtOnce) {
  build(delivery_mode::end_to_end);
  add_lobbies();
  warm_up();
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(send_any_to_l1(&id));
  l1_->n->stop();
  ASSERT_NO_FATAL_FAILURE(
      expect_report(id, "end to end, clean stop after the send", errc::not_connected));
  EXPECT_EQ(game_->report_for(id)->target, kL1);
  // Exactly one report, and the next send_any goes to the lobby that is left.
  run_for(std::chrono::milliseconds(500));
  size_t reports = 0;
  for (const auto& x : game_->reports) reports += x.message_id == id ? 1 : 0;
  EXPECT_EQ(reports, 1U);
  bus_id chosen = 0;
  const uint64_t next = send_any(&chosen);
  EXPECT_EQ(chosen, kL2);
  ASSERT_TRUE(wait([&] { return game_->report_for(next) != nullptr; }));
  EXPECT_EQ(game_->report_for(next)->status, errc::ok);
}

// Killed just before the send: L1's node is destroyed (its connection closed) and the game node,
// whose directory has not heard yet, picks it.
TEST_F(NodeAny, EndToEndChosenNodeKilledJustBeforeTheSendFailsAtOnce) {
  build(delivery_mode::end_to_end);
  add_lobbies();
  warm_up();
  destroy(l1_);
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(send_any_to_l1(&id));
  expect_report(id, "end to end, killed before the send", errc::not_connected);
}

// The same with the game node dialling siblings directly (the default): its messages to L1 go
// over their own link, which closes with L1.
TEST_F(NodeAny, EndToEndOverADirectSiblingLinkChosenNodeKilledFailsAtOnce) {
  build(delivery_mode::end_to_end, 300, 5000, true);
  add_lobbies();
  warm_up();
  ASSERT_TRUE(wait([&] {
    endpoint_info e;
    return game_->n->peer(kL1, &e) && e.role == peer_role::sibling;
  }));
  destroy(l1_);
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(send_any_to_l1(&id));
  expect_report(id, "end to end, direct sibling link, killed before", errc::not_connected);
}

// The link dropped without a close: L1 runs on a loop of its own that stops being run (a frozen
// process) after it acknowledged a first message; the root drops its link at the heartbeat
// timeout (1 s), and only then is L1 known gone. Returns the report of a send_any to L1 made
// while it is frozen.
TEST_F(NodeAny, EndToEndChosenNodeWhoseLinkDropsFailsWhenTheRootDropsIt) {
  build(delivery_mode::end_to_end, 300, 1000);
  errc st = errc::ok;
  bool came = false;
  frozen_lobby(send_options{}, "end to end, link dropped (heartbeat timeout 1 s)", &st, &came);
  EXPECT_TRUE(came);
  EXPECT_EQ(st, errc::not_connected);
}

TEST_F(NodeAny, NextHopRequireResponseChosenNodeWhoseLinkDropsFailsWhenTheRootDropsIt) {
  build(delivery_mode::next_hop, kLongMs, 1000);
  send_options o;
  o.require_response = true;
  errc st = errc::ok;
  bool came = false;
  frozen_lobby(o, "next hop + require_response, link dropped", &st, &came);
  EXPECT_TRUE(came);
  EXPECT_EQ(st, errc::not_connected);
}

// The sender's own parent goes (destroyed): every entry learned through it leaves the game
// node's directory, so its send_any message to L1, which L1 may or may not have had, fails at
// once; nothing is left to pick.
TEST_F(NodeAny, EndToEndSendersParentLostFailsAtOnce) {
  build(delivery_mode::end_to_end);
  add_lobbies();
  warm_up();
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(send_any_to_l1(&id));
  destroy(root_);
  ASSERT_NO_FATAL_FAILURE(
      expect_report(id, "end to end, the sender's parent destroyed", errc::not_connected));
  bus_id got = 0;
  EXPECT_EQ(game_->n->pick("lobby", {}, kLeast, &got), errc::unknown_route);
}

// Next hop with require_response, clean stop just after the send: the root either holds the
// message for L1 (a long child grace), and only L1 leaving the directory ends the wait before
// response_timeout_ms, or meets L1's closing link and refuses it not_connected at once.
TEST_F(NodeAny, NextHopRequireResponseChosenNodeStopsJustAfterTheSendFailsAtOnce) {
  build(delivery_mode::next_hop, kLongMs);
  add_lobbies();
  send_options o;
  o.require_response = true;
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(send_any_to_l1(&id, o));
  l1_->n->stop();
  expect_report(id, "next hop + require_response, clean stop after", errc::not_connected);
  // A require_response message's report says so, whichever path ended it (node.h).
  EXPECT_TRUE(game_->report_for(id)->end_to_end);
}

// Next hop without require_response: ok means the root's channel took it, at once; the root's
// refusal, once its hold for L1 ends, comes as on_dropped. Nothing to fail: a guard of that.
TEST_F(NodeAny, NextHopWithoutResponseIsOkAtOnceAndTheDropIsTold) {
  build(delivery_mode::next_hop);
  add_lobbies();
  destroy(l1_);
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(send_any_to_l1(&id));
  ASSERT_NO_FATAL_FAILURE(expect_report(id, "next hop, killed before the send", errc::ok));
  ASSERT_TRUE(wait([&] { return !dropped_.empty(); }));
  EXPECT_EQ(dropped_.front().first, id);
  EXPECT_NE(dropped_.front().second, errc::ok);  // unknown_route, or closed if it met L1's close
}

// pick() chooses among the directory only: once L1's removal has reached the game node, no
// policy returns it; with no lobby left send_any refuses at once and no report follows.
TEST_F(NodeAny, PickNeverReturnsADepartedNode) {
  build(delivery_mode::end_to_end);
  add_lobbies();
  destroy(l1_);
  ASSERT_TRUE(wait([&] { return !knows(kL1); }));
  for (const pick_policy p :
       {pick_policy::round_robin, pick_policy::least_loaded, pick_policy::consistent_hash}) {
    for (uint64_t key = 0; key < 8; ++key) {
      bus_id got = 0;
      ASSERT_EQ(game_->n->pick("lobby", {}, pick_options{p, key}, &got), errc::ok);
      EXPECT_EQ(got, kL2);
    }
  }
  destroy(l2_);
  ASSERT_TRUE(wait([&] { return !knows(kL2); }));
  const size_t before = game_->reports.size();
  uint64_t id = 0;
  EXPECT_EQ(game_->n->send_any("lobby", {}, 1, "x", 1, kLeast, {}, nullptr, &id),
            errc::unknown_route);
  run_for(std::chrono::milliseconds(200));
  EXPECT_EQ(game_->reports.size(), before);
}

// The fast failure is send_any's: a send_data() to a node that restarts (leaves the directory
// and comes back as a new incarnation) is resent to it and reported ok, as docs/bus.md "Flows"
// promises.
TEST_F(NodeAny, SendDataToANodeThatRestartsIsStillResent) {
  build(delivery_mode::end_to_end, kLongMs);
  add_lobbies();
  warm_up();
  uint64_t id = 0;
  ASSERT_EQ(test::send_str(game_, kL1, 1, "to L1 itself", {}, &id), errc::ok);
  l1_->n->stop();
  ASSERT_TRUE(wait([&] { return !knows(kL1); }));
  EXPECT_EQ(game_->report_for(id), nullptr);
  bus_node* again = make_child(kL1, root_, {}, lobby_config());
  ASSERT_TRUE(wait([&] { return game_->report_for(id) != nullptr; }));
  EXPECT_EQ(game_->report_for(id)->status, errc::ok);
  ASSERT_FALSE(again->got.empty());
  EXPECT_EQ(again->got.back().bytes, "to L1 itself");
}

TEST_F(NodeAny, EndToEndCallAnyToANodeThatLeavesEndsAtOnce) {
  call_any_to_a_node_that_leaves(delivery_mode::end_to_end);
}

TEST_F(NodeAny, NextHopCallAnyToANodeThatLeavesEndsAtOnce) {
  call_any_to_a_node_that_leaves(delivery_mode::next_hop);
}

}  // namespace
}  // namespace uvbus::node_any_test
