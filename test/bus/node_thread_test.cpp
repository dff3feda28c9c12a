// Node threads: a call from a thread other than the node's fails loudly (release builds:
// errc::wrong_thread and nothing done; debug builds: abort naming the function); node::post()
// from other threads keeps the report contract (one report per accepted post).
#include <gtest/gtest.h>
#include <uv.h>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "bus/bus_harness.h"
#include "core/try_alloc.h"
#include "uvbus/node.h"

namespace uvbus::node_thread_test {
namespace {

using namespace std::chrono_literals;

using test::bus_node;
using test::fast_config;
using test::send_str;

class NodeThreadTest : public test::bus_fixture {};

// Runs f on a thread of its own and waits for it.
template <class F>
void on_other_thread(F&& f) {
  std::thread t(std::forward<F>(f));
  t.join();
}

#ifdef NDEBUG

TEST_F(NodeThreadTest, ForeignThreadCallsReturnWrongThreadAndDoNothing) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  node* n = c->n.get();
  std::vector<errc> got;
  bool running = true;
  bool up = true;
  size_t peers = 1;
  size_t urls = 1;
  std::string routes = "x";
  error_info last;
  on_other_thread([&] {
    got.push_back(n->start());
    got.push_back(n->send_data(0x100, 1, "x", 1));
    const const_buffer b{"x", 1};
    got.push_back(n->send_datav(0x100, 1, &b, 1));
    got.push_back(n->send_command(0x100, proto::command_id::echo, "x", 1,
                                  [](errc, const uint8_t*, size_t) {}));
    got.push_back(n->set_callbacks({}));
    n->stop();
    running = n->running();
    up = n->up();
    peers = n->peers().size();
    urls = n->listen_urls().size();
    routes = n->routes_text();
    last = n->last_error();
  });
  for (errc e : got) EXPECT_EQ(e, errc::wrong_thread);
  EXPECT_EQ(got.size(), 5u);
  EXPECT_FALSE(running);
  EXPECT_FALSE(up);
  EXPECT_EQ(peers, 0u);
  EXPECT_EQ(urls, 0u);
  EXPECT_EQ(routes, "");
  EXPECT_EQ(last.code, errc::wrong_thread);
  // Nothing happened: the node still runs, nothing was sent, stop() was refused.
  run_for(100ms);
  EXPECT_TRUE(c->n->running());
  EXPECT_TRUE(c->n->up());
  EXPECT_EQ(c->n->counters().data_sent, 0u);
  EXPECT_TRUE(p->got.empty());
  EXPECT_TRUE(c->reports.empty());
  EXPECT_TRUE(c->downs.empty());
  // The owner thread still works.
  ASSERT_EQ(send_str(c, 0x100, 1, "x"), errc::ok);
  ASSERT_TRUE(wait([&] { return p->got.size() == 1; }));
}

// incoming_trace() and incoming_request() check the thread like the rest: from another thread,
// even while the node's on_data runs (where they have something to give), they give nullptr.
TEST_F(NodeThreadTest, ForeignThreadSeesNoIncomingTraceOrRequest) {
  std::vector<const void*> seen;  // from the other thread, twice per on_data
  bus_node* p = nullptr;
  p = make(0x100, fast_config(), true, [&](node_callbacks* cb) {
    cb->on_data = [&](bus_id, uint32_t, const uint8_t*, size_t) {
      ASSERT_TRUE(p->n->incoming_trace() != nullptr || p->n->incoming_request() != nullptr);
      node* n = p->n.get();
      on_other_thread([&] {
        seen.push_back(n->incoming_trace());
        seen.push_back(n->incoming_request());
      });
    };
  });
  trace_context t;
  t.trace_id[0] = t.span_id[0] = 1;
  send_options o;
  o.trace = &t;
  ASSERT_EQ(p->n->send_data(0x100, 1, "x", 1, o), errc::ok);
  ASSERT_EQ(p->n->call(0x100, 2, "y", 1, 20000, [](const call_result&) {}), errc::ok);
  ASSERT_TRUE(wait([&] { return seen.size() == 4; }));
  for (const void* v : seen) EXPECT_EQ(v, nullptr);
}

#else

TEST_F(NodeThreadTest, ForeignThreadCallAbortsNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  bus_node* p = make_root(0x100, {{0x100, 8}});
  node* n = p->n.get();
  EXPECT_DEATH(on_other_thread([&] { (void)n->send_data(0x100, 1, "x", 1); }),
               "node::send_data called from a thread other than its loop's thread");
  EXPECT_DEATH(on_other_thread([&] { n->stop(); }), "node::stop called from a thread");
  EXPECT_DEATH(on_other_thread([&] { (void)n->peers(); }), "node::peers called from a thread");
  // Each names itself, not the member it is built on (directory(), pick()).
  EXPECT_DEATH(on_other_thread([&] { (void)n->lookup_name("x", nullptr); }),
               "node::lookup_name called from a thread");
  EXPECT_DEATH(on_other_thread([&] { (void)n->find(""); }), "node::find called from a thread");
  EXPECT_DEATH(on_other_thread([&] { (void)n->send_any("", {}, 1, "x", 1); }),
               "node::send_any called from a thread");
  EXPECT_DEATH(on_other_thread([&] { (void)n->incoming_trace(); }),
               "node::incoming_trace called from a thread");
  EXPECT_DEATH(on_other_thread([&] { (void)n->incoming_request(); }),
               "node::incoming_request called from a thread");
}

#endif

// ------------------------------------------------------------------------------------ post --

// Four producer threads post while the loop runs: every accepted post gets exactly one report,
// every ok report is one delivery, nothing is delivered twice, ids are unique.
TEST_F(NodeThreadTest, FourProducersPostWithExactAccounting) {
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 3000;
  bus_node* p = make_root(0x100, {{0x100, 8}});
  p->keep_bytes = true;
  node_config cc = fast_config();
  cc.parent_urls = {p->n->listen_urls().at(0)};
  cc.post_queue_messages = 256;  // small: producers meet queue_full and retry
  cc.link_queue_packets = 16;    // and the loop meets a full link: posts wait for it to drain
  bus_node* c = make(0x101, cc);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  node* n = c->n.get();
  std::atomic<int> tasks_run{0};
  std::atomic<int> done{0};
  std::vector<std::vector<uint64_t>> ids(kThreads);
  std::vector<std::thread> producers;
  producers.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (uint64_t i = 0; i < kPerThread;) {
        const uint64_t v = (static_cast<uint64_t>(t) << 32) | i;
        uint64_t id = 0;
        const errc e = n->post(0x100, 1, &v, sizeof v, {}, &id);
        if (e == errc::queue_full) {
          std::this_thread::yield();
          continue;
        }
        ASSERT_EQ(e, errc::ok);
        ids[t].push_back(id);
        if (i % 1000 == 0) {
          while (n->post([&] { ++tasks_run; }) == errc::queue_full) std::this_thread::yield();
        }
        ++i;
      }
      ++done;
    });
  }
  const uint64_t total = kThreads * kPerThread;
  const bool all = wait([&] { return done == kThreads && c->reports.size() >= total; });
  for (auto& th : producers) th.join();
  ASSERT_TRUE(all) << c->reports.size() << " reports of " << total;
  ASSERT_TRUE(wait([&] { return p->got.size() >= total; }));
  run_for(100ms);
  // Exactly one report per id, all ok; the ids are unique and were known at post() time.
  std::set<uint64_t> posted;
  for (const auto& v : ids) posted.insert(v.begin(), v.end());
  EXPECT_EQ(posted.size(), total);
  std::map<uint64_t, int> reported;
  for (const auto& r : c->reports) {
    ++reported[r.message_id];
    EXPECT_EQ(r.status, errc::ok);
  }
  EXPECT_EQ(reported.size(), total);
  for (const auto& [id, k] : reported) {
    EXPECT_EQ(k, 1) << "message " << id;
    EXPECT_EQ(posted.count(id), 1u);
  }
  // Every message delivered once, in post order per producer.
  EXPECT_EQ(p->got.size(), total);
  std::vector<uint64_t> next(kThreads, 0);
  for (const auto& g : p->got) {
    const uint64_t v = g.value();
    const auto t = static_cast<size_t>(v >> 32);
    ASSERT_LT(t, next.size());
    EXPECT_EQ(v & 0xffffffffu, next[t]) << "producer " << t;
    next[t] = (v & 0xffffffffu) + 1;
  }
  EXPECT_EQ(tasks_run.load(), kThreads * 3);
}

