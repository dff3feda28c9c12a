// shm_writer::coalesce: staged sends published as one reservation (order, contents, checksums,
// back-pressure, loop turns, reader gone or restarted, a writer killed mid-flush).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shm/layout.h"
#include "shm/test_hook.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_coalesce_test {
namespace {

using test::image;
using test::run_until;
using test::shm_cleanup;

using test::collected;

shm_config small_cfg(size_t ring = 4096, uint32_t max_rec = 1024) {
  shm_config c;
  c.ring_bytes = ring;
  c.max_record_size = max_rec;
  return c;
}

// A reader on a fresh mem:// region named after `name`, and *w attached to it, coalescing on
// loop (null: without a loop, explicit flushes). The reader is returned: the tests close it under
// the stage.
std::unique_ptr<shm_reader> open_coalescing(const char* name, shm_writer* w,
                                            uv_loop_t* loop = nullptr) {
  const std::string url = "mem://" + test::unique_name(name);
  auto r = std::make_unique<shm_reader>();
  EXPECT_EQ(r->open(url, small_cfg()), errc::ok);
  EXPECT_EQ(w->open(url), errc::ok);
  EXPECT_EQ(w->coalesce(loop), errc::ok);
  return r;
}

// A region image with one reader and one coalescing writer (no loop: explicit flushes).
struct ring {
  shm_config cfg;
  image img;
  shm_writer w;
  shm_reader r;
  collected got;
  explicit ring(const shm_config& c, size_t stage = shm_writer::kDefaultStageBytes)
      : cfg(c), img(shm_region_size(c)) {
    EXPECT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
    EXPECT_EQ(w.open_image(img.p, img.size), errc::ok);
    EXPECT_EQ(w.coalesce(nullptr, stage), errc::ok);
    EXPECT_EQ(r.open_image(img.p, img.size, cfg), errc::ok);
  }
  size_t poll(size_t max = 100000) { return test::poll_with(r, collected::cb, &got, max); }
  shm_detail::region_header* hdr() { return reinterpret_cast<shm_detail::region_header*>(img.p); }
  uint8_t* data() { return img.p + shm_detail::kHeaderSize + cfg.ring_bytes / 64 * 8; }
};

std::string msg(size_t i) {
  return "m" + std::to_string(i) + std::string(i % 37, static_cast<char>('a' + i % 26));
}

TEST(ShmCoalesce, StagedSendsArriveInOrderIntactAsOneReservation) {
  ring g(small_cfg());
  EXPECT_TRUE(g.w.coalescing());
  EXPECT_EQ(g.w.coalesce(), errc::wrong_state);
  std::vector<std::string> want;
  for (size_t i = 0; i < 10; ++i) {
    want.push_back(msg(i));
    ASSERT_EQ(g.w.send(want.back().data(), want.back().size()), errc::ok);
  }
  want.emplace_back();  // an empty message
  ASSERT_EQ(g.w.send(nullptr, 0), errc::ok);
  const const_buffer parts[] = {{"gat", 3}, {"her", 3}};
  want.emplace_back("gather");
  ASSERT_EQ(g.w.sendv(parts, 2), errc::ok);
  EXPECT_EQ(g.w.staged(), 12u);
  EXPECT_EQ(g.poll(), 0u);  // nothing in the ring yet
  EXPECT_EQ(g.hdr()->write_pos.load(), 0u);
  ASSERT_EQ(g.w.flush(), errc::ok);
  EXPECT_EQ(g.w.staged(), 0u);
  EXPECT_EQ(g.w.flush(), errc::ok);  // nothing staged: ok, no reservation
  EXPECT_EQ(g.w.metrics().coalesced_flushes, 1u);
  EXPECT_EQ(g.w.metrics().records_written, 12u);
  EXPECT_EQ(g.poll(), 12u);
  EXPECT_EQ(g.got.recs, want);
  EXPECT_EQ(g.r.metrics().checksum_failures, 0u);
  EXPECT_EQ(g.hdr()->read_pos.load(), g.hdr()->write_pos.load());
}

TEST(ShmCoalesce, OneStagedMessageIsAPlainRecordAndAFlippedByteSkipsOnlyItsMessage) {
  ring g(small_cfg());
  ASSERT_EQ(g.w.send("solo", 4), errc::ok);
  ASSERT_EQ(g.w.flush(), errc::ok);
  EXPECT_EQ(g.hdr()->write_pos.load(), 1u);  // one node: the plain record format
  EXPECT_EQ(g.poll(), 1u);
  // Three messages in a batch at node 1: flip a payload byte of the first one.
  for (const char* m : {"first", "second", "third"}) ASSERT_EQ(g.w.send(m, 5), errc::ok);
  ASSERT_EQ(g.w.flush(), errc::ok);
  g.data()[64 + 8 + 8] ^= 0x01;  // node 1, after the batch prefix and the item prefix
  EXPECT_EQ(g.poll(), 2u);
  EXPECT_EQ(g.r.metrics().checksum_failures, 1u);
  ASSERT_EQ(g.got.recs.size(), 3u);
  EXPECT_EQ(g.got.recs[0], "solo");
  EXPECT_EQ(g.got.recs[1], "secon");
  EXPECT_EQ(g.got.recs[2], "third");
}

TEST(ShmCoalesce, FullStagePublishesItselfAndABigMessageGoesAloneAfterIt) {
  ring g(small_cfg(), 256);  // 8 messages of 24 bytes (32 bytes each with their prefix)
  std::vector<std::string> want;
  for (size_t i = 0; i < 20; ++i) {
    want.push_back("twenty-four bytes #" + std::to_string(100 + i) + "..");
    ASSERT_EQ(want.back().size(), 24u);
    ASSERT_EQ(g.w.send(want.back().data(), 24), errc::ok);
  }
  EXPECT_EQ(g.w.metrics().coalesced_flushes, 2u);
  EXPECT_EQ(g.w.staged(), 4u);
  want.emplace_back(300, 'B');  // larger than the stage
  ASSERT_EQ(g.w.send(want.back().data(), want.back().size()), errc::ok);
  EXPECT_EQ(g.w.staged(), 0u);
  EXPECT_EQ(g.w.send("x", 2000), errc::message_too_large);
  EXPECT_EQ(g.poll(), 21u);
  EXPECT_EQ(g.got.recs, want);
}

TEST(ShmCoalesce, StageCapsAtMaxBatchMessages) {
  ring g(small_cfg(size_t{64} * 1024, 16384), 16384);
  for (size_t i = 0; i < shm_writer::kMaxBatch + 1; ++i) ASSERT_EQ(g.w.send(nullptr, 0), errc::ok);
  EXPECT_EQ(g.w.metrics().coalesced_flushes, 1u);
  EXPECT_EQ(g.w.staged(), 1u);
  ASSERT_EQ(g.w.flush(), errc::ok);
  EXPECT_EQ(g.poll(), shm_writer::kMaxBatch + 1);
}

TEST(ShmCoalesce, SendBatchAndSendvNowPublishTheStageFirst) {
  ring g(small_cfg());
  ASSERT_EQ(g.w.send("A", 1), errc::ok);
  ASSERT_EQ(g.w.send("B", 1), errc::ok);
  const const_buffer cd[] = {{"C", 1}, {"D", 1}};
  ASSERT_EQ(g.w.send_batch(cd, 2), errc::ok);
  ASSERT_EQ(g.w.send("E", 1), errc::ok);
  const const_buffer f{"F", 1};
  ASSERT_EQ(g.w.sendv_now(&f, 1), errc::ok);
  EXPECT_EQ(g.w.staged(), 0u);  // ok from sendv_now: E and F are committed in the ring
  EXPECT_EQ(g.poll(), 6u);
  EXPECT_EQ(g.got.recs, (std::vector<std::string>{"A", "B", "C", "D", "E", "F"}));
  // Without coalescing, sendv_now is sendv and flush a no-op.
  shm_writer plain;
  ASSERT_EQ(plain.open_image(g.img.p, g.img.size), errc::ok);
  EXPECT_EQ(plain.flush(), errc::ok);
  ASSERT_EQ(plain.sendv_now(&f, 1), errc::ok);
  EXPECT_EQ(g.poll(), 1u);
}

TEST(ShmCoalesce, FullRingKeepsTheStageRefusesNewSendsAndLosesNothing) {
  ring g(small_cfg(4096, 1024), 1024);  // 64 nodes; a full stage takes 17
  std::vector<std::string> want;
  errc e = errc::ok;
  for (size_t i = 0; i < 1000 && e == errc::ok; ++i) {
    const std::string m = msg(i);
    e = g.w.send(m.data(), m.size());
    if (e == errc::ok) want.push_back(m);
  }
  ASSERT_EQ(e, errc::queue_full);
  const size_t staged = g.w.staged();
  EXPECT_GT(staged, 0u);                           // accepted, waiting for room
  EXPECT_EQ(g.w.send("no", 2), errc::queue_full);  // still full: refused, not staged
  EXPECT_EQ(g.w.staged(), staged);
  EXPECT_EQ(g.w.flush(), errc::queue_full);
  EXPECT_GT(g.poll(), 0u);  // room again
  ASSERT_EQ(g.w.flush(), errc::ok);
  (void)g.poll();
  EXPECT_EQ(g.got.recs, want);  // every accepted message once, in order
  EXPECT_GT(g.w.metrics().queue_full, 0u);
  EXPECT_EQ(g.w.metrics().staged_dropped, 0u);
}

// close() on a full ring can not publish the stage: what send() accepted is dropped then, but
// never silently: close() returns how many, and the region counts them (the reader's metrics,
// shm_inspect), for the destructor too.
TEST(ShmCoalesce, CloseThatCannotPublishTheStageReportsWhatItDrops) {
  ring g(small_cfg(4096, 1024), 1024);
  errc e = errc::ok;
  for (size_t i = 0; i < 1000 && e == errc::ok; ++i) e = g.w.send(msg(i).data(), msg(i).size());
  ASSERT_EQ(e, errc::queue_full);
  const size_t staged = g.w.staged();
  ASSERT_GT(staged, 0u);           // accepted (ok), waiting for room
  EXPECT_EQ(g.w.close(), staged);  // the ring is still full
  EXPECT_EQ(g.w.close(), 0u);      // idempotent
  EXPECT_EQ(g.r.metrics().staged_dropped, staged);
  {
    shm_writer w2;  // the destructor can return nothing: the region still says it
    ASSERT_EQ(w2.open_image(g.img.p, g.img.size), errc::ok);
    ASSERT_EQ(w2.coalesce(nullptr, 1024), errc::ok);
    ASSERT_EQ(w2.send("late", 4), errc::ok);
  }
  EXPECT_EQ(g.r.metrics().staged_dropped, staged + 1);
}

// on_staged_dropped hands back what close() drops, oldest first, byte for byte; a send from
// inside it returns closed (staged, it would have been cleared by this close unseen: it was,
// with ok, until 2026-12-07).
TEST(ShmCoalesce, DroppedStagedMessagesAreHandedBackInOrder) {
  ring g(small_cfg(4096, 1024), 1024);
  std::vector<std::string> want;
  errc e = errc::ok;
  for (size_t i = 0; i < 1000 && e == errc::ok; ++i) {
    e = g.w.send(msg(i).data(), msg(i).size());
    if (e == errc::ok) want.push_back(msg(i));
  }
  ASSERT_EQ(e, errc::queue_full);
  const size_t staged = g.w.staged();
  ASSERT_GT(staged, 1u);
  std::vector<std::string> back;
  g.w.on_staged_dropped([&](const uint8_t* d, size_t n) {
    back.emplace_back(reinterpret_cast<const char*>(d), n);
    if (back.size() == 1) {
      EXPECT_EQ(g.w.send("again", 5), errc::closed);
    }
  });
  EXPECT_EQ(g.w.close(), staged);
  const std::vector<std::string> tail(want.end() - static_cast<std::ptrdiff_t>(staged), want.end());
  ASSERT_EQ(back.size(), staged);
  EXPECT_EQ(g.r.metrics().staged_dropped, staged);  // every send that returned ok is accounted
  EXPECT_EQ(back, tail);
}

// The same when the region is removed under a stage (its reader closed for good).
TEST(ShmCoalesce, AStageDroppedForARemovedRegionIsHandedBack) {
  shm_writer w;
  auto r = open_coalescing("coal-back", &w);
  ASSERT_TRUE(w.coalescing());
  std::vector<std::string> back;
  w.on_staged_dropped([&](const uint8_t* d, size_t n) { back.emplace_back(d, d + n); });
  ASSERT_EQ(w.send("a", 1), errc::ok);
  const std::string empty;
  ASSERT_EQ(w.send(empty.data(), 0), errc::ok);
  ASSERT_EQ(w.send("ccc", 3), errc::ok);
  r->close();
  EXPECT_EQ(w.flush(), errc::not_connected);
  EXPECT_EQ(back, (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(w.metrics().staged_dropped, 3u);
}

// From inside on_staged_dropped: clearing the callback (the rest of this drop still goes to it;
// before, the next message called an empty std::function inside a noexcept function: terminate)
// and close() (refused, wrong_state: the flush that drops still runs on the writer; before, a
// heap use-after-free). The writer closes normally afterwards.
TEST(ShmCoalesce, TheDroppedCallbackMayClearItselfAndCannotCloseTheWriter) {
  shm_writer w;
  auto r = open_coalescing("coal-reenter", &w);
  ASSERT_TRUE(w.coalescing());
  std::vector<std::string> back;
  std::vector<size_t> closed;
  w.on_staged_dropped([&](const uint8_t* d, size_t n) {
    back.emplace_back(d, d + n);
    w.on_staged_dropped(nullptr);
    closed.push_back(w.close());
  });
  for (const char* m : {"a", "bb", "ccc"}) ASSERT_EQ(w.send(m, std::strlen(m)), errc::ok);
  r->close();
  EXPECT_EQ(w.flush(), errc::not_connected);
  EXPECT_EQ(back, (std::vector<std::string>{"a", "bb", "ccc"}));
  EXPECT_EQ(closed, (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(w.last_error().code, errc::wrong_state);
  EXPECT_TRUE(w.is_open());
  EXPECT_EQ(w.metrics().staged_dropped, 3u);
  (void)w.close();
  EXPECT_FALSE(w.is_open());
}

TEST(ShmCoalesce, AbandonedFlushIsRetriedWithoutDuplicates) {
  shm_config cfg = small_cfg();
  cfg.abandon_timeout_us = 2000;
  cfg.reclaim_timeout_us = 60 * 1000 * 1000;
  ring g(cfg);
  shm_writer fast;
  ASSERT_EQ(fast.open_image(g.img.p, g.img.size), errc::ok);
  struct ctx {
    ring* g;
    shm_writer* fast;
    int calls = 0;
  } cx{&g, &fast};
  shm_detail::writer_access::set_test_hook(
      g.w,
      [](void* u) {
        auto* x = static_cast<ctx*>(u);
        if (x->calls++ != 0) return;  // stall the first copy only
        ASSERT_EQ(x->fast->send("after", 5), errc::ok);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (x->g->r.metrics().abandoned == 0 && std::chrono::steady_clock::now() < end) {
          (void)x->g->poll(10);
        }
      },
      &cx);
  ASSERT_EQ(g.w.send("slow 1", 6), errc::ok);
  ASSERT_EQ(g.w.send("slow 2", 6), errc::ok);
  ASSERT_EQ(g.w.flush(), errc::ok);  // abandoned once, published by the retry
  EXPECT_EQ(cx.calls, 2);
  (void)g.poll();
  EXPECT_EQ(g.got.recs, (std::vector<std::string>{"after", "slow 1", "slow 2"}));
  EXPECT_EQ(g.r.metrics().abandoned, 1u);
  EXPECT_EQ(g.w.metrics().writer_abandoned, 1u);
  shm_detail::writer_access::set_test_hook(g.w, nullptr, nullptr);
}

struct ShmCoalesceLoop : ::testing::Test {
  uv_loop_t loop;
  void SetUp() override { uv_loop_init(&loop); }
  void TearDown() override {
    uv_run(&loop, UV_RUN_DEFAULT);  // let closed handles finish
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
};

TEST_F(ShmCoalesceLoop, LoopTurnPublishesAndTheHandlesNeverKeepTheLoopAlive) {
  const std::string url = "mem://" + test::unique_name("coal-loop");
  shm_reader r;
  collected got;
  ASSERT_EQ(r.open(url, small_cfg(size_t{64} * 1024)), errc::ok);
  ASSERT_EQ(test::start_with(r, &loop, collected::cb, &got), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(w.coalesce(&loop), errc::ok);
  std::vector<std::string> want;
  for (size_t round = 0; round < 50; ++round) {
    for (size_t i = 0; i < 20; ++i) {
      want.push_back(msg(round * 20 + i));
      ASSERT_EQ(w.send(want.back().data(), want.back().size()), errc::ok);
    }
    uv_run(&loop, UV_RUN_NOWAIT);  // one turn: the stage goes out in it
  }
  EXPECT_TRUE(run_until(&loop, [&] { return got.recs.size() == want.size(); }));
  EXPECT_EQ(got.recs, want);
  EXPECT_EQ(w.staged(), 0u);
  EXPECT_GE(w.metrics().coalesced_flushes, 50u);
  r.close();
  uv_timer_t guard;  // fails the test instead of hanging if the writer kept the loop alive
  uv_timer_init(&loop, &guard);
  uv_timer_start(
      &guard, [](uv_timer_t* t) { uv_stop(t->loop); }, 10000, 0);
  uv_unref(reinterpret_cast<uv_handle_t*>(&guard));
  EXPECT_EQ(uv_run(&loop, UV_RUN_DEFAULT), 0);
  uv_close(reinterpret_cast<uv_handle_t*>(&guard), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);  // the guard lives on this stack: finish its close here
}

// queue_full counts refused sends. A stage stuck on a full ring is retried at every loop turn,
// every millisecond and by flush(); none of those refuses a send, so none counts (each counted
// one before: a ring full for 50 ms read about 100 instead of 1).
TEST_F(ShmCoalesceLoop, RetriesOfAStuckStageAreNotCountedAsQueueFull) {
  const std::string url = "mem://" + test::unique_name("coal-retry");
  shm_reader r;
  collected got;
  ASSERT_EQ(r.open(url, small_cfg(4096, 1024)), errc::ok);  // not started: the ring fills
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(w.coalesce(&loop, 1024), errc::ok);
  std::vector<std::string> want;
  errc e = errc::ok;
  for (size_t i = 0; i < 1000 && e == errc::ok; ++i) {
    want.push_back(msg(i));
    e = w.send(want.back().data(), want.back().size());
  }
  ASSERT_EQ(e, errc::queue_full);
  want.pop_back();  // refused
  ASSERT_GT(w.staged(), 0u);
  EXPECT_EQ(w.flush(), errc::queue_full);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  (void)run_until(&loop, [&] { return std::chrono::steady_clock::now() >= until; });
  EXPECT_GT(w.staged(), 0u);  // still waiting for room
  EXPECT_EQ(w.metrics().queue_full, 1u) << "only the refused send";
  ASSERT_EQ(test::start_with(r, &loop, collected::cb, &got), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return got.recs.size() == want.size(); }));
  EXPECT_EQ(got.recs, want);  // nothing lost
  EXPECT_EQ(w.metrics().queue_full, 1u);
  r.close();
}

TEST_F(ShmCoalesceLoop, ReaderClosedForGoodDropsTheStageAndSaysNotConnected) {
  const std::string url = "mem://" + test::unique_name("coal-gone");
  auto r = std::make_unique<shm_reader>();
  ASSERT_EQ(r->open(url, small_cfg()), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(w.coalesce(&loop), errc::ok);
  ASSERT_EQ(w.send("a", 1), errc::ok);
  ASSERT_EQ(w.send("b", 1), errc::ok);
  r->close();  // remove: unread records are gone, the staged ones with them
  EXPECT_EQ(w.flush(), errc::not_connected);
  EXPECT_EQ(w.staged(), 0u);
  EXPECT_EQ(w.metrics().staged_dropped, 2u);
  EXPECT_EQ(w.metrics().not_connected, 0u);  // flush() refused no send
  EXPECT_EQ(w.send("c", 1), errc::not_connected);
  EXPECT_EQ(w.metrics().not_connected, 1u);
}

// not_connected counts refused sends: the loop turn's flush that finds the region removed drops
// the stage (staged_dropped) and refuses no send. It counted one not_connected for a send that
// had returned ok.
TEST_F(ShmCoalesceLoop, ALoopTurnFindingTheRegionRemovedCountsNoRefusedSend) {
  const std::string url = "mem://" + test::unique_name("coal-gone-turn");
  shm_reader r;
  ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(w.coalesce(&loop), errc::ok);
  ASSERT_EQ(w.send("a", 1), errc::ok);
  r.close();
  // Loop turns: the first one's flush finds the region removed.
  EXPECT_TRUE(run_until(&loop, [&] { return w.staged() == 0; }));
  EXPECT_EQ(w.metrics().staged_dropped, 1u);
  EXPECT_EQ(w.metrics().not_connected, 0u);
}

// ... but a send that on_staged_dropped makes inside that turn and that is refused is a refused
// send: counted. The turn's flush turned the counting off around the callback too.
TEST_F(ShmCoalesceLoop, ASendRefusedInsideTheDroppedCallbackOfALoopTurnIsCounted) {
  shm_writer w;
  auto r = open_coalescing("coal-gone-cb", &w, &loop);
  errc inside = errc::ok;
  w.on_staged_dropped([&](const uint8_t*, size_t) { inside = w.send("b", 1); });
  ASSERT_EQ(w.send("a", 1), errc::ok);
  r->close();
  EXPECT_TRUE(run_until(&loop, [&] { return w.staged() == 0; }));
  EXPECT_EQ(inside, errc::not_connected);
  EXPECT_EQ(w.metrics().staged_dropped, 1u);
  EXPECT_EQ(w.metrics().not_connected, 1u) << "the callback's refused send";
}

TEST_F(ShmCoalesceLoop, StagedMessagesWaitInAKeptRegionForTheNextReader) {
  const std::string name = test::unique_name("coal-keep");
  shm_cleanup cleanup{name};
  const shm_config cfg = small_cfg(size_t{64} * 1024);
  shm_reader r1;
  ASSERT_EQ(r1.open("shm://" + name, cfg), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open("shm://" + name), errc::ok);
  ASSERT_EQ(w.coalesce(&loop), errc::ok);
  ASSERT_EQ(w.send("before", 6), errc::ok);
  r1.close(shm_close_mode::keep);
  ASSERT_EQ(w.send("during", 6), errc::ok);
  ASSERT_EQ(w.flush(), errc::ok);  // a detached region takes records for the next reader
  EXPECT_EQ(w.staged(), 0u);
  shm_reader r2;
  collected got;
  ASSERT_EQ(r2.open("shm://" + name, cfg), errc::ok);
  EXPECT_TRUE(r2.reattached());
  ASSERT_EQ(test::start_with(r2, &loop, collected::cb, &got), errc::ok);
  ASSERT_EQ(w.send("after", 5), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return got.recs.size() == 3; }));
  EXPECT_EQ(got.recs, (std::vector<std::string>{"before", "during", "after"}));
}

TEST_F(ShmCoalesceLoop, WriterKilledMidFlushIsSkippedAndTheNextWritersFlow) {
  const std::string name = test::unique_name("coal-killed");
  shm_cleanup cleanup{name};
  shm_config cfg = small_cfg(size_t{64} * 1024, 4096);
  cfg.abandon_timeout_us = 3000;
  cfg.reclaim_timeout_us = 20000;
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, cfg), errc::ok);
  int held[2];
  ASSERT_EQ(pipe(held), 0);
  const pid_t parent = getpid();
  const pid_t pid = fork();  // before any thread exists in this process
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    test::die_with_parent(parent);
    auto* w = new shm_writer();
    if (w->open("shm://" + name) != errc::ok || w->coalesce() != errc::ok) _exit(1);
    for (int i = 0; i < 3; ++i) (void)w->send("staged, never committed", 23);
    shm_detail::writer_access::set_test_hook(
        *w,
        [](void* fd) {
          (void)!write(*static_cast<int*>(fd), "h", 1);
          for (;;) pause();  // held mid-flush until SIGKILL
        },
        &held[1]);
    (void)w->flush();
    _exit(2);
  }
  char c = 0;
  ASSERT_EQ(read(held[0], &c, 1), 1);  // the child has reserved its batch
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(held[0]);
  close(held[1]);
  EXPECT_TRUE(WIFSIGNALED(status));

  collected got;
  ASSERT_EQ(test::start_with(r, &loop, collected::cb, &got), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open("shm://" + name), errc::ok);
  ASSERT_EQ(w.coalesce(&loop), errc::ok);
  std::vector<std::string> want;
  for (size_t i = 0; i < 2000; ++i) {  // more than a lap behind the dead batch
    const std::string m = msg(i);
    errc e = errc::queue_full;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((e = w.send(m.data(), m.size())) == errc::queue_full &&
           std::chrono::steady_clock::now() < end) {
      uv_run(&loop, UV_RUN_NOWAIT);
    }
    ASSERT_EQ(e, errc::ok);
    want.push_back(m);
  }
  EXPECT_TRUE(run_until(
      &loop, [&] { return got.recs.size() >= want.size(); }, std::chrono::seconds(30)));
  EXPECT_EQ(got.recs, want);
  EXPECT_EQ(r.metrics().abandoned, 1u + w.metrics().writer_abandoned);
  EXPECT_EQ(r.metrics().checksum_failures, 0u);
}

TEST_F(ShmCoalesceLoop, CoalescingWriterThreadsOverMemKeepPerWriterOrder) {
  const std::string url = "mem://" + test::unique_name("coal-threads");
  shm_config cfg = small_cfg(size_t{256} * 1024, 4096);
  shm_reader r;
  ASSERT_EQ(r.open(url, cfg), errc::ok);
  constexpr int kWriters = 3;
  constexpr uint64_t kEach = 20000;
  std::vector<uint64_t> next(kWriters, 0);
  uint64_t total = 0, bad = 0;
  struct sink {
    std::vector<uint64_t>* next;
    uint64_t* total;
    uint64_t* bad;
  } sk{&next, &total, &bad};
  ASSERT_EQ(test::start_with(
                r, &loop,
                [](void* u, const shm_record* recs, size_t n) {
                  auto* s = static_cast<sink*>(u);
                  for (size_t i = 0; i < n; ++i) {
                    uint32_t w = 0;
                    uint64_t seq = 0;
                    if (!test::check_record(recs[i].data, recs[i].size, 100, &w, &seq) ||
                        w >= s->next->size() || seq != (*s->next)[w]++) {
                      ++*s->bad;
                    }
                    ++*s->total;
                  }
                },
                &sk),
            errc::ok);
  std::vector<std::thread> ts;
  ts.reserve(kWriters);
  for (uint32_t id = 0; id < kWriters; ++id) {
    ts.emplace_back([&url, id] {
      shm_writer w;
      ASSERT_EQ(w.open(url), errc::ok);
      ASSERT_EQ(w.coalesce(nullptr, 1024), errc::ok);
      uint8_t buf[128];
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      for (uint64_t seq = 0; seq < kEach && std::chrono::steady_clock::now() < end;) {
        const size_t n = test::make_record(id, seq, 100, buf);
        const errc e = w.send(buf, n);
        if (e == errc::ok && ++seq % 64 == 0) (void)w.flush();  // "end of a loop turn"
        if (e != errc::ok) std::this_thread::yield();
      }
      while (w.staged() != 0 && std::chrono::steady_clock::now() < end) (void)w.flush();
      EXPECT_EQ(w.staged(), 0u);
    });
  }
  EXPECT_TRUE(run_until(
      &loop, [&] { return total == kWriters * kEach; }, std::chrono::seconds(60)));
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(total, kWriters * kEach);
}

}  // namespace
}  // namespace uvbus::shm_coalesce_test
