// The callback contract under a relay's walks and back-pressure: what held messages released to a
// returning child may pause, what a node destroyed or stopped from a callback in the middle of a
// release, an overflow's drain, a directory update, a registration or a flow acknowledgement still
// sends (and a stop in a registration registers), and what a relay's loop does while a same-host
// next hop's ring stays full.
#include <gtest/gtest.h>
#include <uv.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "bus/relay_harness.h"
#include "uvbus/node.h"
#include "uvbus/shm.h"

namespace uvbus::node_callback_test {
namespace {

using namespace std::chrono_literals;
using test::bus_node;
using test::send_str;

node_config relay_config() {
  node_config c = test::hop_config();
  c.sibling_direct = false;
  c.heartbeat_timeout_ms = 60000;  // no stall detector or silence timeout inside a test
  return c;
}

// The same with a shared-memory inbox (a same-host peer writes into it).
node_config shm_config(const char* name) {
  node_config c = relay_config();
  c.enable_shm = true;
  c.shm_ring_bytes = size_t{1} << 20;
  c.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name(name)};
  return c;
}

// The relayed messages a raw child got (not its parent's control messages).
size_t relayed(const test::raw_child& x) {
  size_t k = 0;
  for (const auto& m : x.got) {
    k += m.hd.type == proto::msg_type::forward || m.hd.type == proto::msg_type::data ? 1 : 0;
  }
  return k;
}

class NodeCallback : public test::relay_fixture {
 protected:
  // Starts root_ (0x100, subnet 0x100/8) and returns the config of a child of it.
  node_config root_and_child_config() {
    node_config rc = relay_config();
    rc.subnets = {{0x100, 8}};
    root_ = make(0x100, rc);
    node_config cc = relay_config();
    cc.parent_urls = {root_->n->listen_urls().at(0)};
    return cc;
  }
  // Root and child A (relay_fixture), the root holding messages for absent children for a minute.
  void make_held_root_and_sender(node_config rc, node_config ac, const tweak_fn& root_tweak = {}) {
    rc.child_grace_ms = 60000;  // the whole test runs inside the window
    relay_fixture::make_root_and_sender(std::move(rc), std::move(ac), root_tweak);
  }
  // A sends `count` messages of 60 000 bytes to absent child 0x110: the root holds them all.
  void hold(uint64_t count) {
    a_->keep_bytes = false;
    const std::string payload(60000, 'h');
    uint64_t sent = 0;
    ASSERT_TRUE(wait([&] {
      while (sent < count && send_str(a_, 0x110, 1, payload) == errc::ok) ++sent;
      return root_->n->counters().held_for_child == count;
    }));
  }
  // B 0x102, a child of the root with a ring of its own (shm_config(ring_name)), on a loop of its
  // own that runs only while the test turns it; returns once the root writes to B over the ring.
  void start_b_on_own_loop(test::own_loop_node* b, const char* ring_name) {
    node_config bc = shm_config(ring_name);
    bc.parent_urls = {root_->n->listen_urls().at(0)};
    b->keep_bytes = false;
    ASSERT_NO_FATAL_FAILURE(b->start(0x102, std::move(bc)));
    endpoint_info e;
    ASSERT_TRUE(wait([&] {
      b->turn();
      return b->ups > 0 && root_->n->peer(0x102, &e) && e.data_channel == channel_kind::shm;
    }));
  }
  // A sends `payload` to B until A's link stays full (200 refusals in a row); *sent counts the
  // messages A's sends took.
  void send_to_b_until_full(const std::string& payload, uint64_t* sent) {
    int refused = 0;
    ASSERT_TRUE(wait([&] {
      const bool ok = send_str(a_, 0x102, 1, payload) == errc::ok;
      *sent += ok ? 1 : 0;
      refused = ok ? 0 : refused + 1;
      return refused > 200;
    }));
  }
};

// Held messages released to a child that registers go to its overflow when its link's queue is
// full. They did not come from the relay's ring: that must not stop the ring's reader (every
// same-host peer's traffic to the relay waited until the child's overflow drained).
TEST_F(NodeCallback, ReleasingHeldMessagesDoesNotPauseTheRelaysRing) {
  node_config rc = shm_config("cb-root");
  rc.link_queue_bytes = size_t{256} << 10;
  rc.pending_max_bytes = size_t{32} << 20;
  rc.forward_overflow_bytes = size_t{32} << 20;
  make_held_root_and_sender(rc, shm_config("cb-a"));
  endpoint_info e;
  ASSERT_TRUE(a_->n->peer(0x100, &e));
  ASSERT_EQ(e.data_channel, channel_kind::shm);  // A writes into the root's ring
  constexpr uint64_t kCount = 300;               // 18 MB: more than the link queue and socket
  hold(kCount);
  test::raw_child x(0x110, 0x100);
  x.compress = false;
  x.pause_after_register = true;  // what the root releases to it backs up into its overflow
  x.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return x.registered; }));
  ASSERT_EQ(send_str(a_, 0x100, 2, "through the ring"), errc::ok);
  EXPECT_TRUE(wait([&] { return !root_->got.empty(); }, 15s))
      << "the root's ring reader stayed paused behind the child's overflow";
  x.resume_reading();
  ASSERT_TRUE(wait([&] { return relayed(x) + a_drops().size() >= kCount; }));
  EXPECT_EQ(relayed(x), kCount);
  x.ch->close();
  ASSERT_TRUE(wait([&] { return x.ch->closed(); }));
}

