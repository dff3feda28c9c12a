// Features together: a relay's grace hold or overflow meeting its stop(), relaying with link
// compression near the size limit, and other pairings that single-feature tests do not reach.
#include <gtest/gtest.h>
#include <uv.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "bus/relay_harness.h"
#include "uvbus/node.h"

namespace uvbus::node_combo_test {
namespace {

using namespace std::chrono_literals;
using test::bus_node;
using test::send_str;

// Next-hop delivery, and no direct sibling links: every message between children crosses the root.
node_config tree_config() {
  node_config c = test::hop_config();
  c.sibling_direct = false;
  return c;
}

class NodeCombo : public test::relay_fixture {
 protected:
  // Root and child A (relay_fixture), the root holding messages for absent children for a minute.
  void make_root_and_sender(node_config rc, node_config ac = tree_config()) {
    rc.child_grace_ms = 60000;  // the whole test runs inside the window
    relay_fixture::make_root_and_sender(std::move(rc), std::move(ac));
  }
};

// A relay that stops while it holds messages for a child that has not come back (child_grace_ms)
// tells each source, as it does when it drops them for any other reason: a drop notice for a
// message already reported ok (next hop), the failed report of a require_response message. The
// reason is not_connected (try again: the relay is going, not the target).
TEST_F(NodeCombo, RelayStopTellsTheSourcesOfMessagesHeldForAChild) {
  node_config ac = tree_config();
  ac.response_timeout_ms = 120000;  // a timeout would be the wrong answer, and a late one
  make_root_and_sender(tree_config(), ac);
  std::vector<uint64_t> plain, answered;
  for (int i = 0; i < 3; ++i) {
    uint64_t id = 0;
    ASSERT_EQ(send_str(a_, 0x110, 1, "held", {}, &id), errc::ok);
    plain.push_back(id);
    send_options o;
    o.require_response = true;
    ASSERT_EQ(send_str(a_, 0x110, 1, "held, answered", o, &id), errc::ok);
    answered.push_back(id);
  }
  ASSERT_TRUE(wait([&] { return root_->n->counters().held_for_child == 6; }));
  root_->n->stop();
  ASSERT_TRUE(wait(
      [&] {
        size_t failed = 0;
        for (const uint64_t id : answered) {
          const delivery_report* r = a_->report_for(id);
          failed += r != nullptr && r->status != errc::ok ? 1 : 0;
        }
        return a_drops().size() == plain.size() && failed == answered.size();
      },
      20s))
      << "A was told of " << a_drops().size() << " of " << plain.size()
      << " plain messages; reports " << a_->reports.size();
  for (const auto& d : a_drops()) {
    EXPECT_EQ(d.target, 0x110u);
    EXPECT_EQ(d.why, errc::not_connected) << to_string(d.why);
  }
  for (const uint64_t id : answered) {
    EXPECT_EQ(a_->report_for(id)->status, errc::not_connected)
        << to_string(a_->report_for(id)->status);
  }
  for (const uint64_t id : plain) {
    ASSERT_NE(a_->report_for(id), nullptr);
    EXPECT_EQ(a_->report_for(id)->status, errc::ok);  // next hop: the root's channel took it
  }
  EXPECT_EQ(root_->n->counters().forward_dropped, 6u);
  ASSERT_TRUE(wait([&] { return !root_->downs.empty(); }));
  EXPECT_TRUE(root_->logged("held for"));
}

// A relay waiting in stop() for its own end-to-end acknowledgements (stop_flush_ms) still relays;
// a message for a child in its grace window must not be held then (nothing would release or drop
// it: the hold was silently lost), but refused with not_connected at once.
TEST_F(NodeCombo, StoppingRelayDoesNotHoldMessagesForAChild) {
  node_config rc = test::fast_config();
  rc.stop_flush_ms = 60000;
  make_root_and_sender(rc);
  test::raw_child x(0x1f0, 0x100);  // takes the root's flow data and never acknowledges it
  x.compress = false;
  x.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return x.registered; }));
  ASSERT_EQ(send_str(root_, 0x1f0, 1, "never acknowledged"), errc::ok);
  ASSERT_TRUE(wait([&] { return !x.got.empty(); }));
  root_->n->stop();  // waits for X's acknowledgement, links open
  uint64_t id = 0;
  ASSERT_EQ(send_str(a_, 0x110, 1, "for a child in grace", {}, &id), errc::ok);
  ASSERT_TRUE(wait([&] { return !a_drops().empty(); }, 20s))
      << "held_for_child " << root_->n->counters().held_for_child << ", forward_dropped "
      << root_->n->counters().forward_dropped;
  EXPECT_EQ(a_drops()[0].id, id);
  EXPECT_EQ(a_drops()[0].why, errc::not_connected) << to_string(a_drops()[0].why);
  EXPECT_EQ(root_->n->counters().held_for_child, 0u);
  EXPECT_TRUE(root_->downs.empty());  // still flushing: the relay went on relaying meanwhile
  x.ch->close();
  ASSERT_TRUE(wait([&] { return x.ch->closed(); }));
}

