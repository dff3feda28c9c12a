// node.h's promises checked one by one where no other test did: the detail of each refusal
// (last_error() names the input at fault), counters counted once and in the field named.
#include <uv.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"

namespace uvbus::node_contract_test {
namespace {

using test::bus_fixture;
using test::bus_node;
using test::fast_config;

class NodeContract : public bus_fixture {
 protected:
  // Root P (0x100/8) and its child A (0x101).
  void make_pair(delivery_mode mode = delivery_mode::end_to_end) {
    node_config pc = fast_config();
    pc.delivery = mode;
    p_ = make_root(0x100, {{0x100, 8}}, pc);
    node_config ac = fast_config();
    ac.delivery = mode;
    a_ = make_child(0x101, p_, {}, ac);
    ASSERT_TRUE(wait([&] { return a_->n->up(); }));
  }
  // Root P (0x100/8), and the config of a child of P for the on_writable tests: sending only
  // through P, its retransmit buffer full at 4 messages, its delivery deadline `deadline_ms`.
  node_config make_root_and_small_buffer_config(uint32_t deadline_ms) {
    node_config ac = make_root_for_sender(&p_);
    ac.retransmit_max_messages = 4;
    ac.delivery_timeout_ms = deadline_ms;
    return ac;
  }
  // Root P with a 1 MiB shared-memory ring and its child A writing into it (tweak: A's callbacks).
  // A sends 4000-byte messages without running the loop, so P reads nothing, until P's ring is
  // full (about 260 messages); returns how many A sent.
  uint64_t fill_ring(delivery_mode mode, bus_node** p, bus_node** a, const tweak_fn& tweak = {});
  bus_node* p_ = nullptr;
  bus_node* a_ = nullptr;
};

bool says(const error_info& e, const std::string& text) {
  return e.detail.find(text) != std::string::npos;
}

// An invalid trace context (zero ids) is refused with invalid_argument by every send; the detail
// must name the trace context, not a null buffer or the number of buffers.
TEST_F(NodeContract, AnInvalidTraceContextIsNamedInTheDetail) {
  make_pair();
  const trace_context zero;
  send_options bad;
  bad.trace = &zero;
  const uint64_t v = 7;
  EXPECT_EQ(a_->n->send_data(0x100, 1, &v, sizeof v, bad), errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "trace")) << a_->n->last_error().detail;
  const const_buffer b{&v, sizeof v};
  (void)a_->n->send_data(0x100, 1, nullptr, 3);  // another detail first
  EXPECT_EQ(a_->n->send_datav(0x100, 1, &b, 1, bad), errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "trace")) << a_->n->last_error().detail;
  (void)a_->n->send_data(0x100, 1, nullptr, 3);
  errc e = errc::ok;
  EXPECT_EQ(a_->n->prepare_data(0x100, 1, 8, &e, bad), nullptr);
  EXPECT_EQ(e, errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "trace")) << a_->n->last_error().detail;
  (void)a_->n->send_data(0x100, 1, nullptr, 3);
  int called = 0;
  EXPECT_EQ(a_->n->call(
                0x100, 1, &v, sizeof v, 5000, [&](const call_result&) { ++called; }, bad),
            errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "trace")) << a_->n->last_error().detail;
  // The null-buffer case keeps its own detail.
  EXPECT_EQ(a_->n->send_data(0x100, 1, nullptr, 3), errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "null")) << a_->n->last_error().detail;
  run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(called, 0);
  EXPECT_TRUE(p_->got.empty());
  EXPECT_TRUE(a_->reports.empty());
}

