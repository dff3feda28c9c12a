// Single-process behaviour of the ring: limits, corruption, layout checks, wrap-around,
// try_receive.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "shm/layout.h"
#include "shm/test_hook.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_ring_test {
namespace {

using test::image;

struct collected {
  std::vector<std::vector<uint8_t>> recs;
  static void cb(void* u, const shm_record* r, size_t n) {
    auto* self = static_cast<collected*>(u);
    for (size_t i = 0; i < n; ++i) self->recs.emplace_back(r[i].data, r[i].data + r[i].size);
  }
};

shm_config small_cfg(size_t ring = 4096, uint32_t max_rec = 1024) {
  shm_config c;
  c.ring_bytes = ring;
  c.max_record_size = max_rec;
  return c;
}

TEST(ShmConfig, RejectsInvalidSizes) {
  shm_config c;
  EXPECT_EQ(shm_validate(c), errc::ok);
  c.ring_bytes = 3000;
  EXPECT_EQ(shm_validate(c), errc::invalid_argument);
  c = shm_config{};
  c.node_size = 96;
  EXPECT_EQ(shm_validate(c), errc::invalid_argument);
  c = shm_config{};
  c.ring_bytes = 4096;
  c.max_record_size = 4096;  // more than half the ring
  EXPECT_EQ(shm_validate(c), errc::invalid_argument);
  EXPECT_EQ(shm_region_size(c), 0u);
  EXPECT_EQ(shm_region_size(shm_config{}), 4096u + (8u << 20) / 64 * 8 + (8u << 20));
}

TEST(ShmRing, RecordExactlyAtLimitPassesAndOneMoreIsRefused) {
  const shm_config cfg = small_cfg(8192, 1000);
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer w;
  shm_reader r;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  EXPECT_EQ(w.max_record_size(), 1000u);
  std::vector<uint8_t> big(1001);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(w.send(big.data(), 1000), errc::ok);
  EXPECT_EQ(w.send(big.data(), 1001), errc::message_too_large);
  const const_buffer halves[] = {{big.data(), 500}, {big.data() + 500, 501}};
  EXPECT_EQ(w.sendv(halves, 2), errc::message_too_large);
  collected got;
  EXPECT_EQ(test::poll_with(r, collected::cb, &got, 10), 1u);
  ASSERT_EQ(got.recs.size(), 1u);
  EXPECT_EQ(got.recs[0], std::vector<uint8_t>(big.begin(), big.begin() + 1000));
  EXPECT_EQ(test::poll_with(r, collected::cb, &got, 10), 0u);
}

TEST(ShmRing, FullRingReturnsQueueFullAtOnceAndRecoversAfterDrain) {
  const shm_config cfg = small_cfg(4096, 512);  // 64 nodes
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer w;
  shm_reader r;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  uint8_t buf[100] = {};
  int sent = 0;
  errc e = errc::ok;
  while ((e = w.send(buf, sizeof buf)) == errc::ok) ++sent;  // 116 B = 2 nodes each
  EXPECT_EQ(e, errc::queue_full);
  EXPECT_EQ(sent, 32);
  EXPECT_EQ(w.send(buf, 1), errc::queue_full);  // even a one-node record: nothing is overwritten
  EXPECT_EQ(w.metrics().queue_full, 2u);
  EXPECT_EQ(w.metrics().fill_bytes, 4096u);
  collected got;
  EXPECT_EQ(test::poll_with(r, collected::cb, &got, 1000), 32u);
  EXPECT_EQ(w.send(buf, sizeof buf), errc::ok);
  EXPECT_EQ(test::poll_with(r, collected::cb, &got, 1000), 1u);
}

TEST(ShmRing, WrapAroundWithMultiNodeRecordsKeepsEveryRecordIntactAndInOrder) {
  const shm_config cfg = small_cfg(4096, 1000);  // 64 nodes; records of 1..16 nodes
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer w;
  shm_reader r;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  uint64_t next_send = 0, next_recv = 0;
  uint8_t buf[1024];
  std::mt19937 rng(7);
  struct st {
    uint64_t* next;
    bool ok = true;
  } s{&next_recv};
  auto cb = [](void* u, const shm_record* rec, size_t n) {
    auto* x = static_cast<st*>(u);
    for (size_t i = 0; i < n; ++i) {
      uint32_t wid;
      uint64_t seq;
      if (!test::check_record(rec[i].data, rec[i].size, 900, &wid, &seq) || seq != *x->next) {
        x->ok = false;
      }
      ++*x->next;
    }
  };
  while (next_recv < 20000) {
    // Send a random burst (until full), then drain a random number of records.
    const int burst = static_cast<int>(rng() % 8);
    for (int i = 0; i < burst; ++i) {
      const size_t n = test::make_record(0, next_send, 900, buf);
      const errc e = w.send(buf, n);
      if (e == errc::queue_full) break;
      ASSERT_EQ(e, errc::ok);
      ++next_send;
    }
    (void)test::poll_with(r, cb, &s, 1 + rng() % 6);
    ASSERT_TRUE(s.ok) << "at record " << next_recv;
  }
  const auto* h = reinterpret_cast<const shm_detail::region_header*>(img.p);
  EXPECT_GT(h->write_pos.load(), 64u * 100);  // well over 100 laps
  EXPECT_EQ(r.metrics().checksum_failures, 0u);
  EXPECT_EQ(r.metrics().corrupt, 0u);
}

TEST(ShmRing, GatherSendConcatenatesParts) {
  const shm_config cfg = small_cfg();
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer w;
  shm_reader r;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  const std::string a = "head:", b = "", c = "payload bytes";
  const const_buffer parts[] = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  EXPECT_EQ(w.sendv(parts, 3), errc::ok);
  EXPECT_EQ(w.send(static_cast<const void*>(nullptr), 0), errc::ok);  // an empty record is a record
  collected got;
  EXPECT_EQ(test::poll_with(r, collected::cb, &got, 10), 2u);
  ASSERT_EQ(got.recs.size(), 2u);
  EXPECT_EQ(std::string(got.recs[0].begin(), got.recs[0].end()), "head:payload bytes");
  EXPECT_TRUE(got.recs[1].empty());
}

TEST(ShmRing, FlippedByteInCommittedRecordIsSkippedAndCounted) {
  const shm_config cfg = small_cfg();
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer w;
  shm_reader r;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  const std::string m0 = "first", m1 = "second record, corrupted", m2 = "third";
  ASSERT_EQ(w.send(m0.data(), m0.size()), errc::ok);
  ASSERT_EQ(w.send(m1.data(), m1.size()), errc::ok);
  ASSERT_EQ(w.send(m2.data(), m2.size()), errc::ok);
  // Record 1 starts at node 1 (data after the header and 64 heads); flip one payload byte.
  img.p[shm_detail::kHeaderSize + 64 * 8 + 64 + shm_detail::kRecordHeaderSize + 3] ^= 0x10;
  collected got;
  EXPECT_EQ(test::poll_with(r, collected::cb, &got, 10), 2u);
  ASSERT_EQ(got.recs.size(), 2u);
  EXPECT_EQ(std::string(got.recs[0].begin(), got.recs[0].end()), m0);
  EXPECT_EQ(std::string(got.recs[1].begin(), got.recs[1].end()), m2);
  EXPECT_EQ(r.metrics().checksum_failures, 1u);
  EXPECT_EQ(r.metrics().records_read, 2u);
  // The header counters are visible to other processes (the inspect tool) too.
  const auto* h = reinterpret_cast<const shm_detail::region_header*>(img.p);
  EXPECT_EQ(h->checksum_failures.load(), 1u);
}

TEST(ShmRing, TryReceiveCopiesOneRecordAndReportsSmallBuffers) {
  const shm_config cfg = small_cfg();
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer w;
  shm_reader r;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  char buf[64];
  size_t len = 0;
  EXPECT_EQ(r.try_receive(buf, sizeof buf, &len), errc::would_block);
  ASSERT_EQ(w.send("hello world", 11), errc::ok);
  EXPECT_EQ(r.try_receive(buf, 4, &len), errc::buffer_too_small);
  EXPECT_EQ(len, 11u);
  EXPECT_EQ(r.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(std::string(buf, len), "hello world");
  EXPECT_EQ(r.try_receive(buf, sizeof buf, &len), errc::would_block);
}

TEST(ShmLayout, AttachRefusesWrongMagicVersionAndSizes) {
  const shm_config cfg = small_cfg();
  image img(shm_region_size(cfg));
  auto* h = reinterpret_cast<shm_detail::region_header*>(img.p);
  int line = 0;
  auto expect_refused = [&](auto mutate, errc want) {
    SCOPED_TRACE(++line);
    ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
    mutate();
    shm_writer w;
    shm_reader r;
    EXPECT_EQ(w.open_image(img.p, img.size), want);
    EXPECT_EQ(r.open_image(img.p, img.size, cfg), want);
  };
  expect_refused([&] { h->magic.store(0x1234); }, errc::bad_layout);
  expect_refused([&] { h->magic.store(0); }, errc::not_connected);  // still being formatted
  expect_refused([&] { h->version = shm_detail::kVersion + 1; }, errc::bad_layout);
  expect_refused([&] { h->version = shm_detail::kOldestVersion - 1; }, errc::bad_layout);
  expect_refused([&] { h->header_size = 2048; }, errc::bad_layout);
  expect_refused([&] { h->node_size = 32; }, errc::bad_layout);  // below the minimum
  expect_refused([&] { h->node_size = 100; }, errc::bad_layout);
  expect_refused([&] { h->ring_bytes = 8192; }, errc::bad_layout);
  expect_refused([&] { h->region_size += 64; }, errc::bad_layout);
  expect_refused([&] { h->record_header_size = 32; }, errc::bad_layout);
  expect_refused([&] { h->max_record_size = 1u << 30; }, errc::bad_layout);
  // A mapping shorter than the header says.
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer w;
  EXPECT_EQ(w.open_image(img.p, img.size - 64), errc::bad_layout);
  // Expectations of the writer.
  shm_writer_options opt;
  opt.expect_node_size = 128;
  EXPECT_EQ(w.open_image(img.p, img.size, opt), errc::bad_layout);
  opt = {};
  opt.expect_ring_bytes = 8192;
  EXPECT_EQ(w.open_image(img.p, img.size, opt), errc::bad_layout);
  opt.expect_ring_bytes = 4096;
  opt.expect_node_size = 64;
  EXPECT_EQ(w.open_image(img.p, img.size, opt), errc::ok);
}

TEST(ShmLayout, HostileImagesNeverCrashOrHangTheReader) {
  const shm_config cfg = small_cfg(4096, 1000);
  image img(shm_region_size(cfg));
  std::mt19937_64 rng(42);
  uint64_t delivered = 0;
  for (int round = 0; round < 2000; ++round) {
    ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
    auto* h = reinterpret_cast<shm_detail::region_header*>(img.p);
    h->read_pos.store(rng() % 4 == 0 ? rng() : rng() % 256);
    const uint64_t base = h->read_pos.load();
    // Random bytes everywhere in the ring, plus record headers whose stamps match so the reader
    // trusts the stamp and must bounds-check the rest.
    for (size_t i = shm_detail::kHeaderSize; i < img.size; i += 8) {
      const uint64_t v = rng();
      std::memcpy(img.p + i, &v, 8);
    }
    for (uint64_t pos = base; pos < base + 64; pos += 1 + rng() % 4) {
      auto* head =
          reinterpret_cast<shm_detail::head_word*>(img.p + shm_detail::kHeaderSize) + (pos & 63);
      head->store(shm_detail::make_ctl(pos, rng() % 80, static_cast<uint32_t>(rng() % 7)));
      const auto len = static_cast<uint32_t>(rng() % 3 == 0 ? rng() : rng() % 1200);
      std::memcpy(img.p + shm_detail::kHeaderSize + size_t{64} * 8 + (pos & 63) * 64, &len, 4);
    }
    shm_config rc = cfg;
    rc.abandon_timeout_us = 1;
    shm_reader r;
    ASSERT_EQ(r.open_image(img.p, img.size, rc), errc::ok);
    for (int k = 0; k < 3; ++k) {
      delivered += test::poll_with(
          r,
          [](void*, const shm_record* recs, size_t n) {
            for (size_t i = 0; i < n; ++i) {
              volatile uint8_t sink = 0;
              for (size_t j = 0; j < recs[i].size; ++j) sink = sink + recs[i].data[j];
            }
          },
          nullptr, 1000);
    }
    uint8_t buf[16];
    size_t len;
    (void)r.try_receive(buf, sizeof buf, &len);
  }
  EXPECT_EQ(delivered, 0u);  // random bytes never pass the checksum
}

TEST(ShmRing, AbandonedRecordIsSkippedAfterTimeoutAndSlowWriterLearnsIt) {
  shm_config cfg = small_cfg();
  cfg.abandon_timeout_us = 2000;
  cfg.reclaim_timeout_us = 60 * 1000 * 1000;  // only the writer's acknowledgement releases
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_writer slow, fast;
  shm_reader r;
  ASSERT_EQ(slow.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(fast.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  // The slow writer's hook runs between reserve and commit: from inside it, the other writer
  // sends and the reader polls past the timeout, so the slow record is skipped meanwhile.
  struct ctx {
    shm_writer* fast;
    shm_reader* r;
    collected got;
    bool skipped = false;
  } cx{&fast, &r, {}};
  shm_detail::writer_access::set_test_hook(
      slow,
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
  EXPECT_EQ(slow.send("slow", 4), errc::abandoned);
  EXPECT_TRUE(cx.skipped);
  ASSERT_EQ(cx.got.recs.size(), 1u);
  EXPECT_EQ(std::string(cx.got.recs[0].begin(), cx.got.recs[0].end()), "after");
  EXPECT_EQ(slow.metrics().writer_abandoned, 1u);
  // The skipped nodes were held until the writer acknowledged: now everything is released.
  (void)test::poll_with(r, collected::cb, &cx.got, 10);
  const auto* h = reinterpret_cast<const shm_detail::region_header*>(img.p);
  EXPECT_EQ(h->read_pos.load(), h->write_pos.load());
  shm_detail::writer_access::set_test_hook(slow, nullptr, nullptr);
  EXPECT_EQ(slow.send("again", 5), errc::ok);
  EXPECT_EQ(test::poll_with(r, collected::cb, &cx.got, 10), 1u);
}

TEST(ShmRing, SkippedNodesStayHeldUntilReclaimTimeoutWhenWriterNeverReturns) {
  shm_config cfg = small_cfg(1024, 256);  // 16 nodes
  cfg.abandon_timeout_us = 1000;
  cfg.reclaim_timeout_us = 20000;
  image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  shm_reader r;
  ASSERT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  // Simulate a dead writer: a claimed record (kWriting) that is never committed.
  auto* head = reinterpret_cast<shm_detail::head_word*>(img.p + shm_detail::kHeaderSize);
  head->store(shm_detail::make_ctl(0, 2, shm_detail::kWriting));
  auto* h = reinterpret_cast<shm_detail::region_header*>(img.p);
  h->write_pos.store(2);
  shm_writer w;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(w.send("x", 1), errc::ok);
  collected got;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.recs.empty() && std::chrono::steady_clock::now() < end) {
    (void)test::poll_with(r, collected::cb, &got, 10);
  }
  ASSERT_EQ(got.recs.size(), 1u);
  EXPECT_EQ(r.metrics().abandoned, 1u);
  EXPECT_EQ(h->read_pos.load(), 0u);  // held: a late copy by that writer cannot hit new records
  while (h->read_pos.load() == 0 && std::chrono::steady_clock::now() < end) {
    (void)test::poll_with(r, collected::cb, &got, 10);
  }
  EXPECT_EQ(h->read_pos.load(), 3u);
}

}  // namespace
}  // namespace uvbus::shm_ring_test