// Posts that arrive while the loop waits for room (here: a full pending queue while the parent
// is not up yet) are run once there is room, without waiting for a further post to wake the loop.
TEST_F(NodeThreadTest, PostsQueuedWhileBlockedAreRunOnceThereIsRoom) {
  const std::string path = "/tmp/" + test::unique_name("post") + ".sock";
  node_config cc = fast_config();
  cc.parent_urls = {"unix://" + path};  // nobody there yet
  cc.pending_max_messages = 10;
  bus_node* c = make(0x101, cc);
  auto post_batch = [&] {
    std::thread([&] {
      for (int i = 0; i < 20; ++i) ASSERT_EQ(c->n->post(0x100, 1, "m", 1), errc::ok);
    }).join();
  };
  post_batch();  // 10 wait in the pending queue, the 11th finds it full: the mailbox stops
  ASSERT_TRUE(wait([&] { return c->n->counters().pending_now == 10; }));
  post_batch();  // lands in the mailbox while it is stopped
  run_for(50ms);
  node_config pc = fast_config();
  pc.listen = {"unix://" + path};
  pc.subnets = {{0x100, 8}};
  bus_node* p = make(0x100, pc);
  ASSERT_TRUE(wait([&] { return p->got.size() == 40; }, 10s)) << p->got.size();
  ASSERT_TRUE(wait([&] { return c->reports.size() == 40; }));
  for (const auto& r : c->reports) EXPECT_EQ(r.status, errc::ok);
  ::unlink(path.c_str());
}