// last_error() is "the last error a call of this node returned": send_command()'s refusals too,
// each naming what is wrong.
TEST_F(NodeContract, SendCommandRefusalsAreRecordedWithTheirCause) {
  make_pair();
  int called = 0;
  const auto cb = [&](errc, const uint8_t*, size_t) { ++called; };
  EXPECT_EQ(a_->n->send_data(0x100, 1, "x", a_->n->config().message_limit + 1),
            errc::message_too_large);
  EXPECT_EQ(a_->n->send_command(0x100, proto::command_id::echo, nullptr, 3, cb),
            errc::invalid_argument);
  EXPECT_EQ(a_->n->last_error().code, errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "args")) << a_->n->last_error().detail;
  EXPECT_EQ(a_->n->send_command(0x100, proto::command_id::echo, "x", 1, node::command_cb{}),
            errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "callback")) << a_->n->last_error().detail;
  EXPECT_FALSE(says(a_->n->last_error(), "buffers")) << a_->n->last_error().detail;
  run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(called, 0);
}

// data_received counts what on_data got: a call's answer goes to the call's callback, not to
// on_data, and must not be counted there (nor a request twice).
TEST_F(NodeContract, DataReceivedCountsOnlyWhatOnDataGot) {
  for (const delivery_mode mode : {delivery_mode::end_to_end, delivery_mode::next_hop}) {
    SCOPED_TRACE(mode == delivery_mode::end_to_end ? "end_to_end" : "next_hop");
    nodes_.clear();
    node_config pc = fast_config();
    pc.delivery = mode;
    pc.subnets = {{0x100, 8}};
    p_ = make(0x100, pc, false, [this](node_callbacks* cb) {
      cb->on_data = [this](bus_id, uint32_t, const uint8_t*, size_t) {
        ++p_->got_count;
        if (const reply_handle* h = p_->n->incoming_request(); h != nullptr) {
          reply_handle r = *h;
          EXPECT_EQ(p_->n->reply(r, "pong", 4), errc::ok);
        }
      };
    });
    ASSERT_EQ(p_->n->start(), errc::ok);
    node_config ac = fast_config();
    ac.delivery = mode;
    a_ = make_child(0x101, p_, {}, ac);
    ASSERT_TRUE(wait([&] { return a_->n->up(); }));
    int answers = 0;
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(a_->n->call(0x100, 1, "ping", 4, 20000,
                            [&](const call_result& r) { answers += r.status == errc::ok; }),
                errc::ok);
    }
    // To itself too: the answer comes back through the node's own delivery path.
    ASSERT_EQ(p_->n->call(0x100, 1, "ping", 4, 20000,
                          [&](const call_result& r) { answers += r.status == errc::ok; }),
              errc::ok);
    ASSERT_TRUE(wait([&] { return answers == 4; }));
    EXPECT_EQ(a_->got_count, 0U);
    EXPECT_EQ(a_->n->counters().data_received, a_->got_count);
    EXPECT_EQ(p_->got_count, 4U);
    EXPECT_EQ(p_->n->counters().data_received, p_->got_count);
    EXPECT_EQ(p_->n->counters().requests_received, 4U);
  }
}

// on_writable (end_to_end): "the target whose flow's retransmit buffer was full and is at most
// half full again". Settled messages drain it as acknowledged ones do: a relay's final refusal
// (a target never heard from) and the delivery deadline (a target that went).
TEST_F(NodeContract, AFullRetransmitBufferDrainedByFailuresTellsOnWritable) {
  a_ = make(0x101, make_root_and_small_buffer_config(1500));
  bus_node* b = make_child(0x102, p_);
  ASSERT_TRUE(wait([&] { return a_->n->up() && b->n->up(); }));
  const auto fill = [&](bus_id to) {
    for (int i = 0; i < 4; ++i) ASSERT_EQ(send_str(a_, to, 1, "m"), errc::ok);
    ASSERT_EQ(send_str(a_, to, 1, "m"), errc::queue_full);
  };
  // 0x1ff never existed: the relay refuses each message for good (unknown_route).
  fill(0x1ff);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 4; }));
  for (const auto& r : a_->reports) EXPECT_EQ(r.status, errc::unknown_route);
  EXPECT_TRUE(wait([&] { return a_->writable == 1; })) << "no on_writable after the refusals";
  // 0x102 acknowledged us, then went: its messages fail at their deadline (timeout).
  ASSERT_EQ(send_str(a_, 0x102, 1, "first"), errc::ok);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 5; }));
  ASSERT_EQ(a_->reports.back().status, errc::ok);
  destroy(b);
  fill(0x102);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 9; }));
  for (size_t i = 5; i < 9; ++i) EXPECT_EQ(a_->reports[i].status, errc::timeout);
  EXPECT_TRUE(wait([&] { return a_->writable == 2; })) << "no on_writable after the deadline";
  // Told: the buffer takes messages again.
  EXPECT_EQ(send_str(a_, 0x102, 1, "again"), errc::ok);
}