// A relay that stops while relayed messages wait in a slow next hop's overflow tells their sources
// before it says goodbye: dropped when the hop's link closed, after the sources' links had been
// closed too, their drop notices had nowhere to go (next hop: reported ok, then lost unseen).
TEST_F(NodeCombo, RelayStopTellsTheSourcesOfItsOverflow) {
  node_config rc = tree_config();
  rc.link_queue_bytes = size_t{256} << 10;
  rc.forward_overflow_bytes = size_t{512} << 10;
  node_config ac = tree_config();
  ac.link_queue_bytes = size_t{256} << 10;
  make_root_and_sender(rc, ac);
  test::raw_child y(0x102, 0x100);
  y.compress = false;  // what it is sent must fill the socket
  y.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return y.registered; }));
  y.pause_reading();
  const std::string payload(60000, 'x');
  uint64_t sent = 0;
  int refused = 0;
  // A sends to Y until its own link stays full: the root stopped reading it (its overflow for Y
  // holds messages).
  ASSERT_TRUE(wait([&] {
    if (send_str(a_, 0x102, 1, payload) == errc::ok) {
      ++sent;
      refused = 0;
    } else {
      ++refused;
    }
    return refused > 200;
  }));
  ASSERT_EQ(root_->n->counters().forward_dropped, 0u);
  root_->n->stop();
  y.resume_reading();
  ASSERT_TRUE(wait([&] { return !root_->downs.empty(); }));
  const uint64_t dropped = root_->n->counters().forward_dropped;
  EXPECT_GT(dropped, 0u);
  ASSERT_TRUE(wait([&] { return a_drops().size() >= dropped; }, 20s))
      << "root dropped " << dropped << ", A was told of " << a_drops().size() << " (sent " << sent
      << ")";
  EXPECT_EQ(a_drops().size(), dropped);
  for (const auto& d : a_drops()) EXPECT_EQ(d.why, errc::not_connected) << to_string(d.why);
  y.ch->close();
  ASSERT_TRUE(wait([&] { return y.ch->closed(); }));
}

