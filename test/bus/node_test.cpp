// Bus nodes end to end: every node lives in this process on one libuv loop, on ports the OS picks
// and shared-memory names unique to the test.
#include "uvbus/node.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bus/auth.h"
#include "bus/bus_harness.h"
#include "bus/wire.h"
#include "uvbus/stream.h"

namespace uvbus::node_test {
namespace {

using namespace std::chrono_literals;

using test::bus_node;
using test::fast_config;
using test::send_str;

class NodeTest : public test::bus_fixture {};

TEST_F(NodeTest, ChildRegistersWithParentAndBothExchangeData) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up() && p->added.size() == 1; }));
  ASSERT_EQ(c->registrations, std::vector<errc>{errc::ok});
  EXPECT_EQ(c->ups, 1);
  EXPECT_EQ(p->ups, 1);  // a root is up once started
  ASSERT_EQ(c->added.size(), 1u);
  EXPECT_EQ(c->added[0].id, 0x100u);
  EXPECT_EQ(c->added[0].role, peer_role::parent);
  EXPECT_EQ(p->added[0].id, 0x101u);
  EXPECT_EQ(p->added[0].role, peer_role::child);
  EXPECT_EQ(p->added[0].info.pid, static_cast<uint32_t>(getpid()));
  EXPECT_EQ(p->added[0].data_channel, channel_kind::stream);

  ASSERT_EQ(send_str(c, 0x100, 7, "up"), errc::ok);
  ASSERT_EQ(send_str(p, 0x101, 8, "down"), errc::ok);
  ASSERT_TRUE(wait([&] { return p->got.size() == 1 && c->got.size() == 1; }));
  EXPECT_EQ(p->got[0].source, 0x101u);
  EXPECT_EQ(p->got[0].type, 7u);
  EXPECT_EQ(p->got[0].bytes, "up");
  EXPECT_EQ(c->got[0].source, 0x100u);
  EXPECT_EQ(c->got[0].bytes, "down");
  ASSERT_TRUE(wait([&] { return c->reports.size() == 1 && p->reports.size() == 1; }));
  EXPECT_EQ(c->reports[0].status, errc::ok);
  EXPECT_TRUE(c->reports[0].end_to_end);  // the default: reported once the target got it
  // Heartbeats measure a round trip.
  ASSERT_TRUE(wait([&] {
    endpoint_info e;
    return c->n->peer(0x100, &e) && e.rtt_ns > 0;
  }));
}

TEST_F(NodeTest, GatherFormSendsTheConcatenation) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  const const_buffer spans[] = {{"head|", 5}, {nullptr, 0}, {"body|", 5}, {"tail", 4}};
  uint64_t id = 0;
  ASSERT_EQ(c->n->send_datav(0x100, 4, spans, 4, {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return p->got.size() == 1 && c->reports.size() == 1; }));
  EXPECT_EQ(p->got[0].bytes, "head|body|tail");
  EXPECT_EQ(p->got[0].type, 4u);
  EXPECT_EQ(c->reports[0].message_id, id);
  // The limit applies to the sum of the spans.
  std::string half(c->n->config().message_limit / 2 + 1, 'x');
  const const_buffer big[] = {{half.data(), half.size()}, {half.data(), half.size()}};
  EXPECT_EQ(c->n->send_datav(0x100, 4, big, 2), errc::message_too_large);
  const const_buffer bad[] = {{nullptr, 3}};
  EXPECT_EQ(c->n->send_datav(0x100, 4, bad, 1), errc::invalid_argument);
}

TEST_F(NodeTest, ImmediateErrorsProduceNoReport) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  std::string big(p->n->config().message_limit + 1, 'x');
  EXPECT_EQ(send_str(p, 0x101, 1, big), errc::message_too_large);
  EXPECT_EQ(send_str(p, 0x150, 1, "x"), errc::unknown_route);  // ours, no such child
  EXPECT_EQ(send_str(p, 0x999, 1, "x"), errc::unknown_route);  // a root has no parent
  node n(&loop_, 5, fast_config());
  EXPECT_EQ(n.send_data(1, 1, "x", 1), errc::wrong_state);  // not started
  run_for(50ms);
  EXPECT_TRUE(p->reports.empty());
}