// start(): "Every refusal is recorded in last_error() ... and logged through on_log (error level,
// from the loop)": the refusals of a second start() too.
TEST_F(NodeContract, StartAgainIsRecordedAndLoggedFromTheLoop) {
  bus_node* t = make_root(0x100, {{0x100, 8}});
  ASSERT_TRUE(wait([&] { return t->ups == 1; }));
  t->logs.clear();
  EXPECT_EQ(t->n->start(), errc::wrong_state);
  EXPECT_TRUE(says(t->n->last_error(), "already started")) << t->n->last_error().detail;
  EXPECT_TRUE(t->logs.empty()) << "on_log ran inside start()";
  EXPECT_TRUE(wait([&] { return t->logged("already started"); }));
  t->n->stop();
  ASSERT_TRUE(wait([&] { return t->downs.size() == 1; }));
  EXPECT_EQ(t->n->start(), errc::wrong_state);
  EXPECT_TRUE(says(t->n->last_error(), "can not start again")) << t->n->last_error().detail;
  EXPECT_TRUE(wait([&] { return t->logged("can not start again"); }));
  for (const auto& [lv, m] : t->logs) {
    if (m.find("start") != std::string::npos) {
      EXPECT_EQ(lv, log_level::error) << m;
    }
  }
}

// "Between the two calls this node sends nothing else": a broadcast or a command inside an open
// prepare_data() reservation is refused like a send (wrong_state, the reservation named).
TEST_F(NodeContract, AnOpenReservationRefusesBroadcastsAndCommandsToo) {
  make_pair();
  errc e = errc::io_error;
  uint8_t* at = a_->n->prepare_data(0x100, 1, 8, &e);
  ASSERT_NE(at, nullptr);
  int called = 0;
  EXPECT_EQ(a_->n->broadcast(broadcast_target::in_subnet({0x100, 8}), 2, "b", 1, 5000,
                             [&](const broadcast_report&) { ++called; }),
            errc::wrong_state);
  EXPECT_TRUE(says(a_->n->last_error(), "reservation")) << a_->n->last_error().detail;
  EXPECT_EQ(a_->n->send_command(0x100, proto::command_id::echo, "x", 1,
                                [&](errc, const uint8_t*, size_t) { ++called; }),
            errc::wrong_state);
  EXPECT_TRUE(says(a_->n->last_error(), "reservation")) << a_->n->last_error().detail;
  std::memset(at, 1, 8);
  uint64_t id = 0;
  ASSERT_EQ(a_->n->commit_data(&id), errc::ok);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 1; }));
  run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(called, 0);
  EXPECT_EQ(p_->got.size(), 1U);
}
// The on_writable owed after failures runs as a callback of the node: destroying the node there
// (refusal path) or stopping it (deadline path, from the tick) is allowed and ends cleanly.
TEST_F(NodeContract, DestroyOrStopInsideOnWritableAfterFailures) {
  const node_config ac = make_root_and_small_buffer_config(1500);
  bus_node* a1 = nullptr;
  bus_node* a2 = nullptr;
  a1 = make(0x101, ac, true,
            [&](node_callbacks* cb) { cb->on_writable = [&](bus_id) { a1->n.reset(); }; });
  a2 = make(0x102, ac, true,
            [&](node_callbacks* cb) { cb->on_writable = [&](bus_id) { a2->n->stop(); }; });
  bus_node* b = make_child(0x103, p_);
  ASSERT_TRUE(wait([&] { return a1->n->up() && a2->n->up() && b->n->up(); }));
  ASSERT_EQ(send_str(a2, 0x103, 1, "first"), errc::ok);
  ASSERT_TRUE(wait([&] { return a2->reports.size() == 1; }));
  destroy(b);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(send_str(a1, 0x1ff, 1, "m"), errc::ok);
    ASSERT_EQ(send_str(a2, 0x103, 1, "m"), errc::ok);
  }
  ASSERT_EQ(send_str(a1, 0x1ff, 1, "m"), errc::queue_full);
  ASSERT_EQ(send_str(a2, 0x103, 1, "m"), errc::queue_full);
  ASSERT_TRUE(wait([&] { return a1->n == nullptr; }));
  ASSERT_TRUE(wait([&] { return a2->downs.size() == 1; }));
  EXPECT_EQ(a2->downs[0], errc::closed);
  EXPECT_EQ(a2->reports.size(), 5U);  // each accepted message once
}

