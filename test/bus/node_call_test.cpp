// Request/reply: node::call() gets exactly one outcome — the reply, the handler's error, a
// timeout, a refusal on the way, closed at stop — through a relay, over TCP and shared memory, in
// both delivery modes, to the node itself; answers later than on_data; misuse is refused.
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "bus/bus_harness.h"

#if defined(__SANITIZE_ADDRESS__)
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#else
#include <malloc.h>
#endif

namespace uvbus::node_call_test {
namespace {

using test::bus_fixture;
using test::bus_node;
using test::fast_config;

// Heap bytes in use (mallinfo2 does not see ASan's allocator, which has its own counter).
size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#endif
}

struct outcome {
  errc status = errc::io_error;
  uint32_t code = 0;
  std::string bytes;
};

// A callback that appends each outcome to *out (shared: the test checks there is exactly one).
call_fn record(const std::shared_ptr<std::vector<outcome>>& out) {
  return [out](const call_result& r) {
    out->push_back({r.status, r.code, std::string(reinterpret_cast<const char*>(r.data), r.size)});
  };
}

// What a handler node does with each request.
enum class behaviour { echo_upper, error, ignore, later };

class NodeCallTest : public bus_fixture, public ::testing::WithParamInterface<delivery_mode> {
 protected:
  node_config cfg(bool shm = false, const char* name = "call") {
    node_config c = fast_config();
    c.delivery = GetParam();
    if (shm) {
      c.enable_shm = true;
      c.shm_ring_bytes = 1 << 20;
      c.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name(name)};
    }
    return c;
  }
  // Root P (0x100/8) relays between A (0x101, the caller) and B (0x102, the handler).
  void make_tree(bool shm = false, node_config bc = {}, bool use_bc = false) {
    node_config pc = cfg(shm, "call-p");
    pc.subnets = {{0x100, 8}};
    p_ = make(0x100, pc);
    node_config ac = cfg(shm, "call-a");
    ac.parent_urls = {p_->n->listen_urls().at(0)};
    ac.sibling_direct = false;  // through the relay
    a_ = make(0x101, ac);
    if (!use_bc) bc = cfg(shm, "call-b");
    bc.parent_urls = ac.parent_urls;
    b_ = make_handler(0x102, bc);
    ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up(); }));
  }
  bus_node* make_handler(bus_id id, node_config c) {
    bus_node** self = &handler_;
    bus_node* t = make(id, std::move(c), false, [this, self](node_callbacks* cb) {
      cb->on_data = [this, self](bus_id, uint32_t, const uint8_t* p, size_t n) {
        handle(*self, p, n);
      };
    });
    handler_ = t;
    EXPECT_EQ(t->n->start(), errc::ok);
    return t;
  }
  void handle(bus_node* t, const uint8_t* p, size_t n) {
    const reply_handle* req = t->n->incoming_request();
    if (req == nullptr) {
      ++plain_;
      return;
    }
    ++requests_;
    reply_handle h = *req;
    std::string s(reinterpret_cast<const char*>(p), n);
    switch (mode_) {
      case behaviour::echo_upper:
        for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        EXPECT_EQ(t->n->reply(h, s.data(), s.size()), errc::ok);
        EXPECT_FALSE(h.valid());
        EXPECT_EQ(t->n->reply(h, "x", 1), errc::invalid_argument);  // one answer per handle
        break;
      case behaviour::error:
        EXPECT_EQ(t->n->reply_error(h, 42, "no such item", 12), errc::ok);
        break;
      case behaviour::ignore:
        break;
      case behaviour::later:
        saved_.push_back(h);
        break;
    }
  }

  bus_node* p_ = nullptr;
  bus_node* a_ = nullptr;
  bus_node* b_ = nullptr;
  bus_node* handler_ = nullptr;
  behaviour mode_ = behaviour::echo_upper;
  int requests_ = 0;
  int plain_ = 0;
  std::vector<reply_handle> saved_;
};