TEST_F(NodeTest, MessageToSelfIsDeliveredFromTheLoop) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  ASSERT_EQ(send_str(p, 0x100, 3, "me"), errc::ok);
  EXPECT_TRUE(p->got.empty());  // never inline
  ASSERT_TRUE(wait([&] { return p->got.size() == 1 && p->reports.size() == 1; }));
  EXPECT_EQ(p->got[0].source, 0x100u);
}

TEST_F(NodeTest, MessagesSentBeforeRegistrationWaitAndArrive) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_FALSE(c->n->up());
  for (int i = 0; i < 10; ++i) ASSERT_EQ(send_str(c, 0x100, 1, std::to_string(i)), errc::ok);
  ASSERT_TRUE(wait([&] { return p->got.size() == 10; }));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(p->got[i].bytes, std::to_string(i));
  ASSERT_TRUE(wait([&] { return c->ok_reports() == 10; }));
}

TEST_F(NodeTest, PendingMessagesFailWithTimeoutWhenTheParentNeverComes) {
  // A parent address nobody listens on: connects fail, the queue times out. A unix path never
  // created (a closed root's TCP port could be taken by another test's root meanwhile, which
  // refused this child out_of_subnet).
  const std::string url = "unix:///tmp/" + test::unique_name("no-parent") + ".sock";
  node_config cfg = fast_config();
  cfg.pending_timeout_ms = 200;
  cfg.parent_urls = {url};
  bus_node* c = make(0x101, cfg);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(send_str(c, 0x100, 1, "x"), errc::ok);
  ASSERT_TRUE(wait([&] { return c->reports.size() == 5; }));
  for (const auto& r : c->reports) EXPECT_EQ(r.status, errc::timeout);
  EXPECT_FALSE(c->registrations.empty());
  EXPECT_NE(c->registrations[0], errc::ok);
  EXPECT_EQ(c->n->counters().pending_now, 0u);
  // Queueing disabled: not_connected at once.
  cfg.pending_max_messages = 0;
  bus_node* d = make(0x102, cfg);
  EXPECT_EQ(send_str(d, 0x100, 1, "x"), errc::not_connected);
}

TEST_F(NodeTest, SiblingsConnectDirectlyOnTheFirstMessage) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* a = make_child(0x101, p);
  bus_node* b = make_child(0x102, p);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  for (int i = 0; i < 20; ++i) ASSERT_EQ(send_str(a, 0x102, 5, std::to_string(i)), errc::ok);
  ASSERT_TRUE(wait([&] { return b->got.size() == 20; }));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(b->got[i].source, 0x101u);
    EXPECT_EQ(b->got[i].bytes, std::to_string(i));  // queued during lookup+connect, in order
  }
  endpoint_info e;
  ASSERT_TRUE(a->n->peer(0x102, &e));
  EXPECT_EQ(e.role, peer_role::sibling);
  ASSERT_TRUE(b->n->peer(0x101, &e));
  EXPECT_EQ(e.role, peer_role::sibling);
  EXPECT_EQ(p->n->counters().forwarded, 0u);  // nothing went through the parent
  // The reverse direction uses the same link.
  ASSERT_EQ(send_str(b, 0x101, 5, "back"), errc::ok);
  ASSERT_TRUE(wait([&] { return a->got.size() == 1; }));
  EXPECT_EQ(p->n->counters().forwarded, 0u);
  ASSERT_TRUE(wait([&] { return a->ok_reports() == 20; }));
}

