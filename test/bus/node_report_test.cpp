// The next-hop delivery contract, case by case: exactly one report per accepted message, ok only
// for a message delivered (require_response) or handed to the next hop, relays that drop a message
// tell its source, early messages to a sibling wait for it. Each test pins one bug that broke it.
// (End-to-end delivery, the default, has its own cases in node_flow_test.cpp.)
#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "uvbus/node.h"

namespace uvbus::node_report_test {
namespace {

using namespace std::chrono_literals;

constexpr std::chrono::milliseconds kWait{30000};

node_config quick() {
  node_config c;
  c.listen = {"ipv4://127.0.0.1:0"};
  c.enable_shm = false;
  c.heartbeat_interval_ms = 100;
  c.heartbeat_timeout_ms = 5000;
  c.reconnect_min_ms = 10;
  c.reconnect_max_ms = 50;
  c.handshake_timeout_ms = 5000;
  c.pending_timeout_ms = 5000;
  c.response_timeout_ms = 5000;
  c.delivery = delivery_mode::next_hop;
  return c;
}

struct rnode {
  std::unique_ptr<node> n;
  std::vector<std::string> got;
  std::vector<delivery_report> reports;
  [[nodiscard]] size_t reports_for(uint64_t id) const {
    size_t k = 0;
    for (const auto& r : reports) k += r.message_id == id ? 1 : 0;
    return k;
  }
};

class NodeReportTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    nodes_.clear();
    for (int i = 0; i < 2000 && uv_loop_alive(&loop_) != 0; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }
  rnode* make(bus_id id, node_config cfg) {
    auto t = std::make_unique<rnode>();
    rnode* raw = t.get();
    node_callbacks cb;
    cb.on_data = [raw](bus_id, uint32_t, const uint8_t* p, size_t n) {
      raw->got.emplace_back(reinterpret_cast<const char*>(p), n);
    };
    cb.on_report = [raw](const delivery_report& r) { raw->reports.push_back(r); };
    t->n = std::make_unique<node>(&loop_, id, std::move(cfg), std::move(cb));
    EXPECT_EQ(t->n->start(), errc::ok);
    nodes_.push_back(std::move(t));
    return raw;
  }
  bool wait(const std::function<bool()>& pred, std::chrono::milliseconds d = kWait) {
    return test::run_until(&loop_, pred, d);
  }
  void run_for(std::chrono::milliseconds d) {
    test::run_until(
        &loop_, [] { return false; }, d);
  }
  uv_loop_t loop_{};
  std::vector<std::unique_ptr<rnode>> nodes_;
};

// A require_response message that waited for the parent longer than response_timeout_ms was
// reported timeout, then still sent when the parent came, delivered, and reported ok a second
// time. Its report is the timeout; the message is withdrawn from the queue with it.
TEST_F(NodeReportTest, RequireResponseTimingOutInThePendingQueueIsReportedOnceAndNotSent) {
  node_config rc = quick();
  rc.subnets = {{0x100, 8}};
  rnode* root = make(0x100, rc);
  const std::string url = root->n->listen_urls().at(0);
  root->n.reset();  // the parent is away: the child queues

  node_config cc = quick();
  cc.parent_urls = {url};
  cc.response_timeout_ms = 50;
  rnode* child = make(0x101, cc);
  send_options rr;
  rr.require_response = true;
  uint64_t id = 0;
  ASSERT_EQ(child->n->send_data(0x100, 1, "late", 4, rr, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return !child->reports.empty(); }));
  EXPECT_EQ(child->reports[0].status, errc::timeout);

  // The parent comes back on the same address; the child registers and flushes its queue.
  rc.listen = {url};
  rnode* back = make(0x100, rc);
  ASSERT_TRUE(wait([&] { return child->n->up(); }));
  uint64_t probe = 0;
  ASSERT_EQ(child->n->send_data(0x100, 1, "probe", 5, rr, &probe), errc::ok);
  ASSERT_TRUE(wait([&] { return child->reports_for(probe) == 1; }));
  run_for(50ms);
  EXPECT_EQ(child->reports_for(id), 1u);
  EXPECT_EQ(back->got, std::vector<std::string>{"probe"});
}

// A require_response message to the node's own id registered no reply wait, so run_deferred()
// took it for one already reported and withdrew it: never delivered, never reported (the model
// test, seed 2). It is delivered and reported ok once; after stop() it is reported closed once.
TEST_F(NodeReportTest, RequireResponseToSelfIsDeliveredAndReportedOnce) {
  node_config rc = quick();
  rc.subnets = {{0x100, 8}};
  rnode* root = make(0x100, rc);
  send_options rr;
  rr.require_response = true;
  uint64_t id = 0;
  ASSERT_EQ(root->n->send_data(0x100, 1, "me", 2, rr, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return root->reports_for(id) == 1; }));
  EXPECT_EQ(root->reports[0].status, errc::ok);
  EXPECT_EQ(root->got, std::vector<std::string>{"me"});
  // Reports come in order: once the probe's is here, a second report for id would be too.
  uint64_t probe = 0;
  ASSERT_EQ(root->n->send_data(0x100, 1, "probe", 5, send_options{}, &probe), errc::ok);
  ASSERT_TRUE(wait([&] { return root->reports_for(probe) == 1; }));
  EXPECT_EQ(root->reports_for(id), 1u);

  uint64_t late = 0;
  ASSERT_EQ(root->n->send_data(0x100, 1, "late", 4, rr, &late), errc::ok);
  root->n->stop();
  ASSERT_TRUE(wait([&] { return root->reports_for(late) == 1 && !root->n->running(); }));
  EXPECT_EQ(root->reports.back().status, errc::closed);
  EXPECT_EQ(root->got, (std::vector<std::string>{"me", "probe"}));
}

}  // namespace
}  // namespace uvbus::node_report_test