// A post that meets a full flow waits in the mailbox, which retries it by itself: the loop's
// application never got queue_full, so no on_writable is owed to it (one came for each time the
// flow filled, although no send of the application had been refused).
TEST_F(NodeThreadTest, APostThatMeetsAFullFlowOwesNoOnWritable) {
  node_config pc = fast_config();
  pc.subnets = {{0x100, 8}};
  bus_node* p = make(0x100, pc);
  node_config cc = fast_config(p->n->listen_urls().at(0));
  cc.retransmit_max_messages = 4;  // the fifth post in one loop turn finds the flow full
  bus_node* c = make(0x101, cc);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  std::thread([&] {
    for (int i = 0; i < 40; ++i) ASSERT_EQ(c->n->post(0x100, 1, "m", 1), errc::ok);
  }).join();
  ASSERT_TRUE(wait([&] { return p->got.size() == 40; }, 10s)) << p->got.size();
  ASSERT_TRUE(wait([&] { return c->reports.size() == 40; }));
  for (const auto& r : c->reports) EXPECT_EQ(r.status, errc::ok);
  EXPECT_EQ(c->writable, 0u);
}

// Messages the loop cannot send are still reported once, with the reason.
TEST_F(NodeThreadTest, PostedMessageRefusedOnTheLoopIsItsReport) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  uint64_t id = 0;
  std::thread([&] { EXPECT_EQ(p->n->post(0x150, 1, "x", 1, {}, &id), errc::ok); }).join();
  ASSERT_TRUE(wait([&] { return p->reports.size() == 1; }));
  EXPECT_EQ(p->reports[0].message_id, id);
  EXPECT_EQ(p->reports[0].status, errc::unknown_route);
  run_for(50ms);
  EXPECT_EQ(p->reports.size(), 1u);
}

// The report of a post the loop refused says how it was sent, as send_data's reports do
// (delivery_report::end_to_end): set under end-to-end delivery and for require_response under
// next-hop delivery. It was always false, while a send_data() refused the same way later (a flow
// timeout, a relay's refusal) reported true.
TEST_F(NodeThreadTest, APostRefusedOnTheLoopReportsHowItWasSent) {
  struct mode_case {
    delivery_mode mode;
    bool require_response;
    bool end_to_end;
  };
  const mode_case cases[] = {{delivery_mode::end_to_end, false, true},
                             {delivery_mode::next_hop, false, false},
                             {delivery_mode::next_hop, true, true}};
  bus_id id = 0x100;
  for (const mode_case& m : cases) {
    node_config c = test::fast_config();
    c.delivery = m.mode;
    bus_node* p = make_root(id, {{id, 8}}, c);
    send_options o;
    o.require_response = m.require_response;
    std::thread([&] { EXPECT_EQ(p->n->post(id + 0x50, 1, "x", 1, o), errc::ok); }).join();
    ASSERT_TRUE(wait([&] { return p->reports.size() == 1; }));
    EXPECT_EQ(p->reports[0].status, errc::unknown_route);
    EXPECT_EQ(p->reports[0].end_to_end, m.end_to_end) << id;
    id += 0x100;
  }
}