TEST_F(NodeTest, SiblingLinksCarryTrafficForTheSiblingsDescendants) {
  // r owns a (0x1100/8) and b (0x1200/8); a1 and b1 are their children. Once a and b have a
  // direct link, b relays b1's messages to a over it, and a relays acknowledgements from a1 to b.
  bus_node* r = make_root(0x1000, {{0x1000, 12}});
  bus_node* a = make_child(0x1100, r, {{0x1100, 8}});
  bus_node* b = make_child(0x1200, r, {{0x1200, 8}});
  bus_node* a1 = make_child(0x1101, a);
  bus_node* b1 = make_child(0x1201, b);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up() && a1->n->up() && b1->n->up(); }));
  ASSERT_EQ(send_str(a, 0x1200, 1, "hello sibling"), errc::ok);
  endpoint_info e;
  ASSERT_TRUE(wait([&] { return b->got.size() == 1 && b->n->peer(0x1100, &e); }));
  send_options rr;
  rr.require_response = true;
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(send_str(b1, 0x1100, 2, std::to_string(i), rr), errc::ok);  // b1 -> b -> a
    ASSERT_EQ(send_str(b, 0x1101, 3, std::to_string(i), rr), errc::ok);   // ack a1 -> a -> b
  }
  ASSERT_TRUE(wait([&] { return b1->reports.size() == 10 && b->reports.size() == 10; }));
  for (const auto& rep : b1->reports) EXPECT_EQ(rep.status, errc::ok) << to_string(rep.status);
  for (const auto& rep : b->reports) EXPECT_EQ(rep.status, errc::ok) << to_string(rep.status);
  ASSERT_EQ(a->got.size(), 10u);
  EXPECT_EQ(a1->got.size(), 10u);
  EXPECT_EQ(a->got[0].source, 0x1201u);
  EXPECT_EQ(a->n->counters().protocol_errors + b->n->counters().protocol_errors, 0u);
  ASSERT_TRUE(b->n->peer(0x1100, &e));  // the sibling link survived
}

TEST_F(NodeTest, IdleSiblingLinksAreDropped) {
  node_config cfg = fast_config();
  cfg.sibling_idle_ms = 200;
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* a = make_child(0x101, p, {}, cfg);
  bus_node* b = make_child(0x102, p, {}, cfg);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  ASSERT_EQ(send_str(a, 0x102, 1, "x"), errc::ok);
  endpoint_info e;
  ASSERT_TRUE(wait([&] { return a->n->peer(0x102, &e); }));
  ASSERT_TRUE(wait([&] { return !a->n->peer(0x102, &e) && !b->n->peer(0x101, &e); }));
  // And it comes back on demand.
  ASSERT_EQ(send_str(a, 0x102, 1, "y"), errc::ok);
  ASSERT_TRUE(wait([&] { return b->got.size() == 2; }));
  // One-way traffic keeps it up on both sides: a sends every 50 ms for 3 idle periods.
  ASSERT_TRUE(wait([&] { return a->n->peer(0x102, &e); }));
  const size_t removed_a = a->removed.size();
  const size_t removed_b = b->removed.size();
  for (int i = 0; i < 12; ++i) {
    ASSERT_EQ(send_str(a, 0x102, 1, "z"), errc::ok);
    run_for(50ms);
  }
  EXPECT_EQ(a->removed.size(), removed_a);
  EXPECT_EQ(b->removed.size(), removed_b);
  EXPECT_TRUE(a->n->peer(0x102, &e));
}

TEST_F(NodeTest, ForwardingThroughTheParentPreservesTheSource) {
  node_config cfg = fast_config();
  cfg.sibling_direct = false;
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* a = make_child(0x101, p, {}, cfg);
  bus_node* b = make_child(0x110, p, {{0x110, 4}}, cfg);
  bus_node* bb = make_child(0x11A, b, {}, cfg);  // a grandchild under b's subnet
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up() && bb->n->up(); }));
  ASSERT_EQ(send_str(a, 0x110, 1, "to b"), errc::ok);
  ASSERT_EQ(send_str(a, 0x11A, 2, "to bb"), errc::ok);
  ASSERT_EQ(send_str(bb, 0x101, 3, "to a"), errc::ok);
  ASSERT_TRUE(
      wait([&] { return b->got.size() == 1 && bb->got.size() == 1 && a->got.size() == 1; }));
  EXPECT_EQ(b->got[0].source, 0x101u);
  EXPECT_EQ(bb->got[0].source, 0x101u);
  EXPECT_EQ(bb->got[0].type, 2u);
  EXPECT_EQ(a->got[0].source, 0x11Au);
  EXPECT_EQ(p->n->counters().forwarded, 3u);
  EXPECT_EQ(b->n->counters().forwarded, 2u);
  endpoint_info e;
  EXPECT_FALSE(a->n->peer(0x110, &e));  // no direct link was made
}