// validate() took max_outstanding_calls = 0, after which every call() returned queue_full (no
// call could ever be open): refused now, naming the field.
// max_outstanding_responses bounds require_response messages and commands (node_config.h). Under
// end-to-end delivery a plain message to the node's own id waits for its report like one, and the
// fifth of five in one loop turn was refused queue_full (no detail, no on_writable to follow).
// Now all are accepted, delivered and reported; a require_response one is still bounded.
TEST_F(NodeContract, PlainSelfSendsDoNotCountAgainstMaxOutstandingResponses) {
  node_config c = fast_config();
  c.max_outstanding_responses = 4;
  bus_node* r = make_root(0x100, {{0x100, 8}}, c);
  ASSERT_TRUE(wait([&] { return r->ups == 1; }));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(test::send_str(r, 0x100, 1, "me"), errc::ok) << i;
  ASSERT_TRUE(wait([&] { return r->got.size() == 5 && r->reports.size() == 5; }));
  EXPECT_EQ(r->ok_reports(), 5u);
  send_options o;
  o.require_response = true;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(test::send_str(r, 0x100, 1, "rr", o), errc::ok) << i;
  EXPECT_EQ(test::send_str(r, 0x100, 1, "rr", o), errc::queue_full);
}

TEST_F(NodeContract, MaxOutstandingCallsZeroIsRefusedNamingTheField) {
  node_config cfg = fast_config();
  cfg.max_outstanding_calls = 0;
  std::string detail;
  EXPECT_EQ(node::validate(0x100, cfg, &detail), errc::invalid_argument);
  EXPECT_TRUE(detail.find("max_outstanding_calls") != std::string::npos) << detail;
  cfg.max_outstanding_calls = 1;
  EXPECT_EQ(node::validate(0x100, cfg), errc::ok);
}
// on_writable(hop) follows a queue_full the application got from its own send. A relay whose
// link to a next hop that stalled refused relayed messages (held in its overflow) told its own
// application, which had sent nothing, on_writable(0x102) once that link drained.
TEST_F(NodeContract, ARelayIsNotToldOnWritableForRelayedTraffic) {
  node_config pc = fast_config();
  pc.delivery = delivery_mode::next_hop;
  pc.subnets = {{0x100, 8}};
  pc.link_queue_bytes = size_t{256} << 10;
  pc.forward_overflow_bytes = size_t{512} << 10;
  p_ = make(0x100, pc);
  node_config ac = fast_config(p_->n->listen_urls().at(0));
  ac.delivery = delivery_mode::next_hop;
  ac.sibling_direct = false;
  ac.link_queue_bytes = size_t{256} << 10;
  a_ = make(0x101, ac);
  test::raw_child sink(0x102, 0x100);
  sink.compress = false;  // what it is sent must fill the socket
  sink.pause_after_register = true;
  sink.start(&loop_, p_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return a_->n->up() && sink.registered; }));
  // Until the root's link to the sink refused relayed messages (its overflow holds them).
  const auto refused_to_sink = [&] {
    const std::string key = "uvbus_peer_queue_refused_total{peer=\"0x102\"";
    const std::string text = p_->n->metrics_text();
    const size_t at = text.find(key);
    if (at == std::string::npos) return false;
    const size_t end = text.find('\n', at);
    const size_t sp = text.rfind(' ', end);
    return sp != std::string::npos && text.compare(sp + 1, end - sp - 1, "0") != 0;
  };
  const std::string payload(60000, 'x');
  ASSERT_TRUE(wait([&] {
    for (int i = 0; i < 8 && send_str(a_, 0x102, 1, payload) == errc::ok; ++i) {
    }
    return refused_to_sink();
  }));
  sink.resume_reading();
  // Everything held drains; a last message reaches the sink behind it.
  ASSERT_TRUE(wait([&] { return send_str(a_, 0x102, 2, "last") == errc::ok; }));
  ASSERT_TRUE(wait([&] {
    if (sink.got.empty()) return false;
    const std::vector<uint8_t>& b = sink.got.back().body;
    return b.size() >= 4 && std::memcmp(b.data() + b.size() - 4, "last", 4) == 0;
  }));
  EXPECT_EQ(p_->writable, 0U) << "on_writable for messages the root's application never sent";
  EXPECT_GT(p_->n->counters().forwarded, 0U);
  sink.ch->close();
  ASSERT_TRUE(wait([&] { return sink.ch->closed(); }));
}

