// The ring across its stamp wrap: heads stamp positions mod 2^40 (layout.h), so these tests start
// fresh regions with their cursors just below a multiple of 2^40 and check that writers and the
// reader keep agreeing on every head there, including heads never claimed since the region was
// formatted and heads left untouched for exactly one stamp period.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shm/layout.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_wrap_test {
namespace {

using shm_detail::head_word;
using shm_detail::region_header;
using test::image;

constexpr uint64_t kPeriod = uint64_t{1} << shm_detail::kStampBits;  // positions per stamp cycle

shm_config cfg_of(size_t nodes) {
  shm_config c;
  c.ring_bytes = nodes * 64;
  c.max_record_size = nodes >= 64 ? 1024 : 256;  // at most half the ring
  c.abandon_timeout_us = 2000;
  c.reclaim_timeout_us = 5000;
  return c;
}

// Record `seq` of `len` (>= 8) bytes: seq, then bytes derived from it, so a sink can tell a record
// from any other (stale bytes, another sequence number, a tear).
std::string make_payload(uint64_t seq, size_t len) {
  std::string s(len, '\0');
  std::memcpy(s.data(), &seq, 8);
  for (size_t i = 8; i < len; ++i) s[i] = static_cast<char>(test::mix(seq * 1315423911u + i));
  return s;
}

// Records callback: every record must be the next one, of its expected length, intact.
struct in_order {
  const std::vector<size_t>* lens = nullptr;
  uint64_t next = 0;
  uint64_t bad = 0;
  static void cb(void* u, const shm_record* r, size_t n) {
    auto* self = static_cast<in_order*>(u);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t seq = self->next;
      const bool ok = seq < self->lens->size() && r[i].size == (*self->lens)[seq] &&
                      make_payload(seq, r[i].size) ==
                          std::string(reinterpret_cast<const char*>(r[i].data), r[i].size);
      if (!ok) ++self->bad;
      ++self->next;
    }
  }
};

// Sends record i of lens[i] bytes for every i from sink.next on (in send_batch groups of 1..5 when
// rng is given), polling the reader whenever the ring is full and every few sends; then drains.
// True if every record arrived before a 10 s deadline (a desynchronised ring stalls: queue_full or
// nothing to read, for ever).
bool pump(shm_writer& w, shm_reader& r, in_order& sink, const std::vector<size_t>& lens,
          std::mt19937_64* rng = nullptr) {
  sink.lens = &lens;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  if (r.set_callbacks(test::records_to(in_order::cb, &sink)) != errc::ok) return false;
  for (size_t i = sink.next; i < lens.size();) {
    if (std::chrono::steady_clock::now() > end) return false;
    const size_t want = rng == nullptr ? 1 : 1 + (*rng)() % 5;
    std::vector<std::string> bufs;
    std::vector<const_buffer> msgs;
    size_t body = 0;
    for (size_t j = i; j < lens.size() && bufs.size() < want; ++j) {
      body += shm_writer::batch_bytes(lens[j]);
      if (!bufs.empty() && body > w.max_record_size()) break;
      bufs.push_back(make_payload(j, lens[j]));
    }
    const size_t k = bufs.size();
    msgs.reserve(bufs.size());
    for (const auto& b : bufs) msgs.push_back({b.data(), b.size()});
    const errc e = w.send_batch(msgs.data(), k);
    if (e == errc::ok) {
      i += k;
      if (i % 3 == 0) (void)r.poll(rng == nullptr ? 4 : 1 + (*rng)() % 7);
    } else if (e == errc::queue_full) {
      (void)r.poll(64);
    } else {
      return false;
    }
  }
  while (sink.next < lens.size() && std::chrono::steady_clock::now() < end) (void)r.poll(64);
  return sink.next == lens.size();
}