TEST_P(NodeCallTest, TheReplyComesBackThroughTheRelay) {
  make_tree();
  auto out = std::make_shared<std::vector<outcome>>();
  uint64_t id = 0;
  ASSERT_EQ(a_->n->call(0x102, 5, "hello", 5, 5000, record(out), {}, &id), errc::ok);
  EXPECT_NE(id, 0u);
  EXPECT_TRUE(out->empty());  // never inside call()
  ASSERT_TRUE(wait([&] { return !out->empty(); }));
  EXPECT_EQ(out->at(0).status, errc::ok);
  EXPECT_EQ(out->at(0).bytes, "HELLO");
  // A plain message is not a request; incoming_request() is null outside on_data.
  ASSERT_EQ(test::send_str(a_, 0x102, 5, "plain"), errc::ok);
  ASSERT_TRUE(wait([&] { return plain_ == 1; }));
  EXPECT_EQ(b_->n->incoming_request(), nullptr);
  run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(out->size(), 1u);
  // The call's message has no report of its own; the plain one has.
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 1; }));
  EXPECT_EQ(a_->n->counters().calls_ok, 1u);
  EXPECT_EQ(b_->n->counters().requests_received, 1u);
  EXPECT_EQ(b_->n->counters().answers_sent, 1u);
  EXPECT_TRUE(b_->reports.empty());  // an answer is not reported either
  // data_sent counts every send accepted, the call and the answer too (node.h, docs/bus.md): so
  // it exceeds the reports by them.
  EXPECT_EQ(a_->n->counters().data_sent, 2u);
  EXPECT_EQ(a_->n->counters().reports_ok + a_->n->counters().reports_failed, 1u);
  EXPECT_EQ(b_->n->counters().data_sent, 1u);
}

TEST_P(NodeCallTest, AnErrorAnswerCarriesTheHandlersCodeAndDetail) {
  make_tree();
  mode_ = behaviour::error;
  auto out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(a_->n->call(0x102, 5, "x", 1, 5000, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return !out->empty(); }));
  EXPECT_EQ(out->at(0).status, errc::remote_error);
  EXPECT_EQ(out->at(0).code, 42u);
  EXPECT_EQ(out->at(0).bytes, "no such item");
}

TEST_P(NodeCallTest, AHandlerThatNeverAnswersMakesTheCallTimeOutOnce) {
  make_tree();
  mode_ = behaviour::later;
  auto out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(a_->n->call(0x102, 5, "x", 1, 150, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return !out->empty(); }));
  EXPECT_EQ(out->at(0).status, errc::timeout);
  // The answer comes after all: ignored by the caller, no second outcome.
  ASSERT_EQ(saved_.size(), 1u);
  EXPECT_EQ(b_->n->reply(saved_[0], "late", 4), errc::ok);
  ASSERT_TRUE(wait([&] { return a_->n->counters().answers_ignored == 1; }));
  EXPECT_EQ(out->size(), 1u);
  EXPECT_EQ(a_->n->counters().calls_failed, 1u);
}

// A restarted caller (a new node object of the same id) must not take an answer meant for its
// predecessor's call as the answer to its own (before, both calls had the same id).
TEST_P(NodeCallTest, AnAnswerForAPreviousProcessOfTheCallerIsIgnored) {
  make_tree();
  mode_ = behaviour::later;
  auto old_out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(a_->n->call(0x102, 5, "x", 1, 30000, record(old_out)), errc::ok);
  ASSERT_TRUE(wait([&] { return saved_.size() == 1; }));
  node_config ac = cfg();
  ac.parent_urls = {p_->n->listen_urls().at(0)};
  ac.sibling_direct = false;
  destroy(a_);
  bus_node* a2 = nullptr;
  ASSERT_TRUE(wait([&] {  // the parent lets the id go once it sees the old link close
    if (a2 != nullptr && a2->n->up()) return true;
    if (a2 == nullptr || a2->n == nullptr) a2 = make(0x101, ac);
    return false;
  }));
  auto out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(a2->n->call(0x102, 5, "y", 1, 30000, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return saved_.size() == 2; }));
  ASSERT_EQ(b_->n->reply(saved_[0], "for-old", 7), errc::ok);
  ASSERT_EQ(b_->n->reply(saved_[1], "for-new", 7), errc::ok);
  ASSERT_TRUE(wait([&] { return !out->empty() && a2->n->counters().answers_ignored == 1; }));
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ(out->at(0).bytes, "for-new");
}

