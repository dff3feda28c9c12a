// Node lifecycle: destroying a node from inside each of its own callbacks is safe (ASan checks the
// memory) and no callback of that node fires after the destroying one returns; several parents
// (parent_urls) and failover between them.
#include <gtest/gtest.h>
#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bus/bus_harness.h"
#include "uvbus/node.h"

namespace uvbus::node_lifecycle_test {
namespace {

using namespace std::chrono_literals;

using test::bus_node;
using test::fast_config;
using test::send_str;

// A recording node that destroys itself from inside one chosen callback, the first time `when`
// holds there, and counts every callback that still reaches it afterwards.
struct victim {
  bus_node rec;
  bool destroyed = false;
  int late = 0;  // callbacks after the destroying one returned (must stay 0)

  template <class... A>
  std::function<void(A...)> wrap(std::function<void(A...)> f, bool kill_here,
                                 std::function<bool()> when) {
    return [this, f = std::move(f), kill_here, when = std::move(when)](A... a) {
      if (destroyed) {
        ++late;
        return;
      }
      if (f) f(a...);
      if (kill_here && (!when || when())) {
        destroyed = true;
        rec.n.reset();  // the node is gone; touch nothing of it after this
      }
    };
  }
};

enum class kill_in {
  on_data,
  on_report,
  on_endpoint_added,
  on_endpoint_removed,
  on_up,
  on_down,
  on_registration,
  on_error,
  on_log,
  on_writable,
  on_dropped,
  none,
};

class NodeLifecycleTest : public test::bus_fixture {
 protected:
  void TearDown() override {
    for (auto& v : victims_) EXPECT_EQ(v->late, 0) << "a callback fired after the destruction";
    victims_.clear();
    bus_fixture::TearDown();
  }

  // A node that destroys itself in `where` once `when` holds there.
  victim* make_victim(bus_id id, node_config cfg, kill_in where,
                      const std::function<bool()>& when = {}) {
    auto v = std::make_unique<victim>();
    victim* raw = v.get();
    node_callbacks c = raw->rec.callbacks();
    node_callbacks k;
    k.on_data = raw->wrap(c.on_data, where == kill_in::on_data, when);
    k.on_report = raw->wrap(c.on_report, where == kill_in::on_report, when);
    k.on_endpoint_added = raw->wrap(c.on_endpoint_added, where == kill_in::on_endpoint_added, when);
    k.on_endpoint_removed =
        raw->wrap(c.on_endpoint_removed, where == kill_in::on_endpoint_removed, when);
    k.on_up = raw->wrap(c.on_up, where == kill_in::on_up, when);
    k.on_down = raw->wrap(c.on_down, where == kill_in::on_down, when);
    k.on_registration = raw->wrap(c.on_registration, where == kill_in::on_registration, when);
    k.on_error = raw->wrap(c.on_error, where == kill_in::on_error, when);
    k.on_log = raw->wrap(c.on_log, where == kill_in::on_log, when);
    k.on_writable = raw->wrap(c.on_writable, where == kill_in::on_writable, when);
    k.on_dropped = raw->wrap(std::function<void(bus_id, uint64_t, errc)>{},
                             where == kill_in::on_dropped, when);
    raw->rec.n = std::make_unique<node>(&loop_, id, std::move(cfg), std::move(k));
    EXPECT_EQ(raw->rec.n->start(), errc::ok);
    victims_.push_back(std::move(v));
    return raw;
  }

  static node_config child_of(bus_node* parent) {
    node_config c = fast_config();
    c.parent_urls = {parent->n->listen_urls().at(0)};
    return c;
  }

  // Runs the loop a little longer so anything still queued for the dead node would fire.
  void settle() { run_for(200ms); }