// A formatted image whose three cursors start at `pos`, as if the ring had already carried `pos`
// nodes without ever claiming a node at its last indices (all heads still as formatted).
struct ring_at {
  shm_config cfg;
  image img;
  shm_writer w;
  shm_reader r;
  ring_at(size_t nodes, uint64_t pos) : cfg(cfg_of(nodes)), img(shm_region_size(cfg)) {
    EXPECT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
    hdr()->write_pos.store(pos);
    hdr()->read_pos.store(pos);
    hdr()->consumed_pos.store(pos);
    EXPECT_EQ(w.open_image(img.p, img.size), errc::ok);
    EXPECT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  }
  [[nodiscard]] region_header* hdr() const { return reinterpret_cast<region_header*>(img.p); }
  [[nodiscard]] head_word* head(uint64_t pos) const {
    auto* heads = reinterpret_cast<head_word*>(img.p + shm_detail::kHeaderSize);
    return heads + (pos & (cfg.ring_bytes / 64 - 1));
  }
};

// The reviewer's case: a record starts at position 2^40 - 1, whose index N - 1 was never claimed,
// so its head still holds the formatted ~0, which reads as stamp 2^40 - 1 with node count 0xffff.
// Writers and reader must step over it alike (one node) and every record must still arrive.
void last_stamp_unclaimed(size_t nodes, uint64_t lead, size_t first_len) {
  SCOPED_TRACE("nodes " + std::to_string(nodes) + ", lead " + std::to_string(lead) +
               ", first record " + std::to_string(first_len) + " B");
  const uint64_t at = kPeriod - 1;
  ring_at ring(nodes, at - lead);
  std::vector<size_t> lens(lead, 20);  // one node each: the next record starts exactly at `at`
  in_order sink;
  ASSERT_TRUE(pump(ring.w, ring.r, sink, lens));
  ASSERT_EQ(ring.hdr()->write_pos.load(), at);
  ASSERT_EQ(ring.head(at)->load(), ~uint64_t{0});  // never claimed: reads as stamped `at`
  ASSERT_TRUE(shm_detail::ctl_is(ring.head(at)->load(), at));
  const uint64_t more = std::min<uint64_t>(3 * nodes / 2, 3000);  // over a lap (small ring)
  for (uint64_t i = 0; i < more; ++i) lens.push_back(i == 0 ? first_len : 8 + i * 37 % 180);
  EXPECT_TRUE(pump(ring.w, ring.r, sink, lens))
      << "delivered " << sink.next << " of " << lens.size();
  EXPECT_EQ(sink.bad, 0u);
  const shm_metrics m = ring.r.metrics();
  EXPECT_EQ(m.corrupt, 0u);  // the formatted head is not damage
  EXPECT_EQ(m.checksum_failures, 0u);
  EXPECT_EQ(ring.hdr()->read_pos.load(), ring.hdr()->write_pos.load());
  EXPECT_GT(ring.hdr()->write_pos.load(), kPeriod);
}

TEST(ShmStampWrap, NeverClaimedHeadAtTheLastStampIsSteppedOverByWritersAndReaderAlike) {
  for (const uint64_t lead : {0, 1, 5}) {
    for (const size_t first : {20, 150}) {    // 1 node; 3 nodes (would need padding at N - 1)
      last_stamp_unclaimed(16, lead, first);  // before the fix: queue_full for ever
      if (HasFatalFailure()) return;
    }
  }
  // A ring larger than the 0xffff nodes the ~0 head claims: before the fix the writers went on
  // 65535 nodes ahead and the reader waited for ever at 2^40.
  last_stamp_unclaimed(size_t{1} << 17, 0, 20);
}

