// stop() settles everything it owes before on_down(closed): posts and tasks accepted before it,
// the callbacks of open calls and broadcast summaries (also when stop() is called from a callback
// while the node has no link), so a node destroyed in on_down(closed) loses nothing.
#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"

namespace uvbus::node_stop_order_test {
namespace {

using namespace std::chrono_literals;
using test::bus_node;
using test::fast_config;

// "what:closed" for errc::closed, else "what:" and the error's text.
std::string event(const char* what, errc e) {
  return std::string(what) + ":" + (e == errc::closed ? "closed" : to_string(e));
}

class NodeStopOrder : public test::bus_fixture {
 protected:
  // Records every callback of t into events_ as it comes, and destroys t's node in on_down; with
  // stop_in_on_report, on_report stops the node.
  void record_and_destroy_in_on_down(bus_node* t, bool stop_in_on_report = false) {
    node_callbacks cb = t->callbacks();
    cb.on_data = [](bus_id, uint32_t, const uint8_t*, size_t) {};  // requests are ignored
    cb.on_report = [this, t, stop_in_on_report](const delivery_report& r) {
      t->reports.push_back(r);
      events_.emplace_back("report");
      if (stop_in_on_report) t->n->stop();
    };
    cb.on_down = [this, t](errc e) {
      events_.emplace_back(event("down", e));
      t->n.reset();
    };
    ASSERT_EQ(t->n->set_callbacks(cb), errc::ok);
  }
  // Root 0x100 under `mode` fills its link to a hand-made child that does not read (but pings),
  // then stops: on_down(closed) comes, and every accepted message is reported (a failure closed).
  void stop_with_a_peer_that_does_not_read(delivery_mode mode) {
    node_config pc = fast_config();
    pc.heartbeat_timeout_ms = 1000;
    pc.stop_flush_ms = 0;
    pc.delivery = mode;
    bus_node* p = make_root(0x100, {{0x100, 8}}, pc);
    test::raw_child c(0x101, 0x100);
    c.compress = false;  // what it is sent must fill the socket, not shrink to nothing
    c.pause_after_register = true;
    c.start(&loop_, p->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return c.registered; }));
    const size_t accepted = test::fill_unread_link(&loop_, p, &c, true);
    ASSERT_TRUE(p->removed.empty());
    p->n->stop();
    ASSERT_TRUE(wait([&] { return !p->downs.empty(); }, 10s));
    EXPECT_EQ(p->downs.back(), errc::closed);
    EXPECT_EQ(p->reports.size(), accepted);                 // every accepted message reported
    EXPECT_GT(test::failed_reports(*p, errc::closed), 0u);  // the link held messages when closed
  }
  std::vector<std::string> events_;
};

// Posts accepted before stop() are reported (closed) before on_down(closed), even when the loop
// has not run the mailbox yet.
TEST_F(NodeStopOrder, PostsAcceptedBeforeStopAreReportedBeforeOnDown) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  ASSERT_TRUE(wait([&] { return p->ups == 1; }));
  ASSERT_NO_FATAL_FAILURE(record_and_destroy_in_on_down(p));
  std::thread([&] {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(p->n->post(0x100, 1, "x", 1), errc::ok);
  }).join();
  p->n->stop();
  ASSERT_TRUE(wait([&] { return p->n == nullptr; }));
  run_for(100ms);
  ASSERT_EQ(p->reports.size(), 3u);
  for (const auto& r : p->reports) EXPECT_EQ(r.status, errc::closed);
  EXPECT_EQ(events_, (std::vector<std::string>{"report", "report", "report", "down:closed"}));
}

// A task accepted before stop() runs (it "runs even after stop()") before on_down(closed).
TEST_F(NodeStopOrder, TaskAcceptedBeforeStopRunsBeforeOnDown) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  ASSERT_TRUE(wait([&] { return p->ups == 1; }));
  ASSERT_NO_FATAL_FAILURE(record_and_destroy_in_on_down(p));
  std::thread([&] {
    EXPECT_EQ(p->n->post([this] { events_.emplace_back("task"); }), errc::ok);
  }).join();
  p->n->stop();
  ASSERT_TRUE(wait([&] { return p->n == nullptr; }));
  run_for(100ms);
  EXPECT_EQ(events_, (std::vector<std::string>{"task", "down:closed"}));
}