// on_writable (end_to_end) is owed when a full flow drains, by acknowledgements or failures. A
// full flow of send_any() messages whose chosen node left was settled (not_connected, at once)
// without it: the application, told queue_full, never heard it could send again.
TEST_F(NodeContract, AFullSendAnyFlowSettledByItsNodeLeavingTellsOnWritable) {
  // 60 s: no report within the wait is the deadline's.
  a_ = make(0x101, make_root_and_small_buffer_config(60000));
  // The lobby runs on a loop of its own, run only until A knows it: it never acknowledges.
  test::own_loop_node lobby;
  ASSERT_NO_FATAL_FAILURE(
      lobby.start(0x102, test::typed_config("lobby", p_->n->listen_urls().at(0))));
  directory_entry e;
  ASSERT_TRUE(wait([&] {
    lobby.turn();
    return a_->n->up() && a_->n->lookup(0x102, &e);
  }));
  const pick_options least{pick_policy::least_loaded, 0};
  const auto send_any = [&] {
    bus_id chosen = 0;
    const errc r = a_->n->send_any("lobby", {}, 1, "m", 1, least, {}, &chosen);
    EXPECT_TRUE(r != errc::ok || chosen == 0x102);
    return r;
  };
  for (int i = 0; i < 4; ++i) ASSERT_EQ(send_any(), errc::ok);
  ASSERT_EQ(send_any(), errc::queue_full);
  lobby.n.reset();  // it leaves: its link closes, its directory entry goes
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 4; }));
  for (const auto& r : a_->reports) EXPECT_EQ(r.status, errc::not_connected);
  EXPECT_TRUE(wait([&] { return a_->writable == 1; })) << "no on_writable after the settling";
  lobby.finish();
}
uint64_t NodeContract::fill_ring(delivery_mode mode, bus_node** p, bus_node** a,
                                 const tweak_fn& tweak) {
  node_config pc = fast_config();
  pc.delivery = mode;
  pc.subnets = {{0x100, 8}};
  pc.enable_shm = true;
  pc.shm_ring_bytes = size_t{1} << 20;
  pc.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name("ring-full")};
  *p = make(0x100, pc);
  node_config ac = fast_config((*p)->n->listen_urls().at(0));
  ac.delivery = mode;
  ac.enable_shm = true;
  *a = make(0x101, ac, true, tweak);
  EXPECT_TRUE(wait([&] { return (*a)->n->up(); }));
  endpoint_info e;
  EXPECT_TRUE((*a)->n->peer(0x100, &e));
  EXPECT_EQ(e.data_channel, channel_kind::shm);
  (*p)->keep_bytes = false;
  const std::string m(4000, 'x');
  uint64_t sent = 0;
  errc r = errc::ok;
  while (sent < 1000 && (r = send_str(*a, 0x100, 1, m)) == errc::ok) ++sent;
  EXPECT_EQ(r, errc::queue_full) << "the ring never filled";
  return sent;
}

