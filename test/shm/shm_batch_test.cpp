// shm_writer::send_batch: several messages in one reservation, each verified on its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shm/layout.h"
#include "shm/test_hook.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_batch_test {
namespace {

using test::image;
using test::run_until;

using test::collected;

shm_config small_cfg(size_t ring = 4096, uint32_t max_rec = 1024) {
  shm_config c;
  c.ring_bytes = ring;
  c.max_record_size = max_rec;
  return c;
}

// A region image with one reader and one writer attached.
struct ring {
  shm_config cfg;
  image img;
  shm_writer w;
  shm_reader r;
  explicit ring(const shm_config& c) : cfg(c), img(shm_region_size(c)) {
    EXPECT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
    EXPECT_EQ(w.open_image(img.p, img.size), errc::ok);
    EXPECT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  }
  shm_detail::region_header* hdr() { return reinterpret_cast<shm_detail::region_header*>(img.p); }
  // Data of node 0 (64-byte nodes).
  uint8_t* data() { return img.p + shm_detail::kHeaderSize + cfg.ring_bytes / 64 * 8; }
};

std::vector<const_buffer> spans_of(const std::vector<std::string>& v) {
  std::vector<const_buffer> s;
  s.reserve(v.size());
  for (const auto& m : v) s.push_back({m.data(), m.size()});
  return s;
}

TEST(ShmBatch, RecordsArriveIntactAndInOrderAcrossWrapsAndPartialPolls) {
  // 128 nodes of 64 B: batches of 1..12 records of 12..212 B span up to 43 nodes, so they keep
  // crossing the end of the ring (padding first), and polls of 1..7 records stop inside batches.
  shm_config cfg = small_cfg(8192, 4088);
  cfg.batch_max = 3;  // callback batches end inside ring batches too
  ring g(cfg);
  std::mt19937 rng(11);
  uint64_t next_send = 0, next_recv = 0;
  struct st {
    uint64_t* next;
    bool ok = true;
  } s{&next_recv};
  auto cb = [](void* u, const shm_record* rec, size_t n) {
    auto* x = static_cast<st*>(u);
    for (size_t i = 0; i < n; ++i) {
      uint32_t wid;
      uint64_t seq;
      if (!test::check_record(rec[i].data, rec[i].size, 200, &wid, &seq) || seq != *x->next ||
          reinterpret_cast<uintptr_t>(rec[i].data) % 8 != 0) {
        x->ok = false;
      }
      ++*x->next;
    }
  };
  std::vector<uint8_t> buf(size_t{16} * 256);
  std::vector<const_buffer> sp(16);
  uint64_t batches_sent = 0;
  while (next_recv < 30000) {
    const size_t count = 1 + rng() % 12;
    for (size_t i = 0; i < count; ++i) {
      const size_t n = test::make_record(0, next_send + i, 200, buf.data() + i * 256);
      sp[i] = {buf.data() + i * 256, n};
    }
    const bool single = rng() % 5 == 0;
    const errc e = single ? g.w.send(sp[0].data, sp[0].size) : g.w.send_batch(sp.data(), count);
    ASSERT_TRUE(e == errc::ok || e == errc::queue_full) << to_string(e);
    if (e == errc::ok) {
      next_send += single ? 1 : count;
      batches_sent += single ? 0 : 1;
    }
    (void)test::poll_with(g.r, cb, &s, 1 + rng() % 7);
    ASSERT_TRUE(s.ok) << "at record " << next_recv;
  }
  while (test::poll_with(g.r, cb, &s, 100) > 0) {
  }
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(next_recv, next_send);
  EXPECT_GT(batches_sent, 1000u);
  EXPECT_GT(g.hdr()->write_pos.load(), 128u * 100);  // well over 100 laps
  EXPECT_EQ(g.r.metrics().checksum_failures, 0u);
  EXPECT_EQ(g.r.metrics().corrupt, 0u);
  EXPECT_EQ(g.r.metrics().records_read, next_send);
  EXPECT_EQ(g.w.metrics().records_written, next_send);
  EXPECT_EQ(g.hdr()->read_pos.load(), g.hdr()->write_pos.load());
}

TEST(ShmBatch, BatchAtTheSizeLimitPassesAndOneMoreByteIsRefused) {
  ring g(small_cfg(8192, 960));
  // 10 messages of 88 B take 10 * 96 = 960 B of batch: exactly the limit.
  std::vector<std::string> msgs;
  msgs.reserve(10);
  for (int i = 0; i < 10; ++i) msgs.emplace_back(88, static_cast<char>('a' + i));
  auto sp = spans_of(msgs);
  EXPECT_EQ(shm_writer::batch_bytes(88), 96u);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  msgs[9].push_back('!');  // 89 B pads to 96 + 8: 968 B
  sp = spans_of(msgs);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::message_too_large);
  std::vector<const_buffer> many(shm_writer::kMaxBatch + 1, const_buffer{"", 0});
  EXPECT_EQ(g.w.send_batch(many.data(), many.size()), errc::invalid_argument);
  EXPECT_EQ(g.w.send_batch(many.data(), 0), errc::ok);  // nothing
  EXPECT_EQ(g.w.send_batch(many.data(), 3), errc::ok);  // three empty messages
  collected got;
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &got, 100), 13u);
  ASSERT_EQ(got.recs.size(), 13u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got.recs[i], std::string(88, static_cast<char>('a' + i)));
  for (int i = 10; i < 13; ++i) EXPECT_TRUE(got.recs[i].empty());
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &got, 100), 0u);
}

