// Moving data: ordering and integrity, coalescing, limits, back-pressure and packet fates.
#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "core/murmur3_batch.h"
#include "stream/stream_harness.h"
#include "stream/stream_impl.h"

namespace uvbus::test::stream_data_test {
namespace {

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Deterministic payload i: its size and bytes derive from i (checked at the receiver).
std::string payload(uint64_t i, size_t max) {
  uint64_t g = i * 7919 + 1;
  // Mostly small, sometimes large, now and then empty or at the limit.
  size_t n;
  const uint64_t pick = splitmix(g) % 100;
  if (pick < 2) {
    n = 0;
  } else if (pick < 4) {
    n = max;
  } else if (pick < 15) {
    n = splitmix(g) % max;
  } else {
    n = splitmix(g) % 300;
  }
  std::string s(n, '\0');
  for (size_t k = 0; k < n; k += 8) {
    const uint64_t v = splitmix(g);
    std::memcpy(&s[k], &v, std::min<size_t>(8, n - k));
  }
  if (n >= 8) std::memcpy(&s[0], &i, 8);
  return s;
}

class StreamData : public stream_fixture {
 protected:
  struct pair {
    connection_id server;
    connection_id client;
  };
  // Connects client channel c to server channel s over url (listening there first).
  pair connect(stream_channel* s, recorder* srv, stream_channel* c, recorder* cli,
               const std::string& url = "ipv4://127.0.0.1:0") {
    listener_id l;
    EXPECT_EQ(s->listen(url, &l), errc::ok);
    pair p;
    EXPECT_EQ(c->connect(s->listener_url(l), &p.client), errc::ok);
    const size_t before = srv->accepted.size();
    EXPECT_TRUE(run([&] {
      return srv->accepted.size() > before && cli->connected.count(p.client.value) != 0;
    }));
    p.server = srv->accepted.back();
    EXPECT_EQ(cli->connected[p.client.value], errc::ok);
    return p;
  }
};

// Sends `count` deterministic messages over conn, as fast as the queue allows, resuming from the
// on_writable callback.
struct pump {
  stream_channel* ch;
  connection_id conn;
  uint64_t count;
  size_t max;
  uint64_t next = 0;
  uint64_t refused = 0;
  void run() {
    while (next < count) {
      const std::string p = payload(next, max);
      const errc e = ch->send(conn, p.data(), p.size());
      if (e == errc::queue_full) {
        ++refused;
        return;  // resumed by on_writable
      }
      ASSERT_EQ(e, errc::ok);
      ++next;
    }
  }
};

TEST_F(StreamData, HundredThousandRandomMessagesArriveIntactAndInOrderBothWays) {
  for (const char* url : {"ipv4://127.0.0.1:0", "unix:///tmp/"}) {
    SCOPED_TRACE(url);
    std::string u = url;
    if (u == "unix:///tmp/") u += unique_name("order") + ".sock";
    recorder srv, cli;
    stream_config cfg;
    cfg.message_limit = 8192;
    cfg.queue.ring_bytes = size_t{256} * 1024;  // small: back-pressure must happen
    cfg.queue.max_bytes = size_t{256} * 1024;
    stream_channel* s = make_channel(&srv, cfg);
    stream_channel* c = make_channel(&cli, cfg);
    pair p = connect(s, &srv, c, &cli, u);
    constexpr uint64_t kCount = 100000;
    uint64_t srv_got = 0, cli_got = 0;
    bool bad = false;
    srv.keep_payloads = cli.keep_payloads = false;
    srv.on_received_hook = [&](connection_id, const uint8_t* d, size_t n) {
      const std::string want = payload(srv_got++, cfg.message_limit);
      if (n != want.size() || std::memcmp(d, want.data(), n) != 0) bad = true;
    };
    cli.on_received_hook = [&](connection_id, const uint8_t* d, size_t n) {
      const std::string want = payload(cli_got++, cfg.message_limit);
      if (n != want.size() || std::memcmp(d, want.data(), n) != 0) bad = true;
    };
    pump up{c, p.client, kCount, cfg.message_limit};
    pump down{s, p.server, kCount, cfg.message_limit};
    cli.on_writable_hook = [&](connection_id) { up.run(); };
    srv.on_writable_hook = [&](connection_id) { down.run(); };
    up.run();
    down.run();
    ASSERT_TRUE(run([&] { return (srv_got == kCount && cli_got == kCount) || bad; },
                    std::chrono::seconds(60)));
    EXPECT_FALSE(bad) << "a payload arrived corrupt or out of order";
    EXPECT_GT(up.refused + down.refused, 0u) << "back-pressure never engaged";
    const auto& m = cm(c, p.client);
    EXPECT_EQ(m.packets_sent, kCount);
    EXPECT_EQ(cm(s, p.server).packets_received, kCount);
    EXPECT_EQ(m.send_failed, 0u);
    EXPECT_EQ(m.decode_errors + cm(s, p.server).decode_errors, 0u);
    s->close();
    c->close();
  }
}

TEST_F(StreamData, CoalescesSmallPacketsIntoFewWrites) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  srv.keep_payloads = false;
  constexpr int kCount = 20000;
  // The sender outpaces the socket: everything is queued before the loop runs.
  for (int i = 0; i < kCount; ++i) {
    char buf[64];
    std::memset(buf, i & 0xff, sizeof buf);
    ASSERT_EQ(c->send(p.client, buf, sizeof buf), errc::ok);
  }
  // The queue gauges are the queue as it is when read (no frame updates them on the send path).
  const stream_connection_metrics queued = cm(c, p.client);
  EXPECT_EQ(queued.queue_packets, static_cast<size_t>(kCount));
  EXPECT_EQ(queued.queue_bytes, 69u * kCount);
  EXPECT_EQ(queued.queue_peak_bytes, 69u * kCount);
  EXPECT_EQ(c->metrics().totals.queue_bytes, 69u * kCount);
  ASSERT_TRUE(run([&] { return srv.received_count == kCount; }));
  const auto& m = cm(c, p.client);
  EXPECT_EQ(m.packets_sent, static_cast<uint64_t>(kCount));
  EXPECT_EQ(m.bytes_sent, 64u * kCount);
  EXPECT_EQ(m.queue_packets, 0u);
  EXPECT_EQ(m.queue_bytes, 0u);
  EXPECT_EQ(m.queue_peak_bytes, 69u * kCount);  // kept once the queue drained
  // 20000 frames of 69 bytes: about 22 merge buffers of 64 KiB.
  EXPECT_LT(m.write_calls, 100u);
  EXPECT_GT(m.packets_merged, kCount / 2u);
  EXPECT_EQ(c->metrics().totals.write_calls, m.write_calls);
}

// Payload byte counts of merged, gathered and single writes come from the queue's block tags:
// payloads around the one- and two-byte varint limits (127/128, 16383/16384) must count exactly.
TEST_F(StreamData, BytesSentCountsEveryPayloadByteOfMixedSizes) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  srv.keep_payloads = false;
  const size_t sizes[] = {0, 1, 127, 128, 200, 3000, 16383, 16384, 40000};
  std::vector<uint8_t> buf(40000, 0x5a);
  uint64_t want = 0;
  size_t sent = 0;
  for (int round = 0; round < 16; ++round) {  // 1.2 MB: within the default 2 MiB queue
    for (size_t n : sizes) {
      ASSERT_EQ(c->send(p.client, buf.data(), n), errc::ok);
      want += n;
      ++sent;
    }
  }
  ASSERT_TRUE(run([&] { return srv.received_count == sent; }));
  const auto& m = cm(c, p.client);
  EXPECT_EQ(m.packets_sent, sent);
  EXPECT_EQ(m.bytes_sent, want);
  EXPECT_GT(m.packets_merged, 0u);
  EXPECT_EQ(cm(s, p.server).bytes_received, want);
}