// A child that comes back to a relay holding more for it (child_grace_ms) than its link's queue
// takes gets all of it: what the queue does not take waits in the child's overflow as any relayed
// message does (it was thrown away unseen: next hop, reported ok, never delivered, no notice).
TEST_F(NodeCombo, AReturningChildGetsEverythingHeldForItBeyondItsLinkQueue) {
  node_config rc = tree_config();
  rc.link_queue_bytes = size_t{256} << 10;
  rc.pending_max_bytes = size_t{32} << 20;
  rc.forward_overflow_bytes = size_t{32} << 20;
  make_root_and_sender(rc);
  a_->keep_bytes = false;
  constexpr uint64_t kCount = 300;  // 18 MB: more than the link queue and any socket buffer
  const std::string payload(60000, 'h');
  uint64_t sent = 0;
  ASSERT_TRUE(wait([&] {
    while (sent < kCount && send_str(a_, 0x110, 1, payload) == errc::ok) ++sent;
    return root_->n->counters().held_for_child == kCount;
  }));
  node_config bc = tree_config();
  bc.parent_urls = {root_->n->listen_urls().at(0)};
  bus_node* b = make(0x110, bc, false);
  b->keep_bytes = false;
  ASSERT_EQ(b->n->start(), errc::ok);
  ASSERT_TRUE(wait([&] {
    return b->got_count == kCount || root_->n->counters().forward_dropped + a_drops().size() != 0;
  })) << "B got "
      << b->got_count;
  EXPECT_EQ(b->got_count, kCount);
  EXPECT_EQ(root_->n->counters().forward_dropped, 0u);
  EXPECT_TRUE(a_drops().empty());
  EXPECT_EQ(root_->n->counters().pending_now, 0u);
}

// Largest messages, compressed on both links of a relay, end to end, with a trace context and as
// calls (flow prefix, trace block and call block all at once): each arrives once, intact, and
// its report or answer comes (a relay inflates into a buffer of the frame limit and compresses
// again for the next link).
TEST_F(NodeCombo, LargestCompressibleMessagesCrossACompressingRelayWithTraceAndCalls) {
  node_config c = test::fast_config();
  c.sibling_direct = false;
  c.compression = compression_codec::lz4;
  c.subnets = {{0x100, 8}};
  root_ = make(0x100, c);
  c.subnets.clear();
  c.parent_urls = {root_->n->listen_urls().at(0)};
  a_ = make(0x101, c);
  bus_node* b = make(0x102, c, true, [&b](node_callbacks* cb) {
    cb->on_data = [&b](bus_id src, uint32_t type, const uint8_t* p, size_t n) {
      b->got.push_back({src, type, std::string(reinterpret_cast<const char*>(p), n)});
      if (const reply_handle* h = b->n->incoming_request(); h != nullptr) {
        reply_handle r = *h;
        EXPECT_EQ(b->n->reply(r, p, n), errc::ok);
      }
    };
  });
  ASSERT_TRUE(wait([&] { return a_->n->up() && b->n->up(); }));
  trace_context t;
  t.trace_id.fill(7);
  t.span_id.fill(9);
  send_options o;
  o.trace = &t;
  const size_t big = c.message_limit;
  std::string payload(big, 'z');
  for (size_t i = 0; i < payload.size(); i += 97) payload[i] = static_cast<char>('a' + i % 26);
  ASSERT_EQ(send_str(a_, 0x102, 1, payload, o), errc::ok);
  ASSERT_EQ(send_str(a_, 0x102, 2, payload), errc::ok);
  const std::string request = payload.substr(0, big - 13);  // a call's payload: 13 bytes less
  std::vector<call_result> answers;
  std::vector<std::string> answer_bytes;
  ASSERT_EQ(a_->n->call(
                0x102, 3, request.data(), request.size(), 20000,
                [&](const call_result& r) {
                  answers.push_back(r);
                  answer_bytes.emplace_back(reinterpret_cast<const char*>(r.data), r.size);
                },
                o),
            errc::ok);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 2 && answers.size() == 1; }))
      << a_->reports.size() << " reports, " << answers.size() << " answers, B got "
      << b->got.size();
  for (const auto& r : a_->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  EXPECT_EQ(answers[0].status, errc::ok) << to_string(answers[0].status);
  EXPECT_EQ(answer_bytes[0], request);
  ASSERT_EQ(b->got.size(), 3u);
  EXPECT_EQ(b->got[0].bytes, payload);
  EXPECT_EQ(b->got[1].bytes, payload);
  EXPECT_EQ(b->got[2].bytes, request);
  EXPECT_GE(root_->n->counters().decompressed, 3u);
  EXPECT_GE(root_->n->counters().compressed_sent, 3u);
}