TEST_F(NodeTest, RequireResponseReportsEndToEndAndRelaysReportFailures) {
  node_config cfg = fast_config();
  cfg.sibling_direct = false;
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* a = make_child(0x101, p, {}, cfg);
  bus_node* b = make_child(0x102, p, {}, cfg);
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  send_options o;
  o.require_response = true;
  uint64_t id1 = 0;
  uint64_t id2 = 0;
  ASSERT_EQ(a->n->send_data(0x102, 1, "x", 1, o, &id1), errc::ok);
  // 0x1F0 is inside the parent's subnet but nobody has it: the parent answers unknown_route.
  ASSERT_EQ(a->n->send_data(0x1F0, 1, "y", 1, o, &id2), errc::ok);
  ASSERT_TRUE(wait([&] { return a->reports.size() == 2; }));
  std::map<uint64_t, delivery_report> by_id;
  for (const auto& r : a->reports) by_id[r.message_id] = r;
  EXPECT_EQ(by_id[id1].status, errc::ok);
  EXPECT_TRUE(by_id[id1].end_to_end);
  EXPECT_EQ(by_id[id1].target, 0x102u);
  EXPECT_EQ(by_id[id2].status, errc::unknown_route);
  EXPECT_EQ(b->got.size(), 1u);
}

// A scripted peer speaking the protocol over a raw stream channel, for misbehaviour the real node
// never shows: a parent that stops answering, a relay that bounces everything back.
class raw_peer {
 public:
  explicit raw_peer(uv_loop_t* loop) : ch_(loop) {
    stream_callbacks cb;
    cb.on_accepted = [this](connection_id conn) {
      conn_ = conn;
      send_challenge();
    };
    cb.on_connected = [this](connection_id conn, errc st) {
      if (st == errc::ok) conn_ = conn;
    };
    cb.on_disconnected = [this](connection_id, errc) {
      conn_ = connection_id{};
      closed_ = true;
    };
    cb.on_received = [this](connection_id, const uint8_t* d, size_t n) { on_msg(d, n); };
    (void)ch_.set_callbacks(std::move(cb));
  }
  ~raw_peer() { ch_.close(); }

  bus_id id = 0x100;
  std::vector<subnet> subnets;
  bool answer_pings = true;
  bool bounce = false;            // send every data/forward message straight back
  raw_peer* bounce_to = nullptr;  // ... or out through this other peer's connection
  std::vector<proto::header> seen;
  bool registered = false;
  bool closed_ = false;

  std::string listen(const std::string& url = "ipv4://127.0.0.1:0") {
    listener_id l;
    EXPECT_EQ(ch_.listen(url, &l), errc::ok);
    return ch_.listener_url(l);
  }
  bool drop_after_register = false;  // close each link right after accepting its registration
  int registrations = 0;
  void drop() {
    if (conn_) (void)ch_.disconnect(conn_);
  }
  void connect(const std::string& url) { EXPECT_EQ(ch_.connect(url), errc::ok); }

  void send(const std::vector<uint8_t>& m) {
    if (conn_) {
      EXPECT_EQ(ch_.send(conn_, m.data(), m.size()), errc::ok);
    }
  }

 private:
  void send_challenge() {
    proto::challenge_body c;
    c.acceptor_id = id;
    std::vector<uint8_t> b;
    proto::encode_challenge(c, &b);
    proto::header h;
    h.type = proto::msg_type::challenge;
    send(proto::build(h, b));
  }
  void on_msg(const uint8_t* d, size_t n) {
    proto::header h;
    ASSERT_EQ(proto::parse_header(d, n, &h), errc::ok);
    seen.push_back(h);
    const uint8_t* body = d + proto::kHeaderSize;
    switch (h.type) {
      case proto::msg_type::register_req: {  // we are the acceptor: accept anything
        proto::register_body rb;
        ASSERT_EQ(proto::parse_register(body, h.body_len, &rb), errc::ok);
        proto::register_reply_body rr;
        rr.info.id = id;
        rr.info.subnets = subnets;
        std::vector<uint8_t> b;
        proto::encode_register_reply(rr, &b);
        proto::header o;
        o.type = proto::msg_type::register_reply;
        send(proto::build(o, b));
        registered = true;
        ++registrations;
        if (drop_after_register) drop();
        break;
      }
      case proto::msg_type::challenge: {  // we are the connector: register as a child
        proto::challenge_body c;
        ASSERT_EQ(proto::parse_challenge(body, h.body_len, &c), errc::ok);
        proto::register_body rb;
        rb.info.id = id;
        rb.info.subnets = subnets;
        std::vector<uint8_t> b;
        proto::encode_register(rb, &b);
        proto::header o;
        o.type = proto::msg_type::register_req;
        send(proto::build(o, b));
        break;
      }
      case proto::msg_type::register_reply:
        registered = true;
        break;
      case proto::msg_type::ping:
        if (answer_pings) {
          proto::header o = h;
          o.type = proto::msg_type::pong;
          o.source = id;
          o.target = h.source;
          send(proto::build(o, std::vector<uint8_t>(body, body + h.body_len)));
        }
        break;
      case proto::msg_type::data:
      case proto::msg_type::forward:
        if (bounce) (bounce_to != nullptr ? bounce_to : this)->send(std::vector<uint8_t>(d, d + n));
        break;
      default:
        break;
    }
  }