// A release that refuses what the child's overflow does not take logs; an on_log that stops the
// relay there closes every link. Every held message is still accounted for: delivered to the
// child, or its source told (what was released after that stop went into a closing link's
// overflow, its sources never told).
TEST_F(NodeCallback, StopFromOnLogInsideAReleaseTellsEverySource) {
  node_config rc = relay_config();
  rc.link_queue_bytes = size_t{256} << 10;
  rc.pending_max_bytes = size_t{32} << 20;
  rc.forward_overflow_bytes = size_t{512} << 10;
  rc.stop_flush_ms = 20000;
  bool stopped = false;
  make_held_root_and_sender(rc, relay_config(), [&](node_callbacks* cb) {
    cb->on_log = [&](log_level, const std::string& m) {
      root_->logs.emplace_back(log_level::warn, m);
      if (!stopped && m.find("0x110") != std::string::npos &&
          (m.find("dropping") != std::string::npos || m.find("refused") != std::string::npos)) {
        stopped = true;
        root_->n->stop();
      }
    };
  });
  constexpr uint64_t kCount = 100;  // 6 MB: more than queue, socket and overflow together
  hold(kCount);
  test::raw_child x(0x110, 0x100);
  x.compress = false;
  x.pause_after_register = true;
  x.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return x.registered && stopped; }));
  x.resume_reading();
  ASSERT_TRUE(wait([&] { return !root_->downs.empty(); }));
  EXPECT_TRUE(wait([&] { return relayed(x) + a_drops().size() == kCount; }, 15s))
      << "X got " << relayed(x) << ", A was told of " << a_drops().size() << " of " << kCount;
  x.ch->close();
  ASSERT_TRUE(wait([&] { return x.ch->closed(); }));
}

// A same-host next hop whose ring stays full (its loop does not run): the relay keeps what it
// relays in the hop's overflow and retries. There is no wake-up for ring space, but retrying from
// the idle handle ran the relay's loop flat out (100 % CPU) until the stall detector closed the
// hop after heartbeat_timeout_ms. Counted: loop iterations while nothing moves; then B reads
// again and gets everything.
TEST_F(NodeCallback, AFullRingOfANextHopDoesNotSpinTheRelaysLoop) {
  node_config rc = shm_config("cb-spin-root");
  rc.forward_overflow_bytes = size_t{1} << 20;
  node_config ac = relay_config();
  ac.link_queue_bytes = size_t{256} << 10;
  make_held_root_and_sender(rc, ac);
  test::own_loop_node b;  // B's loop, run only while B registers
  ASSERT_NO_FATAL_FAILURE(start_b_on_own_loop(&b, "cb-spin-b"));
  uint64_t sent = 0;
  // Until A's link stays full: the root's overflow for B holds messages.
  ASSERT_NO_FATAL_FAILURE(send_to_b_until_full(std::string(60000, 's'), &sent));
  uint64_t turns = 0;
  uv_check_t count;
  uv_check_init(&loop_, &count);
  count.data = &turns;
  uv_check_start(&count, [](uv_check_t* c) { ++*static_cast<uint64_t*>(c->data); });
  run_for(500ms);  // timers only: the harness's 10 ms tick and the nodes' heartbeats
  uv_check_stop(&count);
  uv_close(reinterpret_cast<uv_handle_t*>(&count), nullptr);
  uv_run(&loop_, UV_RUN_NOWAIT);  // its close callback, before `count` goes out of scope
  EXPECT_LT(turns, 5000u) << "the relay's loop spun while the ring stayed full";
  // B reads again: the relay's retries deliver everything, none dropped.
  EXPECT_TRUE(wait([&] {
    b.turn();
    return b.got_count == sent;
  })) << "B got "
      << b.got_count << " of " << sent;
  EXPECT_EQ(root_->n->counters().forward_dropped, 0u);
  b.finish();
}

