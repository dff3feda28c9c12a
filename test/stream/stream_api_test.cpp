// The stream channel's API contract: ids that cannot dangle, cumulative reports that cover every
// accepted packet exactly once, errors with detail, and the owner-thread check.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/write_queue.h"
#include "stream/stream_harness.h"
#include "stream/test_access.h"

namespace uvbus::test::stream_api_test {
namespace {

std::string repeat(const std::string& s, int n) {
  std::string r;
  for (int i = 0; i < n; ++i) r += s;
  return r;
}

class StreamApi : public stream_fixture {
 protected:
  struct pair {
    connection_id server;
    connection_id client;
  };
  pair connect(stream_channel* s, recorder* srv, stream_channel* c, recorder* cli) {
    listener_id l;
    EXPECT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
    pair p;
    EXPECT_EQ(c->connect(s->listener_url(l), &p.client), errc::ok);
    const size_t before = srv->accepted.size();
    EXPECT_TRUE(run([&] {
      return srv->accepted.size() > before && cli->connected.count(p.client.value) != 0;
    }));
    p.server = srv->accepted.back();
    return p;
  }
  // The connection of `id` is gone: every call on its id fails cleanly, none touches freed memory.
  static void expect_gone(stream_channel* c, connection_id id) {
    EXPECT_FALSE(c->is_open(id));
    EXPECT_EQ(c->send(id, "x", 1), errc::closed);
    const const_buffer b{"x", 1};
    EXPECT_EQ(c->sendv(id, &b, 1), errc::closed);
    EXPECT_EQ(c->disconnect(id), errc::closed);
    EXPECT_EQ(c->pause_reading(id), errc::closed);
    EXPECT_EQ(c->resume_reading(id), errc::closed);
    errc e = errc::ok;
    EXPECT_EQ(c->prepare_send(id, 1, &e), nullptr);
    EXPECT_EQ(e, errc::closed);
    EXPECT_EQ(c->commit_send(id), errc::closed);
    int other = 0;
    EXPECT_FALSE(c->set_user_data(id, &other));
    EXPECT_EQ(c->user_data(id), nullptr);
    EXPECT_EQ(c->peer_url(id), "");
    EXPECT_FALSE(c->outbound(id));
    EXPECT_FALSE(c->listener(id));
    stream_connection_metrics m;
    EXPECT_EQ(c->connection_metrics(id, &m), errc::closed);
  }
  // A dial cancelled at once: its id, once its slot is free again.
  connection_id dial_and_end(stream_channel* c, recorder* r) {
    connection_id id;
    EXPECT_EQ(c->connect("ipv4://127.0.0.1:9", &id), errc::ok);
    EXPECT_EQ(c->disconnect(id, disconnect_mode::force), errc::ok);
    EXPECT_TRUE(run([&] { return r->connected.count(id.value) != 0; }));
    return id;
  }
};

TEST_F(StreamApi, CallsOnAGoneIdFailCleanly) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  int mark = 0;
  EXPECT_TRUE(c->set_user_data(p.client, &mark));
  EXPECT_EQ(c->user_data(p.client), &mark);
  EXPECT_TRUE(c->is_open(p.client));
  const uint64_t id = p.client.value;
  ASSERT_EQ(c->disconnect(p.client, disconnect_mode::force), errc::ok);
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) != 0 && srv.live.empty(); }));
  expect_gone(c, p.client);
  EXPECT_EQ(c->send(connection_id{}, "x", 1), errc::closed) << "the zero id is never valid";
  // A new connection never gets the old id back, even in the same slot.
  pair q = connect(s, &srv, c, &cli);
  EXPECT_NE(q.client, p.client);
  EXPECT_EQ(c->send(p.client, "x", 1), errc::closed);
  EXPECT_EQ(c->send(q.client, "x", 1), errc::ok);
}