  std::vector<std::unique_ptr<victim>> victims_;
};

// The child sends a burst: the parent dies at the first delivery, with the rest of the burst in
// the same read.
TEST_F(NodeLifecycleTest, DestroyInOnData) {
  victim* p = make_victim(
      0x100,
      [] {
        node_config c = fast_config();
        c.subnets = {{0x100, 8}};
        return c;
      }(),
      kill_in::on_data);
  bus_node* c = make_child(0x101, &p->rec);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(send_str(c, 0x100, 1, "burst"), errc::ok);
  ASSERT_TRUE(wait([&] { return p->destroyed; }));
  EXPECT_EQ(p->rec.got.size(), 1u);
  ASSERT_TRUE(wait([&] { return c->downs.size() == 1; }));  // the child notices
  settle();
}

// The same burst under next-hop delivery with require_response: the target acknowledges what its
// on_data got, and nothing after its destruction (a report of ok says the target's on_data ran).
TEST_F(NodeLifecycleTest, DestroyInOnDataAcknowledgesOnlyWhatWasDelivered) {
  node_config pc = fast_config();
  pc.subnets = {{0x100, 8}};
  pc.delivery = delivery_mode::next_hop;
  victim* p = make_victim(0x100, pc, kill_in::on_data);
  node_config cc = child_of(&p->rec);
  cc.delivery = delivery_mode::next_hop;
  bus_node* c = make(0x101, cc);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  send_options o;
  o.require_response = true;
  for (int i = 0; i < 100; ++i) ASSERT_EQ(send_str(c, 0x100, 1, "burst", o), errc::ok);
  ASSERT_TRUE(wait([&] { return c->reports.size() == 100; }));
  EXPECT_EQ(p->rec.got.size(), 1u);
  EXPECT_LE(c->ok_reports(), 1u);
  settle();
}

// A parent address that fails at once (the kernel refuses the connect): the refusal reaches
// on_registration from the loop, never inside start(), so a callback that destroys the node
// cannot pull it away from under start()'s caller.
TEST_F(NodeLifecycleTest, AParentThatFailsAtOnceIsReportedFromTheLoop) {
  node_config c = fast_config();
  c.parent_urls = {"ipv4://255.255.255.255:4000"};
  bool inside = false;
  int calls_inside = 0;
  bus_node t;
  node_callbacks cb = t.callbacks();
  cb.on_registration = [&](errc e, const std::string& d) {
    calls_inside += inside ? 1 : 0;
    t.registrations.push_back(e);
    t.registration_details.push_back(d);
  };
  cb.on_log = [&](log_level, const std::string&) { calls_inside += inside ? 1 : 0; };
  t.n = std::make_unique<node>(&loop_, 0x101, c, std::move(cb));
  inside = true;
  ASSERT_EQ(t.n->start(), errc::ok);
  inside = false;
  EXPECT_EQ(calls_inside, 0);
  ASSERT_TRUE(wait([&] { return !t.registrations.empty(); }));
  EXPECT_NE(t.registrations[0], errc::ok);
  t.n.reset();
}

// Messages to itself are delivered from the node's idle callback (the deferred path).
TEST_F(NodeLifecycleTest, DestroyInOnDataOfAMessageToItself) {
  victim* p = make_victim(0x100, fast_config(), kill_in::on_data);
  ASSERT_TRUE(wait([&] { return p->rec.ups == 1; }));
  for (int i = 0; i < 10; ++i) ASSERT_EQ(send_str(&p->rec, 0x100, 1, "self"), errc::ok);
  ASSERT_TRUE(wait([&] { return p->destroyed; }));
  EXPECT_EQ(p->rec.got.size(), 1u);
  settle();
}

TEST_F(NodeLifecycleTest, DestroyInOnReport) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  victim* c = make_victim(0x101, child_of(p), kill_in::on_report);
  ASSERT_TRUE(wait([&] { return c->rec.ups == 1; }));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(send_str(&c->rec, 0x100, 1, "m"), errc::ok);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  EXPECT_EQ(c->rec.reports.size(), 1u);
  settle();
}

TEST_F(NodeLifecycleTest, DestroyInOnEndpointAdded) {
  victim* p = make_victim(
      0x100,
      [] {
        node_config c = fast_config();
        c.subnets = {{0x100, 8}};
        return c;
      }(),
      kill_in::on_endpoint_added);
  bus_node* c = make_child(0x101, &p->rec);
  ASSERT_TRUE(wait([&] { return p->destroyed; }));
  settle();
  (void)c;
}

TEST_F(NodeLifecycleTest, DestroyInOnEndpointRemoved) {
  victim* p = make_victim(
      0x100,
      [] {
        node_config c = fast_config();
        c.subnets = {{0x100, 8}};
        return c;
      }(),
      kill_in::on_endpoint_removed);
  bus_node* c = make_child(0x101, &p->rec);
  ASSERT_TRUE(wait([&] { return c->n->up() && p->rec.added.size() == 1; }));
  c->n->stop();
  ASSERT_TRUE(wait([&] { return p->destroyed; }));
  settle();
}

TEST_F(NodeLifecycleTest, DestroyInOnUp) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  victim* c = make_victim(0x101, child_of(p), kill_in::on_up);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  ASSERT_TRUE(wait([&] { return p->removed.size() == 1; }));
  settle();
}