TEST_F(NodeThreadTest, PostRefusesAtOnceWhatIsWrongAtOnce) {
  node_config cfg = fast_config();
  cfg.post_queue_messages = 3;
  bus_node* p = make(0x100, cfg, false);
  EXPECT_EQ(p->n->post(0x100, 1, "x", 1), errc::wrong_state);  // not started
  ASSERT_EQ(p->n->start(), errc::ok);
  const std::string big(p->n->config().message_limit + 1, 'x');
  EXPECT_EQ(p->n->post(0x100, 1, big.data(), big.size()), errc::message_too_large);
  EXPECT_EQ(p->n->post(0x100, 1, nullptr, 1), errc::invalid_argument);
  EXPECT_EQ(p->n->post(std::function<void()>{}), errc::invalid_argument);
  // The mailbox is bounded: the loop is not running, the fourth post finds it full.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p->n->post(0x100, 1, "x", 1), errc::ok);
  EXPECT_EQ(p->n->post(0x100, 1, "x", 1), errc::queue_full);
  ASSERT_TRUE(wait([&] { return p->got.size() == 3 && p->reports.size() == 3; }));
  p->n->stop();
  EXPECT_EQ(p->n->post(0x100, 1, "x", 1), errc::closed);
}

// The smallest post_queue_bytes validate() accepts holds one message of message_limit (each
// message takes its payload rounded up to 8 plus a 64-byte record), and a task's record counts
// against the bytes too.
TEST_F(NodeThreadTest, TheSmallestPostQueueHoldsOneLargestMessage) {
  node_config cfg = fast_config();
  cfg.message_limit = 1000;
  cfg.post_queue_bytes = 1000 + 64;
  std::string why;
  EXPECT_EQ(node::validate(0x100, cfg, &why), errc::ok) << why;
  cfg.post_queue_bytes = 1000 + 63;
  EXPECT_EQ(node::validate(0x100, cfg, &why), errc::invalid_argument);
  EXPECT_NE(why.find("post_queue_bytes (1063) must hold one message"), std::string::npos) << why;
  cfg.post_queue_bytes = 1000 + 64;
  bus_node* p = make_root(0x100, {{0x100, 8}}, cfg);
  const std::string big(1000, 'x');
  // The loop is not running between these calls: the mailbox fills.
  EXPECT_EQ(p->n->post(0x100, 1, big.data(), big.size()), errc::ok);
  EXPECT_EQ(p->n->post([] {}), errc::queue_full);  // 64 more bytes do not fit
  ASSERT_TRUE(wait([&] { return p->got.size() == 1; }));
  int ran = 0;
  for (int i = 0; i < 16; ++i) EXPECT_EQ(p->n->post([&ran] { ++ran; }), errc::ok);
  EXPECT_EQ(p->n->post([&ran] { ++ran; }), errc::queue_full);  // 17 x 64 > 1064
  ASSERT_TRUE(wait([&] { return ran == 16; }));
}

// A batch the loop took from the mailbox but could not finish (its link's queue is full) still
// counts against post_queue_messages: the mailbox does not take another full quota meanwhile.
TEST_F(NodeThreadTest, ABatchStuckOnAFullQueueCountsAgainstThePostQueue) {
  node_config cfg = fast_config("ipv4://127.0.0.1:1");  // a parent that is never there
  cfg.pending_max_messages = 1;                         // one message waits for it, no more
  cfg.pending_timeout_ms = 60000;
  cfg.post_queue_messages = 4;
  cfg.stop_flush_ms = 0;  // nothing went out: stop() need not wait for acknowledgements
  bus_node* c = make(0x101, cfg);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c->n->post(0x200, 1, "x", 1), errc::ok);
  EXPECT_EQ(c->n->post(0x200, 1, "x", 1), errc::queue_full);
  // The loop takes all four: the first waits for the parent, the second meets queue_full.
  ASSERT_TRUE(wait([&] { return c->n->counters().pending_now == 1; }));
  int accepted = 0;
  for (int i = 0; i < 8; ++i) accepted += c->n->post(0x200, 1, "x", 1) == errc::ok ? 1 : 0;
  EXPECT_EQ(accepted, 1);  // three still wait in the batch
  run_for(50ms);           // the batch is retried (tick): still stuck, still counted
  accepted = 0;
  for (int i = 0; i < 8; ++i) accepted += c->n->post(0x200, 1, "x", 1) == errc::ok ? 1 : 0;
  EXPECT_EQ(accepted, 0);
  c->n->stop();  // everything accepted is reported closed
  ASSERT_TRUE(wait([&] { return !c->downs.empty(); }));
  EXPECT_EQ(c->reports.size(), 5u);
}