// close() reports every connection (on_disconnected: closed) before it returns; from then on their
// ids no longer resolve, though the loop frees the connections later: an owner that freed its
// per-connection object in on_disconnected must not get it back from user_data().
TEST_F(StreamApi, CallsOnAnIdCloseReportedFailAtOnce) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  int mark = 0;
  ASSERT_TRUE(c->set_user_data(p.client, &mark));
  // Inside its own final callback the id still resolves (stream.h).
  stream_callbacks cb = cli.callbacks();
  void* in_final = nullptr;
  cb.on_disconnected = [&, base = cb.on_disconnected](connection_id id, errc why) {
    in_final = c->user_data(id);
    base(id, why);
  };
  ASSERT_EQ(c->set_callbacks(std::move(cb)), errc::ok);
  c->close();
  ASSERT_EQ(cli.disconnected.count(p.client.value), 1u);
  EXPECT_EQ(in_final, &mark);
  expect_gone(c, p.client);  // without running the loop
  ASSERT_TRUE(run([&] { return srv.live.empty(); }));
  expect_gone(c, p.client);
}

// The generation counter wraps after 2^32 connections (process-wide): a slot never hands out the
// same id again, and a slot whose generation would wrap is never used again.
TEST_F(StreamApi, IdsAreNeverHandedOutTwiceWhenTheGenerationWraps) {
  recorder r;
  stream_channel* c = make_channel(&r);
  std::vector<connection_id> seen;
  detail::stream_access::set_next_generation(5);
  seen.push_back(dial_and_end(c, &r));
  detail::stream_access::set_next_generation(5);  // as after a wrap-around
  seen.push_back(dial_and_end(c, &r));
  detail::stream_access::set_next_generation(UINT32_MAX);
  seen.push_back(dial_and_end(c, &r));
  for (uint32_t g : {1U, 5U, 6U, UINT32_MAX}) {
    detail::stream_access::set_next_generation(g);
    seen.push_back(dial_and_end(c, &r));
  }
  detail::stream_access::set_next_generation(1);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_TRUE(seen[i]) << i;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(seen[i], seen[j]) << i << " and " << j;
  }
}

// Memory for the send queue ran out: send() says no_memory, it counts as refused, nothing is
// queued, and the connection goes on (a later send that finds memory works).
TEST_F(StreamApi, ASendThatFindsNoMemoryIsRefusedAndCounted) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  const pair p = connect(s, &srv, c, &cli);
  detail::fail_next_ring_alloc(1);
  EXPECT_EQ(c->send(p.client, "lost", 4), errc::no_memory);
  detail::fail_next_ring_alloc(0);
  EXPECT_EQ(cm(c, p.client).send_refused, 1U);
  EXPECT_EQ(cm(c, p.client).queue_packets, 0U);
  uint64_t seq = 0;
  ASSERT_EQ(c->send(p.client, "kept", 4, &seq), errc::ok);
  EXPECT_EQ(seq, 1U);
  ASSERT_TRUE(run([&] { return srv.received[p.server.value].size() == 1; }));
  EXPECT_EQ(srv.received[p.server.value][0], "kept");
  EXPECT_EQ(cli.writable.count(p.client.value), 0U) << "no on_writable follows a no_memory";
}

TEST_F(StreamApi, ListenerIdsWorkUntilClosed) {
  recorder r;
  stream_channel* ch = make_channel(&r);
  int mark = 0;
  listener_id l;
  ASSERT_EQ(ch->listen("ipv4://127.0.0.1:0", &l, &mark), errc::ok);
  EXPECT_NE(ch->listener_port(l), 0);
  EXPECT_EQ(ch->listener_user_data(l), &mark);
  ASSERT_EQ(ch->close_listener(l), errc::ok);
  EXPECT_EQ(ch->close_listener(l), errc::closed);
  EXPECT_EQ(ch->listener_url(l), "");
  EXPECT_EQ(ch->listener_port(l), 0);
  EXPECT_EQ(ch->listener_user_data(l), nullptr);
}

