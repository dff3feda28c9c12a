// Features together around a planned hand-over of a relay: calls waiting for their answers,
// end-to-end messages not yet acknowledged and a broadcast in flight while the relay's listening
// sockets and flow positions move to its next process.
#include <gtest/gtest.h>
#include <uv.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "bus/bus_harness.h"
#include "uvbus/handover.h"
#include "uvbus/node.h"

namespace uvbus {
namespace {

using test::bus_node;

class NodeComboHandover : public test::bus_fixture {};

// A's calls to B wait for answers B gives only after the relay P was replaced; A's plain messages
// and a broadcast to B's type are sent before, between and after. Every call gets B's answer,
// every message is reported ok and delivered once, the broadcast gets one summary.
TEST_F(NodeComboHandover, CallsFlowsAndABroadcastCrossARelayHandOver) {
  node_config pc = test::fast_config();
  pc.subnets = {{0x100, 8}};
  bus_node* p = make(0x100, pc);
  node_config ac = test::fast_config(p->n->listen_urls().at(0));
  ac.sibling_direct = false;
  ac.resend_timeout_ms = 50;
  bus_node* a = make(0x101, ac);
  node_config bc = ac;
  bc.type = "b";
  std::vector<reply_handle> held;
  bus_node* b = nullptr;
  b = make(0x102, bc, true, [&](node_callbacks* cb) {
    cb->on_data = [&](bus_id src, uint32_t type, const uint8_t* d, size_t n) {
      b->got.push_back({src, type, std::string(reinterpret_cast<const char*>(d), n)});
      if (const reply_handle* h = b->n->incoming_request(); h != nullptr) held.push_back(*h);
    };
  });
  directory_entry seen;
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up() && a->n->lookup(0x102, &seen); }));
  std::vector<errc> outcomes;
  std::vector<std::string> answers;
  uint64_t next = 0;
  const auto send_some = [&](int k) {
    for (int i = 0; i < k; ++i, ++next) ASSERT_EQ(a->n->send_data(0x102, 1, &next, sizeof next), errc::ok);
  };
  const auto call_some = [&](int k) {
    for (int i = 0; i < k; ++i) {
      const std::string q = "q" + std::to_string(outcomes.size() + i);
      ASSERT_EQ(a->n->call(0x102, 2, q.data(), q.size(), 60000,
                           [&](const call_result& r) {
                             outcomes.push_back(r.status);
                             answers.emplace_back(reinterpret_cast<const char*>(r.data), r.size);
                           }),
                errc::ok);
    }
  };
  std::vector<broadcast_report> summaries;
  send_some(100);
  call_some(10);
  ASSERT_EQ(a->n->broadcast(broadcast_target::of_type("b"), 3, "all", 3, 60000,
                            [&](const broadcast_report& r) { summaries.push_back(r); }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return held.size() == 10; }));
  send_some(100);
  call_some(5);

  const std::string hpath = "/tmp/" + test::unique_name("combo-handover.ctl");
  handover_state got;
  errc got_e = errc::ok;
  std::thread receiver([&] { got_e = handover_receive(hpath, 30000, &got, nullptr); });
  handover_state give;
  ASSERT_EQ(p->n->detach_listeners(&give.listeners), errc::ok);
  p->n->stop();
  send_some(100);  // while P flushes and goes
  ASSERT_TRUE(wait([&] { return !p->downs.empty(); }));
  give.flow_positions = p->n->flow_positions();
  EXPECT_EQ(handover_send(hpath, give, 30000, nullptr), errc::ok);
  receiver.join();
  ASSERT_EQ(got_e, errc::ok);
  for (const inherited_listener& l : give.listeners) ::close(l.fd);
  node_config c2 = pc;
  c2.inherit_listeners = got.listeners;
  c2.inherit_flow_positions = got.flow_positions;
  bus_node* p2 = make(0x100, c2);
  ASSERT_TRUE(wait([&] { return a->ups >= 2 && b->ups >= 2 && p2->n->up(); }));
  send_some(100);
  ASSERT_TRUE(wait([&] { return held.size() == 15; })) << held.size() << " requests at B";
  for (reply_handle& h : held) {
    const std::string r = "answer";
    ASSERT_EQ(b->n->reply(h, r.data(), r.size()), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return outcomes.size() == 15 && a->reports.size() == next && !summaries.empty(); }))
      << outcomes.size() << " call outcomes, " << a->reports.size() << " of " << next
      << " reports, " << summaries.size() << " summaries";
  for (const errc e : outcomes) EXPECT_EQ(e, errc::ok) << to_string(e);
  for (const auto& s : answers) EXPECT_EQ(s, "answer");
  for (const auto& r : a->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  size_t plain = 0;
  uint64_t expect = 0;
  for (const auto& m : b->got) {
    if (m.type != 1) continue;
    ++plain;
    EXPECT_EQ(m.value(), expect++) << "order or duplicate";
  }
  EXPECT_EQ(plain, next);
  EXPECT_EQ(summaries.size(), 1u);
  EXPECT_EQ(summaries[0].status, errc::ok) << to_string(summaries[0].status);
}

}  // namespace
}  // namespace uvbus
