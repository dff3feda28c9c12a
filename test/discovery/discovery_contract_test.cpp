// discovery.h's promises checked one by one against a scripted fake etcd gateway (a libuv HTTP/1.1
// server on 127.0.0.1, port from the OS): callbacks that stop or destroy the instance, update_self
// and endpoint refusals naming the cause, bounds (one watch message, a range, max_entries), an
// etcd answering garbage, late or not at all, a lease found gone, and a node stopped from its
// on_log while discovery fails.
#include <uv.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "discovery/discovery_harness.h"
#include "discovery/etcd_codec.h"
#include "discovery/scripted_etcd.h"
#include "uvbus/node.h"

namespace uvbus::discovery_contract_test {
namespace {

using std::chrono::seconds;
using test::disc_instance;
using test::kCreated;
using test::reply;
using test::scripted_etcd;
using test::test_entry;
namespace etcd = detail::etcd;

const std::string kPrefix = "/uvbus-test";
const std::string kPut = "/v3/kv/put";
const std::string kRevoke = "/v3/lease/revoke";

// The gateway's JSON of a kv (keys and values base64; mod_revision and lease 0: none given).
std::string raw_kv(const std::string& key, const std::string& value, int64_t mod_revision = 0,
                   int64_t lease = 0) {
  return R"({"key":")" + etcd::base64_encode(key) + R"(","value":")" + etcd::base64_encode(value) +
         (mod_revision == 0 ? "" : R"(","mod_revision":")" + std::to_string(mod_revision)) +
         (lease == 0 ? "" : R"(","lease":")" + std::to_string(lease)) + R"("})";
}
// ... of entry e, put on `lease`.
std::string leased_kv(const directory_entry& e, int64_t lease) {
  return raw_kv(etcd::node_key(kPrefix, e.id), etcd::encode_entry(e), 3, lease);
}
// ... of entry `id`.
std::string kv_of(bus_id id, int64_t mod_revision = 0) {
  return raw_kv(etcd::node_key(kPrefix, id), etcd::encode_entry(test_entry(id)), mod_revision);
}
// A range answer of `more_kvs` and the entries `ids` (mod_revision 3).
std::string range_of(const std::vector<bus_id>& ids, const std::string& more_kvs = "") {
  std::string kvs = more_kvs;
  for (const bus_id id : ids) kvs += (kvs.empty() ? "" : ",") + kv_of(id, 3);
  return R"({"header":{"revision":"5"},"kvs":[)" + kvs + "]}";
}
// One watch message with a PUT of each id.
std::string puts_of(const std::vector<bus_id>& ids) {
  std::string evs;
  for (const bus_id id : ids)
    evs += std::string(evs.empty() ? "" : ",") + R"({"kv":)" + kv_of(id) + "}";
  return R"({"result":{"header":{"revision":"6"},"events":[)" + evs + "]}}\n";
}

// One watch message of the given events ({"kv":...} objects); del_of(): a DELETE of entry `id`.
std::string watch_message(const std::vector<std::string>& events) {
  std::string evs;
  for (const std::string& e : events) evs += (evs.empty() ? "" : ",") + e;
  return R"({"result":{"header":{"revision":"7"},"events":[)" + evs + "]}}\n";
}
std::string put_of(const std::string& kv_json) {
  return R"({"kv":)" + kv_json + "}";
}
std::string del_of(bus_id id) {
  return R"({"type":"DELETE","kv":)" + raw_kv(etcd::node_key(kPrefix, id), "", 7) + "}";
}