// Every accepted packet is covered exactly once by on_written / on_send_failed, in order.
TEST_F(StreamApi, ReportsCoverEveryPacketOnceInNormalFlow) {
  recorder srv, cli;
  stream_config cfg;
  cfg.queue.ring_bytes = size_t{512} * 1024;
  cfg.queue.max_bytes = size_t{512} * 1024;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  srv.keep_payloads = false;
  uint64_t accepted = 0;
  std::string msg;
  // Mixed sizes: merged batches, gathered large frames and partial writes all happen.
  auto pump = [&] {
    for (;;) {
      msg.assign(accepted % 7 == 0 ? 20000 : 1 + accepted % 300, 'n');
      if (accepted == 20000) return;
      uint64_t seq = 0;
      const errc e = c->send(p.client, msg.data(), msg.size(), &seq);
      if (e == errc::queue_full) return;
      ASSERT_EQ(e, errc::ok);
      ASSERT_EQ(seq, ++accepted);
    }
  };
  cli.on_writable_hook = [&](connection_id) { pump(); };
  pump();
  ASSERT_TRUE(run([&] { return cli.written[p.client.value] == 20000; }));
  cli.expect_exact(p.client.value, accepted);
  EXPECT_TRUE(cli.failed.empty());
  EXPECT_LT(cli.written_calls[p.client.value], accepted / 4) << "reports must be cumulative";
}

TEST_F(StreamApi, ReportsCoverEveryPacketOnceWhenThePeerResetsMidQueue) {
  recorder srv, cli;
  stream_config cfg;
  cfg.queue.ring_bytes = size_t{4} * 1024 * 1024;
  cfg.queue.max_bytes = size_t{4} * 1024 * 1024;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  // The server stops reading: the kernel buffers fill and the client's queue backs up.
  ASSERT_EQ(s->pause_reading(p.server), errc::ok);
  const std::string big(50000, 'r');
  uint64_t accepted = 0;
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++accepted;
  ASSERT_TRUE(run([&] { return cm(c, p.client).write_calls > 2; }));
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++accepted;
  // Closing with unread data makes the server's kernel answer with a reset.
  ASSERT_EQ(s->disconnect(p.server, disconnect_mode::force), errc::ok);
  const uint64_t id = p.client.value;
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) != 0; }));
  EXPECT_NE(cli.disconnected[id], errc::ok);
  cli.expect_exact(id, accepted);
  ASSERT_EQ(cli.failed.size(), 1u);
  EXPECT_EQ(cli.failed[0].last, accepted);
  EXPECT_EQ(cli.failed[0].reason, cli.disconnected[id]);
  EXPECT_GT(cli.failed[0].last - cli.failed[0].first + 1, 0u);
}

// on_unsent hands back every packet of the failed range, oldest first, byte for byte, before
// on_send_failed names the range: small merged frames, large gathered ones, the one cut by a
// partial write and in-place (prepare_send) ones alike.
TEST_F(StreamApi, UnsentHandsBackEveryFailedPacketInOrder) {
  recorder srv, cli;
  stream_config cfg;
  cfg.queue.ring_bytes = size_t{4} * 1024 * 1024;
  cfg.queue.max_bytes = cfg.queue.ring_bytes;
  stream_channel* s = make_channel(&srv);
  std::vector<std::string> unsent;
  size_t unsent_at_failure = 0;
  stream_callbacks cbs = cli.callbacks();
  cbs.on_unsent = [&](connection_id, const uint8_t* d, size_t n) {
    EXPECT_TRUE(cli.failed.empty()) << "on_unsent after on_send_failed";
    unsent.emplace_back(reinterpret_cast<const char*>(d), n);
  };
  auto failed = cbs.on_send_failed;
  cbs.on_send_failed = [&](connection_id c, uint64_t first, uint64_t last, errc why) {
    unsent_at_failure = unsent.size();
    failed(c, first, last, why);
  };
  channels_.push_back(std::make_unique<stream_channel>(&loop_, cfg, std::move(cbs)));
  stream_channel* c = channels_.back().get();
  pair p = connect(s, &srv, c, &cli);
  ASSERT_EQ(s->pause_reading(p.server), errc::ok);
  std::vector<std::string> sent;
  auto send_one = [&] {
    const size_t i = sent.size();
    std::string m(i % 5 == 0 ? 9000 + i % 77 : 1 + i % 200, static_cast<char>('a' + i % 26));
    m.replace(0, std::min<size_t>(m.size(), 8), std::to_string(i).substr(0, 8));
    errc e = errc::ok;
    if (i % 3 == 0) {
      uint8_t* d = c->prepare_send(p.client, m.size(), &e);
      if (d == nullptr) return e;
      std::copy(m.begin(), m.end(), d);
      e = c->commit_send(p.client);
    } else {
      e = c->send(p.client, m.data(), m.size());
    }
    if (e == errc::ok) sent.push_back(m);
    return e;
  };
  while (send_one() == errc::ok) {
  }
  ASSERT_TRUE(run([&] { return cm(c, p.client).write_calls > 2; }));
  while (send_one() == errc::ok) {
  }
  ASSERT_EQ(s->disconnect(p.server, disconnect_mode::force), errc::ok);
  const uint64_t id = p.client.value;
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) != 0; }));
  ASSERT_EQ(cli.failed.size(), 1u);
  const uint64_t first = cli.failed[0].first;
  ASSERT_EQ(cli.failed[0].last, sent.size());
  ASSERT_EQ(unsent.size(), sent.size() - first + 1);
  EXPECT_EQ(unsent_at_failure, unsent.size());
  for (size_t i = 0; i < unsent.size(); ++i) {
    ASSERT_EQ(unsent[i], sent[first - 1 + i]) << "packet " << first + i;
  }
}