// on_writable for a next hop whose shared-memory ring was full (docs/bus.md, "Back-pressure"): a
// ring has no wake-up for room, so the node polls it and tells the application once the ring is at
// most half full. Before, nothing was told, and an application waiting for on_writable waited for
// ever. Both delivery modes: end_to_end sends through the flow (flow_out), next_hop through
// route_out().
TEST_F(NodeContract, AFullRingTellsOnWritable) {
  for (const delivery_mode mode : {delivery_mode::end_to_end, delivery_mode::next_hop}) {
    SCOPED_TRACE(mode == delivery_mode::end_to_end ? "end_to_end" : "next_hop");
    bus_node* p = nullptr;
    bus_node* a = nullptr;
    uint64_t sent = fill_ring(mode, &p, &a);
    EXPECT_EQ(a->writable, 0U);
    ASSERT_TRUE(wait([&] { return a->writable >= 1; })) << "no on_writable once the ring drained";
    EXPECT_EQ(send_str(a, 0x100, 1, std::string(4000, 'y')), errc::ok);
    ++sent;
    ASSERT_TRUE(wait([&] { return p->got_count == sent; }));
    destroy(a);
    destroy(p);
  }
}

// The same on_writable runs as a callback of the node, from its poll of the ring: destroying the
// node there is allowed, and nothing of it runs afterwards (ASan: no use after free; the loop
// closes with no handle open).
TEST_F(NodeContract, DestroyInsideOnWritableAfterAFullRing) {
  bus_node* p = nullptr;
  bus_node* a = nullptr;
  int called = 0;
  (void)fill_ring(delivery_mode::end_to_end, &p, &a, [&](node_callbacks* cb) {
    cb->on_writable = [&](bus_id) {
      ++called;
      a->n.reset();
    };
  });
  ASSERT_TRUE(wait([&] { return a->n == nullptr; })) << "no on_writable once the ring drained";
  run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(called, 1);
}

// Bus id 0 is reserved (no node's id; under end_to_end flow 0 meant "no flow yet" and was made
// again at every cache miss): every send refuses it, naming the id, and nothing goes out.
TEST_F(NodeContract, TargetZeroIsRefusedByEverySendNamingTheReservedId) {
  make_pair();
  const auto refused = [&](errc e) {
    EXPECT_EQ(e, errc::invalid_argument);
    EXPECT_TRUE(says(a_->n->last_error(), "bus id 0 is reserved")) << a_->n->last_error().detail;
    (void)a_->n->send_data(0x100, 1, nullptr, 3);  // another detail before the next one
  };
  refused(a_->n->send_data(0, 1, "x", 1));
  const const_buffer b{"x", 1};
  refused(a_->n->send_datav(0, 1, &b, 1));
  errc e = errc::ok;
  EXPECT_EQ(a_->n->prepare_data(0, 1, 8, &e), nullptr);
  refused(e);
  int called = 0;
  refused(a_->n->call(0, 1, "x", 1, 5000, [&](const call_result&) { ++called; }));
  refused(a_->n->send_command(0, proto::command_id::echo, "x", 1,
                              [&](errc, const uint8_t*, size_t) { ++called; }));
  EXPECT_EQ(a_->n->post(0, 1, "x", 1), errc::invalid_argument);  // on the calling thread
  run_for(std::chrono::milliseconds(100));
  EXPECT_EQ(called, 0);
  EXPECT_TRUE(a_->reports.empty());
  EXPECT_TRUE(p_->got.empty());
  EXPECT_EQ(a_->n->counters().data_sent, 0U);
}