TEST_P(NodeCallTest, AnswersMayComeLaterAndInAnyOrder) {
  make_tree();
  mode_ = behaviour::later;
  std::vector<std::shared_ptr<std::vector<outcome>>> outs;
  for (int i = 0; i < 64; ++i) {
    outs.push_back(std::make_shared<std::vector<outcome>>());
    const std::string s = std::to_string(i);
    ASSERT_EQ(a_->n->call(0x102, 5, s.data(), s.size(), 5000, record(outs.back())), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return saved_.size() == 64; }));
  EXPECT_EQ(a_->n->counters().calls_started, 64u);
  for (size_t i = saved_.size(); i-- > 0;) {  // backwards
    const std::string s = "answer " + std::to_string(i);
    ASSERT_EQ(b_->n->reply(saved_[i], s.data(), s.size()), errc::ok);
  }
  ASSERT_TRUE(wait([&] {
    for (const auto& o : outs) {
      if (o->empty()) return false;
    }
    return true;
  }));
  for (size_t i = 0; i < outs.size(); ++i) {
    ASSERT_EQ(outs[i]->size(), 1u);
    EXPECT_EQ(outs[i]->at(0).status, errc::ok);
    EXPECT_EQ(outs[i]->at(0).bytes, "answer " + std::to_string(i));
  }
  // Slots are reused: another round gets fresh ids and the right answers.
  mode_ = behaviour::echo_upper;
  auto again = std::make_shared<std::vector<outcome>>();
  for (int i = 0; i < 200; ++i)
    ASSERT_EQ(a_->n->call(0x102, 5, "ab", 2, 5000, record(again)), errc::ok);
  ASSERT_TRUE(wait([&] { return again->size() == 200; }));
  for (const outcome& o : *again) EXPECT_EQ(o.bytes, "AB");
}

TEST_P(NodeCallTest, ACallToNobodyFailsWithUnknownRoute) {
  make_tree();
  auto out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(a_->n->call(0x1f0, 5, "x", 1, 20000, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return !out->empty(); }));
  EXPECT_EQ(out->at(0).status, errc::unknown_route);
  EXPECT_TRUE(a_->reports.empty());
}

TEST_P(NodeCallTest, StopEndsOpenCallsWithClosedFromTheLoop) {
  make_tree();
  mode_ = behaviour::ignore;
  auto out = std::make_shared<std::vector<outcome>>();
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(a_->n->call(0x102, 5, "x", 1, 20000, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return requests_ == 3; }));
  a_->n->stop();
  EXPECT_TRUE(out->empty());  // not inside stop()
  ASSERT_TRUE(wait([&] { return out->size() == 3; }));
  for (const outcome& o : *out) EXPECT_EQ(o.status, errc::closed);
  EXPECT_EQ(a_->n->call(0x102, 5, "x", 1, 100, record(out)), errc::closed);
  run_for(std::chrono::milliseconds(30));
  EXPECT_EQ(out->size(), 3u);
}

// A call whose request still waits for its link (the parent is not there) is ended by stop() as
// well, and from the loop: its request's failure is reported inside stop(), the callback must not
// run there. And a callback that stops the node or calls again meanwhile is safe.
TEST_P(NodeCallTest, StopEndsCallsWhoseRequestStillWaitsFromTheLoop) {
  node_config c = cfg();
  c.parent_urls = {"ipv4://127.0.0.1:1"};  // nobody listens there
  a_ = make(0x101, c);
  auto out = std::make_shared<std::vector<outcome>>();
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(a_->n->call(0x100, 5, "x", 1, 20000, record(out)), errc::ok);
  node* n = a_->n.get();
  ASSERT_EQ(n->call(0x100, 5, "y", 1, 20000,
                    [n, out](const call_result& r) {
                      out->push_back({r.status, 0, "again"});
                      n->stop();
                      EXPECT_EQ(n->call(0x100, 5, "z", 1, 100, record(out)), errc::closed);
                    }),
            errc::ok);
  a_->n->stop();
  EXPECT_TRUE(out->empty());  // not inside stop()
  ASSERT_TRUE(wait([&] { return out->size() == 3; }));
  for (const outcome& o : *out) EXPECT_EQ(o.status, errc::closed);
  run_for(std::chrono::milliseconds(30));
  EXPECT_EQ(out->size(), 3u);
}

TEST_P(NodeCallTest, ANodeCallsItself) {
  node_config c = cfg();
  c.subnets = {{0x100, 8}};
  bus_node* t = make_handler(0x100, c);
  auto out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(t->n->call(0x100, 5, "self", 4, 5000, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return !out->empty(); }));
  EXPECT_EQ(out->at(0).status, errc::ok);
  EXPECT_EQ(out->at(0).bytes, "SELF");
}

