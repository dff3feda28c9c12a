// In-place sends (node::prepare_data / commit_data / cancel_data): what is committed arrives in
// order with the node's other messages and gets one report; an open reservation refuses other
// sends; cancel and stop drop it; the usual errors; the same over shared memory through a relay.
#include <gtest/gtest.h>
#include <uv.h>

#include <algorithm>
#include <string>
#include <thread>

#include "bus/bus_harness.h"
#include "uvbus/node.h"

namespace uvbus::node_prepare_test {
namespace {

using test::bus_node;

class NodePrepareTest : public test::bus_fixture {
 protected:
  // Root 0x100 and its children A 0x101 (sender) and B 0x102; cfg for all three.
  void make_tree(node_config cfg = test::fast_config()) {
    cfg.sibling_direct = false;
    node_config pc = cfg;
    pc.subnets = {{0x100, 8}};
    if (pc.enable_shm) pc.listen.push_back("shm://" + test::unique_name("prep-p"));
    p_ = make(0x100, pc);
    node_config cc = cfg;
    cc.parent_urls = {p_->n->listen_urls().at(0)};
    if (cc.enable_shm) cc.listen.push_back("shm://" + test::unique_name("prep-a"));
    a_ = make(0x101, cc);
    if (cc.enable_shm) cc.listen.back() = "shm://" + test::unique_name("prep-b");
    b_ = make(0x102, cc);
    ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up(); }));
  }
  // prepare_data + memcpy + commit_data of `text` from A to `to`; returns the message id.
  uint64_t put(bus_id to, const std::string& text) {
    errc e = errc::ok;
    uint8_t* p = a_->n->prepare_data(to, 7, text.size(), &e);
    EXPECT_NE(p, nullptr) << to_string(e);
    if (p == nullptr) return 0;
    std::copy(text.begin(), text.end(), p);
    uint64_t id = 0;
    EXPECT_EQ(a_->n->commit_data(&id), errc::ok);
    return id;
  }
  bus_node* p_ = nullptr;
  bus_node* a_ = nullptr;
  bus_node* b_ = nullptr;
};

TEST_F(NodePrepareTest, CommittedMessagesArriveInOrderWithSentOnesAndAreReportedOnce) {
  make_tree();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 200; ++i) {
    const std::string s = "m" + std::to_string(i);
    if (i % 3 == 0) {
      uint64_t id = 0;
      ASSERT_EQ(a_->n->send_data(0x102, 7, s.data(), s.size(), {}, &id), errc::ok);
      ids.push_back(id);
    } else {
      ids.push_back(put(0x102, s));
    }
  }
  ASSERT_TRUE(wait([&] { return b_->got.size() == 200 && a_->reports.size() == 200; }));
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(b_->got[i].bytes, "m" + std::to_string(i));
    EXPECT_EQ(b_->got[i].type, 7u);
    EXPECT_EQ(b_->got[i].source, 0x101u);
    EXPECT_EQ(a_->reports[i].message_id, ids[i]);
    EXPECT_EQ(a_->reports[i].status, errc::ok);
  }
  EXPECT_EQ(a_->n->counters().data_sent, 200u);
}

TEST_F(NodePrepareTest, AnOpenReservationRefusesOtherSendsAndStaysOpen) {
  make_tree();
  errc e = errc::ok;
  uint8_t* p = a_->n->prepare_data(0x102, 7, 3, &e);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a_->n->send_data(0x102, 7, "x", 1), errc::wrong_state);
  EXPECT_NE(a_->n->last_error().detail.find("prepare_data"), std::string::npos)
      << a_->n->last_error().detail;
  EXPECT_EQ(a_->n->prepare_data(0x100, 7, 1, &e), nullptr);
  EXPECT_EQ(e, errc::wrong_state);
  const std::string abc = "abc";
  std::copy(abc.begin(), abc.end(), p);  // the first reservation is still there
  ASSERT_EQ(a_->n->commit_data(), errc::ok);
  EXPECT_EQ(a_->n->commit_data(), errc::wrong_state);  // nothing open any more
  ASSERT_EQ(a_->n->send_data(0x102, 7, "d", 1), errc::ok);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 2; }));
  EXPECT_EQ(b_->got[0].bytes, "abc");
  EXPECT_EQ(b_->got[1].bytes, "d");
}

