// etcd_discovery against a scripted fake etcd gateway (a libuv HTTP/1.1 server on 127.0.0.1, port
// from the OS): watch cancels that are not a compaction gap, or repeat right after a resync, fail
// the session naming the reason; a watch stream that never says `created` fails after
// request_timeout_ms, and a watch-only instance probes while it waits; calls from a thread other
// than the loop's are refused (release builds) or abort naming the function (debug builds); with
// etcd authentication, stop()'s revokes carry a fresh token.
#include <uv.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "discovery/discovery_harness.h"
#include "discovery/scripted_etcd.h"

namespace uvbus::discovery_fake_test {
namespace {

using std::chrono::seconds;
using test::disc_instance;
using test::kCreated;

const std::string kAuth = "/v3/auth/authenticate";
const std::string kRevoke = "/v3/lease/revoke";

class DiscoveryFakeTest : public test::discovery_fixture {
 protected:
  void SetUp() override {
    discovery_fixture::SetUp();
    // A healthy etcd (lease 7; range-shaped answers) whose watch is never answered unless a test
    // scripts it (watch_answers()).
    fake_ = std::make_unique<test::scripted_etcd>(&loop_);
  }
  void TearDown() override {
    insts_.clear();
    fake_.reset();
    discovery_fixture::TearDown();
  }
  disc_instance* watcher(uint32_t request_timeout_ms) {
    discovery_config c = config({fake_->url()});
    c.request_timeout_ms = request_timeout_ms;
    return make(directory_entry{}, std::move(c));
  }
  // Every watch is answered with `lines` (a 200 response read until close), the connection open.
  void watch_answers(const std::string& lines) {
    fake_->on_watch = [lines](size_t) { return std::make_pair(lines, false); };
  }
  // An etcd with authentication: the n-th authenticate gives token "tok<n>" (the `silent` one is
  // never answered); every watch is created, then ends (each session fails after its put).
  // Registers 0x42 as user "u" and waits until the session that authenticates as the `n`-th is
  // under way: the first session's lease 7 then holds the key.
  disc_instance* failed_with_auth(size_t silent, uint32_t retry_min_ms, size_t n) {
    fake_->on_post = [silent](const std::string& path, size_t nth) {
      test::reply r = test::scripted_etcd::healthy_post(path, nth);
      if (path != kAuth) return r;
      r.body = R"({"header":{"revision":"5"},"token":"tok)" + std::to_string(nth) + R"("})";
      r.silent = nth == silent;
      return r;
    };
    fake_->on_watch = [](size_t) { return std::make_pair(kCreated, true); };
    discovery_config c = config({fake_->url()});
    c.etcd_username = "u";
    c.etcd_password = "p";
    c.retry_min_ms = retry_min_ms;
    c.retry_max_ms = retry_min_ms * 2;
    c.request_timeout_ms = 10000;
    disc_instance* v = make(test::test_entry(0x42), std::move(c));
    EXPECT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
    EXPECT_TRUE(wait([&] { return fake_->count(kAuth) == n; }, seconds(20)));
    return v;
  }
  // stop()s v, runs the loop until its `done` ran, and returns the revoke's header lines.
  std::string stop_and_revoke_headers(disc_instance* v) {
    bool done = false;
    EXPECT_EQ(v->d->stop([&] { done = true; }), errc::ok);
    EXPECT_TRUE(wait([&] { return done; }, seconds(20)));
    EXPECT_EQ(fake_->count(kRevoke, R"("ID":"7")"), 1U);
    return fake_->headers(kRevoke, 0);
  }
  std::unique_ptr<test::scripted_etcd> fake_;
};

// A cancel with a cancel_reason and no compact_revision is not a gap: before, the session read
// and watched again at once, for ever, connected all along; now it fails (on_state(false),
// stats().failures, last_error() naming the reason) and retries after the backoff.
TEST_F(DiscoveryFakeTest, CancelWithoutCompactRevisionFailsTheSession) {
  ASSERT_TRUE(fake_->ok());
  watch_answers(std::string(kCreated) +
                R"({"result":{"canceled":true,"cancel_reason":"permission denied"}})"
                "\n");
  disc_instance* v = watcher(2000);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 2; }, seconds(20)));
  EXPECT_GE(v->ups, 1);
  EXPECT_GE(v->downs, 1);
  EXPECT_NE(v->d->last_error().detail.find("permission denied"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_TRUE(logged(v, "watch cancelled", "permission denied"));
  EXPECT_FALSE(logged(v, "resync"));
}

// A registering instance whose every watch etcd cancels at once: each session registers (grant +
// put) and fails. The backoff must grow across them; before, the registration reset it and the
// instance put itself again every retry_min_ms, for ever.
TEST_F(DiscoveryFakeTest, SessionsThatFailAfterRegisteringBackOffMoreAndMore) {
  ASSERT_TRUE(fake_->ok());
  watch_answers(std::string(kCreated) +
                R"({"result":{"canceled":true,"cancel_reason":"permission denied"}})"
                "\n");
  discovery_config c = config({fake_->url()});
  c.retry_min_ms = 20;
  c.retry_max_ms = 5000;
  directory_entry self;
  self.id = 0x42;
  self.listen = {"ipv4://127.0.0.1:1"};
  disc_instance* v = make(self, std::move(c));
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 5; }, seconds(30)));
  const discovery_stats st = v->d->stats();
  EXPECT_GE(st.registrations, 5u);
  EXPECT_GE(st.last_retry_delay_ms, 20u * 16 * 8 / 10) << "the 5th failure waits 320 ms +-20 %";
  EXPECT_GE(fake_->count("/v3/lease/grant"), 5u);
}