TEST_F(NodeLifecycleTest, DestroyInOnUpOfARoot) {
  victim* r = make_victim(0x100, fast_config(), kill_in::on_up);
  ASSERT_TRUE(wait([&] { return r->destroyed; }));
  settle();
}

// The usual pattern: stop(), then destroy the node when on_down(closed) says it has finished.
// With messages in flight and waiting, whose closed reports would follow.
TEST_F(NodeLifecycleTest, DestroyInOnDownClosedAfterStop) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  victim* c = make_victim(0x101, child_of(p), kill_in::on_down);
  ASSERT_TRUE(wait([&] { return c->rec.ups == 1; }));
  for (int i = 0; i < 50; ++i) ASSERT_EQ(send_str(&c->rec, 0x100, 1, "m"), errc::ok);
  std::vector<errc> command;
  ASSERT_EQ(c->rec.n->send_command(0x100, proto::command_id::echo, "x", 1,
                                   [&](errc st, const uint8_t*, size_t) { command.push_back(st); }),
            errc::ok);
  c->rec.n->stop();
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  EXPECT_EQ(c->rec.downs, std::vector<errc>{errc::closed});
  settle();
  // stop() failed the command (closed) before on_down; nothing after.
  EXPECT_EQ(command, std::vector<errc>{errc::closed});
}

// on_down(reason) for a lost parent.
TEST_F(NodeLifecycleTest, DestroyInOnDownParentLost) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  victim* c = make_victim(0x101, child_of(p), kill_in::on_down);
  ASSERT_TRUE(wait([&] { return c->rec.ups == 1; }));
  destroy(p);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  settle();
}

TEST_F(NodeLifecycleTest, DestroyInOnRegistrationRefused) {
  node_config pc = fast_config();
  pc.subnets = {{0x100, 8}};
  pc.access_tokens = {"secret"};
  bus_node* p = make(0x100, pc);
  node_config cc = child_of(p);
  cc.access_tokens = {"wrong"};
  victim* c = make_victim(0x101, cc, kill_in::on_registration);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  EXPECT_EQ(c->rec.registrations, std::vector<errc>{errc::access_denied});
  settle();
}

// The parent refuses a child (on_error at the parent) and dies there.
TEST_F(NodeLifecycleTest, DestroyInOnError) {
  node_config pc = fast_config();
  pc.subnets = {{0x100, 8}};
  pc.access_tokens = {"secret"};
  victim* p = make_victim(0x100, pc, kill_in::on_error);
  node_config cc = child_of(&p->rec);
  cc.access_tokens = {"wrong"};
  bus_node* c = make(0x101, cc);
  ASSERT_TRUE(wait([&] { return p->destroyed; }));
  ASSERT_TRUE(wait([&] { return !c->registrations.empty(); }));
  settle();
}

// on_log fires from the middle of many code paths: die at the first line of a child that keeps
// reconnecting to a parent that is not there.
TEST_F(NodeLifecycleTest, DestroyInOnLog) {
  node_config cc = fast_config();
  cc.parent_urls = {"ipv4://127.0.0.1:1"};  // nothing listens there
  victim* c = make_victim(0x101, cc, kill_in::on_log);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  settle();
}