TEST_F(NodePrepareTest, CancelledReservationsSendAndReportNothing) {
  make_tree();
  for (int i = 0; i < 100; ++i) {
    uint8_t* p = a_->n->prepare_data(0x102, 7, 5);
    ASSERT_NE(p, nullptr);
    const std::string gone = "gone!";
    std::copy(gone.begin(), gone.end(), p);
    a_->n->cancel_data();
  }
  EXPECT_EQ(a_->n->commit_data(), errc::wrong_state);
  put(0x102, "kept");
  ASSERT_TRUE(wait([&] { return b_->got.size() == 1 && a_->reports.size() == 1; }));
  EXPECT_EQ(b_->got[0].bytes, "kept");
  EXPECT_EQ(a_->n->counters().data_sent, 1u);
  a_->n->cancel_data();  // nothing open: nothing happens
}

TEST_F(NodePrepareTest, SelfAndNextHopMessagesUseTheNodesBuffer) {
  node_config c = test::fast_config();
  c.delivery = delivery_mode::next_hop;
  make_tree(c);
  put(0x101, "to myself");
  put(0x102, "next hop");
  put(0x102, std::string());  // an empty payload
  ASSERT_TRUE(wait([&] { return a_->got.size() == 1 && b_->got.size() == 2; }));
  EXPECT_EQ(a_->got[0].bytes, "to myself");
  EXPECT_EQ(b_->got[0].bytes, "next hop");
  EXPECT_EQ(b_->got[1].bytes, "");
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 3; }));
  for (const delivery_report& r : a_->reports) EXPECT_EQ(r.status, errc::ok);
}

TEST_F(NodePrepareTest, ACommitThatFailsHasDroppedTheReservation) {
  make_tree();
  uint8_t* p = p_->n->prepare_data(0x1AA, 7, 4);  // inside the root's subnets, no such child
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p_->n->commit_data(), errc::unknown_route);
  EXPECT_NE(p_->n->last_error().detail.find("0x1aa"), std::string::npos)
      << p_->n->last_error().detail;
  EXPECT_EQ(p_->n->commit_data(), errc::wrong_state);  // nothing open any more
  uint64_t id = 0;
  ASSERT_EQ(p_->n->send_data(0x102, 7, "ok", 2, {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 1 && p_->reports.size() == 1; }));
  EXPECT_EQ(b_->got[0].bytes, "ok");
  EXPECT_EQ(p_->reports[0].message_id, id);  // no report for the failed commit
}

TEST_F(NodePrepareTest, StopDropsTheReservation) {
  make_tree();
  ASSERT_NE(a_->n->prepare_data(0x102, 7, 8), nullptr);
  a_->n->stop();
  EXPECT_EQ(a_->n->commit_data(), errc::closed);
  errc e = errc::ok;
  EXPECT_EQ(a_->n->prepare_data(0x102, 7, 8, &e), nullptr);
  EXPECT_EQ(e, errc::closed);
  ASSERT_TRUE(wait([&] { return !a_->downs.empty(); }));
  EXPECT_TRUE(a_->reports.empty());
  EXPECT_TRUE(b_->got.empty());
}

// A caller that lets the loop run with a reservation open (against the contract, but it must not
// corrupt memory): the flow tick gave back the quiet flow's grown buffer, the reservation's room
// included, and the write and commit_data() used freed memory (ASan: heap-use-after-free). The
// buffer now stays while the reservation is open.
TEST_F(NodePrepareTest, TheFlowTickKeepsTheBufferOfAnOpenReservation) {
  make_tree();
  const std::string text(20000, 'r');  // more than the store a quiet flow keeps (16 KiB)
  errc e = errc::ok;
  uint8_t* p = a_->n->prepare_data(0x102, 7, text.size(), &e);
  ASSERT_NE(p, nullptr) << to_string(e);
  // The flow was quiet for a second: a tick after that (the tick period is at most 250 ms, and
  // the reservation's flow made its last progress no later than t0) has walked it.
  const uint64_t t0 = uv_now(&loop_);
  ASSERT_TRUE(wait([&] { return uv_now(&loop_) > t0 + 1600; }));
  std::copy(text.begin(), text.end(), p);
  uint64_t id = 0;
  ASSERT_EQ(a_->n->commit_data(&id), errc::ok);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 1 && a_->reports.size() == 1; }));
  EXPECT_EQ(b_->got[0].bytes, text);
  EXPECT_EQ(a_->reports[0].status, errc::ok);
}

