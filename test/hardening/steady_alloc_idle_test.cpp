// Nothing is allocated per heartbeat: a parent and its children, idle but for their pings and
// pongs, run many heartbeat intervals while the allocations are counted (the counter:
// steady_alloc.h; operator new is replaced in steady_alloc_test.cpp, the same binary).
#include <gtest/gtest.h>
#include <uv.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "hardening/steady_alloc.h"
#include "uvbus/node.h"

namespace uvbus::steady_alloc_idle_test {

using namespace test::steady_alloc;

constexpr size_t kChildren = 8;
constexpr uint64_t kHeartbeats = 20;  // round trips counted on every link, each way

node_config idle_config(bus_id id) {
  node_config c;
  c.listen = {"ipv4://127.0.0.1:0"};
  c.sibling_direct = false;
  c.heartbeat_interval_ms = 5;  // a ping on every tick (the tick's shortest period)
  c.heartbeat_timeout_ms = 60000;
  if (id == 0x100) c.subnets = {{0x100, 8}};
  return c;
}

// A parent 0x100 and kChildren children on one loop. rtt_ns of a link changes with every pong
// that comes back, so its changes count the round trips.
struct idle_tree {
  explicit idle_tree(uv_loop_t* l) : loop(l) {}
  uv_loop_t* loop;
  std::unique_ptr<node> parent;
  std::vector<std::unique_ptr<node>> children;
  std::vector<uint64_t> last_rtt;  // per link and side: the children's view, then the parent's
  std::vector<uint64_t> trips;
  int ups = 0;

  void start() {
    parent = std::make_unique<node>(loop, 0x100, idle_config(0x100), node_callbacks{});
    ASSERT_EQ(parent->start(), errc::ok);
    for (size_t i = 0; i < kChildren; ++i) {
      node_config c = idle_config(0x101 + i);
      c.parent_urls = {parent->listen_urls().at(0)};
      node_callbacks cb;
      cb.on_up = [this](bus_id) { ++ups; };
      children.push_back(std::make_unique<node>(loop, 0x101 + i, std::move(c), std::move(cb)));
      ASSERT_EQ(children.back()->start(), errc::ok);
    }
    last_rtt.assign(2 * kChildren, 0);
    trips.assign(2 * kChildren, 0);
    ASSERT_TRUE(test::run_until(
        loop, [&] { return ups == static_cast<int>(kChildren) && all_made(1); }, kDeadline));
  }
  // Whether every link has made `n` more round trips each way than at the last reset (peer()
  // copies the peer's node_info: not counted).
  bool all_made(uint64_t n) {
    const bool was = counting;
    counting = false;
    bool all = true;
    for (size_t i = 0; i < kChildren; ++i) {
      endpoint_info e;
      note(i, children[i]->peer(0x100, &e) ? e.rtt_ns : 0);
      note(kChildren + i, parent->peer(0x101 + i, &e) ? e.rtt_ns : 0);
    }
    for (const uint64_t t : trips) all = all && t >= n;
    counting = was;
    return all;
  }
  void note(size_t k, uint64_t rtt) {
    if (rtt != 0 && rtt != last_rtt[k]) ++trips[k];
    last_rtt[k] = rtt;
  }
  void reset_trips() { trips.assign(trips.size(), 0); }
};

TEST(SteadyAlloc, HeartbeatsAllocateNothing) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    idle_tree t(&loop);
    ASSERT_NO_FATAL_FAILURE(t.start());
    // Warm: every link's buffers and the tick's at their size.
    t.reset_trips();
    ASSERT_TRUE(test::run_until(
        &loop, [&] { return t.all_made(3); }, kDeadline));
    t.reset_trips();
    allocations = 0;
    counting = true;
    const bool ok = test::run_until(
        &loop, [&] { return t.all_made(kHeartbeats); }, kDeadline);
    counting = false;
    const uint64_t counted = allocations.load();
    ASSERT_TRUE(ok) << "the heartbeats did not come round";
    // A ping and its pong each way on every link, at least kHeartbeats times: one allocation for
    // each would count 4 * 8 * 20 = 640 (twice that under a sanitizer).
    EXPECT_LE(counted, kChildren) << counted << " allocations for " << kHeartbeats
                                  << " heartbeats each way on " << kChildren << " links";
    EXPECT_EQ(t.parent->counters().heartbeat_timeouts, 0U);
    t.children.clear();
    t.parent.reset();
  }
  EXPECT_EQ(close_loop(&loop), 0);
}

}  // namespace uvbus::steady_alloc_idle_test