class DiscoveryContractTest : public test::discovery_fixture {
 protected:
  void SetUp() override {
    discovery_fixture::SetUp();
    fake_ = std::make_unique<scripted_etcd>(&loop_);
    ASSERT_TRUE(fake_->ok());
    // By default a healthy etcd: lease 7, empty ranges, a watch that says created and stays.
    fake_->on_watch = [](size_t) { return std::make_pair(kCreated, false); };
  }
  void TearDown() override {
    insts_.clear();
    nodes_.clear();
    for (int i = 0; i < 5; ++i) uv_run(&loop_, UV_RUN_NOWAIT);
    fake_.reset();
    discovery_fixture::TearDown();
  }
  discovery_config fake_config() {
    discovery_config c = config({fake_->url()});
    c.prefix = kPrefix;
    return c;
  }
  // The answers to POSTs to `path` as before, then changed by edit(&reply, nth).
  void edit_answers(const std::string& path, const std::function<void(reply*, size_t)>& edit) {
    auto before = fake_->on_post;
    fake_->on_post = [before, path, edit](const std::string& p, size_t nth) {
      reply r = before(p, nth);
      if (p == path) edit(&r, nth);
      return r;
    };
  }
  // Every range answer holds `self` on lease 7 (the fake's lease), as etcd's would after its put.
  void own_entry_in_ranges(const directory_entry& self) {
    const std::string body = R"({"header":{"revision":"5"},"kvs":[)" + leased_kv(self, 7) + "]}";
    edit_answers("/v3/kv/range", [body](reply* r, size_t) { r->body = body; });
  }
  // stop()s v and runs the loop until its `done` ran.
  void stop_and_wait(disc_instance* v) {
    bool done = false;
    ASSERT_EQ(v->d->stop([&] { done = true; }), errc::ok);
    ASSERT_TRUE(wait([&] { return done; }, seconds(20)));
  }
  std::unique_ptr<scripted_etcd> fake_;
  std::vector<std::unique_ptr<node>> nodes_;
};

// max_response_bytes bounds one watch message: several small messages arriving in one read (curl
// reads on while data is pending) are no message above it. Before, the stream's whole unconsumed
// buffer was held against the bound: 20 PUTs of ~480 bytes in one write failed the watch
// (oversize) at every session, and the directory never filled.
TEST_F(DiscoveryContractTest, ABurstOfSmallWatchMessagesIsNoMessageAboveTheBound) {
  // At least 20 messages and more than twice the bound in all: an entry's length moves with the
  // digits of the test's pid (a pid of 3 digits left 20 of them at 8 158 bytes).
  std::vector<bus_id> ids;
  std::string lines = kCreated;
  for (bus_id id = 1; id <= 20 || lines.size() <= size_t{2} * 4096; ++id) {
    ids.push_back(id);
    lines += puts_of({id});
  }
  ASSERT_LT(ids.size(), 40U);
  fake_->on_watch = [lines](size_t) { return std::make_pair(lines, false); };
  discovery_config c = fake_config();
  c.max_response_bytes = 4096;
  c.max_entry_bytes = 1024;  // one message of such an entry fits (check() refuses otherwise)
  disc_instance* v = make(directory_entry{}, c);
  ASSERT_TRUE(wait([&] { return v->d->size() == ids.size(); }, seconds(20)))
      << v->d->size() << " entries; " << v->d->last_error().detail;
  EXPECT_EQ(v->d->stats().failures, 0U) << v->d->last_error().detail;
}