// A broadcast carries no trace context (a receiver would take one for a protocol violation): a
// set send_options::trace, valid or not, is refused naming the field instead of dropped.
TEST_F(NodeContract, ABroadcastRefusesATraceContextNamingTheField) {
  make_pair();
  trace_context t;
  t.trace_id[0] = 1;
  t.span_id[0] = 1;
  const trace_context zero;
  int called = 0;
  const trace_context* const both[] = {&t, &zero};
  for (const trace_context* one : both) {
    send_options o;
    o.trace = one;
    EXPECT_EQ(a_->n->broadcast(
                  broadcast_target::in_subnet({0x100, 8}), 2, "b", 1, 5000,
                  [&](const broadcast_report&) { ++called; }, o),
              errc::invalid_argument);
    EXPECT_TRUE(says(a_->n->last_error(), "send_options::trace")) << a_->n->last_error().detail;
  }
  send_options rr;
  rr.require_response = true;  // implied: every target acknowledges a broadcast anyway
  ASSERT_EQ(a_->n->broadcast(
                broadcast_target::in_subnet({0x100, 8}), 2, "b", 1, 20000,
                [&](const broadcast_report&) { ++called; }, rr),
            errc::ok);
  ASSERT_TRUE(wait([&] { return called == 1; }));
  EXPECT_EQ(p_->got.size(), 1U);
}

// Null pointers and loops: node::peer() with a null out answers without writing, and a node
// built on a null loop is refused by start() (it crashed there) and destroyed without one.
TEST_F(NodeContract, ANullOutOrLoopIsAValueNotACrash) {
  make_pair();
  EXPECT_TRUE(a_->n->peer(0x100, nullptr));
  EXPECT_FALSE(a_->n->peer(0x1ff, nullptr));
  node n(nullptr, 0x300, fast_config());
  EXPECT_EQ(n.start(), errc::invalid_argument);
  EXPECT_TRUE(says(n.last_error(), "the loop is null")) << n.last_error().detail;
  EXPECT_FALSE(n.running());
  EXPECT_EQ(n.post(0x300, 1, "x", 1), errc::wrong_state);
}

// reply_error()'s refusals name reply_error, not reply.
TEST_F(NodeContract, ReplyErrorRefusalsNameReplyError) {
  make_pair();
  reply_handle none;
  EXPECT_EQ(a_->n->reply_error(none, 7, "why", 3), errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "node::reply_error: the handle"))
      << a_->n->last_error().detail;
  EXPECT_EQ(a_->n->reply(none, "r", 1), errc::invalid_argument);
  EXPECT_TRUE(says(a_->n->last_error(), "node::reply: the handle")) << a_->n->last_error().detail;
}

// User type 0xffffffff has its own latency histogram: it was the key of the "other" series (the
// types past the first 64 measured), so its samples were exported as type="other".
TEST_F(NodeContract, TheLastUserTypeIsNotTheOtherLatencySeries) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  node_config ac = fast_config(p->n->listen_urls().at(0));
  ac.latency_histograms = true;
  ac.latency_sample_every = 1;
  bus_node* a = make(0x101, ac);
  ASSERT_TRUE(wait([&] { return a->n->up(); }));
  ASSERT_EQ(a->n->send_data(0x100, 0xffffffffU, "x", 1), errc::ok);
  ASSERT_TRUE(wait([&] { return a->reports.size() == 1; }));
  latency_percentiles lp;
  EXPECT_TRUE(a->n->latency_of_type(0xffffffffU, &lp));
  const std::string text = a->n->metrics_text();
  EXPECT_NE(text.find("type=\"4294967295\""), std::string::npos) << text;
  EXPECT_EQ(text.find("type=\"other\""), std::string::npos) << text;
}