TEST_F(StreamData, WithoutCoalescingEveryPacketCostsAWrite) {
  recorder srv, cli;
  stream_config cfg;
  cfg.merge_threshold = 0;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  constexpr int kCount = 2000;
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(c->send(p.client, "0123456789", 10), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == kCount; }));
  EXPECT_GE(cm(c, p.client).write_calls, static_cast<uint64_t>(kCount));
  EXPECT_EQ(cm(c, p.client).packets_merged, 0u);
}

TEST_F(StreamData, MessagesAtTheLimitPassAndLimitPlusOneIsRefused) {
  recorder srv, cli;
  stream_config cfg;
  cfg.message_limit = 100000;
  stream_channel* s = make_channel(&srv, cfg);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  std::string big(cfg.message_limit, 'x');
  big[0] = 'a';
  big.back() = 'z';
  uint64_t seq = 0;
  ASSERT_EQ(c->send(p.client, big.data(), big.size(), &seq), errc::ok);
  EXPECT_EQ(seq, 1u);
  std::string over(cfg.message_limit + 1, 'y');
  EXPECT_EQ(c->send(p.client, over.data(), over.size(), &seq), errc::message_too_large);
  const const_buffer parts[] = {{big.data(), big.size()}, {"!", 1}};
  EXPECT_EQ(c->sendv(p.client, parts, 2, &seq), errc::message_too_large);
  EXPECT_EQ(seq, 1u) << "a refused send must not take a sequence number";
  EXPECT_EQ(cm(c, p.client).queue_packets, 1u) << "a refused send left something queued";
  ASSERT_TRUE(run([&] { return srv.received[p.server.value].size() == 1; }));
  EXPECT_EQ(srv.received[p.server.value][0], big);
  // And back the other way; also the empty message.
  ASSERT_EQ(s->send(p.server, big.data(), big.size()), errc::ok);
  ASSERT_EQ(s->send(p.server, static_cast<const void*>(nullptr), 0), errc::ok);
  ASSERT_TRUE(run([&] { return cli.received[p.client.value].size() == 2; }));
  EXPECT_EQ(cli.received[p.client.value][0], big);
  EXPECT_EQ(cli.received[p.client.value][1], "");
  ASSERT_TRUE(run([&] { return cli.written[p.client.value] == 1; }));
  EXPECT_EQ(cli.written_calls[p.client.value], 1u) << "a refused send was reported";
}

