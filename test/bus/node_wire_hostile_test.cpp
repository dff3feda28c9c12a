// Routed messages from a hostile peer: malformed bodies relayed to an honest node, acks, command
// replies and drop notices forged by a node that is not the target, broadcast acknowledgements
// pushed onto an older link, bodies not consumed exactly, header layout bytes no release writes,
// and bad bodies read from the shared-memory ring.
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "uvbus/shm.h"

namespace uvbus::node_wire_hostile_test {
namespace {

using test::bus_fixture;
using test::bus_node;
using test::fast_config;

constexpr bus_id kRoot = 0x100;
constexpr subnet kNet{0x100, 8};

// A data body: user type 1, then text.
std::vector<uint8_t> data_body(const std::string& text) {
  std::vector<uint8_t> b(proto::kDataPrefix + text.size());
  b[0] = 1;
  std::memcpy(b.data() + proto::kDataPrefix, text.data(), text.size());
  return b;
}

class NodeWireHostileTest : public bus_fixture {
 protected:
  // Root kRoot owning kNet, patient with raw children that send no heartbeats.
  bus_node* root(node_config c = fast_config(), const tweak_fn& tweak = {}) {
    c.heartbeat_timeout_ms = 60000;
    c.response_timeout_ms = 60000;
    c.subnets = {kNet};
    return make(kRoot, std::move(c), true, tweak);
  }
  // A raw child `id` of r, registered, offering protocol versions up to max_version.
  std::unique_ptr<test::raw_child> raw(bus_node* r, bus_id id,
                                       uint8_t max_version = proto::kMaxVersion) {
    auto c = std::make_unique<test::raw_child>(id, r->n->id());
    c->compress = false;
    c->max_version = max_version;
    c->start(&loop_, r->n->listen_urls().at(0));
    EXPECT_TRUE(wait([&] { return c->registered; }));
    return c;
  }
  // A next-hop root r with raw children c (0x102) and d (0x103, the target: it answers nothing
  // until told), and a require_response message `id` sent to d.
  struct waiting_message {
    bus_node* r = nullptr;
    std::unique_ptr<test::raw_child> c, d;
    uint64_t id = 0;
  };
  waiting_message next_hop_message_waiting() {
    node_config rc = fast_config();
    rc.delivery = delivery_mode::next_hop;
    waiting_message w;
    w.r = root(rc);
    w.c = raw(w.r, 0x102);
    w.d = raw(w.r, 0x103);
    send_options opt;
    opt.require_response = true;
    EXPECT_EQ(w.r->n->send_data(0x103, 1, "x", 1, opt, &w.id), errc::ok);
    return w;
  }
  // Whether t got "text" from `from` (what a test sends last, after what it checks: the path is
  // in order, so everything before it was handled).
  static bool got(const bus_node* t, bus_id from, const std::string& text) {
    for (const auto& m : t->got) {
      if (m.source == from && m.bytes == text) return true;
    }
    return false;
  }
  // The first message of type t c got, or nullptr.
  static const test::raw_child::message* got_type(const test::raw_child& c, proto::msg_type t) {
    for (const auto& m : c.got) {
      if (m.hd.type == t) return &m;
    }
    return nullptr;
  }
  void TearDown() override {
    bus_fixture::TearDown();
    if (!ring_.empty()) (void)shm_remove(ring_);
  }
  std::string ring_;
};

// A malformed body relayed to a node made it close its own link to the relay (its parent): the
// message came from the raw child through the root, and the child's node took the root for the
// culprit. Now the message is dropped and counted; the link stays.
TEST_F(NodeWireHostileTest, ARelayedMalformedBodyDropsTheMessageNotTheRelaysLink) {
  bus_node* r = root();
  bus_node* a = make_child(0x101, r);
  ASSERT_TRUE(wait([&] { return a->ups == 1; }));
  auto c = raw(r, 0x102);
  using proto::msg_type;
  const struct {
    msg_type t;
    size_t size;
    uint8_t flags;
  } bad[] = {
      {msg_type::data, 2, 0},          {msg_type::data, 5, proto::flag_flow | proto::flag_sync},
      {msg_type::ack, 3, 0},           {msg_type::dropped, 4, 0},
      {msg_type::flow_ack, 7, 0},      {msg_type::command, 2, 0},
      {msg_type::command_reply, 3, 0}, {msg_type::broadcast_ack, 1, 0}};
  uint64_t seq = 0;
  for (const auto& b : bad) c->send_to(0x101, b.t, std::vector<uint8_t>(b.size), b.flags, 0, ++seq);
  c->send_to(0x101, msg_type::data, data_body("after"), 0, 0, ++seq);
  ASSERT_TRUE(wait([&] { return got(a, 0x102, "after"); }));
  EXPECT_TRUE(a->downs.empty());
  EXPECT_EQ(a->ups, 1);
  EXPECT_EQ(a->n->counters().protocol_errors, std::size(bad));
  EXPECT_TRUE(a->logged("dropping forward message 1 0x102 -> 0x101: bad data body"));
  EXPECT_FALSE(c->closed);
}

// An ok ack was matched by the acknowledged sequence alone, and a command reply by its sequence:
// any node could report a message delivered, or answer a command, for a target that never did.
// Now only the target's count; the target's own still do.
TEST_F(NodeWireHostileTest, AnOkAckOrCommandReplyFromAnotherNodeIsIgnored) {
  waiting_message w = next_hop_message_waiting();
  bus_node* r = w.r;
  test::raw_child* c = w.c.get();
  test::raw_child* d = w.d.get();
  const uint64_t id = w.id;
  int answers = 0;
  std::string answer;
  ASSERT_EQ(r->n->send_command(0x103, proto::command_id::echo, "e", 1,
                               [&](errc e, const uint8_t* p, size_t n) {
                                 ++answers;
                                 answer = e == errc::ok ? std::string(p, p + n) : to_string(e);
                               }),
            errc::ok);
  using proto::msg_type;
  ASSERT_TRUE(
      wait([&] { return got_type(*d, msg_type::data) && got_type(*d, msg_type::command); }));
  const uint64_t data_seq = got_type(*d, msg_type::data)->hd.sequence;
  const uint64_t cmd_seq = got_type(*d, msg_type::command)->hd.sequence;
  const auto answer_as = [&](test::raw_child& from, const std::string& text) {
    std::vector<uint8_t> ack(proto::kAckSize);
    proto::encode_ack({data_seq, proto::reason::ok}, ack.data());
    from.send(proto::msg_type::ack, ack);
    std::vector<uint8_t> reply;
    proto::encode_command_reply(static_cast<uint32_t>(proto::command_id::echo), proto::reason::ok,
                                text.data(), text.size(), &reply);
    from.send(proto::msg_type::command_reply, reply, 0, 0, cmd_seq);
  };
  answer_as(*c, "forged");
  c->send(proto::msg_type::data, data_body("after"));
  ASSERT_TRUE(wait([&] { return got(r, 0x102, "after"); }));
  EXPECT_EQ(r->report_for(id), nullptr);
  EXPECT_EQ(answers, 0);
  answer_as(*d, "e");
  ASSERT_TRUE(wait([&] { return r->report_for(id) != nullptr && answers == 1; }));
  EXPECT_EQ(r->report_for(id)->status, errc::ok);
  EXPECT_EQ(answer, "e");
}

// A drop notice with reason 0 (ok) was taken as the report of the require_response message it
// named: any node linked to the sender could make a message report ok that its target never got.
// No relay sends reason 0: now a protocol error (from the link's own peer: its link is closed).
TEST_F(NodeWireHostileTest, ADropNoticeWithReasonOkIsAProtocolErrorNotAReport) {
  waiting_message w = next_hop_message_waiting();
  bus_node* r = w.r;
  test::raw_child* c = w.c.get();
  test::raw_child* d = w.d.get();
  const uint64_t id = w.id;
  ASSERT_TRUE(wait([&] { return got_type(*d, proto::msg_type::data) != nullptr; }));
  const uint64_t data_seq = got_type(*d, proto::msg_type::data)->hd.sequence;
  std::vector<uint8_t> notice;
  proto::encode_dropped({data_seq, 0x103, proto::reason::ok}, &notice);
  c->send(proto::msg_type::dropped, notice);
  ASSERT_TRUE(wait([&] { return c->closed || r->report_for(id) != nullptr; }));
  EXPECT_EQ(r->report_for(id), nullptr);
  EXPECT_TRUE(c->closed);
  EXPECT_EQ(r->n->counters().protocol_errors, 1U);
  std::vector<uint8_t> ack(proto::kAckSize);
  proto::encode_ack({data_seq, proto::reason::ok}, ack.data());
  d->send(proto::msg_type::ack, ack);
  ASSERT_TRUE(wait([&] { return r->report_for(id) != nullptr; }));
  EXPECT_EQ(r->report_for(id)->status, errc::ok);
}

// A broadcast acknowledgement (type 16, version 6) was relayed to a link of version 5, and a
// node acknowledged a broadcast over one: an older peer closes its link on a type it does not
// know. Now dropped and counted, as a drop notice is for a version-1 link.
TEST_F(NodeWireHostileTest, ABroadcastAckNeverGoesToALinkBelowVersion6) {
  bus_node* r = root();
  auto c = raw(r, 0x102);
  auto old = raw(r, 0x104, 5);
  c->send_to(0x104, proto::msg_type::broadcast_ack, {}, 0, 0, 7);
  c->send(proto::msg_type::data, data_body("c"));
  std::vector<uint8_t> b;
  broadcast_target to;
  to.by_subnet = true;
  to.net = kNet;
  proto::encode_broadcast_head(to, 1, &b);
  b.push_back('!');
  old->send(proto::msg_type::broadcast, b, 0, 0, 8);
  ASSERT_TRUE(wait([&] { return got(r, 0x102, "c") && got(r, 0x104, "!"); }));
  ASSERT_EQ(test::send_str(r, 0x104, 1, "after"), errc::ok);
  ASSERT_TRUE(wait([&] { return got_type(*old, proto::msg_type::data) != nullptr; }));
  EXPECT_EQ(got_type(*old, proto::msg_type::broadcast_ack), nullptr);
  EXPECT_GE(r->n->counters().forward_dropped, 2u);
}

// A bye without its reason, a broadcast acknowledgement with a body, and a header whose layout
// byte is not 1 (a node took 1..6, and relayed the byte on to peers that take only 1) were
// accepted; the protocol says each is a protocol error. Now the link is closed and it is counted.
TEST_F(NodeWireHostileTest, BodiesNotConsumedExactlyAndOtherHeaderLayoutsAreRefused) {
  bus_node* r = root();
  const std::vector<std::function<void(test::raw_child&)>> sends = {
      [](test::raw_child& c) { c.send(proto::msg_type::bye, {}); },
      [](test::raw_child& c) { c.send(proto::msg_type::broadcast_ack, {0}); },
      [](test::raw_child& c) {
        proto::header h;
        h.type = proto::msg_type::data;
        h.source = c.id;
        h.target = c.parent;
        std::vector<uint8_t> m = proto::build(h, data_body("v2"));
        m[0] = 2;
        (void)c.ch->send(c.conn, m.data(), m.size());
      }};
  uint64_t errors = 0;
  bus_id id = 0x110;
  for (const auto& send : sends) {
    auto c = raw(r, ++id);
    send(*c);
    EXPECT_TRUE(wait([&] { return c->closed; })) << id;
    EXPECT_EQ(r->n->counters().protocol_errors, ++errors) << id;
  }
  EXPECT_TRUE(r->got.empty());
}

// A malformed body read from the shared-memory ring was dropped without a trace (a bad header
// there was counted). Now counted as a protocol error like one. The same for a broadcast (a
// selector of kind 9, a body cut short inside its subnet selector): it was dropped, uncounted.
TEST_F(NodeWireHostileTest, AMalformedBodyFromTheRingIsCounted) {
  ring_ = "shm://" + test::unique_name("wire-hostile");
  node_config rc = fast_config();
  rc.enable_shm = true;
  rc.shm_ring_bytes = size_t{1} << 20;
  rc.listen.push_back(ring_);
  bus_node* r = root(rc);
  shm_writer w;
  ASSERT_EQ(w.open(ring_), errc::ok);
  proto::header h;
  h.type = proto::msg_type::data;
  h.source = 0x102;
  h.target = kRoot;
  proto::header bh = h;
  bh.type = proto::msg_type::broadcast;
  bh.target = 0;
  bh.sequence = 1;
  for (const std::vector<uint8_t>& body : {std::vector<uint8_t>{9, 0, 0, 0, 0}, {2, 0, 1}}) {
    const std::vector<uint8_t> m = proto::build(bh, body);
    ASSERT_EQ(w.send(m.data(), m.size()), errc::ok);
  }
  for (const std::vector<uint8_t>& body : {std::vector<uint8_t>(2), data_body("after")}) {
    const std::vector<uint8_t> m = proto::build(h, body);
    ASSERT_EQ(w.send(m.data(), m.size()), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return got(r, 0x102, "after"); }));
  EXPECT_EQ(r->n->counters().protocol_errors, 3u);
  EXPECT_TRUE(r->logged("dropping broadcast message 1 0x102 -> 0x0: bad broadcast body"));
  w.close();
}

// A trace block with all-zero ids (the protocol says they never are) was handed to on_data:
// incoming_trace() was not null but not valid(), and an application passing it on to its own
// send had that refused, invalid_argument, for the peer's fault. Now it counts as no trace: the
// message is delivered with incoming_trace() null; a valid block still comes through.
TEST_F(NodeWireHostileTest, AnAllZeroTraceBlockIsDeliveredAsNoTrace) {
  bus_node* r = nullptr;
  std::vector<bool> traced;
  r = root(fast_config(), [&](node_callbacks* cb) {
    cb->on_data = [inner = cb->on_data, &r, &traced](bus_id s, uint32_t t, const uint8_t* p,
                                                     size_t n) {
      traced.push_back(r->n->incoming_trace() != nullptr);
      inner(s, t, p, n);
    };
  });
  auto c = raw(r, 0x102);
  for (const uint8_t fill : {uint8_t{0}, uint8_t{0x5a}}) {
    std::vector<uint8_t> body(proto::kTraceSize, fill);
    const std::vector<uint8_t> text = data_body(fill == 0 ? "zero" : "valid");
    body.insert(body.end(), text.begin(), text.end());
    c->send(proto::msg_type::data, body, proto::flag_trace);
  }
  ASSERT_TRUE(wait([&] { return got(r, 0x102, "valid"); }));
  EXPECT_TRUE(got(r, 0x102, "zero"));
  EXPECT_EQ(traced, (std::vector<bool>{false, true}));
  EXPECT_EQ(r->n->counters().protocol_errors, 0u);
  EXPECT_FALSE(c->closed);
}

}  // namespace
}  // namespace uvbus::node_wire_hostile_test