// From a few laps before a stamp wrap (the first and a later one) to many laps after it: random
// sizes (1 to 4 nodes, so padding lands everywhere), batches, polls of random lengths.
TEST(ShmStampWrap, RingKeepsDeliveringAcrossTheStampWrap) {
  for (const uint64_t start : {kPeriod - 192, 3 * kPeriod - 192 + 5, 7 * kPeriod - 1}) {  // 3 laps
    for (const bool batches : {false, true}) {
      SCOPED_TRACE("start " + std::to_string(start) + (batches ? ", batches" : ""));
      std::mt19937_64 rng(start + batches);
      ring_at ring(64, start);
      std::vector<size_t> lens(2000);
      for (auto& l : lens) l = 8 + rng() % 240;
      in_order sink;
      EXPECT_TRUE(pump(ring.w, ring.r, sink, lens, batches ? &rng : nullptr))
          << "delivered " << sink.next << " of " << lens.size();
      EXPECT_EQ(sink.bad, 0u);
      const shm_metrics m = ring.r.metrics();
      EXPECT_EQ(m.corrupt + m.checksum_failures + m.abandoned, 0u);
      EXPECT_EQ(ring.hdr()->read_pos.load(), ring.hdr()->write_pos.load());
      EXPECT_GT(ring.hdr()->write_pos.load(),
                start / kPeriod * kPeriod + kPeriod + 640);  // 10 laps
    }
  }
}

// A head not claimed for exactly one stamp period carries a stamp equal to the current position's
// again (here an intact COMMITTED record of 3 nodes from 2^40 positions ago, and a PAD). Writers
// help write_pos over it as over an unadvanced claim, the reader skips the same nodes, and the old
// record never verifies at its new position (position_mix differs by a non-zero constant).
TEST(ShmStampWrap, HeadUntouchedForOneStampPeriodIsSkippedInStepAndNeverDelivered) {
  constexpr uint64_t kAt = 5 * kPeriod + 4;  // node index 4 of 16
  for (uint64_t k = 1; k < 1000; ++k) {
    EXPECT_NE(shm_detail::position_mix(kAt), shm_detail::position_mix(kAt + k * kPeriod));
  }
  ring_at ring(16, kAt);
  const std::string old = make_payload(0, 150);  // what record 0 will be: must not count twice
  shm_detail::record_prefix pre{
      static_cast<uint32_t>(old.size()),
      shm_detail::record_checksum(shm_detail::kVersion, old.data(), old.size(), kAt - kPeriod)};
  uint8_t* node = ring.img.p + shm_detail::kHeaderSize + size_t{16} * 8 + size_t{4} * 64;
  std::memcpy(node, &pre, sizeof pre);
  std::copy(old.begin(), old.end(), node + sizeof pre);
  ring.head(kAt)->store(shm_detail::make_ctl(kAt - kPeriod, 3, shm_detail::kCommitted));
  ring.head(kAt + 9)->store(shm_detail::make_ctl(kAt + 9 - kPeriod, 0, shm_detail::kPad));
  // Record 0 (3 nodes) goes after the old record (kAt + 3 .. kAt + 5), records 1..3 (1 node) fill
  // kAt + 6 .. kAt + 8, and record 4 meets the PAD at kAt + 9, three nodes before the lap's end.
  std::vector<size_t> lens(4, 20);
  lens[0] = 150;
  in_order sink;
  ASSERT_TRUE(pump(ring.w, ring.r, sink, lens));
  ASSERT_EQ(ring.hdr()->write_pos.load(), kAt + 9);
  ASSERT_TRUE(shm_detail::ctl_is(ring.head(kAt + 9)->load(), kAt + 9));
  // A matching head needs no writer: the reader has stepped over the PAD already, past write_pos.
  ASSERT_EQ(ring.hdr()->read_pos.load(), kAt + 12);
  for (size_t i = 4; i < 200; ++i) lens.push_back(8 + i * 53 % 200);
  EXPECT_TRUE(pump(ring.w, ring.r, sink, lens)) << "delivered " << sink.next;
  EXPECT_EQ(sink.bad, 0u);
  const shm_metrics m = ring.r.metrics();
  EXPECT_EQ(m.checksum_failures, 1u);  // the old record, at its aliased position
  EXPECT_EQ(m.corrupt, 0u);
  EXPECT_EQ(ring.hdr()->read_pos.load(), ring.hdr()->write_pos.load());
}

