// Hostile peers against a live bus node's listener, while an honest child keeps exchanging data
// with it in both directions: connections that never speak, frames that stop halfway (slow loris
// at the handshake), garbage, forged and out-of-subnet registrations in bulk, data before
// registration, and connections dropped mid-handshake. The node must close every one of them by
// itself (at once for bad input, at handshake_timeout_ms for the silent and the slow), register
// nobody but the honest child, keep its memory, and never disturb the honest link.
#include <gtest/gtest.h>
#include <uv.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/wire.h"
#include "hardening_util.h"
#include "uvbus/node.h"
#include "uvbus/queue_config.h"

namespace uvbus::hardening::hostile_node_test {
namespace {

using namespace std::chrono_literals;
using test::wait_until;

constexpr bus_id kRoot = 0x1000;
constexpr bus_id kChild = 0x1001;
constexpr uint32_t kHandshakeMs = 300;

node_config config(uint32_t handshake_ms) {
  node_config c = test::fast_config();
  c.handshake_timeout_ms = handshake_ms;
  c.heartbeat_interval_ms = 200;
  c.access_tokens = {"secret"};
  // Hundreds of hostile peers from 127.0.0.1 here, to see what each one costs and how the node
  // ends it; the per-address cap would refuse all but 64 (unregistered_flood_test.cpp tests it).
  c.max_unregistered_per_address = 0;
  return c;
}

// A register_req a peer could forge without the token: well formed, wrong proof.
std::vector<uint8_t> forged_register(bus_id id) {
  proto::register_body b;
  b.role = proto::link_role::child;
  b.info.id = id;
  b.info.pid = 4242;
  b.info.host_id = "forged";
  b.info.hostname = "attacker";
  std::vector<uint8_t> body;
  proto::encode_register(b, &body);
  proto::header h;
  h.type = proto::msg_type::register_req;
  h.source = id;
  h.target = kRoot;
  const std::vector<uint8_t> msg = proto::build(h, body);
  return frame_of(msg.data(), msg.size());
}

std::vector<uint8_t> data_before_registration() {
  uint8_t body[proto::kDataPrefix + 5];
  proto::encode_data_prefix(7, body);
  // NOLINTNEXTLINE(bugprone-not-null-terminated-result): payload bytes, not a C string
  std::memcpy(body + proto::kDataPrefix, "hello", 5);
  proto::header h;
  h.type = proto::msg_type::data;
  h.source = 0x1002;
  h.target = kRoot;
  const std::vector<uint8_t> msg = proto::build(h, std::vector<uint8_t>(body, body + sizeof body));
  return frame_of(msg.data(), msg.size());
}

class HostileNode : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    node_config rc = config(handshake_ms_);
    rc.subnets = {{kRoot, 8}};
    node_callbacks rcb;
    rcb.on_data = [this](bus_id src, uint32_t, const uint8_t* p, size_t n) {
      if (src == kChild) root_got_.emplace_back(reinterpret_cast<const char*>(p), n);
    };
    root_ = std::make_unique<node>(&loop_, kRoot, rc, rcb);
    ASSERT_EQ(root_->start(), errc::ok);
    const std::string url = root_->listen_urls().at(0);
    port_ = static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));

    node_config cc = config(handshake_ms_);
    cc.parent_urls = {url};
    node_callbacks ccb;
    ccb.on_data = [this](bus_id src, uint32_t, const uint8_t* p, size_t n) {
      if (src == kRoot) child_got_.emplace_back(reinterpret_cast<const char*>(p), n);
    };
    child_ = std::make_unique<node>(&loop_, kChild, cc, ccb);
    ASSERT_EQ(child_->start(), errc::ok);
    ASSERT_TRUE(wait_until(&loop_, [&] { return child_->up(); }));
    ASSERT_TRUE(exchange(10));
  }

  void TearDown() override {
    peers_.clear();
    child_.reset();
    root_.reset();
    EXPECT_EQ(test::close_loop(&loop_), 0);
  }

  // n messages each way between the honest child and the root; true when all arrived intact and
  // in order.
  bool exchange(int n) {
    root_got_.clear();
    child_got_.clear();
    std::vector<std::string> sent;
    for (int i = 0; i < n; ++i) {
      std::string m = "honest-" + std::to_string(seq_++);
      m.append(static_cast<size_t>((i * 53) % 2000), 'h');
      if (child_->send_data(kRoot, 1, m.data(), m.size()) != errc::ok) return false;
      if (root_->send_data(kChild, 1, m.data(), m.size()) != errc::ok) return false;
      sent.push_back(std::move(m));
    }
    if (!wait_until(&loop_, [&] {
          return root_got_.size() >= sent.size() && child_got_.size() >= sent.size();
        })) {
      return false;
    }
    return root_got_ == sent && child_got_ == sent;
  }

  void connect_raw(size_t count) {
    while (count > 0) {
      const size_t batch = std::min<size_t>(count, 64);
      for (size_t i = 0; i < batch; ++i) {
        raw_peer p;
        ASSERT_TRUE(p.connect_to(port_));
        peers_.push_back(std::move(p));
      }
      // Let the node accept them (and send its challenges) before the next batch.
      ASSERT_TRUE(exchange(2));
      count -= batch;
    }
  }

  bool all_closed_by_node() {
    return std::all_of(peers_.begin(), peers_.end(),
                       [](raw_peer& p) { return p.closed_by_peer(); });
  }

  bool only_the_honest_child_is_registered() {
    const std::vector<endpoint_info> peers = root_->peers();
    return peers.size() == 1 && peers[0].id == kChild;
  }

  // The root's handshake timeout: short where the test measures it, else long enough that no
  // hostile connection times out before its bytes arrive on a busy machine.
  uint32_t handshake_ms_ = kHandshakeMs;
  uv_loop_t loop_{};
  std::unique_ptr<node> root_;
  std::unique_ptr<node> child_;
  uint16_t port_ = 0;
  int seq_ = 0;
  std::vector<std::string> root_got_;
  std::vector<std::string> child_got_;
  std::vector<raw_peer> peers_;
};