  stream_channel ch_;
  connection_id conn_;
};

TEST_F(NodeTest, TtlStopsAForwardingLoop) {
  // A broken relay: two children of p that pass everything p sends to the first straight back
  // through the second. Sending to an id in the first one's subnet from the second then loops
  // p -> first -> second -> p ... (p never sends a message back out of the link it came in on, so
  // a loop needs two links) until the TTL runs out.
  bus_node* p = make_root(0x1000, {{0x1000, 12}});
  raw_peer second(&loop_);
  second.id = 0x1200;
  second.subnets = {{0x1200, 8}};
  raw_peer first(&loop_);
  first.id = 0x1100;
  first.subnets = {{0x1100, 8}};
  first.bounce = true;
  first.bounce_to = &second;
  first.connect(p->n->listen_urls()[0]);
  second.connect(p->n->listen_urls()[0]);
  ASSERT_TRUE(wait([&] { return first.registered && second.registered && p->added.size() == 2; }));
  proto::header h;
  h.type = proto::msg_type::data;
  h.flags = proto::flag_require_response;
  h.ttl = 5;
  h.source = 0x1200;
  h.target = 0x11AA;
  h.sequence = 42;
  std::vector<uint8_t> body(proto::kDataPrefix, 0);
  second.send(proto::build(h, body));
  ASSERT_TRUE(wait([&] { return p->n->counters().ttl_expired == 1; }));
  // p relayed it with ttl 4, 3, 2, 1, 0 and dropped the sixth arrival.
  std::vector<int> ttls;
  for (const auto& s : first.seen) {
    if (s.type == proto::msg_type::forward) ttls.push_back(s.ttl);
  }
  EXPECT_EQ(ttls, (std::vector<int>{4, 3, 2, 1, 0}));
  EXPECT_EQ(p->n->counters().forwarded, 5u);
  // And the source was told why.
  ASSERT_TRUE(wait(
      [&] { return !second.seen.empty() && second.seen.back().type == proto::msg_type::ack; }));
  EXPECT_EQ(second.seen.back().target, 0x1200u);
  EXPECT_EQ(p->n->counters().protocol_errors, 0u);
}

TEST_F(NodeTest, HeartbeatTimeoutDropsASilentParent) {
  raw_peer parent(&loop_);
  parent.id = 0x100;
  parent.subnets = {{0x100, 8}};
  const std::string url = parent.listen();
  node_config cfg = fast_config();
  cfg.heartbeat_interval_ms = 50;
  cfg.heartbeat_timeout_ms = 300;
  cfg.reconnect_min_ms = 5000;  // do not come back during the test
  cfg.reconnect_max_ms = 5000;
  cfg.parent_urls = {url};
  bus_node* c = make(0x101, cfg);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  // While it answers pings the link stays; then it falls silent.
  ASSERT_FALSE(wait([&] { return !c->downs.empty(); }, 600ms));
  parent.answer_pings = false;
  ASSERT_TRUE(wait([&] { return !c->downs.empty(); }, 3000ms));
  EXPECT_EQ(c->downs[0], errc::timeout);
  EXPECT_EQ(c->n->counters().heartbeat_timeouts, 1u);
  ASSERT_EQ(c->removed.size(), 1u);
  EXPECT_EQ(c->removed[0].second, errc::timeout);
  EXPECT_FALSE(c->n->up());
}