// A compaction cancel resyncs once (range read, new watch); the same cancel again right after that
// resync (within request_timeout_ms, 10 s here) fails the session instead of looping.
TEST_F(DiscoveryFakeTest, RepeatedCompactionCancelFailsTheSession) {
  ASSERT_TRUE(fake_->ok());
  watch_answers(std::string(kCreated) + R"({"result":{"canceled":true,"compact_revision":"3"}})"
                                        "\n");
  disc_instance* v = watcher(10000);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
  EXPECT_TRUE(logged(v, "compact_revision 3", "resync"));
  EXPECT_TRUE(logged(v, "compact_revision 3", "of a resync"));
  EXPECT_NE(v->d->last_error().detail.find("compact_revision 3"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_GE(fake_->count("/v3/watch"), 2U);
}

// A watch stream that never says `created` (the fake accepts the POST and sends nothing): the
// watch-only instance probes meanwhile (a count_only range read, every ttl_s/3), and the session
// fails after request_timeout_ms naming why; it was never connected.
TEST_F(DiscoveryFakeTest, WatchNeverCreatedFailsAfterTheRequestTimeout) {
  ASSERT_TRUE(fake_->ok());
  disc_instance* v = watcher(3000);  // ttl_s 2: a probe after ~667 ms, well before the deadline
  ASSERT_TRUE(wait([&] { return fake_->count("/v3/kv/range", "count_only") >= 1; }, seconds(20)));
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
  EXPECT_NE(v->d->last_error().detail.find("not created within 3000 ms"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_EQ(v->ups, 0);
  EXPECT_FALSE(v->d->connected());
}

// With etcd authentication, stop() while the next session authenticates (its authenticate never
// answered): the revoke of the failed session's lease, which holds the key, carries a token (etcd
// refuses to revoke a lease holding keys for a request without the right to write them). Before,
// authenticate() had dropped the token: the revoke went without one, etcd refused it, and the
// entry stayed up to ttl_s.
TEST_F(DiscoveryFakeTest, StopWhileAuthenticatingRevokesWithAToken) {
  ASSERT_TRUE(fake_->ok());
  disc_instance* v = failed_with_auth(1, 50, 2);
  const std::string h = stop_and_revoke_headers(v);
  EXPECT_EQ(fake_->count(kAuth), 3U);
  EXPECT_NE(h.find("Authorization: tok2\r\n"), std::string::npos) << h;
}

// ... and stop() during the backoff authenticates afresh too: the session's token may be the one
// etcd refused (the failure), or another member's. Before, the revoke carried the failed
// session's token.
TEST_F(DiscoveryFakeTest, StopDuringTheBackoffRevokesWithAFreshToken) {
  ASSERT_TRUE(fake_->ok());
  disc_instance* v = failed_with_auth(99, 5000, 1);
  const std::string h = stop_and_revoke_headers(v);
  EXPECT_EQ(fake_->count(kAuth), 2U);
  EXPECT_NE(h.find("Authorization: tok1\r\n"), std::string::npos) << h;
}

// A watching instance sends only keep-alives, which etcd does not check the token of: at stop()
// its token may have lapsed (a simple token idle for --auth-token-ttl, a JWT expired). Its revoke,
// refused "invalid auth token", authenticates and revokes again. Before, the refusal counted as
// done, nothing was logged, and the entry stayed up to ttl_s.
TEST_F(DiscoveryFakeTest, StopRevokeRefusedForItsTokenAuthenticatesAndRevokesAgain) {
  ASSERT_TRUE(fake_->ok());
  fake_->on_post = [](const std::string& path, size_t nth) {
    test::reply r = test::scripted_etcd::healthy_post(path, nth);
    if (path == kAuth)
      r.body = R"({"header":{"revision":"5"},"token":"tok)" + std::to_string(nth) + R"("})";
    if (path == kRevoke && nth == 0) {
      r.status = 401;
      r.body = R"({"error":"etcdserver: invalid auth token","code":16})";
    }
    return r;
  };
  watch_answers(kCreated);
  discovery_config c = config({fake_->url()});
  c.etcd_username = "u";
  c.etcd_password = "p";
  disc_instance* v = make(test::test_entry(0x42), std::move(c));
  ASSERT_TRUE(wait([&] { return v->ups == 1; }, seconds(20)));
  bool done = false;
  ASSERT_EQ(v->d->stop([&] { done = true; }), errc::ok);
  ASSERT_TRUE(wait([&] { return done; }, seconds(20)));
  EXPECT_EQ(fake_->count(kAuth), 2U);
  EXPECT_EQ(fake_->count(kRevoke, R"("ID":"7")"), 2U);
  const std::string h = fake_->headers(kRevoke, 1);
  EXPECT_NE(h.find("Authorization: tok1\r\n"), std::string::npos) << h;
}

// Endpoints {A, B}, the session on A: at stop() A answers every revoke 503 (no leader). The revoke
// goes to B. Before, it went to A alone, the answer counted as done and the entry stayed up to
// ttl_s; and a revoke that finally fails (B answers 503 too in the second half) is logged.
TEST_F(DiscoveryFakeTest, StopRevokeFailingOnOneEndpointGoesToTheNext) {
  ASSERT_TRUE(fake_->ok());
  test::scripted_etcd b(&loop_);
  ASSERT_TRUE(b.ok());
  const auto no_leader = [](const std::string& path, size_t nth) {
    test::reply r = test::scripted_etcd::healthy_post(path, nth);
    if (path == kRevoke) {
      r.status = 503;
      r.body = R"({"error":"etcdserver: no leader","code":14})";
    }
    return r;
  };
  fake_->on_post = no_leader;
  watch_answers(kCreated);
  for (int round = 0; round < 2; ++round) {
    disc_instance* v = make(test::test_entry(0x42), config({fake_->url(), b.url()}));
    ASSERT_TRUE(wait([&] { return v->ups == 1; }, seconds(20)));
    bool done = false;
    ASSERT_EQ(v->d->stop([&] { done = true; }), errc::ok);
    ASSERT_TRUE(wait([&] { return done; }, seconds(20)));
    EXPECT_EQ(fake_->count(kRevoke, R"("ID":"7")"), round + 1U);
    EXPECT_EQ(b.count(kRevoke, R"("ID":"7")"), round + 1U);
    EXPECT_EQ(logged(v, "stop(): revoke of lease 7", "no leader"), round == 1);
    b.on_post = no_leader;
  }
  EXPECT_EQ(b.count("/v3/lease/grant"), 0U);
}

#ifdef NDEBUG

// discovery.h: every member function belongs to the loop's thread. Called from another thread
// each does nothing and says wrong_thread (or false / 0 / empty): start() from there started
// nothing, so stop() on the owner's thread finds nothing started.
TEST_F(DiscoveryFakeTest, CallsFromAForeignThreadReturnWrongThreadAndDoNothing) {
  ASSERT_TRUE(fake_->ok());
  etcd_discovery d(&loop_, config({fake_->url()}), {});
  std::vector<errc> got;
  size_t size = 1;
  bool found = true;
  std::thread t([&] {
    got.push_back(d.start(directory_entry{}));
    got.push_back(d.update_self(directory_entry{}));
    got.push_back(d.stop(nullptr));
    got.push_back(d.last_error().code);
    size = d.size() + d.directory().size();
    found = d.lookup(1, nullptr) || d.connected();
  });
  t.join();
  ASSERT_EQ(got.size(), 4U);
  for (errc e : got) EXPECT_EQ(e, errc::wrong_thread);
  EXPECT_EQ(size, 0U);
  EXPECT_FALSE(found);
  EXPECT_EQ(d.stop(nullptr), errc::wrong_state);  // start() from the other thread did nothing
  EXPECT_EQ(fake_->count("/v3/lease/grant") + fake_->count("/v3/watch"), 0U);
}

#else

TEST(DiscoveryFakeDeathTest, CallsFromAForeignThreadAbortNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  discovery_config c;
  c.etcd_endpoints = {"http://127.0.0.1:2379"};
  auto d = std::make_unique<etcd_discovery>(&loop, c, discovery_callbacks{});
  EXPECT_DEATH(std::thread([&] { (void)d->size(); }).join(),
               "etcd_discovery::size called from a thread other than its loop's thread");
  d.reset();
  uv_run(&loop, UV_RUN_NOWAIT);  // its handles' close callbacks
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

#endif

}  // namespace
}  // namespace uvbus::discovery_fake_test