TEST(ShmBatch, FullRingRefusesTheWholeBatch) {
  ring g(small_cfg(4096, 2040));                             // 64 nodes
  std::vector<std::string> msgs(15, std::string(120, 'x'));  // 15 * 128 + 8 B = 31 nodes
  auto sp = spans_of(msgs);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::queue_full);  // 2 nodes left
  collected got;
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &got, 1000), 30u);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &got, 1000), 15u);
}

TEST(ShmBatch, FlippedByteInOneRecordOfABatchSkipsOnlyThatRecord) {
  ring g(small_cfg());
  const std::vector<std::string> msgs = {"first", "second, corrupted", "third"};
  auto sp = spans_of(msgs);
  ASSERT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  // Batch prefix (8), item 0: prefix 8 + "first" padded to 8, item 1: prefix 8 + payload.
  g.data()[8 + 16 + 8 + 3] ^= 0x10;
  collected got;
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &got, 10), 2u);
  ASSERT_EQ(got.recs.size(), 2u);
  EXPECT_EQ(got.recs[0], "first");
  EXPECT_EQ(got.recs[1], "third");
  EXPECT_EQ(g.r.metrics().checksum_failures, 1u);
  EXPECT_EQ(g.r.metrics().records_read, 2u);
  EXPECT_EQ(g.hdr()->read_pos.load(), g.hdr()->write_pos.load());
}

TEST(ShmBatch, CorruptItemLengthSkipsTheRestOfTheBatchOnly) {
  ring g(small_cfg());
  const std::vector<std::string> msgs = {"first", "second", "third"};
  auto sp = spans_of(msgs);
  ASSERT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  ASSERT_EQ(g.w.send("after", 5), errc::ok);
  // Item 1's length runs far past the batch body.
  const uint32_t huge = 5000;
  std::memcpy(g.data() + 8 + 16, &huge, 4);
  collected got;
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &got, 10), 2u);
  ASSERT_EQ(got.recs.size(), 2u);
  EXPECT_EQ(got.recs[0], "first");
  EXPECT_EQ(got.recs[1], "after");
  EXPECT_EQ(g.r.metrics().corrupt, 1u);
  // A length that stays inside the body but is wrong fails the checksum instead.
  ASSERT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  const uint64_t at = (g.hdr()->write_pos.load() - 1) & 63;  // the batch's single node
  const uint32_t wrong = 1;
  std::memcpy(g.data() + at * 64 + 8, &wrong, 4);
  got.recs.clear();
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &got, 10), 2u);
  ASSERT_EQ(got.recs.size(), 2u);
  EXPECT_EQ(got.recs[0], "second");
  EXPECT_EQ(got.recs[1], "third");
  EXPECT_EQ(g.r.metrics().checksum_failures, 1u);
  EXPECT_EQ(g.hdr()->read_pos.load(), g.hdr()->write_pos.load());
}