TEST_F(NodeTest, HeartbeatTimeoutDropsASilentChild) {
  node_config cfg = fast_config();
  cfg.heartbeat_interval_ms = 50;
  cfg.heartbeat_timeout_ms = 300;
  bus_node* p = make_root(0x100, {{0x100, 8}}, cfg);
  raw_peer child(&loop_);
  child.id = 0x101;
  child.answer_pings = false;
  child.connect(p->n->listen_urls()[0]);
  ASSERT_TRUE(wait([&] { return p->added.size() == 1; }));
  ASSERT_TRUE(wait([&] { return p->removed.size() == 1; }, 3000ms));
  EXPECT_EQ(p->removed[0].second, errc::timeout);
}

// A parent answering with the id of a peer this node already has (a child here) replaced that
// peer's entry: the child's link kept pointing to the freed one (heap-use-after-free at its next
// message or heartbeat).
TEST_F(NodeTest, AParentAnsweringWithARegisteredPeersIdIsRefused) {
  const std::string path = "/tmp/" + test::unique_name("parent") + ".sock";
  bus_node* n = make_root(0x200, {{0x200, 8}}, fast_config("unix://" + path));
  bus_node* c = make_child(0x201, n);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  raw_peer parent(&loop_);
  parent.id = 0x201;  // the child's id
  parent.listen("unix://" + path);
  const auto refused = [&] {  // the index of the first duplicate_id refusal, or size()
    size_t i = 0;
    while (i < n->registrations.size() && n->registrations[i] != errc::duplicate_id) ++i;
    return i;
  };
  ASSERT_TRUE(wait([&] { return n->ups > 0 || refused() < n->registrations.size(); }));
  EXPECT_EQ(n->ups, 0);
  ASSERT_LT(refused(), n->registrations.size());
  const std::string& why = n->registration_details[refused()];
  EXPECT_NE(why.find("0x201, a registered peer's"), std::string::npos) << why;
  ASSERT_EQ(send_str(c, 0x200, 1, "still here"), errc::ok);  // the child's link is intact
  ASSERT_TRUE(wait([&] { return n->got.size() == 1; }));
  endpoint_info e;
  ASSERT_TRUE(n->n->peer(0x201, &e));
  EXPECT_EQ(e.role, peer_role::child);
}

// A parent that accepted each registration and dropped the link at once was retried every
// reconnect_min_ms for ever (a registration reset the backoff); the backoff now restarts only
// after a link that stayed registered for reconnect_max_ms.
TEST_F(NodeTest, AParentThatDropsEveryRegistrationAtOnceIsRetriedLessAndLessOften) {
  raw_peer parent(&loop_);
  parent.drop_after_register = true;
  node_config cfg = fast_config(parent.listen());
  cfg.reconnect_min_ms = 50;
  cfg.reconnect_max_ms = 800;
  cfg.reconnect_jitter = 0;
  const auto t0 = std::chrono::steady_clock::now();
  bus_node* c = make(0x101, cfg);
  ASSERT_TRUE(wait([&] { return c->ups == 5; }));
  // 50 + 100 + 200 + 400 ms between the five registrations (without backoff: 4 x 50).
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 700ms);
  parent.drop_after_register = false;  // the next link lasts: the backoff starts again
  ASSERT_TRUE(wait([&] { return c->ups == 6; }));
  run_for(900ms);
  ASSERT_TRUE(c->n->up());
  const auto t1 = std::chrono::steady_clock::now();
  parent.drop();
  ASSERT_TRUE(wait([&] { return c->ups == 7; }));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 700ms);  // 50 ms, not 800
}

TEST_F(NodeTest, WrongTokenIsRefusedAndLogged) {
  node_config pc = fast_config();
  pc.access_tokens = {"old-secret", "new-secret"};
  bus_node* p = make_root(0x100, {{0x100, 8}}, pc);
  node_config cc = fast_config();
  cc.access_tokens = {"wrong"};
  bus_node* bad = make_child(0x101, p, {}, cc);
  cc.access_tokens = {"new-secret"};  // rotation: either token is accepted
  bus_node* good = make_child(0x102, p, {}, cc);
  cc.access_tokens = {};
  bus_node* none = make_child(0x103, p, {}, cc);
  ASSERT_TRUE(wait([&] {
    return !bad->registrations.empty() && !none->registrations.empty() && good->n->up();
  }));
  EXPECT_EQ(bad->registrations[0], errc::access_denied);
  EXPECT_EQ(none->registrations[0], errc::access_denied);
  EXPECT_FALSE(bad->n->up());
  EXPECT_GE(p->n->counters().registrations_refused, 2u);
  EXPECT_GE(std::count(p->errors.begin(), p->errors.end(), errc::access_denied), 2);
  EXPECT_TRUE(p->logged("no matching access token"));
  // Without tokens the refusal is a configuration error: no retry, sends fail at once with it
  // (not retriable). With tokens it cannot be proven (the parent does not share ours), so it may
  // come from an impostor: the child says so and retries (docs/security.md).
  run_for(200ms);
  EXPECT_EQ(none->registrations.size(), 1u);
  EXPECT_EQ(send_str(none, 0x100, 1, "x"), errc::access_denied);
  EXPECT_FALSE(is_retriable(errc::access_denied));
  EXPECT_GE(bad->registrations.size(), 2u);
  EXPECT_NE(bad->registration_details[0].find("not proven"), std::string::npos)
      << bad->registration_details[0];
  EXPECT_EQ(send_str(bad, 0x100, 1, "x"), errc::ok) << "queued for the retries";
}