// ... and one message above it still fails the session, naming the bound.
TEST_F(DiscoveryContractTest, OneWatchMessageAboveTheBoundFailsTheSession) {
  const std::string big = puts_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  ASSERT_GT(big.size(), 4096U);
  fake_->on_watch = [big](size_t) { return std::make_pair(kCreated + big, false); };
  discovery_config c = fake_config();
  c.max_response_bytes = 4096;
  c.max_entry_bytes = 1024;  // one message of such an entry fits (check() refuses otherwise)
  disc_instance* v = make(directory_entry{}, c);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
  EXPECT_NE(v->d->last_error().detail.find("max_response_bytes"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_EQ(v->d->size(), 0U);
}

// max_response_bytes must hold one watch message (or a range answer) of one valid entry: the value
// of max_entry_bytes base64-encoded, the key, the gateway's JSON. Before, 4096 was accepted with
// max_entry_bytes 16384: an entry of 3 KiB or more failed the watch (oversize) at every session.
TEST_F(DiscoveryContractTest, AResponseBoundBelowOneEntrysMessageIsRefused) {
  discovery_config c = fake_config();
  c.max_response_bytes = 4096;
  std::string why;
  EXPECT_EQ(validate(c, &why), errc::invalid_argument);
  // 4 x 5462 (the value's base64) + 48 (the key's: "/uvbus-test/nodes/" + 16 digits) + 512.
  EXPECT_NE(why.find("max_response_bytes 4096 cannot hold one watch message of an entry of "
                     "max_entry_bytes 16384: at least 22408"),
            std::string::npos)
      << why;
  c.max_response_bytes = 22408;
  EXPECT_EQ(validate(c, &why), errc::ok) << why;
  c.max_response_bytes = 22407;
  EXPECT_EQ(validate(c, &why), errc::invalid_argument);
  etcd_discovery d(&loop_, c, {});
  EXPECT_EQ(d.start(test_entry(1)), errc::invalid_argument);
  EXPECT_NE(d.last_error().detail.find("at least 22408"), std::string::npos)
      << d.last_error().detail;
}

// A range answer above max_response_bytes fails the request (oversize), nothing is applied.
TEST_F(DiscoveryContractTest, ARangeAboveTheBoundFailsWithOversize) {
  fake_->on_post = [](const std::string&, size_t) {
    reply r;
    r.body = range_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
    return r;
  };
  discovery_config c = fake_config();
  c.max_response_bytes = 4096;
  c.max_entry_bytes = 1024;  // one message of such an entry fits (check() refuses otherwise)
  disc_instance* v = make(directory_entry{}, c);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
  EXPECT_EQ(v->d->last_error().code, errc::not_connected);
  EXPECT_NE(v->d->last_error().detail.find("range: oversize"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_EQ(v->d->size(), 0U);
}

// An etcd answering a range with `{}` (no header: no range answer at all) or with garbage fails
// the session and keeps the directory. Before, `{}` read as an empty range: both entries were
// removed from the directory (and every node's), and the watch started from revision 1.
TEST_F(DiscoveryContractTest, ARangeAnswerWithoutAHeaderKeepsTheDirectory) {
  fake_->on_post = [](const std::string&, size_t nth) {
    reply r;
    r.body = nth == 0 ? range_of({1, 2}) : nth % 2 == 1 ? "{}" : "<html>busy</html>";
    return r;
  };
  fake_->on_watch = [](size_t) { return std::make_pair(kCreated, true); };  // then ends
  disc_instance* v = make(directory_entry{}, fake_config());
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 3; }, seconds(20)));
  EXPECT_EQ(v->d->size(), 2U);
  EXPECT_EQ(v->count(directory_event::removed, 1), 0U);
  EXPECT_EQ(v->count(directory_event::removed, 2), 0U);
  EXPECT_TRUE(logged(v, "range: bad body: no header.revision"));
  EXPECT_TRUE(logged(v, "range: bad body: not a JSON object"));
}

// stop() inside on_directory: no further event of the same watch message. Before, the other two
// PUTs of that message were still reported after stop().
TEST_F(DiscoveryContractTest, StopInsideOnDirectoryEndsTheBatch) {
  fake_->on_watch = [](size_t) { return std::make_pair(kCreated + puts_of({1, 2, 3}), false); };
  auto* in = insts_.emplace_back(std::make_unique<disc_instance>()).get();
  bool done = false;
  discovery_callbacks cb;
  cb.on_directory = [&](directory_event ev, const directory_entry& e) {
    in->events.emplace_back(ev, e.id);
    if (in->events.size() == 1) {
      EXPECT_EQ(in->d->stop([&] { done = true; }), errc::ok);
    }
  };
  in->d = std::make_unique<etcd_discovery>(&loop_, fake_config(), std::move(cb));
  ASSERT_EQ(in->d->start(directory_entry{}), errc::ok);
  ASSERT_TRUE(wait([&] { return done; }, seconds(20)));
  EXPECT_EQ(in->events.size(), 1U);
  EXPECT_FALSE(in->d->connected());
}

// Destroying the instance inside on_directory (mid-message) and inside on_state(false) (the
// watch stream ended): nothing of it is touched afterwards (ASan), no further callback, and the
// callback goes on after the reset (its captures live on). Before, the std::function running was
// the instance's own: destroyed under itself, the counts after the reset were a
// heap-use-after-free.
TEST_F(DiscoveryContractTest, DestroyInsideOnDirectoryOrOnStateTouchesNothing) {
  fake_->on_watch = [](size_t) { return std::make_pair(kCreated + puts_of({1, 2, 3}), true); };
  int events = 0;
  int downs = 0;
  std::unique_ptr<etcd_discovery> a;
  std::unique_ptr<etcd_discovery> b;
  discovery_callbacks ca;
  ca.on_directory = [&](directory_event, const directory_entry&) {
    a.reset();
    ++events;
  };
  discovery_callbacks cb;
  cb.on_state = [&](bool up) {
    if (!up) {
      b.reset();
      ++downs;
    }
  };
  a = std::make_unique<etcd_discovery>(&loop_, fake_config(), std::move(ca));
  b = std::make_unique<etcd_discovery>(&loop_, fake_config(), std::move(cb));
  ASSERT_EQ(a->start(directory_entry{}), errc::ok);
  ASSERT_EQ(b->start(test_entry(0x42)), errc::ok);
  ASSERT_TRUE(wait([&] { return a == nullptr && b == nullptr; }, seconds(20)));
  EXPECT_EQ(events, 1);
  EXPECT_EQ(downs, 1);
  ASSERT_TRUE(wait([&] { return fake_->count("/v3/watch") >= 2; }, seconds(5)));
  const size_t posts = fake_->count("/v3/kv/range") + fake_->count("/v3/lease/grant");
  run_for(std::chrono::milliseconds(300));  // nothing more is asked of etcd meanwhile
  EXPECT_EQ(fake_->count("/v3/kv/range") + fake_->count("/v3/lease/grant"), posts);
}

// update_self()'s refusals name the state or the ids. Before, not started and watch-only both
// returned invalid_argument "id differs from the registered id".
TEST_F(DiscoveryContractTest, UpdateSelfRefusalsNameWhatIsWrong) {
  etcd_discovery idle(&loop_, fake_config(), {});
  EXPECT_EQ(idle.update_self(test_entry(0x42)), errc::wrong_state);
  EXPECT_NE(idle.last_error().detail.find("not started"), std::string::npos)
      << idle.last_error().detail;
  disc_instance* v = make(directory_entry{}, fake_config());
  EXPECT_EQ(v->d->update_self(test_entry(0x42)), errc::wrong_state);
  EXPECT_NE(v->d->last_error().detail.find("watch only"), std::string::npos)
      << v->d->last_error().detail;
  disc_instance* r = make(test_entry(0x42), fake_config());
  EXPECT_EQ(r->d->update_self(test_entry(0x43)), errc::invalid_argument);
  EXPECT_NE(r->d->last_error().detail.find("0x43 differs from the registered 0x42"),
            std::string::npos)
      << r->d->last_error().detail;
  EXPECT_EQ(r->d->update_self(test_entry(0x42)), errc::ok);
  ASSERT_EQ(r->d->stop(nullptr), errc::ok);
  EXPECT_EQ(r->d->update_self(test_entry(0x42)), errc::closed);
}

// An endpoint that can never work is refused by validate() / start(), naming it and the part.
// Before, all of these were accepted and every session failed on them for ever (a query or
// fragment: /v3/... was appended inside it, every request went to the root path, 404; until
// 2026-12-07), and a URL over 1024 bytes was "not an http:// or https:// URL".
TEST_F(DiscoveryContractTest, EndpointsThatCanNeverWorkAreRefusedNamingThePart) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"http://127.0.0.1:2379?x", "a query ('?')"},
      {"http://127.0.0.1:2379#x", "a fragment ('#')"},
      {"https://proxy/etcd?a=b", "a query ('?')"},
      {"http://" + std::string(1100, 'h'), "longer than 1024 bytes"},
      {"http://", "no host"},
      {"http://:2379", "no host"},
      {"http://127.0.0.1:99999", "port \"99999\""},
      {"http://127.0.0.1:0", "port \"0\""},
      {"http://127.0.0.1:", "port \"\""},
      {"http://127.0.0.1:23x9", "port \"23x9\""},
      {"http://[::1:2379", "without ']'"},
      {"http://127.0.0.1 :2379", "space or control"},
  };
  for (const auto& [url, part] : bad) {
    discovery_config c = fake_config();
    c.etcd_endpoints = {fake_->url(), url};
    std::string why;
    EXPECT_EQ(validate(c, &why), errc::invalid_argument) << url;
    EXPECT_NE(why.find("etcd_endpoints[1] \"" + url.substr(0, 200) + "\""), std::string::npos)
        << why;
    EXPECT_NE(why.find(part), std::string::npos) << why;
  }
  for (const std::string url : {"http://127.0.0.1:2379", "http://[::1]:2379",
                                "https://etcd.example:2379/", "http://proxy/etcd", "http://h"}) {
    discovery_config c = fake_config();
    c.etcd_endpoints = {url};
    std::string why;
    EXPECT_EQ(validate(c, &why), errc::ok) << url << ": " << why;
  }
  discovery_config c = fake_config();
  c.etcd_endpoints = {"http://127.0.0.1:99999"};
  etcd_discovery d(&loop_, c, {});
  EXPECT_EQ(d.start(test_entry(1)), errc::invalid_argument);
  EXPECT_NE(d.last_error().detail.find("99999"), std::string::npos) << d.last_error().detail;
}

