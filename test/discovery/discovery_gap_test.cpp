// A watch gap forced end to end against a real etcd: watchers miss changes, etcd compacts past
// their watch revision, they watch from the compacted revision, etcd cancels the watch with
// compact_revision, and they resync from a range read without losing their own registration.
#include <algorithm>
#include <set>
#include <string>

#include "discovery/discovery_harness.h"
#include "discovery/discovery_impl.h"
#include "discovery/etcd_codec.h"

namespace uvbus::discovery_gap_test {
namespace {

using test::disc_instance;
using test::test_entry;

class DiscoveryGapTest : public test::discovery_fixture {
 protected:
  const std::string nodes_ = "/uvbus-test/nodes/";

  // etcd's current revision (the header of a range read of the prefix).
  int64_t current_revision() {
    long status = 0;
    const std::string body = test::http_post(etcd_->endpoint(0) + "/v3/kv/range",
                                             detail::etcd::range_request(nodes_), &status);
    detail::etcd::range_reply rr;
    std::string why;
    EXPECT_EQ(status, 200) << body;
    EXPECT_TRUE(detail::etcd::parse_range(body, &rr, &why)) << why;
    return rr.revision;
  }
  // Compacts etcd's history up to `rev` (physically: the call returns once it is done).
  void compact(int64_t rev) {
    long status = 0;
    const std::string body = test::http_post(
        etcd_->endpoint(0) + "/v3/kv/compaction",
        R"({"revision":")" + std::to_string(rev) + R"(","physical":true})", &status);
    ASSERT_EQ(status, 200) << body;
  }
  static bool logged_gap(const disc_instance* in) {
    for (const std::string& l : in->logs) {
      if (l.find("compact_revision") != std::string::npos &&
          l.find("resync") != std::string::npos) {
        return true;
      }
    }
    return false;
  }

  // W registers, V only watches, A and Y register; all in sync. Notes W's and V's baselines.
  void start_in_sync() {
    start_etcd(1);
    w_ = make(test_entry(0x10), config());
    v_ = make(directory_entry{}, config());  // watch only
    a_ = make(test_entry(0x20), config());
    y_ = make(test_entry(0x30), config());
    ASSERT_TRUE(wait([&] {
      return w_->ids() == before_ && v_->ids() == before_ && a_->ids() == before_ &&
             w_->d->connected() && v_->d->connected() && y_->d->connected();
    }));
    w0_ = w_->d->stats();
    v0_ = v_->d->stats();
    w_events_ = w_->events.size();
    v_events_ = v_->events.size();
  }
  // While W and V do not watch: X registers, Y stops (its lease revoked), A changes its entry.
  void change_while_unwatched() {
    x_ = make(test_entry(0x40), config());
    bool y_stopped = false;
    ASSERT_EQ(y_->d->stop([&] { y_stopped = true; }), errc::ok);
    ASSERT_EQ(a_->d->update_self(moved_), errc::ok);
    directory_entry got;
    ASSERT_TRUE(wait([&] {
      return y_stopped && a_->ids() == after_ && x_->ids() == after_ && a_->d->lookup(0x20, &got) &&
             got == moved_;
    }));
    EXPECT_EQ(w_->ids(), before_);  // W and V really missed it
    EXPECT_EQ(v_->ids(), before_);
    EXPECT_EQ(w_->events.size(), w_events_);
    EXPECT_EQ(v_->events.size(), v_events_);
  }
  // `in` reached the directory after the changes through one range resync.
  bool converged(const disc_instance* in, const discovery_stats& s0) const {
    directory_entry e;
    return in->ids() == after_ && in->d->lookup(0x20, &e) && e == moved_ &&
           in->d->stats().resyncs == s0.resyncs + 1;
  }
  // Each change seen exactly once, the gap logged, the session never down.
  void expect_each_change_once(const disc_instance* in, size_t events_before) const {
    EXPECT_EQ(in->count(directory_event::added, 0x40), 1U);
    EXPECT_EQ(in->count(directory_event::removed, 0x30), 1U);
    EXPECT_EQ(in->count(directory_event::changed, 0x20), 1U);
    EXPECT_EQ(in->events.size(), events_before + 3);  // exactly those three
    EXPECT_TRUE(logged_gap(in));
    EXPECT_TRUE(in->d->connected());
    EXPECT_EQ(in->downs, 0);
  }