// Whether a raw child got a relayed message whose payload (the end of its body) is `text`.
bool got_text(const test::raw_child& x, const std::string& text) {
  for (const auto& m : x.got) {
    const std::string body(m.body.begin(), m.body.end());
    if (body.size() >= text.size() &&
        body.compare(body.size() - text.size(), text.size(), text) == 0) {
      return true;
    }
  }
  return false;
}

// A relay draining a next hop's overflow refuses a message the hop cannot take (a call to a
// version-4 link) and logs; an on_log that destroys the relay there ends the drain: nothing more
// is sent by the destroyed node (the walk went on, and the messages after the refused one still
// reached the hop, written after the destruction).
TEST_F(NodeCallback, DestroyFromOnLogWhileDrainingAnOverflowSendsNothingMore) {
  node_config rc = relay_config();
  rc.link_queue_bytes = size_t{256} << 10;
  rc.forward_overflow_bytes = size_t{32} << 20;
  bool destroyed = false;
  make_held_root_and_sender(rc, relay_config(), [&](node_callbacks* cb) {
    cb->on_log = [&](log_level, const std::string& m) {
      if (!destroyed && m.find("dropping") != std::string::npos) {
        destroyed = true;
        root_->n.reset();
      }
    };
  });
  test::raw_child x(0x110, 0x100);
  x.compress = false;
  x.max_version = 4;  // takes no call messages (version 5)
  x.pause_after_register = true;
  x.start(&loop_, root_->n->listen_urls().at(0));
  node_config sc = relay_config();
  sc.parent_urls = {root_->n->listen_urls().at(0)};
  bus_node* s = make(0x102, sc);
  ASSERT_TRUE(wait([&] { return x.registered && s->n->up(); }));
  const std::string payload(60000, 'o');
  int refused = 0;
  ASSERT_TRUE(wait([&] {  // S's messages fill the root's overflow for X (S's link paused)
    refused = send_str(s, 0x110, 1, payload) == errc::ok ? 0 : refused + 1;
    return refused > 200;
  }));
  // In one loop turn, so one write and one read at the root: behind S's in X's overflow, and a
  // marker for the root itself that shows the read happened.
  ASSERT_EQ(a_->n->call(0x110, 2, "call", 4, 20000, [](const call_result&) {}), errc::ok);
  for (const char* t : {"after-1", "after-2", "after-3"}) {
    ASSERT_EQ(send_str(a_, 0x110, 3, t), errc::ok);
  }
  ASSERT_EQ(send_str(a_, 0x100, 4, "marker"), errc::ok);
  ASSERT_TRUE(wait([&] { return !root_->got.empty(); }));
  ASSERT_FALSE(destroyed);
  x.resume_reading();
  ASSERT_TRUE(wait([&] { return destroyed; }));
  // X reads all the destroyed node wrote, then sees its connection close.
  ASSERT_TRUE(wait([&] { return x.closed; }));
  EXPECT_FALSE(got_text(x, "after-1") || got_text(x, "after-2") || got_text(x, "after-3"))
      << "the destroyed relay went on draining the overflow";
  x.ch->close();
  ASSERT_TRUE(wait([&] { return x.ch->closed(); }));
}

