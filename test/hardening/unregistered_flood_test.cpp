// Ten thousand silent connections against a live bus node, from many 127.x.y.z source addresses,
// while an honest child keeps exchanging data with it: the node holds at most max_unregistered of
// them (max_unregistered_per_address from one address), refuses and counts the rest at once, its
// memory grows by a bound computed from the config, and the honest link never notices. Once the
// flood leaves, a new peer registers.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "hardening_util.h"
#include "uvbus/node.h"
#include "uvbus/queue_config.h"

namespace uvbus::hardening::unregistered_flood_test {
namespace {

using test::wait_until;

constexpr bus_id kRoot = 0x1000;
constexpr bus_id kChild = 0x1001;
constexpr bus_id kLateChild = 0x1002;
constexpr size_t kWanted = 10000;
constexpr size_t kOneAddress = 100;  // connections from the first source address
constexpr size_t kPerAddress = 50;   // then this many from each further address
constexpr size_t kBatch = 64;        // below the listen backlog: connects complete in the kernel

// How many silent connections this process can hold: each costs a client descriptor here, and
// at most max_unregistered of them a node descriptor as well.
size_t connections_possible(size_t node_side) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
    (void)getrlimit(RLIMIT_NOFILE, &rl);
  }
  const size_t limit = rl.rlim_cur == RLIM_INFINITY ? size_t{1} << 20 : rl.rlim_cur;
  const size_t spare = node_side + 512;  // the node's side, the honest nodes, the test runner
  return limit > spare ? std::min(kWanted, limit - spare) : 0;
}

// The source address of hostile connection i: 127.0.0.2 for the first kOneAddress, then
// kPerAddress each from 127.0.1.0 on.
uint32_t source_of(size_t i) {
  if (i < kOneAddress) return 0x7f000002U;
  return 0x7f000100U + static_cast<uint32_t>((i - kOneAddress) / kPerAddress);
}

// A silent client: connect from `src`, never send. raw_peer's connect is from 127.0.0.1 only.
int silent_connect(uint16_t port, uint32_t src) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(src);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 ||
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What the node did with a silent client: 1 it sent its challenge (held, unregistered), -1 it
// closed the connection (refused), 0 not yet known.
int verdict(int fd) {
  uint8_t buf[256];
  const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  if (r > 0) return 1;
  if (r == 0) return -1;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
}

// A counter of the node's metrics text (0 if absent).
uint64_t metric(const node& n, const std::string& name) {
  const std::string text = n.metrics_text();
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return 0;
  return static_cast<uint64_t>(std::strtod(text.c_str() + at + name.size() + 2, nullptr));
}

class UnregisteredFlood : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    node_config rc = test::fast_config();
    rc.subnets = {{kRoot, 8}};
    rc.handshake_timeout_ms = 600000;  // the flood stays until the test ends it
    node_callbacks rcb;
    rcb.on_data = [this](bus_id src, uint32_t, const uint8_t* p, size_t n) {
      if (src == kChild) root_got_.emplace_back(reinterpret_cast<const char*>(p), n);
    };
    root_ = std::make_unique<node>(&loop_, kRoot, rc, rcb);
    ASSERT_EQ(root_->start(), errc::ok);
    url_ = root_->listen_urls().at(0);
    port_ = static_cast<uint16_t>(std::stoi(url_.substr(url_.rfind(':') + 1)));
    node_callbacks ccb;
    ccb.on_data = [this](bus_id src, uint32_t, const uint8_t* p, size_t n) {
      if (src == kRoot) child_got_.emplace_back(reinterpret_cast<const char*>(p), n);
    };
    child_ = std::make_unique<node>(&loop_, kChild, test::fast_config(url_), ccb);
    ASSERT_EQ(child_->start(), errc::ok);
    ASSERT_TRUE(wait_until(&loop_, [&] { return child_->up(); }));
    ASSERT_TRUE(exchange(20));
  }

  void TearDown() override {
    for (const int fd : fds_) ::close(fd);
    late_.reset();
    child_.reset();
    root_.reset();
    EXPECT_EQ(test::close_loop(&loop_), 0);
  }

  // n messages each way between the honest child and the root, intact and in order.
  bool exchange(int n) {
    root_got_.clear();
    child_got_.clear();
    std::vector<std::string> sent;
    for (int i = 0; i < n; ++i) {
      std::string m = "honest-" + std::to_string(seq_++);
      m.append(static_cast<size_t>((i * 53) % 1500), 'h');
      if (child_->send_data(kRoot, 1, m.data(), m.size()) != errc::ok) return false;
      if (root_->send_data(kChild, 1, m.data(), m.size()) != errc::ok) return false;
      sent.push_back(std::move(m));
    }
    return wait_until(&loop_,
                      [&] {
                        return root_got_.size() >= sent.size() && child_got_.size() >= sent.size();
                      }) &&
           root_got_ == sent && child_got_ == sent;
  }

  // Opens hostile connections [from, to) and runs the loop until the node has held or refused
  // each of them; counts the verdicts.
  void flood(size_t from, size_t to) {
    const size_t first = fds_.size();
    for (size_t i = from; i < to; ++i) {
      const int fd = silent_connect(port_, source_of(i));
      ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
      fds_.push_back(fd);
    }
    std::vector<int> v(fds_.size() - first, 0);
    ASSERT_TRUE(wait_until(&loop_, [&] {
      bool all = true;
      for (size_t k = 0; k < v.size(); ++k) {
        if (v[k] == 0) v[k] = verdict(fds_[first + k]);
        all = all && v[k] != 0;
      }
      return all;
    }));
    for (const int x : v) (x > 0 ? held_ : refused_) += 1;
  }

  uv_loop_t loop_{};
  std::unique_ptr<node> root_;
  std::unique_ptr<node> child_;
  std::unique_ptr<node> late_;
  std::string url_;
  uint16_t port_ = 0;
  int seq_ = 0;
  std::vector<std::string> root_got_;
  std::vector<std::string> child_got_;
  std::vector<int> fds_;
  size_t held_ = 0;
  size_t refused_ = 0;
};