TEST_F(StreamData, GatherSendConcatenatesTheParts) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  const uint32_t header = 0x01020304;
  const const_buffer parts[] = {{&header, 4}, {"body", 4}, {nullptr, 0}, {"!", 1}};
  ASSERT_EQ(c->sendv(p.client, parts, 4), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received[p.server.value].size() == 1; }));
  EXPECT_EQ(srv.received[p.server.value][0], std::string("\x04\x03\x02\x01"
                                                         "body!",
                                                         9));
}

TEST_F(StreamData, PrepareAndCommitSendsInPlace) {
  recorder srv, cli;
  stream_config cfg;
  cfg.message_limit = 1000;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  errc e = errc::ok;
  uint8_t* buf = c->prepare_send(p.client, 5, &e);
  ASSERT_NE(buf, nullptr);
  EXPECT_EQ(e, errc::ok);
  // Another send while the reservation is open is refused, and so is a second reservation.
  EXPECT_EQ(c->send(p.client, "x", 1), errc::invalid_argument);
  EXPECT_EQ(c->prepare_send(p.client, 1, &e), nullptr);
  EXPECT_EQ(e, errc::invalid_argument);
  std::memcpy(buf, "hello", 5);  // NOLINT(bugprone-not-null-terminated-result): payload bytes
  uint64_t seq = 0;
  EXPECT_EQ(c->commit_send(p.client, &seq), errc::ok);
  EXPECT_EQ(seq, 1u);
  // A cancelled reservation leaves nothing behind.
  buf = c->prepare_send(p.client, 3, &e);
  ASSERT_NE(buf, nullptr);
  c->cancel_send(p.client);
  EXPECT_EQ(cm(c, p.client).queue_packets, 1u);
  EXPECT_EQ(c->prepare_send(p.client, 1001, &e), nullptr);
  EXPECT_EQ(e, errc::message_too_large);
  buf = c->prepare_send(p.client, 0, &e);
  ASSERT_NE(buf, nullptr);
  EXPECT_EQ(c->commit_send(p.client, &seq), errc::ok);
  EXPECT_EQ(seq, 2u) << "a cancelled reservation took a sequence number";
  ASSERT_EQ(c->send(p.client, "world", 5), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received[p.server.value].size() == 3; }));
  EXPECT_EQ(srv.received[p.server.value][0], "hello");
  EXPECT_EQ(srv.received[p.server.value][1], "");
  EXPECT_EQ(srv.received[p.server.value][2], "world");
  EXPECT_EQ(cm(c, p.client).packets_sent, 3u);
}