TEST_F(NodeTest, DuplicateAndOutOfSubnetIdsAreRefused) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* first = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return first->n->up(); }));
  bus_node* dup = make_child(0x101, p);
  bus_node* outside = make_child(0x201, p);
  bus_node* wide = make_child(0x1F0, p, {{0x100, 12}});  // subnet wider than the parent's
  ASSERT_TRUE(wait([&] {
    return !dup->registrations.empty() && !outside->registrations.empty() &&
           !wide->registrations.empty();
  }));
  EXPECT_EQ(dup->registrations[0], errc::duplicate_id);
  EXPECT_EQ(outside->registrations[0], errc::out_of_subnet);
  EXPECT_EQ(wide->registrations[0], errc::out_of_subnet);
  EXPECT_TRUE(first->n->up());
  // A duplicate retries (the other may be a dying old instance); it gets in once that is gone.
  destroy(first);
  ASSERT_TRUE(wait([&] { return dup->n->up(); }));
}

// A tool (join_as_tool) takes an id outside the parent's subnets, reaches the nodes below the
// parent and gets their answers; an id inside the subnets is refused (it belongs to a child).
TEST_F(NodeTest, AToolJoinsWithAnIdOutsideTheSubnetsAndTalksBothWays) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  node_config tc = fast_config();
  tc.join_as_tool = true;
  tc.parent_urls = {p->n->listen_urls().at(0)};
  bus_node* inside = make(0x1ff, tc);
  const bus_id tool_id = 0xfffe000000000001ULL;
  bus_node* tool = make(tool_id, tc);
  ASSERT_TRUE(wait([&] { return tool->n->up() && !inside->registrations.empty(); }));
  EXPECT_EQ(inside->registrations[0], errc::out_of_subnet);
  bool listed = false;
  for (const endpoint_info& e : p->n->peers())
    listed |= e.id == tool_id && e.role == peer_role::tool;
  EXPECT_TRUE(listed);
  ASSERT_EQ(send_str(tool, 0x101, 7, "from the tool"), errc::ok);
  ASSERT_TRUE(wait([&] { return !c->got.empty() && tool->ok_reports() == 1; }));
  EXPECT_EQ(c->got[0].source, tool_id);
  EXPECT_EQ(c->got[0].bytes, "from the tool");
  ASSERT_EQ(send_str(c, tool_id, 8, "answer"), errc::ok);
  ASSERT_TRUE(wait([&] { return !tool->got.empty() && c->ok_reports() == 1; }));
  EXPECT_EQ(tool->got[0].source, 0x101U);
  EXPECT_EQ(tool->got[0].bytes, "answer");
  // Through the parent both ways, sibling_direct (on by default) notwithstanding: a tool dials no
  // other node (it did: the child's private address, unreachable from an operator's host).
  for (const endpoint_info& e : tool->n->peers()) EXPECT_EQ(e.id, 0x100U) << std::hex << e.id;
  for (const endpoint_info& e : c->n->peers()) EXPECT_EQ(e.id, 0x100U) << std::hex << e.id;
}

TEST_F(NodeTest, VersionMismatchIsRefused) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  node_config cc = fast_config();
  cc.protocol_min = proto::kMaxVersion + 1;  // a future node only
  cc.protocol_max = proto::kMaxVersion + 2;
  bus_node* c = make_child(0x101, p, {}, cc);
  ASSERT_TRUE(wait([&] { return !c->registrations.empty(); }));
  EXPECT_EQ(c->registrations[0], errc::version_mismatch);
}