TEST_F(HostileNode, SilentAndHalfFramePeersAreClosedAtTheHandshakeTimeout) {
  ASSERT_TRUE(exchange(20));
  const size_t heap_before = heap_bytes();
  const size_t rss_before = rss_bytes();
  // Every peer's handshake deadline starts when the node accepts it, after this point.
  const auto start = std::chrono::steady_clock::now();
  connect_raw(60);
  {
    const size_t held = heap_bytes() - std::min(heap_bytes(), heap_before);
    const size_t rss_held = rss_bytes() - std::min(rss_bytes(), rss_before);
    // Every accepted connection gets the node's challenge at once; its send ring starts at
    // ring_initial_bytes (4 KiB), not at link_queue_bytes (2 MiB): that and the connection's
    // state are the price of an unregistered connection until the handshake timeout.
    std::printf("[ figures  ] unregistered node connections: %zu heap bytes, %zu RSS bytes each\n",
                held / 60, rss_held / 60);
    RecordProperty("node_unregistered_heap_bytes_per_connection", static_cast<int>(held / 60));
    EXPECT_LE(held, 60 * (write_queue_config{}.ring_initial_bytes + size_t{64} * 1024));
  }
  const std::vector<uint8_t> half = header_announcing(1000);
  for (size_t i = 0; i < peers_.size(); ++i) {
    // On a slow machine the node may already have closed a peer at its handshake timeout: a
    // failed write is then that expected outcome, checked below with the others.
    if (i % 2 == 1 && peers_[i].send_all(&loop_, half)) {
      (void)peers_[i].send_all(&loop_, std::vector<uint8_t>(10, 'x'));
    }
  }
  ASSERT_TRUE(exchange(20));
  ASSERT_TRUE(wait_until(
      &loop_, [&] { return all_closed_by_node(); }, test::kWait));
  const auto took = std::chrono::steady_clock::now() - start;
  // Closed by the timeout, not by accident right away (the window is the handshake timeout).
  EXPECT_GE(took, std::chrono::milliseconds(kHandshakeMs) - 50ms);
  EXPECT_TRUE(only_the_honest_child_is_registered());
  EXPECT_TRUE(exchange(100));
}