// A 16 KiB send queue for 1 KiB messages: fills after a few sends.
stream_config small_queue() {
  stream_config cfg;
  cfg.message_limit = 1024;
  cfg.queue.ring_bytes = size_t{16} * 1024;
  cfg.queue.max_bytes = size_t{16} * 1024;
  return cfg;
}

TEST_F(StreamData, QueueFullIsReportedAndWritableFollows) {
  recorder srv, cli;
  const stream_config cfg = small_queue();
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  char buf[1000] = {};
  int accepted = 0;
  errc e = errc::ok;
  while ((e = c->send(p.client, buf, sizeof buf)) == errc::ok) ++accepted;
  EXPECT_EQ(e, errc::queue_full);
  EXPECT_TRUE(is_retriable(e));
  EXPECT_GT(accepted, 5);
  EXPECT_EQ(cm(c, p.client).queue_packets, static_cast<size_t>(accepted));
  EXPECT_EQ(cm(c, p.client).send_refused, 1u);
  ASSERT_TRUE(run([&] { return cli.writable[p.client.value] == 1; }));
  EXPECT_LE(cm(c, p.client).queue_bytes, cfg.queue.max_bytes / 2);
  EXPECT_EQ(c->send(p.client, buf, sizeof buf), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == static_cast<uint64_t>(accepted) + 1; }));
  EXPECT_EQ(cli.writable[p.client.value], 1) << "on_writable fires once per queue_full episode";
}

// Checksums are written in batches before a flush writes the queue; frames queued by on_writable,
// which a flush calls between two of its writes, must get theirs before the flush goes on.
TEST_F(StreamData, FramesQueuedFromOnWritableCarryTheirChecksums) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, small_queue());
  pair p = connect(s, &srv, c, &cli);
  uint64_t sent = 0;
  const uint64_t total = 400;
  auto next = [&] {
    std::string m(100 + sent % 900, static_cast<char>('a' + sent % 26));
    m.replace(0, std::to_string(sent).size(), std::to_string(sent));
    return m;
  };
  // Sends until the queue refuses; the frames after the last full batch of 16 wait for a flush
  // to write their checksums.
  auto fill = [&](connection_id id) {
    while (sent < total) {
      const std::string m = next();
      if (c->send(id, m.data(), m.size()) != errc::ok) return;
      ++sent;
    }
  };
  cli.on_writable_hook = fill;
  fill(p.client);
  ASSERT_LT(sent, total) << "the queue must fill for on_writable to matter";
  ASSERT_TRUE(run([&] { return srv.received_count == total || !srv.disconnected.empty(); }));
  ASSERT_TRUE(srv.disconnected.empty()) << to_string(srv.disconnected.begin()->second);
  const auto& got = srv.received[p.server.value];
  ASSERT_EQ(got.size(), total);
  for (sent = 0; sent < total; ++sent) ASSERT_EQ(got[sent], next()) << sent;
}