// A same-host peer's ring whose reader is gone while its stream link still looks registered: the
// sender falls back to the stream. That is noticed inside send_data(); the log line it writes
// must not run on_log there (no callback fires from inside a node member function).
TEST_F(NodeCombo, ShmFallbackInsideSendDataDoesNotLogFromInsideTheCall) {
  node_config pc = test::fast_config();
  pc.enable_shm = true;
  pc.shm_ring_bytes = 1 << 20;
  pc.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name("combo-p")};
  pc.subnets = {{0x100, 8}};
  bool inside = false;
  int logged_inside = 0;
  root_ = make(0x100, pc, true, [&](node_callbacks* cb) {
    cb->on_log = [&](log_level, const std::string& m) {
      if (inside) ++logged_inside;
      root_->logs.emplace_back(log_level::info, m);
    };
  });
  node_config bc = pc;
  bc.subnets.clear();
  bc.listen = {"ipv4://127.0.0.1:0", "shm://" + test::unique_name("combo-b")};
  bc.parent_urls = {root_->n->listen_urls().at(0)};
  bus_node* b = make(0x102, bc);
  ASSERT_TRUE(wait([&] { return b->n->up(); }));
  endpoint_info e;
  ASSERT_TRUE(root_->n->peer(0x102, &e));
  ASSERT_EQ(e.data_channel, channel_kind::shm);
  ASSERT_EQ(send_str(root_, 0x102, 1, "through the ring"), errc::ok);
  ASSERT_TRUE(wait([&] { return b->got.size() == 1; }));
  destroy(b);  // its ring's reader goes at once; the root has not seen the link go yet
  inside = true;
  const errc r = send_str(root_, 0x102, 1, "after the reader");
  inside = false;
  EXPECT_EQ(logged_inside, 0) << "send_data returned " << to_string(r);
  ASSERT_TRUE(wait([&] { return root_->logged("shared memory reader gone"); }));
}

// stop() from on_log while the relay refuses a stalled next hop's overflow one message at a time
// (each refusal logs): stop() gives the rest of that overflow back to its sources, and the walk
// that logged must not go on over what stop() took away.
TEST_F(NodeCombo, StopFromOnLogWhileAStalledHopsOverflowIsRefused) {
  node_config rc = tree_config();
  rc.heartbeat_timeout_ms = 1500;
  rc.link_queue_bytes = size_t{256} << 10;
  rc.forward_overflow_bytes = size_t{512} << 10;
  node_config ac = tree_config();
  ac.link_queue_bytes = size_t{256} << 10;
  relay_fixture::make_root_and_sender(rc, ac, [&](node_callbacks* cb) {
    cb->on_log = [&](log_level lv, const std::string& m) {
      root_->logs.emplace_back(lv, m);
      if (m.find("dropping forward message") != std::string::npos) root_->n->stop();
    };
  });
  test::raw_child y(0x102, 0x100);
  y.compress = false;
  y.start(&loop_, root_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return y.registered; }));
  y.pause_reading();
  const std::string payload(60000, 'x');
  auto next_ping = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait([&] {
    for (int i = 0; i < 16 && send_str(a_, 0x102, 1, payload) == errc::ok; ++i) {
    }
    if (std::chrono::steady_clock::now() >= next_ping) {
      y.ping();
      next_ping = std::chrono::steady_clock::now() + 100ms;
    }
    return !root_->downs.empty() || root_->n->counters().forward_dropped > 1;
  }));
  y.resume_reading();
  ASSERT_TRUE(wait([&] { return !root_->downs.empty(); }));
  // At least the message whose log line stopped the node; how many more the overflow held then
  // depends on how much the root had read from A before it paused A's link (timing).
  const uint64_t dropped = root_->n->counters().forward_dropped;
  EXPECT_GE(dropped, 1u);
  // Every one told, the one whose log line stopped the node included (told before the line).
  ASSERT_TRUE(wait([&] { return a_drops().size() >= dropped; }, 20s))
      << "root dropped " << dropped << ", A was told of " << a_drops().size();
  EXPECT_EQ(a_drops().size(), dropped);
  y.ch->close();
  ASSERT_TRUE(wait([&] { return y.ch->closed(); }));
}

