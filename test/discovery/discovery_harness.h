// The discovery tests' fixture: a loop, a real etcd (etcd_fixture.h) and etcd_discovery
// instances whose events, states and log lines are recorded, with waits on conditions.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <uv.h>

#include <chrono>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "discovery/etcd_fixture.h"
#include "test_util.h"
#include "uvbus/discovery.h"

namespace uvbus::test {

struct disc_instance {
  std::unique_ptr<etcd_discovery> d;
  std::vector<std::pair<directory_event, bus_id>> events;
  std::vector<std::string> logs;
  int ups = 0;
  int downs = 0;
  [[nodiscard]] std::set<bus_id> ids() const {
    std::set<bus_id> out;
    for (const directory_entry& e : d->directory()) out.insert(e.id);
    return out;
  }
  [[nodiscard]] size_t count(directory_event ev, bus_id id) const {
    size_t n = 0;
    for (const auto& [e, i] : events) n += (e == ev && i == id) ? 1 : 0;
    return n;
  }
};

// True when one of in's log lines contains both a and b.
inline bool logged(const disc_instance* in, const std::string& a, const std::string& b = "") {
  for (const std::string& l : in->logs) {
    if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
  }
  return false;
}

inline directory_entry test_entry(bus_id id, const std::string& type = "logic") {
  directory_entry e;
  e.id = id;
  e.name = "node-" + std::to_string(id);
  e.type = type;
  e.labels = {{"zone", "a"}, {"version", "7"}};
  e.listen = {"ipv4://127.0.0.1:" + std::to_string(10000 + id % 1000)};
  e.host_id = "host-1";
  e.hostname = "box";
  e.pid = static_cast<uint32_t>(getpid());
  e.start_time_ms = 1700000000000ULL + id;
  e.protocol_version = 5;
  return e;
}

class discovery_fixture : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    insts_.clear();
    etcd_.reset();
    uv_run(&loop_, UV_RUN_NOWAIT);  // close callbacks of the destroyed instances' handles
    uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }
  // Starts an etcd of n members (serving TLS with tls) and waits until each is healthy.
  void start_etcd(size_t n, const etcd_tls_files* tls = nullptr) {
    etcd_ = std::make_unique<etcd_cluster>(n, tls);
    ASSERT_TRUE(etcd_->ok());
    ASSERT_TRUE(etcd_->start());
    ASSERT_TRUE(etcd_->wait_healthy(&loop_, std::chrono::seconds(30))) << "etcd: " << etcd_->dir();
  }
  discovery_config config(std::vector<std::string> eps = {}) {
    discovery_config c;
    c.etcd_endpoints = eps.empty() ? etcd_->endpoints() : std::move(eps);
    c.prefix = "/uvbus-test";
    c.ttl_s = 2;
    c.request_timeout_ms = 2000;
    c.retry_min_ms = 50;
    c.retry_max_ms = 500;
    return c;
  }
  // A started instance registering `self` (id 0: watch only).
  disc_instance* make(const directory_entry& self, discovery_config c) {
    auto& slot = insts_.emplace_back(std::make_unique<disc_instance>());
    disc_instance* in = slot.get();
    discovery_callbacks cb;
    cb.on_directory = [in](directory_event ev, const directory_entry& e) {
      in->events.emplace_back(ev, e.id);
    };
    cb.on_state = [in](bool up) { ++(up ? in->ups : in->downs); };
    cb.on_log = [in](log_level, const std::string& m) { in->logs.push_back(m); };
    in->d = std::make_unique<etcd_discovery>(&loop_, std::move(c), std::move(cb));
    EXPECT_EQ(in->d->start(self), errc::ok) << in->d->last_error().detail;
    return in;
  }
  // Two instances, 0x10 and 0x20, registered with c: runs until both see both and the first is
  // connected, which it must be without a failure.
  std::pair<disc_instance*, disc_instance*> make_two(const discovery_config& c) {
    disc_instance* a = make(test_entry(0x10), c);
    disc_instance* b = make(test_entry(0x20), c);
    const std::set<bus_id> both = {0x10, 0x20};
    EXPECT_TRUE(wait([&] { return a->ids() == both && b->ids() == both && a->d->connected(); }))
        << a->d->last_error().detail;
    EXPECT_EQ(a->d->stats().failures, 0U);
    return {a, b};
  }
  template <class Pred>
  bool wait(Pred&& p, std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    return run_until(&loop_, std::forward<Pred>(p), deadline);
  }
  // Runs the loop for `d` (to check that something does not happen meanwhile).
  void run_for(std::chrono::milliseconds d) {
    run_until(
        &loop_, [] { return false; }, d);
  }
  uv_loop_t loop_{};
  std::unique_ptr<etcd_cluster> etcd_;
  std::deque<std::unique_ptr<disc_instance>> insts_;
};

}  // namespace uvbus::test