// The merge window (stream_impl.h): what a socket took when it took only part of a merge, never
// below kMinMergeWindow; doubled after a merge it took whole, back to the whole buffer (0).
TEST(StreamMergeWindow, ShrinksToWhatTheSocketTookAndGrowsBack) {
  constexpr size_t cap = size_t{256} * 1024;
  constexpr auto k = size_t{1024};
  EXPECT_EQ(detail::next_merge_window(0, 80 * k, cap, cap), 80 * k);
  EXPECT_EQ(detail::next_merge_window(80 * k, 0, 80 * k, cap), 80 * k) << "EAGAIN says nothing";
  EXPECT_EQ(detail::next_merge_window(80 * k, 5 * k, 80 * k, cap), detail::kMinMergeWindow);
  EXPECT_EQ(detail::next_merge_window(80 * k, 80 * k, 80 * k, cap), 160 * k);
  EXPECT_EQ(detail::next_merge_window(160 * k, 160 * k, 160 * k, cap), 0u) << "the whole buffer";
  EXPECT_EQ(detail::next_merge_window(0, cap, cap, cap), 0u);
}

// A unix socket takes a few hundred KiB at most, so a reader that pauses makes the writer's merges
// go out in part and its merge window shrink; frames as large as merge_threshold (above the
// smallest window) must still be merged and sent, intact and in order.
TEST_F(StreamData, FramesUpToTheMergeThresholdPassWhileTheMergeWindowIsSmall) {
  recorder srv, cli;
  stream_config cfg;
  cfg.message_limit = size_t{64} * 1024;
  cfg.merge_threshold = size_t{40} * 1024;  // above kMinMergeWindow
  cfg.queue.ring_bytes = cfg.queue.max_bytes = size_t{1024} * 1024;
  stream_channel* s = make_channel(&srv, cfg);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli, "unix:///tmp/" + unique_name("window") + ".sock");
  ASSERT_EQ(s->pause_reading(p.server), errc::ok);
  uint64_t sent = 0;
  auto next = [](uint64_t i) {  // every fourth frame 30-38 KiB, the rest 100-1100 B
    const size_t n = i % 4 == 3 ? size_t{30} * 1024 + (i * 977) % 8192 : 100 + (i * 131) % 1000;
    std::string m(n, static_cast<char>('a' + i % 26));
    m.replace(0, std::to_string(i).size(), std::to_string(i));
    return m;
  };
  constexpr uint64_t kTotal = 600;  // about 5 MiB: several queue fills
  auto fill = [&](connection_id id) {
    while (sent < kTotal) {
      const std::string m = next(sent);
      if (c->send(id, m.data(), m.size()) != errc::ok) return;
      ++sent;
    }
  };
  cli.on_writable_hook = fill;
  fill(p.client);
  ASSERT_LT(sent, kTotal) << "the queue must fill while the reader is paused";
  // Let the writer meet the full socket before the reader resumes.
  ASSERT_TRUE(run([&] { return cm(c, p.client).queue_packets < sent; }));
  ASSERT_EQ(s->resume_reading(p.server), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == kTotal || !srv.disconnected.empty(); },
                  std::chrono::seconds(60)));
  ASSERT_TRUE(srv.disconnected.empty()) << to_string(srv.disconnected.begin()->second);
  const auto& got = srv.received[p.server.value];
  ASSERT_EQ(got.size(), kTotal);
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(got[i], next(i)) << i;
  EXPECT_GT(cm(c, p.client).packets_merged, 0u);
}