// Inside on_unsent the ending connection takes nothing, another one does, and closing the channel
// from there stops neither this walk nor the other connection's: every queued packet is handed
// back once.
TEST_F(StreamApi, UnsentMaySendElsewhereAndCloseTheChannel) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  std::map<uint64_t, std::string> unsent;
  stream_channel* c = nullptr;
  connection_id other;
  stream_callbacks cbs = cli.callbacks();
  cbs.on_unsent = [&](connection_id conn, const uint8_t* d, size_t n) {
    EXPECT_EQ(c->send(conn, "xyz", 3), errc::closed);
    if (unsent[conn.value].empty() && conn.value != other.value) {
      for (int i = 0; i < 50; ++i) EXPECT_EQ(c->send(other, "def", 3), errc::ok);
      c->close();
      EXPECT_EQ(unsent[other.value], repeat("def", 50));
    }
    unsent[conn.value].append(reinterpret_cast<const char*>(d), n);
  };
  channels_.push_back(std::make_unique<stream_channel>(&loop_, stream_config{}, std::move(cbs)));
  c = channels_.back().get();
  pair p1 = connect(s, &srv, c, &cli);
  other = connect(s, &srv, c, &cli).client;
  for (int i = 0; i < 50; ++i) ASSERT_EQ(c->send(p1.client, "abc", 3), errc::ok);
  ASSERT_EQ(c->disconnect(p1.client, disconnect_mode::force), errc::ok);
  ASSERT_TRUE(run([&] { return cli.disconnected.size() == 2; }));
  EXPECT_EQ(unsent[p1.client.value], repeat("abc", 50));
  cli.expect_exact(p1.client.value, 50);
  cli.expect_exact(other.value, 50);
}

TEST_F(StreamApi, ReportsCoverEveryPacketOnceOnChannelClose) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  uint64_t accepted = 0;
  for (int i = 0; i < 100; ++i, ++accepted) ASSERT_EQ(c->send(p.client, "abc", 3), errc::ok);
  ASSERT_TRUE(run([&] { return cli.written[p.client.value] == 100; }));
  ASSERT_EQ(s->pause_reading(p.server), errc::ok);
  const std::string big(60000, 'z');
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++accepted;
  c->close();
  cli.expect_exact(p.client.value, accepted);
  ASSERT_EQ(cli.failed.size(), 1u);
  EXPECT_EQ(cli.failed[0].reason, errc::closed);
}