// Bad input is closed at once, not by the handshake timeout: a long timeout keeps slow sending on
// a busy machine from closing a connection before its bytes are judged.
class HostileNodeFlood : public HostileNode {
 public:
  HostileNodeFlood() { handshake_ms_ = 20000; }
};

TEST_F(HostileNodeFlood, ARegistrationFloodRegistersNobodyAndClosesEveryone) {
  constexpr size_t kPeers = 250;
  // Baseline after the same exchange as at the end, so the test's own buffers of received
  // messages weigh the same in both measurements.
  ASSERT_TRUE(exchange(200));
  const size_t heap_before = heap_bytes();
  connect_raw(kPeers);
  std::mt19937 rng(99);
  const node_counters before = root_->counters();
  size_t forged = 0;
  for (size_t i = 0; i < kPeers; ++i) {
    std::vector<uint8_t> bytes;
    switch (i % 5) {
      case 0:  // random bytes
        bytes.resize(200);
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
        break;
      case 1:  // a valid frame whose payload is not a bus message
        bytes = frame_of(std::string("definitely not a bus header, but framed correctly"));
        break;
      case 2:  // a forged registration inside the subnet (no token)
        bytes = forged_register(kRoot + 0x10 + i % 200);
        ++forged;
        break;
      case 3:  // a forged registration outside the subnet
        bytes = forged_register(0x9000 + i);
        ++forged;
        break;
      default:  // 4: data before any registration
        bytes = data_before_registration();
        break;
    }
    (void)peers_[i].send_all(&loop_, bytes);
    if (i % 25 == 0) {
      ASSERT_TRUE(exchange(5));
    }
  }
  ASSERT_TRUE(wait_until(
      &loop_, [&] { return all_closed_by_node(); }, test::kWait));
  const node_counters after = root_->counters();
  EXPECT_EQ(after.registrations_accepted, before.registrations_accepted);
  EXPECT_GE(after.registrations_refused + after.protocol_errors,
            before.registrations_refused + before.protocol_errors + forged);
  EXPECT_TRUE(only_the_honest_child_is_registered());
  EXPECT_TRUE(exchange(200));
  // Every hostile connection's state is gone: 250 connections held about 1.4 MiB (5.5 KiB each);
  // 128 KiB of slack for timers, logs and the sanitizers' own bookkeeping (ThreadSanitizer's
  // accounting ended 77 KiB above the baseline once, ASan's within 64 KiB). Repeating the flood
  // showed no growth at all from one round to the next.
  EXPECT_LT(heap_bytes(), heap_before + size_t{128} * 1024);
}

TEST_F(HostileNode, ConnectionsDroppedMidHandshakeLeaveNothingBehind) {
  constexpr size_t kPeers = 120;
  ASSERT_TRUE(exchange(50));
  const size_t heap_before = heap_bytes();
  connect_raw(kPeers);
  const std::vector<uint8_t> reg = forged_register(kRoot + 0x20);
  for (size_t i = 0; i < kPeers; ++i) {
    // Anywhere inside the registration frame, then gone (FIN or RST).
    const size_t cut = 1 + (i * 7) % (reg.size() - 1);
    ASSERT_TRUE(peers_[i].send_all(&loop_, reg.data(), cut));
    if (i % 2 == 0) {
      peers_[i].abort();
    } else {
      peers_[i].close();
    }
  }
  ASSERT_TRUE(exchange(50));
  EXPECT_TRUE(only_the_honest_child_is_registered());
  // The node noticed every disconnect: its per-connection state is released.
  ASSERT_TRUE(wait_until(&loop_, [&] { return heap_bytes() < heap_before + size_t{64} * 1024; }));
  EXPECT_TRUE(exchange(100));
}

}  // namespace
}  // namespace uvbus::hardening::hostile_node_test