TEST_F(NodePrepareTest, RefusalsNameTheirCause) {
  node_config c = test::fast_config();
  c.message_limit = 100;
  c.retransmit_max_messages = 4;
  make_tree(c);
  errc e = errc::ok;
  EXPECT_EQ(a_->n->prepare_data(0x102, 7, 101, &e), nullptr);
  EXPECT_EQ(e, errc::message_too_large);
  EXPECT_NE(a_->n->last_error().detail.find("101 bytes"), std::string::npos);
  trace_context bad;  // zero ids: invalid
  send_options o;
  o.trace = &bad;
  EXPECT_EQ(a_->n->prepare_data(0x102, 7, 1, &e, o), nullptr);
  EXPECT_EQ(e, errc::invalid_argument);
  // Four unacknowledged messages fill the retransmit buffer (the loop does not run meanwhile).
  for (int i = 0; i < 4; ++i) put(0x102, "f");
  EXPECT_EQ(a_->n->prepare_data(0x102, 7, 1, &e), nullptr);
  EXPECT_EQ(e, errc::queue_full);
  ASSERT_TRUE(wait([&] { return a_->writable != 0; }));
  put(0x102, "after");
  ASSERT_TRUE(wait([&] { return b_->got.size() == 5; }));
  EXPECT_EQ(b_->got[4].bytes, "after");

  bus_node* idle = make(0x200, test::fast_config(), false);
  EXPECT_EQ(idle->n->prepare_data(0x102, 7, 1, &e), nullptr);
  EXPECT_EQ(e, errc::wrong_state);
  EXPECT_EQ(idle->n->commit_data(), errc::wrong_state);
}

#ifdef NDEBUG  // debug builds abort naming the function instead (thread_check_test.cpp)
TEST_F(NodePrepareTest, AnotherThreadIsRefused) {
  make_tree();
  errc e = errc::ok;
  uint8_t sentinel = 0;
  uint8_t* p = &sentinel;
  std::thread t([&] { p = a_->n->prepare_data(0x102, 7, 1, &e); });
  t.join();
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(e, errc::wrong_thread);
  errc c = errc::ok;
  std::thread u([&] { c = a_->n->commit_data(); });
  u.join();
  EXPECT_EQ(c, errc::wrong_thread);
}
#endif

// A over its parent's ring, the parent forwarding into B's ring: the relay's ring path.
TEST_F(NodePrepareTest, CommittedMessagesCrossSharedMemoryThroughARelay) {
  node_config c = test::fast_config();
  c.enable_shm = true;
  c.shm_ring_bytes = 1 << 20;
  make_tree(c);
  endpoint_info ep;
  ASSERT_TRUE(a_->n->peer(0x100, &ep));
  ASSERT_EQ(ep.data_channel, channel_kind::shm);
  ASSERT_TRUE(p_->n->peer(0x102, &ep));
  ASSERT_EQ(ep.data_channel, channel_kind::shm);
  for (int i = 0; i < 2000; ++i) {
    const std::string s = std::to_string(i);
    if (i % 2 == 0) {
      ASSERT_EQ(a_->n->send_data(0x102, 7, s.data(), s.size()), errc::ok);
    } else {
      put(0x102, s);
    }
  }
  ASSERT_TRUE(wait([&] { return b_->got.size() == 2000 && a_->reports.size() == 2000; }));
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(b_->got[i].bytes, std::to_string(i));
  for (const delivery_report& r : a_->reports) ASSERT_EQ(r.status, errc::ok);
  EXPECT_EQ(a_->n->counters().data_sent_shm, 2000u);
  EXPECT_EQ(p_->n->counters().forwarded, 2000u);
}

}  // namespace
}  // namespace uvbus::node_prepare_test