// Every log line, in a busy exchange: the parent dies at its n-th log line, wherever that is.
TEST_F(NodeLifecycleTest, DestroyInOnLogDuringTraffic) {
  node_config pc = fast_config();
  pc.subnets = {{0x100, 8}};
  int lines = 0;
  victim* p = make_victim(0x100, pc, kill_in::on_log, [&] { return ++lines == 3; });
  bus_node* c = make_child(0x101, &p->rec);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  for (int i = 0; i < 20; ++i) (void)send_str(c, 0x100, 1, "m");
  c->n->stop();
  ASSERT_TRUE(wait([&] { return p->destroyed; }));
  settle();
}

// A stream link's queue fills, drains, and on_writable destroys the node.
TEST_F(NodeLifecycleTest, DestroyInOnWritable) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  node_config cc = child_of(p);
  cc.link_queue_packets = 4;
  victim* c = make_victim(0x101, cc, kill_in::on_writable);
  ASSERT_TRUE(wait([&] { return c->rec.ups == 1; }));
  const std::string m(1000, 'x');
  errc e = errc::ok;
  for (int i = 0; i < 100000 && e == errc::ok; ++i) e = send_str(&c->rec, 0x100, 1, m);
  ASSERT_EQ(e, errc::queue_full);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  settle();
}

// A relay drops messages for an id it does not know and tells the source (on_dropped), which
// dies at the first notice with more on the way.
TEST_F(NodeLifecycleTest, DestroyInOnDropped) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  node_config cc = child_of(p);
  cc.sibling_direct = false;              // everything through the parent, which drops it
  cc.delivery = delivery_mode::next_hop;  // on_dropped is next-hop delivery's
  victim* c = make_victim(0x101, cc, kill_in::on_dropped);
  ASSERT_TRUE(wait([&] { return c->rec.ups == 1; }));
  for (int i = 0; i < 20; ++i) ASSERT_EQ(send_str(&c->rec, 0x150, 1, "lost"), errc::ok);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  settle();
}

// A send_command() callback may destroy the node too.
TEST_F(NodeLifecycleTest, DestroyInCommandCallback) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  victim* c = make_victim(0x101, child_of(p), kill_in::none);
  ASSERT_TRUE(wait([&] { return c->rec.ups == 1; }));
  for (int i = 0; i < 5; ++i) ASSERT_EQ(send_str(&c->rec, 0x100, 1, "m"), errc::ok);
  int calls = 0;
  ASSERT_EQ(c->rec.n->send_command(0x100, proto::command_id::echo, "x", 1,
                                   [&](errc st, const uint8_t*, size_t) {
                                     ++calls;
                                     EXPECT_EQ(st, errc::ok);
                                     c->destroyed = true;
                                     c->rec.n.reset();
                                   }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return c->destroyed; }));
  settle();
  EXPECT_EQ(calls, 1);
}

// set_callbacks() from inside a callback takes effect when it returns: the running callback is
// not destroyed under itself.
TEST_F(NodeLifecycleTest, SetCallbacksFromInsideACallback) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  int second = 0;
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  node* cn = c->n.get();
  node_callbacks first = c->callbacks();
  const std::string big(64, 'y');
  first.on_data = [cn, &second, big](bus_id, uint32_t, const uint8_t*, size_t) {
    node_callbacks next;
    next.on_report = [](const delivery_report&) {};
    next.on_data = [&second](bus_id, uint32_t, const uint8_t*, size_t) { ++second; };
    EXPECT_EQ(cn->set_callbacks(std::move(next)), errc::ok);
    EXPECT_EQ(big.size(), 64u);  // our own capture is still alive
  };
  ASSERT_EQ(c->n->set_callbacks(std::move(first)), errc::ok);
  ASSERT_EQ(send_str(p, 0x101, 1, "a"), errc::ok);
  ASSERT_EQ(send_str(p, 0x101, 1, "b"), errc::ok);
  ASSERT_TRUE(wait([&] { return second == 1; }));
  // Whether reports are tracked is fixed at start().
  node_callbacks none;
  EXPECT_EQ(c->n->set_callbacks(none), errc::wrong_state);
  EXPECT_EQ(c->n->last_error().code, errc::wrong_state);
}