// A child's directory update with an entry outside its subnets: the relay ignores it and logs.
// An on_log that destroys the relay there ends the update: the destroyed node forwards none of it
// (the walk went on, and the entries before the refused one still went out to the other peers).
TEST_F(NodeCallback, DestroyFromOnLogInsideADirectoryUpdateForwardsNothing) {
  node_config rc = relay_config();
  rc.subnets = {{0x100, 8}};
  bool destroyed = false;
  root_ = make(0x100, rc, true, [&](node_callbacks* cb) {
    cb->on_log = [&](log_level, const std::string& m) {
      if (!destroyed && m.find("outside its subnets") != std::string::npos) {
        destroyed = true;
        root_->n.reset();
      }
    };
  });
  std::vector<bus_id> d_added;
  node_config dc = relay_config();
  dc.parent_urls = {root_->n->listen_urls().at(0)};
  bus_node* d = make(0x120, dc, true, [&](node_callbacks* cb) {
    cb->on_directory = [&](directory_event ev, const directory_entry& e) {
      if (ev == directory_event::added) d_added.push_back(e.id);
    };
  });
  test::raw_child c(0x110, 0x100);
  c.subnets = {{0x110, 4}};
  c.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return c.registered && d->n->up() && d->n->directory().size() == 2; }));
  proto::directory_body b;
  directory_entry inside;
  inside.id = 0x111;  // below C: forwarded to D
  inside.name = "inside";
  directory_entry outside;
  outside.id = 0x1f0;  // not C's: refused, logged
  outside.name = "outside";
  b.entries = {inside, outside};
  std::vector<uint8_t> body;
  proto::encode_directory(b, &body);
  c.send(proto::msg_type::directory, body);
  ASSERT_TRUE(wait([&] { return destroyed; }));
  // D reads all the destroyed node wrote, then sees its parent's connection close.
  ASSERT_TRUE(wait([&] { return !d->downs.empty(); }));
  EXPECT_EQ(std::count(d_added.begin(), d_added.end(), bus_id{0x111}), 0)
      << "the destroyed relay forwarded the update";
  c.ch->close();
  ASSERT_TRUE(wait([&] { return c.ch->closed(); }));
}

// A relay destroyed from the on_log of a child's registration ("accepted child ...") sends that
// child nothing more: it went on registering it and sent it everything held for it
// (child_grace_ms), written after the destruction.
TEST_F(NodeCallback, DestroyFromOnLogWhileAcceptingAChildSendsItNothing) {
  node_config rc = relay_config();
  bool destroyed = false;
  make_held_root_and_sender(rc, relay_config(), [&](node_callbacks* cb) {
    cb->on_log = [&](log_level, const std::string& m) {
      if (!destroyed && m.find("accepted child 0x110") != std::string::npos) {
        destroyed = true;
        root_->n.reset();
      }
    };
  });
  hold(3);
  test::raw_child x(0x110, 0x100);
  x.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return destroyed; }));
  ASSERT_TRUE(wait([&] { return x.closed; }));  // it read all the destroyed node wrote
  EXPECT_EQ(relayed(x), 0u) << "the destroyed relay released what it held to the child";
}

// A child destroyed from on_up (the documented place for any callback to destroy the node) sends
// nothing more: the messages it queued before its parent took it went out after the destruction.
TEST_F(NodeCallback, DestroyFromOnUpSendsNothingQueuedForTheParent) {
  node_config cc = root_and_child_config();
  bus_node* c = nullptr;
  bool destroyed = false;
  c = make(0x101, cc, false, [&](node_callbacks* cb) {
    cb->on_up = [&](bus_id) {
      destroyed = true;
      c->n.reset();
    };
  });
  ASSERT_EQ(c->n->start(), errc::ok);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(send_str(c, 0x100, 1, "queued"), errc::ok);
  ASSERT_TRUE(wait([&] { return destroyed; }));
  ASSERT_TRUE(wait([&] { return !root_->removed.empty(); }));  // it read all the child wrote
  EXPECT_TRUE(root_->got.empty()) << root_->got.size() << " messages from the destroyed child";
}

// A node destroyed from on_endpoint_added, as its direct link to a sibling comes up, sends that
// sibling nothing: the messages it queued while it looked the sibling up went out after the
// destruction.
TEST_F(NodeCallback, DestroyFromOnEndpointAddedSendsNothingQueuedForTheSibling) {
  node_config cc = root_and_child_config();
  cc.sibling_direct = true;
  bus_node* b = make(0x102, cc);
  bus_node* a = nullptr;
  bool destroyed = false;
  a = make(0x101, cc, true, [&](node_callbacks* cb) {
    cb->on_endpoint_added = [&](const endpoint_info& e) {
      if (e.role != peer_role::sibling) return;
      destroyed = true;
      a->n.reset();
    };
  });
  ASSERT_TRUE(wait([&] { return a->n->up() && b->n->up(); }));
  for (int i = 0; i < 3; ++i) ASSERT_EQ(send_str(a, 0x102, 1, "queued"), errc::ok);
  ASSERT_TRUE(wait([&] { return destroyed; }));
  ASSERT_TRUE(wait([&] {  // B read all the destroyed node wrote
    return std::any_of(b->removed.begin(), b->removed.end(),
                       [](const auto& r) { return r.first == 0x101; });
  }));
  EXPECT_TRUE(b->got.empty()) << b->got.size() << " messages from the destroyed sibling";
}