TEST_P(NodeCallTest, OverSharedMemory) {
  make_tree(true);
  endpoint_info e;
  ASSERT_TRUE(a_->n->peer(0x100, &e));
  EXPECT_EQ(e.data_channel, channel_kind::shm);
  auto out = std::make_shared<std::vector<outcome>>();
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(a_->n->call(0x102, 5, "shm", 3, 5000, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return out->size() == 20; }));
  for (const outcome& o : *out) EXPECT_EQ(o.bytes, "SHM");
  EXPECT_GE(a_->n->counters().data_sent_shm, 20u);
}

TEST_P(NodeCallTest, AVersion4HopRefusesTheCallNotTheLink) {
  node_config bc = cfg();
  bc.protocol_max = 4;
  make_tree(false, bc, true);
  auto out = std::make_shared<std::vector<outcome>>();
  const errc e = a_->n->call(0x102, 5, "x", 1, 5000, record(out));
  if (e == errc::ok) {
    ASSERT_TRUE(wait([&] { return !out->empty(); }));
    EXPECT_EQ(out->at(0).status, errc::version_mismatch);
  } else {
    EXPECT_EQ(e, errc::version_mismatch);
  }
  EXPECT_EQ(requests_ + plain_, 0);
  // The links stay up: plain messages still go through.
  ASSERT_EQ(test::send_str(a_, 0x102, 5, "plain"), errc::ok);
  ASSERT_TRUE(wait([&] { return plain_ == 1; }));
  EXPECT_EQ(p_->n->counters().protocol_errors, 0u);
}

TEST_P(NodeCallTest, MisuseIsRefusedWithAClearError) {
  make_tree();
  auto out = std::make_shared<std::vector<outcome>>();
  EXPECT_EQ(a_->n->call(0x102, 5, "x", 1, 5000, call_fn{}), errc::invalid_argument);
  EXPECT_NE(a_->n->last_error().detail.find("callback is empty"), std::string::npos);
  EXPECT_EQ(a_->n->call(0x102, 5, "x", 1, 0, record(out)), errc::invalid_argument);
  EXPECT_NE(a_->n->last_error().detail.find("timeout_ms is 0"), std::string::npos);
  const std::string big(a_->n->config().message_limit - 12, 'x');
  EXPECT_EQ(a_->n->call(0x102, 5, big.data(), big.size(), 5000, record(out)),
            errc::message_too_large);
  EXPECT_NE(a_->n->last_error().detail.find("message_limit - 13"), std::string::npos);
  reply_handle none;
  EXPECT_EQ(b_->n->reply(none, "x", 1), errc::invalid_argument);
  EXPECT_EQ(b_->n->reply_error(none, 1, nullptr, 0), errc::invalid_argument);
  run_for(std::chrono::milliseconds(30));
  EXPECT_TRUE(out->empty());
}

// An answer over the limit is refused naming the limit, as call() does (it named none).
TEST_P(NodeCallTest, ATooLargeAnswerIsRefusedNamingTheLimit) {
  make_tree();
  mode_ = behaviour::later;
  auto out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(a_->n->call(0x102, 5, "x", 1, 30000, record(out)), errc::ok);
  ASSERT_TRUE(wait([&] { return saved_.size() == 1; }));
  const size_t limit = b_->n->config().message_limit - 13;
  const std::string big(limit + 1, 'x');
  EXPECT_EQ(b_->n->reply(saved_[0], big.data(), big.size()), errc::message_too_large);
  EXPECT_NE(
      b_->n->last_error().detail.find("at most message_limit - 13 (" + std::to_string(limit) + ")"),
      std::string::npos)
      << b_->n->last_error().detail;
  ASSERT_EQ(b_->n->reply(saved_[0], big.data(), limit), errc::ok);  // the handle is still good
  ASSERT_TRUE(wait([&] { return out->size() == 1; }));
  EXPECT_EQ(out->at(0).status, errc::ok);
}

TEST_P(NodeCallTest, TheCallbackMayDestroyTheNode) {
  make_tree();
  bool called = false;
  ASSERT_EQ(a_->n->call(0x102, 5, "x", 1, 5000,
                        [&](const call_result& r) {
                          called = true;
                          EXPECT_EQ(r.status, errc::ok);
                          destroy(a_);
                        }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return called; }));
  run_for(std::chrono::milliseconds(30));
}