// The sender hashes frames as they are queued or in batches of 16, by kernel and size (AVX-512:
// every frame in batches; AVX2: under 24 B at once when none waits; scalar: under 256 B at once,
// larger ones in batches, two chains at a time), and the receiver verifies them one at a time or
// in batches likewise: every way must put, and find, the right checksum on every frame.
TEST_F(StreamData, FramesCarryTheirChecksumsWithEveryHashKernel) {
  for (const murmur3_impl k : {murmur3_impl::scalar, murmur3_impl::avx2, murmur3_impl::avx512}) {
    for (const uint64_t longest : {128, 1000}) {  // message_limit 1024
      if (!murmur3_batch_use(k)) continue;        // the channel reads the kernel when it is created
      SCOPED_TRACE(std::string(to_string(k)) + " up to " + std::to_string(longest));
      recorder srv, cli;
      stream_channel* s = make_channel(&srv);
      stream_channel* c = make_channel(&cli, small_queue());
      pair p = connect(s, &srv, c, &cli);
      constexpr uint64_t kTotal = 3000;
      auto next = [&](uint64_t i) {
        return std::string(i * 7919 % (longest + 1), static_cast<char>(i * 37));
      };
      uint64_t sent = 0;
      auto fill = [&](connection_id id) {
        for (; sent < kTotal; ++sent) {
          const std::string m = next(sent);
          if (c->send(id, m.data(), m.size()) != errc::ok) return;
        }
      };
      cli.on_writable_hook = fill;
      fill(p.client);
      ASSERT_TRUE(run([&] { return srv.received_count == kTotal || !srv.disconnected.empty(); }));
      ASSERT_TRUE(srv.disconnected.empty()) << to_string(srv.disconnected.begin()->second);
      const auto& got = srv.received[p.server.value];
      for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(got[i], next(i)) << i;
      s->close();
      c->close();
    }
  }
  ASSERT_TRUE(murmur3_batch_use(murmur3_impl::auto_));
}

TEST_F(StreamData, DynamicQueueModeWorksToo) {
  recorder srv, cli;
  stream_config cfg;
  cfg.queue.mode = queue_mode::dynamic;
  cfg.queue.max_bytes = size_t{128} * 1024;
  cfg.queue.max_blocks = 100;
  cfg.message_limit = size_t{64} * 1024;  // a frame of message_limit must fit max_bytes
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  int sent = 0;
  while (c->send(p.client, "abc", 3) == errc::ok) ++sent;
  EXPECT_EQ(sent, 100);
  ASSERT_TRUE(run([&] { return srv.received_count == 100u; }));
  EXPECT_LT(cm(c, p.client).write_calls, 10u);
}

TEST_F(StreamData, ForceDisconnectWithAFullQueueFailsEachQueuedPacketOnce) {
  recorder srv, cli;
  stream_config cfg;
  cfg.queue.ring_bytes = size_t{1024} * 1024;
  cfg.queue.max_bytes = size_t{1024} * 1024;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  // The server stops reading, so the socket buffers fill and part of the queue stays behind.
  ASSERT_EQ(s->pause_reading(p.server), errc::ok);
  std::string big(60000, 'b');
  uint64_t n = 0;
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++n;
  ASSERT_TRUE(run([&] { return cm(c, p.client).queue_bytes < size_t{1024} * 1024 - 60000; }));
  // Run a little more so a write is in flight (socket full), then refill the queue.
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++n;
  ASSERT_TRUE(run([&] { return cm(c, p.client).write_calls > 2; }));
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++n;
  const uint64_t id = p.client.value;
  ASSERT_EQ(c->disconnect(p.client, disconnect_mode::force), errc::ok);
  EXPECT_EQ(c->send(p.client, "x", 1), errc::closed);
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) != 0; }));
  EXPECT_EQ(cli.disconnected[id], errc::cancelled);
  cli.expect_exact(id, n);
  const uint64_t ok = cli.written[id];
  ASSERT_EQ(cli.failed.size(), 1u) << "one range for all the failed packets";
  EXPECT_EQ(cli.failed[0].reason, errc::cancelled);
  EXPECT_EQ(cli.failed[0].last, n);
  EXPECT_LT(ok, n) << "nothing was left to fail: the test did not fill the queue";
  EXPECT_GT(ok, 0u);
  const auto totals = c->metrics().totals;
  EXPECT_EQ(totals.packets_sent, ok);
  EXPECT_EQ(totals.send_failed, n - ok);
}