// stop() from on_report on a node with no link: the open call's callback (closed) still runs,
// once, before on_down(closed).
TEST_F(NodeStopOrder, StopFromOnReportRunsAnOpenCallsCallbackBeforeOnDown) {
  bus_node* r = make_root(0x100, {{0x100, 8}});
  ASSERT_TRUE(wait([&] { return r->ups == 1; }));
  ASSERT_NO_FATAL_FAILURE(record_and_destroy_in_on_down(r, true));
  ASSERT_EQ(r->n->call(0x100, 5, "q", 1, 60000,
                       [this](const call_result& res) {
                         events_.emplace_back(event("call", res.status));
                       }),
            errc::ok);
  ASSERT_EQ(send_str(r, 0x100, 1, "x"), errc::ok);
  ASSERT_TRUE(wait([&] { return r->n == nullptr; }));
  run_for(100ms);
  EXPECT_EQ(events_, (std::vector<std::string>{"report", "call:closed", "down:closed"}));
}

// The same for a broadcast summary: the broadcast waits for a target that never acknowledges it,
// and on_report stops the node. A node left alone has no broadcast open any
// more (each ends, not_connected, once its last silent target leaves the directory:
// NodeFanout.ABroadcastEndsAtOnceWhenItsSilentTargetsRelayDies), so the target stays.
TEST_F(NodeStopOrder, StopFromOnReportRunsABroadcastSummaryBeforeOnDown) {
  node_config rc = fast_config();
  rc.type = "root";
  bus_node* r = make_root(0x1000, {{0x1000, 8}}, rc);
  // A hand-made child gets its copy and never acknowledges it: the broadcast stays open until
  // stop(). (A version 5 child served until a target no copy goes to began to fail at once.)
  test::raw_child l(0x1001, 0x1000);
  l.start(&loop_, r->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return l.registered; }));
  proto::directory_body up;
  directory_entry e;
  e.id = 0x1001;
  e.type = "logic";
  e.protocol_version = proto::kMaxVersion;  // a target a copy goes to (below 6 fails at once)
  up.entries.push_back(e);
  std::vector<uint8_t> body;
  proto::encode_directory(up, &body);
  l.send(proto::msg_type::directory, body);
  ASSERT_TRUE(wait([&] { return r->n->directory().size() == 2; }));
  ASSERT_EQ(r->n->broadcast(broadcast_target::of_type("logic"), 1, "b", 1, 60000,
                            [this](const broadcast_report& rep) {
                              events_.emplace_back(event("broadcast", rep.status));
                            }),
            errc::ok);
  ASSERT_NO_FATAL_FAILURE(record_and_destroy_in_on_down(r, true));
  ASSERT_EQ(send_str(r, 0x1000, 1, "x"), errc::ok);
  ASSERT_TRUE(wait([&] { return r->n == nullptr; }));
  run_for(100ms);
  EXPECT_EQ(events_, (std::vector<std::string>{"report", "broadcast:closed", "down:closed"}));
  l.ch->close();
  ASSERT_TRUE(wait([&] { return l.ch->closed(); }));
}

// stop() closes every link gracefully: its queue reaches the kernel first. A peer that stopped
// reading (a stalled process) with more queued than the kernel takes held that for ever, and
// on_down(closed) never came (the heartbeat check skips closing links). A graceful close now gets
// heartbeat_timeout_ms; then the link is closed at once and what it still held is reported.
TEST_F(NodeStopOrder, StopEndsWhenAPeerDoesNotReadWhatIsQueuedForIt) {
  ASSERT_NO_FATAL_FAILURE(stop_with_a_peer_that_does_not_read(delivery_mode::end_to_end));
}

// The same under next-hop reports: what the link still held is reported closed (the node
// stopped), as node.h says. It was reported cancelled (the stream's word for the forced close
// that ends the graceful one).
TEST_F(NodeStopOrder, StopReportsWhatAPeerDidNotReadClosedUnderNextHopDelivery) {
  ASSERT_NO_FATAL_FAILURE(stop_with_a_peer_that_does_not_read(delivery_mode::next_hop));
}

}  // namespace
}  // namespace uvbus::node_stop_order_test