// A null detail is "the code alone" (it was written through on a refusal), and a null loop is
// refused by start() (the constructor crashed on it), as shm_reader does.
TEST_F(DiscoveryContractTest, ANullDetailOrLoopIsAValueNotACrash) {
  discovery_config c = fake_config();
  c.etcd_endpoints.clear();
  EXPECT_EQ(validate(c, nullptr), errc::invalid_argument);
  etcd_discovery d(nullptr, fake_config(), {});
  EXPECT_EQ(d.start(test_entry(1)), errc::invalid_argument);
  EXPECT_NE(d.last_error().detail.find("the loop is null"), std::string::npos)
      << d.last_error().detail;
  EXPECT_EQ(d.stop({}), errc::wrong_state);
}

// max_entries: entries beyond it are skipped, counted (skipped_full) and logged, from a range
// read and from the watch alike.
TEST_F(DiscoveryContractTest, EntriesBeyondMaxEntriesAreSkippedCountedAndLogged) {
  fake_->on_post = [](const std::string&, size_t) {
    reply r;
    r.body = range_of({1, 2, 3});
    return r;
  };
  fake_->on_watch = [](size_t) { return std::make_pair(kCreated + puts_of({4}), false); };
  discovery_config c = fake_config();
  c.max_entries = 2;
  disc_instance* v = make(directory_entry{}, c);
  ASSERT_TRUE(wait([&] { return v->d->stats().skipped_full >= 2; }, seconds(20)));
  EXPECT_EQ(v->ids(), (std::set<bus_id>{1, 2}));
  EXPECT_EQ(v->d->stats().skipped_full, 2U);
  EXPECT_TRUE(logged(v, "max_entries reached"));
  EXPECT_TRUE(v->d->connected());
}