TEST(ShmBatch, TryReceiveTakesABatchOneRecordAtATime) {
  ring g(small_cfg());
  const std::vector<std::string> msgs = {"one", std::string(40, 'z'), "three"};
  auto sp = spans_of(msgs);
  ASSERT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  char buf[64];
  size_t len = 0;
  ASSERT_EQ(g.r.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(std::string(buf, len), "one");
  EXPECT_EQ(g.hdr()->read_pos.load(), 0u);  // the batch's nodes stay held until its end
  EXPECT_EQ(g.r.try_receive(buf, 8, &len), errc::buffer_too_small);
  EXPECT_EQ(len, 40u);
  ASSERT_EQ(g.r.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(std::string(buf, len), std::string(40, 'z'));
  ASSERT_EQ(g.r.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(std::string(buf, len), "three");
  EXPECT_EQ(g.r.try_receive(buf, sizeof buf, &len), errc::would_block);
  EXPECT_EQ(g.hdr()->read_pos.load(), g.hdr()->write_pos.load());
}

TEST(ShmBatch, AbandonedBatchIsSkippedAsAUnitAndItsWriterTold) {
  shm_config cfg = small_cfg();
  cfg.abandon_timeout_us = 2000;
  cfg.reclaim_timeout_us = 60 * 1000 * 1000;  // only the writer's acknowledgement releases
  ring g(cfg);
  shm_writer fast;
  ASSERT_EQ(fast.open_image(g.img.p, g.img.size), errc::ok);
  struct ctx {
    shm_writer* fast;
    shm_reader* r;
    collected got;
    bool skipped = false;
  } cx{&fast, &g.r, {}};
  shm_detail::writer_access::set_test_hook(
      g.w,
      [](void* u) {
        auto* x = static_cast<ctx*>(u);
        ASSERT_EQ(x->fast->send("after", 5), errc::ok);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (x->r->metrics().abandoned == 0 && std::chrono::steady_clock::now() < end) {
          (void)test::poll_with(*x->r, collected::cb, &x->got, 10);
        }
        x->skipped = x->r->metrics().abandoned == 1;
      },
      &cx);
  const std::vector<std::string> msgs = {"slow 1", "slow 2", std::string(100, 's')};
  auto sp = spans_of(msgs);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::abandoned);
  EXPECT_TRUE(cx.skipped);
  ASSERT_EQ(cx.got.recs.size(), 1u);  // none of the batch: it went as one unit
  EXPECT_EQ(cx.got.recs[0], "after");
  EXPECT_EQ(g.r.metrics().abandoned, 1u);
  EXPECT_EQ(g.w.metrics().writer_abandoned, 1u);
  EXPECT_EQ(g.w.metrics().records_written, 0u);
  (void)test::poll_with(g.r, collected::cb, &cx.got, 10);
  EXPECT_EQ(g.hdr()->read_pos.load(), g.hdr()->write_pos.load());  // acknowledged: released
  shm_detail::writer_access::set_test_hook(g.w, nullptr, nullptr);
  EXPECT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);  // the same batch again
  EXPECT_EQ(test::poll_with(g.r, collected::cb, &cx.got, 10), 3u);
  ASSERT_EQ(cx.got.recs.size(), 4u);
  EXPECT_EQ(cx.got.recs[1], "slow 1");
  EXPECT_EQ(cx.got.recs[3], std::string(100, 's'));
}

TEST(ShmBatch, ThreeBatchingWriterThreadsOverMemKeepPerWriterOrder) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  const std::string name = test::unique_name("memb");
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  cfg.abandon_timeout_us = 50000;
  cfg.reclaim_timeout_us = 30 * 1000 * 1000;
  shm_reader r;
  ASSERT_EQ(r.open("mem://" + name, cfg), errc::ok);
  constexpr uint32_t kWriters = 3;
  constexpr uint64_t kEach = 20000;
  struct chk_t {
    std::vector<uint64_t> next = std::vector<uint64_t>(kWriters, 0);
    uint64_t total = 0, bad = 0;
    static void cb(void* u, const shm_record* rec, size_t n) {
      auto* c = static_cast<chk_t*>(u);
      for (size_t i = 0; i < n; ++i) {
        uint32_t w;
        uint64_t seq;
        if (!test::check_record(rec[i].data, rec[i].size, 100, &w, &seq) || w >= kWriters ||
            seq != c->next[w]) {
          ++c->bad;
          continue;
        }
        ++c->next[w];
        ++c->total;
      }
    }
  } chk;
  ASSERT_EQ(test::start_with(r, &loop, chk_t::cb, &chk), errc::ok);
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  ts.reserve(kWriters);
  for (uint32_t id = 0; id < kWriters; ++id) {
    ts.emplace_back([&, id] {
      shm_writer w;
      if (w.open("mem://" + name) != errc::ok) {
        ++failures;
        return;
      }
      std::vector<uint8_t> buf(size_t{32} * 128);
      std::vector<const_buffer> sp(32);
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      for (uint64_t seq = 0; seq < kEach;) {
        const size_t count = std::min<uint64_t>(1 + (seq * 7 + id) % 32, kEach - seq);
        for (size_t i = 0; i < count; ++i) {
          sp[i] = {buf.data() + i * 128, test::make_record(id, seq + i, 100, buf.data() + i * 128)};
        }
        errc e;
        while ((e = w.send_batch(sp.data(), count)) == errc::queue_full || e == errc::abandoned) {
          if (std::chrono::steady_clock::now() > end) break;
          std::this_thread::yield();
        }
        if (e != errc::ok) {
          ++failures;
          return;
        }
        seq += count;
      }
    });
  }
  EXPECT_TRUE(run_until(
      &loop, [&] { return chk.total + chk.bad >= kWriters * kEach; }, std::chrono::seconds(60)));
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(chk.bad, 0u);
  EXPECT_EQ(chk.total, kWriters * kEach);
  r.close();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(ShmBatch, SkippedRecordsAreLogged) {
  ring g(small_cfg());
  const std::vector<std::string> msgs = {"first", "second, corrupted", "third"};
  auto sp = spans_of(msgs);
  ASSERT_EQ(g.w.send_batch(sp.data(), sp.size()), errc::ok);
  g.data()[8 + 16 + 8 + 3] ^= 0x10;
  std::vector<std::pair<log_level, std::string>> logs;
  size_t got = 0;
  shm_reader_callbacks cb;
  cb.on_records = [&](const shm_record*, size_t n) { got += n; };
  cb.on_log = [&](log_level lv, const std::string& m) { logs.emplace_back(lv, m); };
  ASSERT_EQ(g.r.set_callbacks(cb), errc::ok);
  EXPECT_EQ(g.r.poll(10), 2u);
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_EQ(logs[0].first, log_level::error);
  EXPECT_NE(logs[0].second.find("1 record(s) skipped: checksum mismatch"), std::string::npos)
      << logs[0].second;
  EXPECT_EQ(g.r.poll(10), 0u);  // nothing new: no line
  EXPECT_EQ(logs.size(), 1u);
}

}  // namespace
}  // namespace uvbus::shm_batch_test