TEST_F(StreamApi, SetCallbacksInsideACallbackTakesEffectAfterIt) {
  recorder srv, cli, other;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  srv.on_received_hook = [&](connection_id, const uint8_t*, size_t) {
    // Replaces the std::function that is running right now: must not destroy it under our feet.
    ASSERT_EQ(s->set_callbacks(other.callbacks()), errc::ok);
  };
  ASSERT_EQ(c->send(p.client, "one", 3), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
  ASSERT_EQ(c->send(p.client, "two", 3), errc::ok);
  ASSERT_TRUE(run([&] { return other.received_count == 1; }));
  EXPECT_EQ(srv.received_count, 1u);
}

TEST_F(StreamApi, ValidateAndLastErrorNameTheFieldAndTheUrl) {
  std::string detail;
  stream_config cfg;
  cfg.backlog = 0;
  EXPECT_EQ(stream_channel::validate(cfg, &detail), errc::invalid_argument);
  EXPECT_NE(detail.find("backlog"), std::string::npos) << detail;
  cfg = {};
  cfg.read_buffer_size = 100;
  EXPECT_EQ(stream_channel::validate(cfg, &detail), errc::invalid_argument);
  EXPECT_NE(detail.find("read_buffer_size"), std::string::npos) << detail;
  cfg = {};
  cfg.queue.max_bytes = 1000;
  EXPECT_EQ(stream_channel::validate(cfg, &detail), errc::invalid_argument);
  EXPECT_NE(detail.find("queue.max_bytes"), std::string::npos) << detail;
  EXPECT_EQ(stream_channel::validate(stream_config{}, &detail), errc::ok);

  recorder r;
  stream_channel* ch = make_channel(&r);
  EXPECT_EQ(ch->listen("ipv4://127.0.0.1"), errc::bad_url);
  EXPECT_EQ(ch->last_error().code, errc::bad_url);
  EXPECT_EQ(ch->last_error().detail, "ipv4://127.0.0.1: missing port");
  EXPECT_EQ(ch->connect("ipv4://127.0.0.1:0"), errc::bad_url);
  EXPECT_NE(ch->last_error().detail.find("ipv4://127.0.0.1:0"), std::string::npos);
  EXPECT_EQ(ch->connect("shm://x"), errc::unsupported_scheme);
  EXPECT_NE(ch->last_error().detail.find("shm://x"), std::string::npos);
  EXPECT_EQ(ch->listen("127.0.0.1:80"), errc::bad_url);
  EXPECT_NE(ch->last_error().detail.find("no scheme"), std::string::npos);
  // A call that succeeds leaves it alone.
  EXPECT_EQ(ch->listen("ipv4://127.0.0.1:0"), errc::ok);
  EXPECT_NE(ch->last_error().detail.find("no scheme"), std::string::npos);

  stream_config bad;
  bad.message_limit = 0;
  stream_channel* b = make_channel(&r, bad);
  EXPECT_EQ(b->listen("ipv4://127.0.0.1:0"), errc::invalid_argument);
  EXPECT_NE(b->last_error().detail.find("message_limit"), std::string::npos);
}

#ifdef NDEBUG

TEST_F(StreamApi, ForeignThreadCallsReturnWrongThreadAndDoNothing) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  std::vector<errc> got;
  bool open = false;
  std::thread t([&] {
    got.push_back(c->send(p.client, "x", 1));
    const const_buffer b{"x", 1};
    got.push_back(c->sendv(p.client, &b, 1));
    got.push_back(c->connect("ipv4://127.0.0.1:1"));
    got.push_back(c->listen("ipv4://127.0.0.1:0"));
    got.push_back(c->disconnect(p.client));
    got.push_back(c->pause_reading(p.client));
    got.push_back(c->set_callbacks({}));
    errc e = errc::ok;
    (void)c->prepare_send(p.client, 1, &e);
    got.push_back(e);
    c->close();
    open = c->is_open(p.client);
  });
  t.join();
  for (errc e : got) EXPECT_EQ(e, errc::wrong_thread);
  EXPECT_FALSE(open);
  // Nothing was done: the connection still works and nothing was sent.
  EXPECT_FALSE(c->closed());
  EXPECT_EQ(cm(c, p.client).queue_packets, 0u);
  ASSERT_EQ(c->send(p.client, "y", 1), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
  EXPECT_EQ(srv.received[p.server.value][0], "y");
}

#else

TEST_F(StreamApi, ForeignThreadCallsAbortNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  recorder r;
  stream_channel* ch = make_channel(&r);
  EXPECT_DEATH(
      {
        std::thread t([&] { (void)ch->send(connection_id{}, "x", 1); });
        t.join();
      },
      "stream_channel::send called from a thread other than its loop's thread");
}

#endif

}  // namespace
}  // namespace uvbus::test::stream_api_test