TEST_F(StreamData, SendReturnsConsecutiveSequenceNumbers) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  for (uint64_t i = 1; i <= 10; ++i) {
    uint64_t seq = 0;
    ASSERT_EQ(c->send(p.client, "abc", 3, &seq), errc::ok);
    EXPECT_EQ(seq, i);
  }
  const uint64_t id = p.client.value;
  ASSERT_EQ(c->disconnect(p.client, disconnect_mode::force), errc::ok);
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) != 0; }));
  // Nothing reached the kernel (the force came before the loop ran): one range 1..10.
  ASSERT_EQ(cli.failed.size(), 1u);
  EXPECT_EQ(cli.failed[0].first, 1u);
  EXPECT_EQ(cli.failed[0].last, 10u);
  EXPECT_EQ(cli.failed[0].reason, errc::cancelled);
  EXPECT_EQ(cli.written.count(id), 0u);
}

TEST_F(StreamData, OneCumulativeReportPerWriteBatch) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(c->send(p.client, "0123456789", 10), errc::ok);
  ASSERT_TRUE(run([&] { return cli.written[p.client.value] == 1000; }));
  // 1000 small frames leave in one merged write: one report, not one per packet.
  EXPECT_EQ(cli.written_calls[p.client.value], 1u);
  EXPECT_EQ(cm(c, p.client).write_calls, 1u);
  EXPECT_TRUE(cli.failed.empty());
}

TEST_F(StreamData, GracefulDisconnectDeliversEverythingFirst) {
  recorder srv, cli;
  stream_config cfg;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli, cfg);
  pair p = connect(s, &srv, c, &cli);
  srv.keep_payloads = false;
  uint64_t n = 0;
  std::string msg(1000, 'g');
  while (c->send(p.client, msg.data(), msg.size()) == errc::ok) ++n;
  const uint64_t id = p.client.value;
  ASSERT_EQ(c->disconnect(p.client, disconnect_mode::graceful), errc::ok);
  EXPECT_EQ(c->send(p.client, "x", 1), errc::closed);
  ASSERT_TRUE(run([&] { return cli.disconnected.count(id) && srv.live.empty(); }));
  EXPECT_EQ(cli.disconnected[id], errc::ok);
  EXPECT_EQ(srv.received_count, n);
  cli.expect_exact(id, n);
  EXPECT_EQ(cli.written[id], n);
  EXPECT_TRUE(cli.failed.empty());
}

TEST_F(StreamData, ChannelCloseFailsEveryQueuedPacketSynchronouslyOnce) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  ASSERT_EQ(s->pause_reading(p.server), errc::ok);
  std::string big(30000, 'c');
  uint64_t n = 0;
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++n;
  ASSERT_TRUE(run([&] { return cm(c, p.client).write_calls > 3; }));
  while (c->send(p.client, big.data(), big.size()) == errc::ok) ++n;
  const uint64_t id = p.client.value;
  const uint64_t sent_before = cm(c, p.client).packets_sent;
  c->close();
  // Synchronous: everything reported before close() returned.
  ASSERT_EQ(cli.disconnected.count(id), 1u);
  EXPECT_EQ(cli.disconnected[id], errc::closed);
  cli.expect_exact(id, n);
  ASSERT_EQ(cli.failed.size(), 1u);
  EXPECT_EQ(cli.failed[0].reason, errc::closed);
  EXPECT_EQ(cli.failed[0].first, sent_before + 1);
  EXPECT_EQ(cli.failed[0].last, n);
  EXPECT_EQ(c->connect("ipv4://127.0.0.1:1"), errc::closed);
  EXPECT_EQ(c->listen("ipv4://127.0.0.1:0"), errc::closed);
  const size_t reports = cli.failed.size() + cli.written_calls[id];
  ASSERT_EQ(s->resume_reading(p.server), errc::ok);
  ASSERT_TRUE(run([&] { return srv.live.empty(); }));
  EXPECT_EQ(cli.failed.size() + cli.written_calls[id], reports) << "a callback fired after close()";
}