// stop() with posts not yet run: each still gets exactly one report (closed); accepted tasks run.
TEST_F(NodeThreadTest, StopWithPostsInFlightReportsEachClosed) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  ASSERT_TRUE(wait([&] { return p->ups == 1; }));
  std::vector<uint64_t> ids(50);
  int tasks = 0;
  std::thread([&] {
    for (auto& id : ids) EXPECT_EQ(p->n->post(0x100, 1, "x", 1, {}, &id), errc::ok);
    EXPECT_EQ(p->n->post([&] { ++tasks; }), errc::ok);
  }).join();
  p->n->stop();  // before the loop ran the mailbox
  ASSERT_TRUE(wait([&] { return p->reports.size() == ids.size() && !p->downs.empty(); }));
  run_for(50ms);
  ASSERT_EQ(p->reports.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(p->reports[i].message_id, ids[i]);
    EXPECT_EQ(p->reports[i].status, errc::closed);
  }
  EXPECT_TRUE(p->got.empty());
  EXPECT_EQ(tasks, 1);
}

// Destroyed with posts in flight: no report, no task, nothing leaks (ASan).
TEST_F(NodeThreadTest, DestroyWithPostsInFlightReportsNothing) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  ASSERT_TRUE(wait([&] { return p->ups == 1; }));
  int tasks = 0;
  std::thread([&] {
    for (int i = 0; i < 50; ++i) EXPECT_EQ(p->n->post(0x100, 1, "x", 1), errc::ok);
    EXPECT_EQ(p->n->post([&] { ++tasks; }), errc::ok);
  }).join();
  destroy(p);
  run_for(50ms);
  EXPECT_TRUE(p->reports.empty());
  EXPECT_EQ(tasks, 0);
}

// A posted task runs on the loop thread and may call the node, even destroy it.
TEST_F(NodeThreadTest, PostedTaskRunsOnTheLoopThread) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  const std::thread::id loop_thread = std::this_thread::get_id();
  bool ran = false;
  std::thread([&] {
    EXPECT_EQ(p->n->post([&] {
      EXPECT_EQ(std::this_thread::get_id(), loop_thread);
      EXPECT_EQ(send_str(p, 0x100, 1, "from a task"), errc::ok);
      ran = true;
    }),
              errc::ok);
    EXPECT_EQ(p->n->post([&] { p->n.reset(); }), errc::ok);
  }).join();
  ASSERT_TRUE(wait([&] { return ran && p->n == nullptr; }));
  run_for(50ms);
}

// The mailbox could not grow (post_queue_bytes may be above 1 GiB): std::bad_alloc escaped into
// the posting thread, and post(task) had queued its task without its record, so the next task
// posted ran the orphan in its place. Now no_memory, nothing queued: the next task runs, once.
TEST_F(NodeThreadTest, APostRefusedForMemoryQueuesNothing) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  int first = 0;
  int second = 0;
  detail::fail_next_try_resize(1);  // the mailbox is empty, never grown: the next post grows it
  const errc refused = p->n->post([&first] { ++first; });
  detail::fail_next_try_resize(0);
  EXPECT_EQ(refused, errc::no_memory);
  std::thread([&] { EXPECT_EQ(p->n->post([&second] { ++second; }), errc::ok); }).join();
  ASSERT_TRUE(wait([&] { return second != 0; }));
  run_for(50ms);
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
  detail::fail_next_try_resize(1);
  EXPECT_EQ(p->n->post(0x100, 1, "x", 1), errc::no_memory);
  detail::fail_next_try_resize(0);
}

}  // namespace
}  // namespace uvbus::node_thread_test