TEST_F(UnregisteredFlood, TenThousandSilentConnectionsAreCappedAndTheHonestPeerUnaffected) {
  const node_config& cfg = root_->config();
  const size_t cap = cfg.max_unregistered;
  const size_t per = cfg.max_unregistered_per_address;
  ASSERT_EQ(cap, 1024u);  // the defaults this test is about
  ASSERT_EQ(per, 64u);
  const size_t n = connections_possible(cap);
  ASSERT_GT(n, cap + kOneAddress) << "too few file descriptors for this test";
  if (n < kWanted) {
    std::printf("[ note     ] file descriptor limit: %zu silent connections instead of %zu\n", n,
                kWanted);
  }
  const uint64_t reconnects = child_->counters().reconnects;
  const size_t heap_before = heap_bytes();
  const size_t rss_before = rss_bytes();
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; i += kBatch) {
    flood(i, std::min(n, i + kBatch));
    if (HasFatalFailure()) return;
    if ((i / kBatch) % 16 == 0) {
      ASSERT_TRUE(exchange(5)) << "after " << i << " connections";
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The first address got max_unregistered_per_address; the others filled max_unregistered.
  EXPECT_EQ(held_, cap);
  EXPECT_EQ(refused_, n - cap);
  EXPECT_EQ(metric(*root_, "uvbus_stream_rejected_total"), n - cap);
  size_t held_first = 0;
  for (size_t i = 0; i < kOneAddress; ++i) held_first += verdict(fds_[i]) == 0 ? 1 : 0;
  EXPECT_EQ(held_first, per);  // still open, challenge already read

  // Memory: each held connection costs its state and a first send ring of ring_initial_bytes
  // (the 2 MiB ring is never allocated for it); refused ones leave nothing behind. The bound is
  // generous (sanitizer allocators, libuv, the node's link table): 16 KiB per held connection
  // beside its ring, plus 8 MiB.
  const size_t ring0 = write_queue_config{}.ring_initial_bytes;
  const size_t heap_grew = heap_bytes() - std::min(heap_bytes(), heap_before);
  const size_t rss_grew = rss_bytes() - std::min(rss_bytes(), rss_before);
  const size_t bound = cap * (ring0 + size_t{16} * 1024) + size_t{8} * 1024 * 1024;
  std::printf(
      "[ figures  ] %zu silent connections in %.1f s: %zu held, %zu refused; heap +%zu KiB "
      "(%zu B per held), RSS +%zu KiB (bound %zu KiB)\n",
      n, secs, held_, refused_, heap_grew / 1024, heap_grew / cap, rss_grew / 1024, bound / 1024);
  RecordProperty("unregistered_heap_bytes_per_held_connection", static_cast<int>(heap_grew / cap));
  EXPECT_LE(heap_grew, bound);
  // RSS also carries the sanitizer's quarantine of what the refused connections freed: twice the
  // bound, and a guard against a 2 MiB ring per connection coming back.
  EXPECT_LE(rss_grew, 2 * bound);

  // The honest link was never touched: same connection, everything delivered.
  EXPECT_TRUE(child_->up());
  EXPECT_EQ(child_->counters().reconnects, reconnects);
  EXPECT_TRUE(exchange(100));

  // The flood leaves; a new peer can register again.
  for (const int fd : fds_) ::close(fd);
  fds_.clear();
  late_ = std::make_unique<node>(&loop_, kLateChild, test::fast_config(url_), node_callbacks{});
  ASSERT_EQ(late_->start(), errc::ok);
  ASSERT_TRUE(wait_until(&loop_, [&] { return late_->up(); }));
  EXPECT_TRUE(exchange(20));
}

}  // namespace
}  // namespace uvbus::hardening::unregistered_flood_test