// Several parents: the first is dead, the node registers with the second.
TEST_F(NodeLifecycleTest, FirstParentDeadRegistersWithTheSecond) {
  bus_node* p2 = make(0x2, [] {
    node_config c = fast_config();
    c.subnets = {{0x100, 8}};
    return c;
  }());
  node_config cc = fast_config();
  cc.parent_urls = {"ipv4://127.0.0.1:1", p2->n->listen_urls().at(0)};  // nothing on port 1
  bus_node* c = make(0x101, cc);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  ASSERT_GE(c->registrations.size(), 2u);
  EXPECT_NE(c->registrations.front(), errc::ok);
  EXPECT_EQ(c->registrations.back(), errc::ok);
  ASSERT_EQ(c->added.size(), 1u);
  EXPECT_EQ(c->added[0].id, 0x2u);
  ASSERT_EQ(send_str(c, 0x2, 1, "hello"), errc::ok);
  ASSERT_TRUE(wait([&] { return p2->got.size() == 1; }));
}

// The registered parent dies: the node fails over to the next one, and messages sent meanwhile
// wait and go to the new parent.
TEST_F(NodeLifecycleTest, FailsOverWhenTheCurrentParentDies) {
  auto gateway = [this](bus_id id) {
    node_config c = fast_config();
    c.subnets = {{0x100, 8}};
    return make(id, c);
  };
  bus_node* p1 = gateway(0x1);
  bus_node* p2 = gateway(0x2);
  node_config cc = fast_config();
  cc.parent_urls = {p1->n->listen_urls().at(0), p2->n->listen_urls().at(0)};
  bus_node* c = make(0x101, cc);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  EXPECT_EQ(c->added.at(0).id, 0x1u);
  destroy(p1);
  ASSERT_TRUE(wait([&] { return c->downs.size() == 1; }));
  uint64_t id = 0;
  ASSERT_EQ(send_str(c, 0x2, 1, "after", {}, &id), errc::ok);  // waits for the new parent
  ASSERT_TRUE(wait([&] { return c->n->up() && p2->got.size() == 1; }));
  EXPECT_EQ(c->added.back().id, 0x2u);
  EXPECT_EQ(c->added.back().role, peer_role::parent);
  EXPECT_EQ(p2->got[0].bytes, "after");
  ASSERT_TRUE(wait([&] { return c->report_for(id) != nullptr; }));
  EXPECT_EQ(c->report_for(id)->status, errc::ok);
  // The second dies too: the list wraps around to the first, which is dead; the node is down
  // and keeps trying.
  destroy(p2);
  ASSERT_TRUE(wait([&] { return c->downs.size() == 2; }));
  EXPECT_FALSE(c->n->up());
}

// A stopped node keeps nothing alive on its loop: uv_run(UV_RUN_DEFAULT) returns once stop() has
// finished, with the node object still there (before: the post() mailbox's async handle kept the
// loop alive forever, and a program waiting for uv_run() to return after stop() hung).
TEST_F(NodeLifecycleTest, AStoppedNodeLetsTheLoopEnd) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  ASSERT_EQ(c->n->post(0x100, 1, "x", 1), errc::ok);
  p->n->stop();
  c->n->stop();
  ASSERT_TRUE(wait([&] { return !p->downs.empty() && !c->downs.empty() && !c->reports.empty(); }));
  for (int i = 0; i < 100 && uv_loop_alive(&loop_) != 0; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(uv_loop_alive(&loop_), 0) << "a stopped node keeps the loop alive";
  EXPECT_EQ(c->reports.size(), 1u);
}

}  // namespace
}  // namespace uvbus::node_lifecycle_test