// A child stopped from on_endpoint_added of its parent (fired while it registers) went on to
// report on_registration(ok) and on_up, and said it was up, on a stopping node. Now nothing
// follows the stop but the goodbye.
TEST_F(NodeCallback, StopFromOnEndpointAddedOfTheParentFiresNoOnUp) {
  node_config cc = root_and_child_config();
  bus_node* c = nullptr;
  c = make(0x101, cc, true, [&](node_callbacks* cb) {
    cb->on_endpoint_added = [&](const endpoint_info& e) {
      c->added.push_back(e);
      if (e.role == peer_role::parent) c->n->stop();
    };
  });
  ASSERT_TRUE(wait([&] { return !c->downs.empty() && !root_->removed.empty(); }));
  EXPECT_EQ(c->ups, 0);
  EXPECT_FALSE(c->n->up());
  EXPECT_TRUE(c->registrations.empty()) << to_string(c->registrations.at(0));
  EXPECT_EQ(c->downs, std::vector<errc>{errc::closed});
}

// A relay stopped from the on_log of a child's registration ("accepted child ...") went on to
// register the child: its link, closing for the stop, was registered again (out of the stop's
// deadline for a peer that does not read) and on_endpoint_added came after the stop. The link
// just closes now, and the stop completes.
TEST_F(NodeCallback, StopFromOnLogWhileAcceptingAChildRegistersItNot) {
  node_config rc = relay_config();
  rc.subnets = {{0x100, 8}};
  bool stopped = false;
  root_ = make(0x100, rc, true, [&](node_callbacks* cb) {
    cb->on_log = [&](log_level, const std::string& m) {
      if (!stopped && m.find("accepted child 0x101") != std::string::npos) {
        stopped = true;
        root_->n->stop();
      }
    };
  });
  node_config cc = relay_config();
  cc.parent_urls = {root_->n->listen_urls().at(0)};
  (void)make(0x101, cc);
  ASSERT_TRUE(wait([&] { return stopped && !root_->downs.empty(); }));
  EXPECT_TRUE(root_->added.empty()) << "on_endpoint_added after stop()";
  EXPECT_EQ(root_->downs, std::vector<errc>{errc::closed});
}

// A same-host child whose ring cannot be opened is logged ("shared memory ... unusable") while
// the relay registers it: that line comes from the loop, once the registration is complete (it
// ran on_log in the middle of it: the child was accepted but not yet a peer).
TEST_F(NodeCallback, AChildsUnusableRingIsLoggedAfterItsRegistration) {
  bool logged = false;
  bool registered_when_logged = false;
  make_held_root_and_sender(shm_config("cb-ring-root"), relay_config(), [&](node_callbacks* cb) {
    cb->on_log = [&](log_level, const std::string& m) {
      if (logged || m.find("unusable") == std::string::npos) return;
      logged = true;
      endpoint_info e;
      registered_when_logged = root_->n->peer(0x110, &e);
    };
  });
  endpoint_info a;
  ASSERT_TRUE(root_->n->peer(0x101, &a));
  test::raw_child x(0x110, 0x100);
  x.host_id = a.info.host_id;  // the root's host: it tries the child's ring
  x.listen = {"shm://" + test::unique_name("cb-missing")};
  x.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return logged; }));
  EXPECT_TRUE(registered_when_logged) << "on_log ran in the middle of the child's registration";
  x.ch->close();
  ASSERT_TRUE(wait([&] { return x.ch->closed(); }));
}

// The flow data messages (flag_flow) a raw child got.
size_t flow_data(const test::raw_child& x) {
  size_t k = 0;
  for (const auto& m : x.got) k += (m.hd.flags & proto::flag_flow) != 0 ? 1 : 0;
  return k;
}