// malformed and skipped_full count an entry once per (key, mod_revision): the same bad entries
// read again at every range read (each session's watch ends at once) are not counted or logged
// again; a new value of the malformed key (a new mod_revision) is. Before, every read counted
// both again (4 reads: 4 and 4).
TEST_F(DiscoveryContractTest, ABadEntryCountsOncePerModRevisionNotAtEveryRangeRead) {
  auto bad_rev = std::make_shared<int64_t>(3);  // the fake may answer after the test's frame
  fake_->on_post = [bad_rev](const std::string&, size_t) {
    reply r;
    r.body = range_of({1, 2, 3}, raw_kv(kPrefix + "/nodes/00000000000000aa", "{no", *bad_rev));
    return r;
  };
  fake_->on_watch = [](size_t) { return std::make_pair(kCreated, true); };  // then ends
  discovery_config c = fake_config();
  c.max_entries = 2;
  disc_instance* v = make(directory_entry{}, c);
  const auto lines = [v](const std::string& what) {
    return std::count_if(v->logs.begin(), v->logs.end(),
                         [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  ASSERT_TRUE(wait([&] { return v->d->stats().resyncs >= 4; }, seconds(20)));
  EXPECT_EQ(v->d->stats().malformed, 1U);
  EXPECT_EQ(v->d->stats().skipped_full, 1U);
  EXPECT_EQ(lines("malformed entry"), 1);
  EXPECT_EQ(lines("max_entries reached"), 1);
  *bad_rev = 9;  // the key written again (still malformed)
  const uint64_t resyncs = v->d->stats().resyncs;
  ASSERT_TRUE(wait([&] { return v->d->stats().resyncs >= resyncs + 2; }, seconds(20)));
  EXPECT_EQ(v->d->stats().malformed, 2U);
  EXPECT_EQ(v->d->stats().skipped_full, 1U);
  EXPECT_EQ(lines("malformed entry"), 2);
  EXPECT_EQ(v->ids(), (std::set<bus_id>{1, 2}));
}

// Entries left out at max_entries come in as soon as room frees (a watch DELETE, a PUT that makes
// an entry invalid), without a range read; one deleted while left out is forgotten. Before, they
// waited for the next range read: the directory went empty, 3 and 4 never came.
TEST_F(DiscoveryContractTest, EntriesLeftOutForWantOfRoomComeInWhenRoomFrees) {
  fake_->on_post = [](const std::string&, size_t) {
    reply r;
    r.body = range_of({1, 2, 3, 4, 5});  // room for 1 and 2
    return r;
  };
  const std::string events = watch_message({del_of(1),  // 3 comes in
                                            put_of(raw_kv(etcd::node_key(kPrefix, 2), "[1]", 7)),
                                            del_of(5),    // left out: forgotten
                                            del_of(3)});  // room, nobody left out
  fake_->on_watch = [events](size_t) { return std::make_pair(kCreated + events, false); };
  discovery_config c = fake_config();
  c.max_entries = 2;
  disc_instance* v = make(directory_entry{}, c);
  ASSERT_TRUE(wait([&] { return v->count(directory_event::removed, 2) == 1; }, seconds(20)));
  EXPECT_EQ(v->ids(), std::set<bus_id>{4});
  EXPECT_EQ(v->count(directory_event::added, 3), 1U);
  EXPECT_EQ(v->count(directory_event::removed, 3), 1U);
  EXPECT_EQ(v->count(directory_event::added, 4), 1U);
  EXPECT_EQ(v->count(directory_event::added, 5), 0U);
  const discovery_stats st = v->d->stats();
  EXPECT_EQ(st.skipped_full, 3U);
  EXPECT_EQ(st.malformed, 1U);
  EXPECT_EQ(st.resyncs, 1U);
  EXPECT_EQ(st.failures, 0U);
}

// A lease found gone (a keep-alive answered without a TTL) ends the session: new lease, new put,
// the directory kept meanwhile.
TEST_F(DiscoveryContractTest, ALeaseFoundGoneRegistersAgainWithANewLease) {
  auto base = fake_->on_post;
  fake_->on_post = [base](const std::string& path, size_t nth) {
    reply r = base(path, nth);
    if (path == "/v3/lease/keepalive" && nth == 0) r.body = R"({"result":{"ID":"7"}})";
    return r;
  };
  disc_instance* v = make(test_entry(0x42), fake_config());
  ASSERT_TRUE(
      wait([&] { return v->d->stats().registrations >= 2 && v->d->connected(); }, seconds(20)));
  EXPECT_EQ(v->d->stats().failures, 1U);
  EXPECT_TRUE(logged(v, "keep-alive: the lease expired"));
  EXPECT_GE(fake_->count("/v3/lease/grant"), 2U);
  EXPECT_EQ(v->ups, 2);
  EXPECT_EQ(v->downs, 1);
}

// An etcd that never answers: the request's deadline (request_timeout_ms) fails the session with
// the request and `timeout` named, and the next one starts after the backoff.
TEST_F(DiscoveryContractTest, AnEtcdThatNeverAnswersTimesOutNamingTheRequest) {
  fake_->on_post = [](const std::string&, size_t) {
    reply r;
    r.silent = true;
    return r;
  };
  discovery_config c = fake_config();
  c.request_timeout_ms = 300;
  disc_instance* v = make(test_entry(0x42), c);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 2; }, seconds(20)));
  EXPECT_NE(v->d->last_error().detail.find("lease grant: timeout"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_EQ(v->ups, 0);
}

// A node whose on_log calls stop() when discovery logs a failure. Before, the line came from
// inside etcd_discovery's failure path: stop() ran there, the failure path went on and armed the
// next session over stop()'s completion, so the lease grant was retried for ever and on_down
// (closed) never came. Now the line comes from the loop, and the node stops.
TEST_F(DiscoveryContractTest, ANodeStoppedFromOnLogOnADiscoveryFailureStops) {
  const std::vector<int> ports = test::free_ports(1);
  node_config c;
  c.listen = {"ipv4://127.0.0.1:0"};
  c.enable_shm = false;
  c.discovery = fake_config();
  c.discovery.etcd_endpoints = {"http://127.0.0.1:" + std::to_string(ports[0])};
  node* n = nullptr;
  int closed = 0;
  int stops = 0;
  node_callbacks cb;
  cb.on_log = [&](log_level, const std::string& m) {
    if (m.find("lease grant") != std::string::npos && stops++ == 0) n->stop();
  };
  cb.on_down = [&](errc e) { closed += e == errc::closed ? 1 : 0; };
  nodes_.push_back(std::make_unique<node>(&loop_, 0x42, c, cb));
  n = nodes_.back().get();
  ASSERT_EQ(n->start(), errc::ok) << n->last_error().detail;
  ASSERT_TRUE(wait([&] { return closed == 1; }, seconds(20))) << stops << " lease grant lines";
  EXPECT_FALSE(n->running());
}

// A grant answer without an ID names the step once. Before: "lease grant: lease grant: no lease
// ID/TTL in the grant".
TEST_F(DiscoveryContractTest, ABadGrantAnswerNamesTheStepOnce) {
  edit_answers("/v3/lease/grant", [](reply* r, size_t) { r->body = R"({"header":{}})"; });
  disc_instance* v = make(test_entry(0x42), fake_config());
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
  EXPECT_EQ(v->d->last_error().detail, "lease grant: bad body: no lease ID/TTL in the grant");
}

// start() and update_self() refuse an entry every reader (this instance included) would skip as
// malformed, naming the field or max_entry_bytes; the registered entry stays. Before, both
// returned ok and the node was invisible in every directory.
TEST_F(DiscoveryContractTest, AnEntryNoReaderAcceptsIsRefused) {
  std::vector<std::pair<directory_entry, std::string>> bad;
  directory_entry e = test_entry(0x42);
  for (int i = 0; e.labels.size() <= 32; ++i) e.labels.emplace_back("k" + std::to_string(i), "v");
  bad.emplace_back(e, "\"labels\" is not an object of at most 32 labels");
  e = test_entry(0x42);
  e.name.assign(257, 'n');
  bad.emplace_back(e, "\"name\" is not a string of at most 256 bytes");
  e = test_entry(0x42);
  e.listen.assign(17, "ipv4://127.0.0.1:1");
  bad.emplace_back(e, "\"urls\" is not an array of at most 16 URLs");
  e = test_entry(0x42);
  e.listen.assign(16, "ipv4://127.0.0.1:1/" + std::string(200, 'p'));  // each field valid
  e.labels.clear();
  for (int i = 0; i < 32; ++i)
    e.labels.emplace_back(std::to_string(i) + std::string(250, 'k'), std::string(256, 'v'));
  bad.emplace_back(e, "above max_entry_bytes (16384)");
  e.listen.resize(2);
  bad.emplace_back(e, "above max_entry_bytes (256)");
  discovery_config small = fake_config();
  small.max_entry_bytes = 256;
  for (const auto& [entry, why] : bad) {
    const bool tiny = why.find("(256)") != std::string::npos;
    etcd_discovery d(&loop_, tiny ? small : fake_config(), {});
    EXPECT_EQ(d.start(entry), errc::invalid_argument) << why;
    EXPECT_NE(d.last_error().detail.find(why), std::string::npos) << d.last_error().detail;
    EXPECT_EQ(d.stop(nullptr), errc::wrong_state) << "not started";
  }
  disc_instance* v = make(test_entry(0x42), fake_config());
  EXPECT_EQ(v->d->update_self(bad[0].first), errc::invalid_argument);
  EXPECT_NE(v->d->last_error().detail.find("update_self(): "), std::string::npos)
      << v->d->last_error().detail;
  ASSERT_TRUE(wait([&] { return v->d->connected(); }, seconds(20)));
  EXPECT_EQ(fake_->count("/v3/kv/put", etcd::base64_encode(etcd::encode_entry(bad[0].first))), 0U);
}

// Two update_self() calls in a row: the second put waits for the first's answer (500 ms late
// here), so etcd cannot apply the older value after the newer. Before, the second cancelled the
// first in flight and was sent at once on another connection.
TEST_F(DiscoveryContractTest, AnUpdateWaitsForThePutBeforeIt) {
  directory_entry one = test_entry(0x42);
  one.name = "one";
  directory_entry two = test_entry(0x42);
  two.name = "two";
  const std::string b64_one = etcd::base64_encode(etcd::encode_entry(one));
  const std::string b64_two = etcd::base64_encode(etcd::encode_entry(two));
  own_entry_in_ranges(test_entry(0x42));
  auto answered_before_two = std::make_shared<size_t>(0);
  scripted_etcd* f = fake_.get();
  edit_answers("/v3/kv/put", [=](reply* r, size_t) {
    if (f->body().find(b64_one) != std::string::npos) r->delay_ms = 500;
    if (f->body().find(b64_two) != std::string::npos) *answered_before_two = f->answered(kPut);
  });
  disc_instance* v = make(test_entry(0x42), fake_config());
  ASSERT_TRUE(wait([&] { return v->d->connected(); }, seconds(20)));
  ASSERT_EQ(v->d->update_self(one), errc::ok);
  ASSERT_TRUE(wait([&] { return fake_->count(kPut, b64_one) == 1; }, seconds(20)));
  ASSERT_EQ(v->d->update_self(two), errc::ok);
  ASSERT_TRUE(wait([&] { return fake_->count(kPut, b64_two) == 1; }, seconds(20)));
  EXPECT_EQ(*answered_before_two, 2U) << "the registration's put and `one`'s were answered";
  EXPECT_EQ(fake_->count(kPut), 3U);
  EXPECT_EQ(v->d->stats().failures, 0U) << v->d->last_error().detail;
}

// A session that fails after registering leaves its key on its lease; stop() during the backoff
// revokes that lease (the entry leaves every directory at once). Before, fail() had forgotten the
// lease: nothing was revoked and the entry stayed up to ttl_s.
TEST_F(DiscoveryContractTest, StopDuringTheBackoffRevokesTheLeaseThatHoldsTheKey) {
  fake_->on_watch = [](size_t) { return std::make_pair(kCreated, true); };  // then ends
  discovery_config c = fake_config();
  c.retry_min_ms = 2000;
  c.retry_max_ms = 4000;
  disc_instance* v = make(test_entry(0x42), c);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures == 1; }, seconds(20)));
  stop_and_wait(v);
  EXPECT_EQ(fake_->count(kRevoke), 1U);
  EXPECT_EQ(fake_->count(kRevoke, R"("ID":"7")"), 1U);
}