// TLS (psk) and lz4 on every link of a relay, largest messages end to end, and the target
// destroyed mid-stream (its link dies with frames half-sent) and replaced: every message is
// reported ok, and the two incarnations together got every one, each in order.
TEST_F(NodeCombo, LargeMessagesOverTlsAndCompressionSurviveATargetDyingMidStream) {
  node_config c = test::fast_config();
  c.sibling_direct = false;
  c.compression = compression_codec::lz4;
  c.tls.mode = tls_mode::psk;
  c.tls.psk_token = "combo-token-0123456789abcdef";
  c.resend_timeout_ms = 50;
  c.delivery_timeout_ms = 60000;
  c.subnets = {{0x100, 8}};
  root_ = make(0x100, c);
  c.subnets.clear();
  c.parent_urls = {root_->n->listen_urls().at(0)};
  a_ = make(0x101, c);
  bus_node* b = make(0x102, c);
  ASSERT_TRUE(wait([&] { return a_->n->up() && b->n->up(); }));
  std::string payload(c.message_limit, 'p');
  constexpr uint64_t kCount = 300;
  uint64_t sent = 0;
  const auto send_until = [&](uint64_t n) {
    return wait([&] {
      while (sent < n) {
        std::memcpy(&payload[0], &sent, sizeof sent);
        if (send_str(a_, 0x102, 1, payload) != errc::ok) break;
        ++sent;
      }
      return sent == n;
    });
  };
  ASSERT_TRUE(send_until(kCount / 2));
  ASSERT_TRUE(wait([&] { return b->got.size() >= 20; }));
  destroy(b);  // frames to it in flight, some half written
  bus_node* b2 = make(0x102, c);
  ASSERT_TRUE(send_until(kCount));
  ASSERT_TRUE(wait([&] { return a_->reports.size() == kCount; }, 2 * test::kWait))
      << a_->reports.size() << " reports";
  for (const auto& r : a_->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  std::vector<bool> seen(kCount, false);
  for (const bus_node* t : {b, b2}) {
    uint64_t last = 0;
    bool first = true;
    for (const auto& m : t->got) {
      ASSERT_EQ(m.bytes.size(), payload.size());
      const uint64_t v = m.value();
      ASSERT_LT(v, kCount);
      EXPECT_TRUE(first || v > last) << "out of order: " << v << " after " << last;
      first = false;
      last = v;
      seen[v] = true;
    }
  }
  for (uint64_t v = 0; v < kCount; ++v) EXPECT_TRUE(seen[v]) << "never delivered: " << v;
  EXPECT_GT(root_->n->counters().decompressed, 0u);
}

// stop() from on_log while the grace hold's deadline refuses held messages one by one (each
// refusal logs): stop() takes what is still held, and the walk that logged must not go on over
// the queues it freed.
TEST_F(NodeCombo, StopFromOnLogWhileHeldMessagesExpire) {
  node_config rc = tree_config();
  rc.child_grace_ms = 5000;  // from the root's start: A registers and sends well inside it
  relay_fixture::make_root_and_sender(rc, tree_config(), [&](node_callbacks* cb) {
    cb->on_log = [&](log_level lv, const std::string& m) {
      root_->logs.emplace_back(lv, m);
      if (m.find("held for children refused") != std::string::npos) root_->n->stop();
    };
  });
  for (int i = 0; i < 3; ++i) ASSERT_EQ(send_str(a_, 0x110 + i % 2, 1, "held"), errc::ok);
  ASSERT_TRUE(wait([&] { return root_->n->counters().held_for_child == 3; }));
  ASSERT_TRUE(wait([&] { return !root_->downs.empty(); }));
  EXPECT_EQ(root_->n->counters().forward_dropped, 3u);
  ASSERT_TRUE(wait([&] { return a_drops().size() == 3; })) << "A was told of " << a_drops().size();
}

}  // namespace
}  // namespace uvbus::node_combo_test