TEST_F(StreamData, DisconnectInsideOnReceivedStopsDelivery) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(c->send(p.client, "m", 1), errc::ok);
  srv.on_received_hook = [&](connection_id conn, const uint8_t*, size_t) {
    if (srv.received_count == 3) {
      ASSERT_EQ(s->disconnect(conn, disconnect_mode::force), errc::ok);
      EXPECT_EQ(srv.disconnected.count(conn.value), 0u) << "callback inside disconnect()";
    }
  };
  const uint64_t sid = p.server.value;
  ASSERT_TRUE(run([&] { return srv.disconnected.count(sid) != 0; }));
  EXPECT_EQ(srv.received_count, 3u);
  ASSERT_TRUE(run([&] { return cli.live.empty(); }));
}

TEST_F(StreamData, EchoFromInsideOnReceived) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  srv.on_received_hook = [&](connection_id conn, const uint8_t* d, size_t n) {
    ASSERT_EQ(s->send(conn, d, n), errc::ok);
  };
  int rounds = 0;
  cli.on_received_hook = [&](connection_id conn, const uint8_t* d, size_t n) {
    if (++rounds < 1000) {
      ASSERT_EQ(c->send(conn, d, n), errc::ok);
    }
  };
  ASSERT_EQ(c->send(p.client, "ping", 4), errc::ok);
  ASSERT_TRUE(run([&] { return rounds == 1000; }));
}

TEST_F(StreamData, PauseAndResumeReading) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair p = connect(s, &srv, c, &cli);
  ASSERT_EQ(s->pause_reading(p.server), errc::ok);
  ASSERT_EQ(c->send(p.client, "held", 4), errc::ok);
  ASSERT_TRUE(run([&] { return cm(c, p.client).packets_sent == 1; }));
  run([] { return false; }, std::chrono::milliseconds(50));
  EXPECT_EQ(srv.received_count, 0u);
  ASSERT_EQ(s->resume_reading(p.server), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == 1; }));
}

TEST_F(StreamData, ChannelMetricsSumConnections) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  stream_channel* c = make_channel(&cli);
  pair a = connect(s, &srv, c, &cli);
  pair b = connect(s, &srv, c, &cli);
  ASSERT_EQ(c->send(a.client, "12345", 5), errc::ok);
  ASSERT_EQ(c->send(b.client, "123", 3), errc::ok);
  ASSERT_TRUE(run([&] { return srv.received_count == 2; }));
  const auto m = s->metrics();
  EXPECT_EQ(m.totals.packets_received, 2u);
  EXPECT_EQ(m.totals.bytes_received, 8u);
  EXPECT_EQ(c->metrics().totals.bytes_sent, 8u);
  EXPECT_EQ(m.connections_accepted, 2u);
  EXPECT_EQ(m.listeners_open, 2u);
  ASSERT_EQ(c->disconnect(a.client, disconnect_mode::force), errc::ok);
  ASSERT_TRUE(run([&] { return srv.live.size() == 1; }));
  // Closed connections still count in the totals.
  EXPECT_EQ(s->metrics().totals.bytes_received, 8u);
  EXPECT_EQ(s->metrics().connections_closed, 1u);
  EXPECT_EQ(c->metrics().totals.bytes_sent, 8u);
}

TEST_F(StreamData, DestroyingTheChannelFiresNoCallbacks) {
  recorder srv, cli;
  stream_channel* s = make_channel(&srv);
  auto c = std::make_unique<stream_channel>(&loop_, stream_config{}, cli.callbacks());
  listener_id l;
  ASSERT_EQ(s->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  connection_id conn;
  ASSERT_EQ(c->connect(s->listener_url(l), &conn), errc::ok);
  ASSERT_TRUE(run([&] { return !cli.live.empty(); }));
  ASSERT_EQ(c->send(conn, "x", 1), errc::ok);
  c.reset();
  EXPECT_TRUE(cli.failed.empty());
  EXPECT_TRUE(cli.written.empty());
  EXPECT_TRUE(cli.disconnected.empty());
  ASSERT_TRUE(run([&] { return srv.live.empty(); }));
}

}  // namespace
}  // namespace uvbus::test::stream_data_test