// ... and the next session revokes it once its own put (on lease 8 here) landed: a put of the
// failed session that etcd applies late cannot keep the key on a lease nobody renews.
TEST_F(DiscoveryContractTest, TheNextSessionRevokesTheLeaseTheFailedOneLeft) {
  fake_->on_watch = [](size_t nth) { return std::make_pair(kCreated, nth == 0); };
  edit_answers("/v3/lease/grant", [](reply* r, size_t nth) {
    r->body = R"({"header":{"revision":"5"},"ID":")" + std::to_string(7 + nth) + R"(","TTL":"2"})";
  });
  disc_instance* v = make(test_entry(0x42), fake_config());
  ASSERT_TRUE(wait([&] { return v->d->stats().registrations == 2 && v->d->connected(); }));
  ASSERT_TRUE(wait([&] { return fake_->count(kRevoke, R"("ID":"7")") == 1; }, seconds(20)));
  EXPECT_EQ(fake_->count(kRevoke, R"("ID":"8")"), 0U);
  stop_and_wait(v);
  EXPECT_EQ(fake_->count(kRevoke, R"("ID":"8")"), 1U);
  EXPECT_EQ(fake_->count(kRevoke), 2U);
}

// The own entry found on another lease (a put of a failed session applied late: its lease expires
// unrenewed) or deleted (`etcdctl del`) is written again on the session's lease, without failing
// the session (the second within ttl_s/3 of the first at the next keep-alive tick). Before,
// nothing wrote it again: the node left every directory while connected() stayed true.
TEST_F(DiscoveryContractTest, TheOwnEntryOnAnotherLeaseOrDeletedIsWrittenAgain) {
  const directory_entry self = test_entry(0x42);
  own_entry_in_ranges(self);
  const std::string lost =
      watch_message({put_of(leased_kv(self, 3))}) + watch_message({del_of(0x42)});
  fake_->on_watch = [lost](size_t) { return std::make_pair(kCreated + lost, false); };
  disc_instance* v = make(self, fake_config());
  ASSERT_TRUE(wait([&] { return fake_->count(kPut) >= 3; }, seconds(20)));
  EXPECT_TRUE(logged(v, "own entry", "written again"));
  EXPECT_TRUE(v->d->connected());
  EXPECT_EQ(v->d->stats().failures, 0U) << v->d->last_error().detail;
  EXPECT_EQ(fake_->count(kPut, R"("lease":"7")"), fake_->count(kPut));
}

// About 1.5 MB of small watch messages in one write (etcd catching a watcher up) are delivered
// whole. Before, each message consumed moved the rest of the buffer (quadratic: gigabytes moved
// for a burst like this one); what is checked here is only that the single pass delivers them all.
TEST_F(DiscoveryContractTest, AMegabyteBurstOfSmallWatchMessagesIsDeliveredWhole) {
  const std::string filler = R"({"result":{"header":{"revision":"6"}}})"
                             "\n";
  std::string lines = kCreated;
  size_t entries = 0;
  for (size_t n = 1; lines.size() < 1500000; ++n) {
    lines += n % 40 == 0 ? puts_of({++entries}) : filler;
  }
  fake_->on_watch = [lines](size_t) { return std::make_pair(lines, false); };
  disc_instance* v = make(directory_entry{}, fake_config());
  ASSERT_TRUE(wait([&] { return v->d->size() == entries; }, seconds(30)))
      << v->d->size() << " of " << entries << "; " << v->d->last_error().detail;
  EXPECT_EQ(v->d->stats().failures, 0U) << v->d->last_error().detail;
}

}  // namespace
}  // namespace uvbus::discovery_contract_test