// A call's deadline is its own timeout_ms. The request's own wait (next hop: response_timeout_ms
// for the target's acknowledgement; end to end: delivery_timeout_ms) running out first ended the
// call with timeout, although the handler, held up past it, still answered in the call's time.
TEST_P(NodeCallTest, ACallOutlivesItsRequestsShorterAcknowledgementTimeout) {
  node_config pc = cfg();
  pc.subnets = {{0x100, 8}};
  p_ = make(0x100, pc);
  node_config ac = cfg();
  ac.parent_urls = {p_->n->listen_urls().at(0)};
  ac.sibling_direct = false;
  ac.response_timeout_ms = 300;
  ac.delivery_timeout_ms = 300;
  a_ = make(0x101, ac);
  // B, the handler, runs on a loop of its own, held still while A's request waits.
  test::own_loop_node b;
  ASSERT_EQ(uv_loop_init(&b.loop), 0);
  b.open = true;
  node_callbacks cb = b.callbacks();
  cb.on_data = [&b](bus_id, uint32_t, const uint8_t* p, size_t n) {
    reply_handle h = *b.n->incoming_request();
    std::string s(reinterpret_cast<const char*>(p), n);
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(b.n->reply(h, s.data(), s.size()), errc::ok);
  };
  node_config bc = cfg();
  bc.parent_urls = ac.parent_urls;
  b.n = std::make_unique<node>(&b.loop, 0x102, bc, cb);
  ASSERT_EQ(b.n->start(), errc::ok);
  ASSERT_TRUE(wait([&] {
    b.turn();
    return a_->n->up() && b.n->up();
  }));
  auto out = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(a_->n->call(0x102, 5, "late", 4, 20000, record(out)), errc::ok);
  run_for(std::chrono::milliseconds(900));  // B is held up three times A's 300 ms
  const size_t early = out->size();
  ASSERT_TRUE(wait([&] {
    b.turn();
    return !out->empty();
  }));
  EXPECT_EQ(early, 0u) << "the call ended while B was held up: " << to_string(out->at(0).status);
  EXPECT_EQ(out->at(0).status, errc::ok) << to_string(out->at(0).status);
  EXPECT_EQ(out->at(0).bytes, "LATE");
  EXPECT_EQ(a_->n->counters().answers_ignored, 0u);
  run_for(std::chrono::milliseconds(30));
  EXPECT_EQ(out->size(), 1u);
  b.finish();
}

// An answered call leaves nothing behind. Its deadline stayed in the deadline heap until every
// earlier deadline had gone: behind one call still open (a handler that keeps its request), a
// node grew with every call it made and had answered, not with the calls open.
TEST_P(NodeCallTest, AnsweredCallsLeaveNoDeadlinesBehind) {
  node_config c = cfg();
  c.subnets = {{0x100, 8}};
  bus_node* t = make_handler(0x100, c);
  mode_ = behaviour::later;  // the first call stays open (its handler keeps the request)
  auto first = std::make_shared<std::vector<outcome>>();
  ASSERT_EQ(t->n->call(0x100, 5, "kept", 4, 3600 * 1000, record(first)), errc::ok);
  ASSERT_TRUE(wait([&] { return saved_.size() == 1; }));
  mode_ = behaviour::echo_upper;
  size_t done = 0;
  size_t want = 0;
  const auto calls = [&](int rounds) {
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(t->n->call(0x100, 5, "x", 1, 3600 * 1000,
                             [&done](const call_result& res) {
                               EXPECT_EQ(res.status, errc::ok);
                               ++done;
                             }),
                  errc::ok);
      }
      want += 100;
      ASSERT_TRUE(wait([&] { return done == want; }));
    }
  };
  ASSERT_NO_FATAL_FAILURE(calls(10));  // warm-up: every container at its steady size
  const size_t before = heap_in_use();
  ASSERT_NO_FATAL_FAILURE(calls(300));  // 30 000 calls, at most 100 open at a time
  const size_t after = heap_in_use();
  EXPECT_EQ(t->n->counters().calls_ok, want);
  EXPECT_LT(after, before + size_t{64} * 1024) << "heap grew by " << (after - before) << " bytes";
  EXPECT_TRUE(first->empty());
}

INSTANTIATE_TEST_SUITE_P(Modes, NodeCallTest,
                         ::testing::Values(delivery_mode::end_to_end, delivery_mode::next_hop),
                         [](const auto& info) {
                           return info.param == delivery_mode::end_to_end ? "EndToEnd" : "NextHop";
                         });

}  // namespace
}  // namespace uvbus::node_call_test