// Writers help write_pos over an old matching head only while that keeps write_pos within a ring
// of read_pos (a real claim always is): otherwise queue_full until the reader, which needs no
// writer to step over such a head, has passed it. Here 14 records from node 8 on fill the ring up
// to node 6 of the next lap, whose head matches with a count of 4: helping would put write_pos 18
// nodes past read_pos in a ring of 16.
TEST(ShmStampWrap, OldHeadNeverTakesWritePosMoreThanARingPastReadPos) {
  constexpr uint64_t kAt = 2 * kPeriod + 8;
  ring_at ring(16, kAt);
  ring.head(kAt + 14)->store(shm_detail::make_ctl(kAt + 14 - kPeriod, 4, shm_detail::kCommitted));
  std::vector<size_t> lens(40, 20);
  for (size_t i = 0; i < 14; ++i) {
    const std::string b = make_payload(i, lens[i]);
    ASSERT_EQ(ring.w.send(b.data(), b.size()), errc::ok);
  }
  const std::string b = make_payload(14, lens[14]);
  EXPECT_EQ(ring.w.send(b.data(), b.size()), errc::queue_full);
  EXPECT_EQ(ring.hdr()->write_pos.load(), kAt + 14);  // not helped: it would pass read_pos + 16
  in_order sink;
  sink.lens = &lens;
  EXPECT_EQ(test::poll_with(ring.r, in_order::cb, &sink, 64), 14u);
  EXPECT_EQ(ring.hdr()->read_pos.load(), kAt + 18);  // stepped over the old head
  EXPECT_TRUE(pump(ring.w, ring.r, sink, lens)) << "delivered " << sink.next;
  EXPECT_EQ(sink.bad, 0u);
  EXPECT_EQ(ring.r.metrics().corrupt, 1u);  // the old head's zeroed data: length 0 in 4 nodes
  EXPECT_EQ(ring.hdr()->read_pos.load(), ring.hdr()->write_pos.load());
}

// A reader passes the never-claimed head at 2^40 - 1 while no writer sends (its cursors then lead
// write_pos by that node) and closes with keep; the next reader helps write_pos over the same head
// at reattach (as writers do) and must accept the cursors, and a writer's records must arrive.
TEST(ShmStampWrap, ReaderPastTheNeverClaimedHeadIsReattached) {
  const std::string name = test::unique_name("stamp-reattach");
  const std::string url = "shm://" + name;
  test::shm_cleanup cleanup{name};
  const shm_config cfg = cfg_of(1024);
  const uint64_t at = kPeriod - 1;
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, cfg), errc::ok);
    test::raw_region raw(name);
    ASSERT_NE(raw.p, MAP_FAILED);
    raw.hdr()->write_pos.store(at);
    raw.hdr()->read_pos.store(at);
    raw.hdr()->consumed_pos.store(at);
    r.close(shm_close_mode::keep);  // its own cursors are still 0: it stores nothing
  }
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, cfg), errc::ok) << r.last_error().detail;
    ASSERT_TRUE(r.reattached());
    in_order sink;
    const std::vector<size_t> none;
    sink.lens = &none;
    EXPECT_EQ(test::poll_with(r, in_order::cb, &sink, 10), 0u);
    EXPECT_EQ(r.metrics().corrupt, 0u);
    r.close(shm_close_mode::keep);
  }
  shm_region_info info;
  ASSERT_EQ(shm_inspect(url, &info), errc::ok);
  ASSERT_EQ(info.write_pos, at);
  ASSERT_EQ(info.consumed_pos, at + 1);  // the reader stepped over the formatted head
  shm_reader r;
  ASSERT_EQ(r.open(url, cfg), errc::ok) << r.last_error().detail;
  ASSERT_TRUE(r.reattached());
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  std::vector<size_t> lens(3000);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = 8 + i * 97 % 240;
  in_order sink;
  EXPECT_TRUE(pump(w, r, sink, lens)) << "delivered " << sink.next;
  EXPECT_EQ(sink.bad, 0u);
  EXPECT_EQ(r.metrics().corrupt + r.metrics().checksum_failures, 0u);
}

}  // namespace
}  // namespace uvbus::shm_wrap_test