// A message refused because its link speaks too old a version (flows need 3) is named so: the
// detail said "the parent refused this node for good: version_mismatch", though the parent had
// accepted it and the node's other sends still went.
TEST_F(NodeContract, ALinkTooOldForTheMessageIsNamedNotAParentsRefusal) {
  node_config pc = fast_config();
  pc.delivery = delivery_mode::next_hop;
  pc.protocol_max = 2;
  p_ = make_root(0x100, {{0x100, 8}}, pc);
  a_ = make_child(0x101, p_);  // end to end
  ASSERT_TRUE(wait([&] { return a_->n->up(); }));
  EXPECT_EQ(a_->n->send_data(0x100, 1, "x", 1), errc::version_mismatch);
  const error_info e = a_->n->last_error();
  EXPECT_FALSE(says(e, "refused this node")) << e.detail;
  EXPECT_TRUE(says(e, "negotiated a protocol version below what this message needs")) << e.detail;
  EXPECT_TRUE(a_->n->up());
}

// A routes answer larger than a frame (here 70 children whose 255-byte host names of control
// bytes are escaped to 1020 bytes each) was refused by the link unseen and the asker got timeout:
// it is cut at a line's end, its last line counting the routes left out.
TEST_F(NodeContract, ARoutesAnswerLargerThanAFrameIsCutNotLost) {
  node_config pc = fast_config();
  pc.heartbeat_timeout_ms = 120000;       // the raw children never ping
  pc.max_unregistered_per_address = 128;  // they all connect at once, from one address
  p_ = make_root(0x100, {{0x100, 8}}, pc);
  constexpr size_t kRaw = 70;
  std::vector<std::unique_ptr<test::raw_child>> raws;
  for (size_t i = 0; i < kRaw; ++i) {
    raws.push_back(std::make_unique<test::raw_child>(0x110 + i, 0x100));
    raws.back()->hostname = std::string(255, '\n');
    raws.back()->start(&loop_, p_->n->listen_urls().at(0));
  }
  node_config ac = fast_config(p_->n->listen_urls().at(0));
  ac.response_timeout_ms = 3000;
  a_ = make(0x101, ac);
  ASSERT_TRUE(wait([&] { return a_->n->up() && p_->n->peers().size() == kRaw + 1; }));
  ASSERT_GT(p_->n->routes_text().size(), size_t{64} << 10);  // the whole text: above any frame
  errc status = errc::wrong_state;                           // none of the answers
  std::string text;
  bool answered = false;
  ASSERT_EQ(a_->n->send_command(0x100, proto::command_id::routes, nullptr, 0,
                                [&](errc e, const uint8_t* d, size_t n) {
                                  status = e;
                                  text.assign(reinterpret_cast<const char*>(d), n);
                                  answered = true;
                                }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return answered; }));
  ASSERT_EQ(status, errc::ok);
  EXPECT_EQ(text.rfind("self 0x100\n", 0), 0U) << text.substr(0, 64);
  size_t shown = 0;
  for (size_t at = text.find("\nchild 0x"); at != std::string::npos;
       at = text.find("\nchild 0x", at + 1)) {
    ++shown;
  }
  const size_t last = text.rfind("\n... ");
  ASSERT_NE(last, std::string::npos)
      << text.substr(text.size() - std::min<size_t>(200, text.size()));
  char* end = nullptr;
  const size_t left = std::strtoull(text.c_str() + last + 5, &end, 10);
  EXPECT_EQ(std::string(end), " more routes not shown (answer limit 65567 bytes)\n");
  EXPECT_GT(left, 0U);
  EXPECT_EQ(shown + left, kRaw + 1);
  for (auto& r : raws) r->ch->close();
  ASSERT_TRUE(wait([&] {
    for (auto& r : raws)
      if (!r->ch->closed()) return false;
    return true;
  }));
}

}  // namespace
}  // namespace uvbus::node_contract_test