TEST_F(NodeTest, CommandsReturnRoutesAndCounters) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  std::string routes;
  std::string counters;
  errc st1 = errc::io_error;
  ASSERT_EQ(c->n->send_command(0x100, proto::command_id::routes, nullptr, 0,
                               [&](errc st, const uint8_t* d, size_t n) {
                                 st1 = st;
                                 routes.assign(reinterpret_cast<const char*>(d), n);
                               }),
            errc::ok);
  ASSERT_EQ(c->n->send_command(0x100, proto::command_id::counters, nullptr, 0,
                               [&](errc, const uint8_t* d, size_t n) {
                                 counters.assign(reinterpret_cast<const char*>(d), n);
                               }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return !routes.empty() && !counters.empty(); }));
  EXPECT_EQ(st1, errc::ok);
  EXPECT_NE(routes.find("self 0x100"), std::string::npos) << routes;
  EXPECT_NE(routes.find("child 0x101"), std::string::npos) << routes;
  EXPECT_NE(counters.find("registrations_accepted=1"), std::string::npos) << counters;
  // To an unknown id inside the parent's subnet: the command fails with a timeout, not silently.
  errc st3 = errc::ok;
  node_config cfg;
  ASSERT_EQ(c->n->send_command(0x100, proto::command_id::echo, "hey", 3,
                               [&](errc st, const uint8_t* d, size_t n) {
                                 st3 = st;
                                 EXPECT_EQ(std::string(reinterpret_cast<const char*>(d), n), "hey");
                               }),
            errc::ok);
  ASSERT_TRUE(wait([&] { return st3 == errc::ok; }));
}

TEST_F(NodeTest, GracefulStopTellsPeersAndFailsPending) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  bus_node* c = make_child(0x101, p);
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  ASSERT_EQ(send_str(c, 0x100, 1, "last words"), errc::ok);
  c->n->stop();
  EXPECT_EQ(send_str(c, 0x100, 1, "too late"), errc::closed);
  ASSERT_TRUE(wait([&] { return !c->downs.empty() && p->removed.size() == 1; }));
  EXPECT_EQ(c->downs.back(), errc::closed);
  ASSERT_EQ(p->got.size(), 1u);  // flushed before closing
  EXPECT_EQ(p->got[0].bytes, "last words");
  ASSERT_EQ(c->reports.size(), 1u);
  EXPECT_EQ(c->reports[0].status, errc::ok);
  EXPECT_EQ(p->removed[0].second, errc::closed);  // it said goodbye
}

// node_config::tls: the links run inside TLS (PSK mode here); a child with another token never
// registers, and the parent keeps serving the honest one.
TEST_F(NodeTest, LinksRunOverTlsAndAWrongTokenNeverRegisters) {
  node_config tc = fast_config();
  tc.tls.mode = tls_mode::psk;
  tc.tls.psk_token = "cluster-token-0123456789abcdef";
  bus_node* p = make_root(0x100, {{0x100, 8}}, tc);
  node_config bad = tc;
  bad.tls.psk_token = "another-token-0123456789abcdef";
  bus_node* intruder = make_child(0x102, p, {}, bad);
  bus_node* c = make_child(0x101, p, {}, tc);
  ASSERT_TRUE(wait([&] { return c->n->up() && p->added.size() == 1; }));
  ASSERT_EQ(send_str(c, 0x100, 7, "up"), errc::ok);
  ASSERT_EQ(send_str(p, 0x101, 8, "down"), errc::ok);
  ASSERT_TRUE(wait([&] { return p->got.size() == 1 && c->got.size() == 1; }));
  EXPECT_EQ(p->got[0].bytes, "up");
  EXPECT_EQ(c->got[0].bytes, "down");
  // The parent refused the intruder's handshake (logged by its stream channel).
  ASSERT_TRUE(wait([&] { return p->logged("tls: handshake failed"); }));
  EXPECT_FALSE(intruder->n->up());
  for (const errc e : intruder->registrations) EXPECT_NE(e, errc::ok);
  EXPECT_EQ(p->added.size(), 1u);
}

}  // namespace
}  // namespace uvbus::node_test
