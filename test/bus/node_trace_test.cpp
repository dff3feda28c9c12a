// Trace context on the bus: send_options::trace reaches the target's on_data (incoming_trace())
// unchanged through a relay, over TCP and shared memory, in both delivery modes, from post() and
// to the node itself; a version-3 hop gets the message without it; a bad one is refused.
#include <optional>
#include <set>

#include "bus/bus_harness.h"
#include "uvbus/trace.h"

namespace uvbus::node_trace_test {
namespace {

using test::bus_fixture;
using test::bus_node;
using test::fast_config;

trace_context sample_trace(uint8_t salt) {
  trace_context t;
  for (size_t i = 0; i < t.trace_id.size(); ++i) t.trace_id[i] = static_cast<uint8_t>(salt + i);
  for (size_t i = 0; i < t.span_id.size(); ++i) t.span_id[i] = static_cast<uint8_t>(0x80 + i);
  t.flags = 1;
  return t;
}

class NodeTraceTest : public bus_fixture, public ::testing::WithParamInterface<delivery_mode> {
 protected:
  // P relays between A and B; B records the trace context of every delivery (or its absence).
  void make_tree(node_config bc = fast_config()) {
    node_config pc = fast_config();
    pc.delivery = GetParam();
    pc.subnets = {{0x100, 8}};
    p_ = make(0x100, pc);
    node_config ac = fast_config(p_->n->listen_urls().at(0));
    ac.delivery = GetParam();
    ac.sibling_direct = false;  // through the relay
    a_ = make(0x101, ac);
    bc.parent_urls = {p_->n->listen_urls().at(0)};
    bc.delivery = GetParam();
    b_ = make(0x102, bc, true, [this](node_callbacks* cb) { record_traces(cb, &b_traces_, &b_); });
    ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up(); }));
  }
  // Wraps on_data to record incoming_trace() of *who's node.
  static void record_traces(node_callbacks* cb, std::vector<std::optional<trace_context>>* out,
                            bus_node** who) {
    auto inner = cb->on_data;
    cb->on_data = [inner, out, who](bus_id s, uint32_t type, const uint8_t* p, size_t n) {
      const trace_context* t = (*who)->n->incoming_trace();
      out->push_back(t != nullptr ? std::optional<trace_context>(*t) : std::nullopt);
      inner(s, type, p, n);
    };
  }

  bus_node* p_ = nullptr;
  bus_node* a_ = nullptr;
  bus_node* b_ = nullptr;
  std::vector<std::optional<trace_context>> b_traces_;
};

TEST_P(NodeTraceTest, ReachesTheTargetUnchangedThroughARelay) {
  make_tree();
  const trace_context t = sample_trace(1);
  send_options with;
  with.trace = &t;
  const uint64_t v1 = 1;
  const uint64_t v2 = 2;
  ASSERT_EQ(a_->n->send_data(0x102, 1, &v1, sizeof v1, with), errc::ok);
  ASSERT_EQ(a_->n->send_data(0x102, 1, &v2, sizeof v2), errc::ok);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 2; }));
  ASSERT_EQ(b_traces_.size(), 2u);
  ASSERT_TRUE(b_traces_[0].has_value());
  EXPECT_EQ(*b_traces_[0], t);
  EXPECT_FALSE(b_traces_[1].has_value());
  EXPECT_EQ(b_->got[0].value(), 1u);  // the payload is untouched by the trace block
  EXPECT_EQ(b_->got[1].value(), 2u);
  EXPECT_EQ(b_->n->incoming_trace(), nullptr);  // outside on_data
  EXPECT_EQ(p_->n->counters().forwarded, 2u);
}

TEST_P(NodeTraceTest, AVersion3TargetGetsTheMessageWithoutIt) {
  node_config bc = fast_config();
  bc.protocol_max = 3;
  make_tree(bc);
  const trace_context t = sample_trace(2);
  send_options with;
  with.trace = &t;
  const uint64_t v = 7;
  ASSERT_EQ(a_->n->send_data(0x102, 1, &v, sizeof v, with), errc::ok);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 1; }));
  EXPECT_FALSE(b_traces_.at(0).has_value());
  EXPECT_EQ(b_->got[0].value(), 7u);
  EXPECT_EQ(b_->n->counters().protocol_errors, 0u);
  EXPECT_EQ(p_->n->counters().protocol_errors, 0u);
  if (GetParam() == delivery_mode::end_to_end) {
    ASSERT_TRUE(wait([&] { return a_->reports.size() == 1; }));
    EXPECT_EQ(a_->reports[0].status, errc::ok);
  }
}

TEST_P(NodeTraceTest, PostAndSelfSendsCarryItAndABadOneIsRefused) {
  make_tree();
  const trace_context t = sample_trace(3);
  send_options with;
  with.trace = &t;
  const uint64_t v = 9;
  ASSERT_EQ(a_->n->post(0x102, 1, &v, sizeof v, with), errc::ok);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 1; }));
  ASSERT_TRUE(b_traces_.at(0).has_value());
  EXPECT_EQ(*b_traces_[0], t);
  ASSERT_EQ(b_->n->send_data(0x102, 1, &v, sizeof v, with), errc::ok);  // to itself
  ASSERT_TRUE(wait([&] { return b_->got.size() == 2; }));
  ASSERT_TRUE(b_traces_.at(1).has_value());
  EXPECT_EQ(*b_traces_[1], t);
  const trace_context zero;
  send_options bad;
  bad.trace = &zero;
  EXPECT_EQ(a_->n->send_data(0x102, 1, &v, sizeof v, bad), errc::invalid_argument);
  EXPECT_EQ(a_->n->post(0x102, 1, &v, sizeof v, bad), errc::invalid_argument);
}

TEST_P(NodeTraceTest, OverSharedMemoryToo) {
  // Every node has a ring: A -> P and P -> B go over shared memory.
  const auto with_ring = [](const char* name) {
    node_config c = fast_config();
    c.enable_shm = true;
    c.shm_ring_bytes = 1 << 20;
    c.delivery = GetParam();
    c.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name(name)};
    return c;
  };
  node_config pc = with_ring("trace-p");
  pc.subnets = {{0x100, 8}};
  p_ = make(0x100, pc);
  node_config ac = with_ring("trace-a");
  ac.parent_urls = {p_->n->listen_urls().at(0)};
  ac.sibling_direct = false;
  a_ = make(0x101, ac);
  node_config bc = with_ring("trace-b");
  bc.parent_urls = ac.parent_urls;
  b_ = make(0x102, bc, true, [this](node_callbacks* cb) { record_traces(cb, &b_traces_, &b_); });
  ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up(); }));
  endpoint_info e;
  ASSERT_TRUE(a_->n->peer(0x100, &e));
  EXPECT_EQ(e.data_channel, channel_kind::shm);
  const trace_context t = sample_trace(4);
  send_options with;
  with.trace = &t;
  for (uint64_t v = 0; v < 50; ++v) {
    ASSERT_EQ(a_->n->send_data(0x102, 1, &v, sizeof v, with), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return b_->got.size() == 50; }));
  for (const auto& got : b_traces_) {
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, t);
  }
  EXPECT_EQ(a_->n->counters().data_sent_shm, 50u);
}

INSTANTIATE_TEST_SUITE_P(Modes, NodeTraceTest,
                         ::testing::Values(delivery_mode::end_to_end, delivery_mode::next_hop),
                         [](const auto& info) {
                           return info.param == delivery_mode::end_to_end ? "EndToEnd" : "NextHop";
                         });

}  // namespace
}  // namespace uvbus::node_trace_test