// An end-to-end source whose retransmit buffer was full gets an acknowledgement that frees half
// of it, asking for a resend (a gap): on_writable fires, and an on_writable that destroys the node
// ends the handling there: the destroyed node resends nothing (it resent what was unacknowledged,
// written after the destruction).
TEST_F(NodeCallback, DestroyFromOnWritableOnAFlowAckResendsNothing) {
  node_config rc = relay_config();
  rc.subnets = {{0x100, 8}};
  root_ = make(0x100, rc);
  test::raw_child x(0x110, 0x100);
  x.start(&loop_, root_->n->listen_urls().at(0));
  node_config ac = test::fast_config();
  ac.delivery = delivery_mode::end_to_end;
  ac.sibling_direct = false;
  ac.retransmit_max_messages = 8;
  ac.resend_timeout_ms = 60000;  // no resend of its own within the test
  ac.delivery_timeout_ms = 60000;
  ac.parent_urls = {root_->n->listen_urls().at(0)};
  bool destroyed = false;
  bus_node* a = nullptr;
  a = make(0x101, ac, true, [&](node_callbacks* cb) {
    cb->on_writable = [&](bus_id) {
      destroyed = true;
      a->n.reset();
    };
  });
  ASSERT_TRUE(wait([&] { return x.registered && a->n->up(); }));
  size_t sent = 0;
  while (send_str(a, 0x110, 1, "flow") == errc::ok) ++sent;
  ASSERT_EQ(sent, 8u);
  ASSERT_TRUE(wait([&] { return flow_data(x) == sent; }));
  uint64_t epoch = 0;
  std::memcpy(&epoch, x.got.back().body.data() + 4, 8);  // the flow prefix: type, epoch
  proto::flow_ack_body ack;
  ack.epoch = epoch;
  ack.incarnation = 1;
  ack.through = x.got.back().hd.sequence - 4;  // half acknowledged, a gap after it
  ack.kind = proto::ack_kind::gap;
  std::vector<uint8_t> body(proto::kFlowAckSize);
  proto::encode_flow_ack(ack, body.data());
  proto::header h;
  h.type = proto::msg_type::flow_ack;
  h.source = 0x110;
  h.target = 0x101;
  const std::vector<uint8_t> m = proto::build(h, body);
  ASSERT_EQ(x.ch->send(x.conn, m.data(), m.size()), errc::ok);
  ASSERT_TRUE(wait([&] { return destroyed; }));
  ASSERT_TRUE(wait([&] { return !root_->removed.empty(); }));  // it read all A wrote
  ASSERT_EQ(send_str(root_, 0x110, 9, "marker"), errc::ok);    // behind what it relayed
  ASSERT_TRUE(wait([&] { return relayed(x) == flow_data(x) + 1; }));
  EXPECT_EQ(flow_data(x), sent) << "the destroyed source resent what was unacknowledged";
  x.ch->close();
  ASSERT_TRUE(wait([&] { return x.ch->closed(); }));
}

// Relayed messages that wait in the relay's coalescing stage for a full ring are dropped with the
// stage when that ring's region goes (here removed by an operator while B lives on): each source
// is told, and what follows goes over the stream. B reads its ring dry first (the relay's loop
// does not run meanwhile), so every message A sent is either one B got or one A was told of.
TEST_F(NodeCallback, RelayedMessagesInAStageForAGoneRingAreToldToTheirSources) {
  node_config rc = shm_config("cb-stage-root");
  rc.forward_overflow_bytes = size_t{256} << 10;
  node_config ac = relay_config();
  ac.link_queue_bytes = size_t{128} << 10;
  relay_fixture::make_root_and_sender(rc, ac);
  test::own_loop_node b;  // B's loop, run apart from the relay's while it reads its ring dry
  ASSERT_NO_FATAL_FAILURE(start_b_on_own_loop(&b, "cb-stage-b"));
  const std::string ring = b.n->config().listen.at(1);
  uint64_t sent = 0;
  // Until A's link stays full: the ring, the stage, the overflow are. 1000 bytes: small enough
  // to be staged.
  ASSERT_NO_FATAL_FAILURE(send_to_b_until_full(std::string(1000, 's'), &sent));
  shm_region_info info;
  ASSERT_TRUE(test::wait_until(&b.loop, [&] {
    return shm_inspect(ring, &info) == errc::ok && info.read_pos == info.write_pos;
  }));
  ASSERT_GT(b.got_count, 0u);
  ASSERT_EQ(shm_remove(ring, true), errc::ok);  // the stage can never be published now
  ASSERT_TRUE(wait([&] {
    b.turn();
    return b.got_count + a_drops().size() == sent;
  })) << "sent "
      << sent << ", B got " << b.got_count << ", A was told of " << a_drops().size();
  EXPECT_GT(a_drops().size(), 0u);
  EXPECT_EQ(root_->n->counters().forward_dropped, a_drops().size());
  EXPECT_TRUE(root_->logged("staged for a shared-memory ring were dropped"));
  b.finish();
}

}  // namespace
}  // namespace uvbus::node_callback_test