  const std::set<bus_id> before_ = {0x10, 0x20, 0x30};
  const std::set<bus_id> after_ = {0x10, 0x20, 0x40};
  const directory_entry moved_ = [] {
    directory_entry e = test_entry(0x20);
    e.labels = {{"zone", "b"}};
    return e;
  }();
  disc_instance* w_ = nullptr;
  disc_instance* v_ = nullptr;
  disc_instance* a_ = nullptr;
  disc_instance* y_ = nullptr;
  disc_instance* x_ = nullptr;
  discovery_stats w0_;
  discovery_stats v0_;
  size_t w_events_ = 0;
  size_t v_events_ = 0;
};

// W (registering) and V (watch only) stop watching while X registers, Y stops and A changes its
// entry; etcd compacts past that; W and V then watch from their old revision + 1 and must
// converge through the gap path (one range resync each, no duplicate event, no new session), and
// keep watching from the range's revision afterwards.
TEST_F(DiscoveryGapTest, CompactedWatchRevisionResyncsTheDirectory) {
  ASSERT_NO_FATAL_FAILURE(start_in_sync());
  const int64_t w_rev = detail::discovery_rewatch_from(*w_->d, 0);
  const int64_t v_rev = detail::discovery_rewatch_from(*v_->d, 0);
  ASSERT_GT(w_rev, 0);
  ASSERT_GT(v_rev, 0);
  ASSERT_NO_FATAL_FAILURE(change_while_unwatched());

  // History up to now is gone: a watch from w_rev + 1 or v_rev + 1 can only be cancelled.
  const int64_t now = current_revision();
  ASSERT_GT(now, std::max(w_rev, v_rev) + 1);
  ASSERT_NO_FATAL_FAILURE(compact(now));
  EXPECT_EQ(detail::discovery_rewatch_from(*w_->d, w_rev + 1), w_rev);
  EXPECT_EQ(detail::discovery_rewatch_from(*v_->d, v_rev + 1), v_rev);
  ASSERT_TRUE(wait([&] { return converged(w_, w0_) && converged(v_, v0_); }));
  expect_each_change_once(w_, w_events_);
  expect_each_change_once(v_, v_events_);
  // A gap is not a session failure: no new lease, no new put, W's entry stayed in etcd.
  EXPECT_EQ(w_->d->stats().failures, w0_.failures);
  EXPECT_EQ(w_->d->stats().registrations, w0_.registrations);
  EXPECT_EQ(v_->d->stats().failures, v0_.failures);
  EXPECT_EQ(a_->count(directory_event::removed, 0x10), 0U);
  EXPECT_EQ(x_->count(directory_event::removed, 0x10), 0U);

  // Both watch again, from the range's revision: a later change arrives once, nothing replays.
  directory_entry moved_again = moved_;
  moved_again.labels = {{"zone", "c"}};
  ASSERT_EQ(a_->d->update_self(moved_again), errc::ok);
  ASSERT_TRUE(wait([&] {
    return w_->count(directory_event::changed, 0x20) == 2 &&
           v_->count(directory_event::changed, 0x20) == 2;
  }));
  EXPECT_EQ(w_->events.size(), w_events_ + 4);
  EXPECT_EQ(v_->events.size(), v_events_ + 4);
  directory_entry got;
  ASSERT_TRUE(w_->d->lookup(0x20, &got));
  EXPECT_EQ(got, moved_again);
  EXPECT_EQ(w_->ids(), after_);
}

}  // namespace
}  // namespace uvbus::discovery_gap_test
