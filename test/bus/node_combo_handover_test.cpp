// Features together around a planned hand-over of a relay: calls waiting for their answers,
// end-to-end messages not yet acknowledged and a broadcast in flight while the relay's listening
// sockets and flow positions move to its next process.
#include <gtest/gtest.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "bus/bus_harness.h"
#include "uvbus/handover.h"
#include "uvbus/node.h"

namespace uvbus::node_combo_handover_test {
namespace {

using test::bus_node;

class NodeComboHandover : public test::bus_fixture {
 protected:
  // Root P, child A (the caller and sender) and child B (type "b", keeping each request's handle
  // to answer later).
  void make_tree() {
    pc_ = test::fast_config();
    pc_.subnets = {{0x100, 8}};
    p_ = make(0x100, pc_);
    node_config ac = test::fast_config(p_->n->listen_urls().at(0));
    ac.sibling_direct = false;
    ac.resend_timeout_ms = 50;
    a_ = make(0x101, ac);
    node_config bc = ac;
    bc.type = "b";
    b_ = make(0x102, bc, true, [this](node_callbacks* cb) {
      cb->on_data = [this](bus_id src, uint32_t type, const uint8_t* d, size_t n) {
        b_->got.push_back({src, type, std::string(reinterpret_cast<const char*>(d), n)});
        if (const reply_handle* h = b_->n->incoming_request(); h != nullptr) held_.push_back(*h);
      };
    });
    directory_entry seen;
    ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up() && a_->n->lookup(0x102, &seen); }));
  }
  void send_some(int k) {
    for (int i = 0; i < k; ++i, ++next_) {
      ASSERT_EQ(a_->n->send_data(0x102, 1, &next_, sizeof next_), errc::ok);
    }
  }
  void call_some(int k) {
    for (int i = 0; i < k; ++i) {
      const std::string q = "q" + std::to_string(calls_++);
      ASSERT_EQ(a_->n->call(0x102, 2, q.data(), q.size(), 60000,
                            [this](const call_result& r) {
                              outcomes_.push_back(r.status);
                              answers_.emplace_back(reinterpret_cast<const char*>(r.data), r.size);
                            }),
                errc::ok);
    }
  }
  // P detaches its listeners and stops (`meanwhile` runs right after stop()); a new P takes the
  // listeners and the flow positions over, as another process would.
  void hand_over(const std::function<void()>& meanwhile) {
    const std::string hpath = "/tmp/" + test::unique_name("combo-handover.ctl");
    handover_state got;
    errc got_e = errc::ok;
    std::thread receiver([&] { got_e = handover_receive(hpath, 30000, &got, nullptr); });
    handover_state give;
    ASSERT_EQ(p_->n->detach_listeners(&give.listeners), errc::ok);
    p_->n->stop();
    meanwhile();
    ASSERT_TRUE(wait([&] { return !p_->downs.empty(); }));
    give.flow_positions = p_->n->flow_positions();
    EXPECT_EQ(handover_send(hpath, give, 30000, nullptr), errc::ok);
    receiver.join();
    ASSERT_EQ(got_e, errc::ok);
    for (const inherited_listener& l : give.listeners) ::close(l.fd);
    node_config c2 = pc_;
    c2.inherit_listeners = got.listeners;
    c2.inherit_flow_positions = got.flow_positions;
    bus_node* p2 = make(0x100, c2);
    ASSERT_TRUE(wait([&] { return a_->ups >= 2 && b_->ups >= 2 && p2->n->up(); }));
  }

  node_config pc_;
  bus_node* p_ = nullptr;
  bus_node* a_ = nullptr;
  bus_node* b_ = nullptr;
  std::vector<reply_handle> held_;
  std::vector<errc> outcomes_;
  std::vector<std::string> answers_;
  uint64_t next_ = 0;
  size_t calls_ = 0;
};

// A's calls to B wait for answers B gives only after the relay P was replaced; A's plain messages
// and a broadcast to B's type are sent before, between and after. Every call gets B's answer,
// every message is reported ok and delivered once, the broadcast gets one summary.
TEST_F(NodeComboHandover, CallsFlowsAndABroadcastCrossARelayHandOver) {
  make_tree();
  std::vector<broadcast_report> summaries;
  send_some(100);
  call_some(10);
  ASSERT_EQ(a_->n->broadcast(broadcast_target::of_type("b"), 3, "all", 3, 60000,
                             [&](const broadcast_report& r) { summaries.push_back(r); }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return held_.size() == 10; }));
  send_some(100);
  call_some(5);
  hand_over([&] { send_some(100); });  // sent while P flushes and goes
  send_some(100);
  ASSERT_TRUE(wait([&] { return held_.size() == 15; })) << held_.size() << " requests at B";
  for (reply_handle& h : held_) ASSERT_EQ(b_->n->reply(h, "answer", 6), errc::ok);
  ASSERT_TRUE(wait([&] {
    return outcomes_.size() == 15 && a_->reports.size() == next_ && !summaries.empty();
  })) << outcomes_.size()
      << " call outcomes, " << a_->reports.size() << " of " << next_ << " reports, "
      << summaries.size() << " summaries";
  for (const errc e : outcomes_) EXPECT_EQ(e, errc::ok) << to_string(e);
  for (const auto& s : answers_) EXPECT_EQ(s, "answer");
  for (const auto& r : a_->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  size_t plain = 0;
  for (const auto& m : b_->got) {
    if (m.type != 1) continue;
    EXPECT_EQ(m.value(), plain++) << "out of order or twice";
  }
  EXPECT_EQ(plain, next_);
  EXPECT_EQ(summaries.size(), 1u);
  EXPECT_EQ(summaries[0].status, errc::ok) << to_string(summaries[0].status);
}

}  // namespace
}  // namespace uvbus::node_combo_handover_test
