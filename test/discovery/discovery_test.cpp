// etcd_discovery against a real etcd: two instances register and see each other (and changes
// and leaving), malformed entries written by someone else are skipped, an owner that dies
// without revoking leaves within the TTL, entries an operator deletes are written again by their
// owners, an etcd restart is survived (directory kept, then re-registered), and a 3-member
// cluster losing its leader while nodes register converges.
#include <chrono>

#include "discovery/discovery_harness.h"
#include "discovery/etcd_codec.h"

namespace uvbus::discovery_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using test::disc_instance;
using test::test_entry;

class DiscoveryTest : public test::discovery_fixture {
 protected:
  // Writes key -> value straight into etcd (as another writer of the prefix would).
  void raw_put(const std::string& key, const std::string& value) {
    long status = 0;
    const std::string body = test::http_post(etcd_->endpoint(0) + "/v3/kv/put",
                                             detail::etcd::put_request(key, value, 0), &status);
    ASSERT_EQ(status, 200) << body;
  }
};

TEST_F(DiscoveryTest, TwoInstancesRegisterWatchChangeAndLeave) {
  start_etcd(1);
  // a's TTL is long, so its quick removal below can only come from the revoke; b's is 2 s, so
  // b staying proves its keep-alives.
  discovery_config long_ttl = config();
  long_ttl.ttl_s = 30;
  disc_instance* a = make(test_entry(0x10), long_ttl);
  disc_instance* b = make(test_entry(0x20, "gateway"), config());
  const std::set<bus_id> both = {0x10, 0x20};
  ASSERT_TRUE(wait([&] {
    return a->ids() == both && b->ids() == both && a->d->connected() && b->d->connected();
  }));
  EXPECT_EQ(a->ups, 1);
  directory_entry got;
  ASSERT_TRUE(a->d->lookup(0x20, &got));
  EXPECT_EQ(got, test_entry(0x20, "gateway"));

  // Keep-alive works: nothing leaves over 1.5 TTL.
  run_for(milliseconds(3000));
  EXPECT_EQ(a->count(directory_event::removed, 0x20), 0U);
  EXPECT_EQ(b->count(directory_event::removed, 0x10), 0U);
  EXPECT_EQ(a->d->stats().failures, 0U);

  // A change is seen as `changed`.
  directory_entry moved = test_entry(0x10);
  moved.labels = {{"zone", "b"}};
  ASSERT_EQ(a->d->update_self(moved), errc::ok);
  ASSERT_TRUE(wait([&] { return b->count(directory_event::changed, 0x10) == 1; }));
  ASSERT_TRUE(b->d->lookup(0x10, &got));
  EXPECT_EQ(got, moved);

  // stop() revokes: b sees a leave at once (far within a's 30 s TTL).
  bool stopped = false;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(a->d->stop([&] { stopped = true; }), errc::ok);
  EXPECT_FALSE(stopped);  // never inside the call
  ASSERT_TRUE(
      wait([&] { return stopped && b->count(directory_event::removed, 0x10) == 1; }, seconds(15)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(10000));
  EXPECT_EQ(a->d->stop(nullptr), errc::wrong_state);
}

TEST_F(DiscoveryTest, MalformedEntriesAreSkippedAndLogged) {
  start_etcd(1);
  const std::string p = "/uvbus-test";
  raw_put(p + "/nodes/00000000000000aa", "{not json");
  raw_put(p + "/nodes/not-a-hex-id", detail::etcd::encode_entry(test_entry(0xbb)));
  raw_put(p + "/nodes/00000000000000cc", detail::etcd::encode_entry(test_entry(0xdd)));  // id
  raw_put(p + "/nodes/00000000000000ee", R"({"v":1,"id":"00000000000000ee","pid":"x"})");
  raw_put(p + "/nodes/00000000000000ef", std::string("\x00\xff\x01", 3));
  raw_put(p + "/nodes/0000000000000077", detail::etcd::encode_entry(test_entry(0x77)));
  disc_instance* a = make(test_entry(0x10), config());
  ASSERT_TRUE(wait([&] { return a->ids() == std::set<bus_id>{0x10, 0x77}; }));
  EXPECT_EQ(a->d->stats().malformed, 5U);
  bool logged = false;
  for (const std::string& l : a->logs) logged |= l.find("malformed entry") != std::string::npos;
  EXPECT_TRUE(logged);

  // Garbage written over a valid entry while watching: the entry leaves, nothing else changes.
  raw_put(p + "/nodes/0000000000000077", "[1,2,3]");
  ASSERT_TRUE(wait([&] { return a->count(directory_event::removed, 0x77) == 1; }));
  EXPECT_EQ(a->ids(), std::set<bus_id>{0x10});
  EXPECT_EQ(a->d->stats().malformed, 6U);
  // ... and a valid one again comes back.
  raw_put(p + "/nodes/0000000000000077", detail::etcd::encode_entry(test_entry(0x77)));
  ASSERT_TRUE(wait([&] { return a->count(directory_event::added, 0x77) == 2; }));
  EXPECT_TRUE(a->d->connected());
}

TEST_F(DiscoveryTest, OwnerDyingWithoutRevokeLeavesWithinTheTtl) {
  start_etcd(1);
  disc_instance* a = make(test_entry(0x10), config());
  disc_instance* b = make(directory_entry{}, config());  // watch only
  ASSERT_TRUE(wait([&] { return b->ids() == std::set<bus_id>{0x10} && a->d->connected(); }));
  // kill -9 as etcd sees it: the connection drops and the lease is never revoked nor renewed.
  const auto t0 = std::chrono::steady_clock::now();
  a->d.reset();
  ASSERT_TRUE(wait([&] { return b->count(directory_event::removed, 0x10) == 1; }, seconds(10)));
  const auto took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  // TTL 2 s from the last keep-alive (at most ttl/3 before the kill), plus etcd's 500 ms expiry
  // check and scheduling slack.
  EXPECT_LT(took.count(), 3500) << "took " << took.count() << " ms";
  EXPECT_TRUE(b->ids().empty());
}

// Every entry deleted behind the instances' backs (`etcdctl del --prefix <prefix>/nodes/`): each
// owner writes its own again on its lease, so each sees the other leave and come back, and both
// stay connected. Before, nothing wrote them again: both stayed gone while their owners kept the
// leases alive and reported connected.
TEST_F(DiscoveryTest, OwnEntriesDeletedInEtcdAreWrittenAgain) {
  start_etcd(1);
  const discovery_config c = config();
  auto [a, b] = make_two(c);
  long status = 0;
  const std::string body =
      test::http_post(etcd_->endpoint(0) + "/v3/kv/deleterange",
                      detail::etcd::range_request(c.prefix + "/nodes/"), &status);
  ASSERT_EQ(status, 200) << body;
  const std::set<bus_id> both = {0x10, 0x20};
  ASSERT_TRUE(wait([&] {
    return b->count(directory_event::removed, 0x10) == 1 &&
           a->count(directory_event::removed, 0x20) == 1 && a->ids() == both && b->ids() == both;
  })) << a->ids().size()
      << " " << b->ids().size();
  EXPECT_EQ(b->count(directory_event::added, 0x10), 2U);
  EXPECT_TRUE(a->d->connected() && b->d->connected());
  EXPECT_EQ(a->d->stats().failures + b->d->stats().failures, 0U);
  EXPECT_TRUE(logged(a, "own entry", "written again"));
}

TEST_F(DiscoveryTest, EtcdRestartKeepsTheDirectoryThenReRegisters) {
  start_etcd(1);
  disc_instance* a = make(test_entry(0x10), config());
  disc_instance* b = make(test_entry(0x20), config());
  const std::set<bus_id> both = {0x10, 0x20};
  ASSERT_TRUE(wait([&] { return a->ids() == both && b->ids() == both; }));
  const uint64_t regs = a->d->stats().registrations;

  etcd_->kill_member(0);
  ASSERT_TRUE(wait([&] { return !a->d->connected() && !b->d->connected(); }));
  // Unreachable for a while (several retries): the last directory stays.
  run_for(milliseconds(1500));
  EXPECT_EQ(a->ids(), both);
  EXPECT_EQ(b->ids(), both);
  EXPECT_GE(a->d->stats().failures, 2U);

  ASSERT_TRUE(etcd_->start_member(0));
  ASSERT_TRUE(wait([&] { return a->d->connected() && b->d->connected(); }));
  EXPECT_GT(a->d->stats().registrations, regs);  // a new lease
  disc_instance* c = make(test_entry(0x30), config());
  const std::set<bus_id> three = {0x10, 0x20, 0x30};
  ASSERT_TRUE(wait([&] { return a->ids() == three && b->ids() == three && c->ids() == three; }));
  // The new leases are kept alive: nothing leaves over 1.5 TTL.
  run_for(milliseconds(3000));
  EXPECT_EQ(a->ids(), three);
  EXPECT_EQ(c->ids(), three);
}

TEST_F(DiscoveryTest, LeaderKilledWhileNodesRegisterConverges) {
  start_etcd(3);
  const size_t leader = etcd_->leader();
  ASSERT_LT(leader, etcd_->size());
  std::vector<disc_instance*> insts;
  std::set<bus_id> want;
  const std::vector<std::string> eps = etcd_->endpoints();
  for (bus_id id = 1; id <= 8; ++id) {
    // Each instance starts on another member (the leader's included).
    std::vector<std::string> mine;
    mine.reserve(eps.size());
    for (size_t k = 0; k < eps.size(); ++k) mine.push_back(eps[(id + k) % eps.size()]);
    insts.push_back(make(test_entry(0x100 + id), config(mine)));
    want.insert(0x100 + id);
    if (id == 4) etcd_->kill_member(leader);  // half of them registering meanwhile
  }
  ASSERT_TRUE(wait(
      [&] {
        for (disc_instance* in : insts) {
          if (in->ids() != want || !in->d->connected()) return false;
        }
        return true;
      },
      seconds(45)));
  // Stable afterwards: leases are kept alive through the surviving members.
  run_for(milliseconds(3000));
  for (disc_instance* in : insts) EXPECT_EQ(in->ids(), want);
}

TEST_F(DiscoveryTest, UnreachableEtcdIsRetriedAndConfigIsChecked) {
  const std::vector<int> ports = test::free_ports(1);
  discovery_config c;
  c.etcd_endpoints = {"http://127.0.0.1:" + std::to_string(ports[0])};
  c.retry_min_ms = 20;
  c.retry_max_ms = 40;
  c.ttl_s = 2;
  disc_instance* a = make(test_entry(0x10), c);
  ASSERT_TRUE(wait([&] { return a->d->stats().failures >= 3; }));
  EXPECT_FALSE(a->d->connected());
  EXPECT_EQ(a->d->last_error().code, errc::not_connected);
  EXPECT_NE(a->d->last_error().detail.find("lease grant"), std::string::npos);

  discovery_config bad = c;
  bad.ttl_s = 1;
  std::string why;
  EXPECT_EQ(validate(bad, &why), errc::invalid_argument);
  EXPECT_NE(why.find("ttl_s"), std::string::npos);
  bad = c;
  bad.prefix = "uvbus/";
  EXPECT_EQ(validate(bad, &why), errc::invalid_argument);
  EXPECT_NE(why.find("prefix"), std::string::npos);
  bad = c;
  bad.etcd_endpoints = {"127.0.0.1:2379"};
  EXPECT_EQ(validate(bad, &why), errc::invalid_argument);
  EXPECT_NE(why.find("etcd_endpoints[0]"), std::string::npos);
  etcd_discovery d(&loop_, bad, {});
  EXPECT_EQ(d.start(test_entry(1)), errc::invalid_argument);
  EXPECT_NE(d.last_error().detail.find("etcd_endpoints[0]"), std::string::npos);
}

}  // namespace
}  // namespace uvbus::discovery_test
