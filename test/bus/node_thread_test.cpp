// Node threads: a call from a thread other than the node's fails loudly (release builds:
// errc::wrong_thread and nothing done; debug builds: abort naming the function).
#include <gtest/gtest.h>
#include <uv.h>

#include <string>
#include <thread>
#include <vector>

#include "bus/bus_harness.h"
#include "uvbus/node.h"

namespace uvbus {
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

#else

TEST_F(NodeThreadTest, ForeignThreadCallAbortsNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  bus_node* p = make_root(0x100, {{0x100, 8}});
  node* n = p->n.get();
  EXPECT_DEATH(on_other_thread([&] { (void)n->send_data(0x100, 1, "x", 1); }),
               "node::send_data called from a thread other than its loop's thread");
  EXPECT_DEATH(on_other_thread([&] { n->stop(); }), "node::stop called from a thread");
  EXPECT_DEATH(on_other_thread([&] { (void)n->peers(); }), "node::peers called from a thread");
}

#endif

}  // namespace
}  // namespace uvbus
