// Persistent inboxes: a reader that dies or closes with keep is followed by one that reattaches
// and reads every record not yet consumed, in order; incompatible regions; uvbus_shm_inspect.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "shm/layout.h"
#include "shm/test_hook.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_persist_test {
namespace {

using test::raw_region;
using test::run_until;
using test::shm_cleanup;

constexpr size_t kSpread = 120;  // record sizes 12..132

struct ShmPersist : ::testing::Test {
  uv_loop_t loop;
  void SetUp() override { uv_loop_init(&loop); }
  void TearDown() override {
    uv_run(&loop, UV_RUN_DEFAULT);  // let closed handles finish
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
};

shm_config small_cfg() {
  shm_config c;
  c.ring_bytes = size_t{1} << 20;
  c.max_record_size = 4096;
  c.abandon_timeout_us = 3000;
  c.reclaim_timeout_us = 20000;
  return c;
}

// For the tests not about abandonment: a writer preempted for milliseconds on a loaded machine
// (sanitizers, two cores) must not have its records skipped (3 ms in small_cfg() once made a
// killed reader's writer see abandoned under TSan), so the timeouts here are generous.
shm_config patient_cfg() {
  shm_config c = small_cfg();
  c.abandon_timeout_us = 500000;
  c.reclaim_timeout_us = 2000000;
  return c;
}

// Checks test::make_record records: per writer in order from first[w], intact.
struct seq_sink {
  std::vector<uint64_t> next;
  uint64_t total = 0;
  uint64_t bad = 0;
  explicit seq_sink(std::vector<uint64_t> first) : next(std::move(first)) {}
  void take(const shm_record* r, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t w = 0;
      uint64_t seq = 0;
      if (!test::check_record(r[i].data, r[i].size, kSpread, &w, &seq) || w >= next.size() ||
          seq != next[w]) {
        ++bad;
        continue;
      }
      ++next[w];
      ++total;
    }
  }
  shm_reader_callbacks callbacks() {
    return {[this](const shm_record* r, size_t n) { take(r, n); }};
  }
};

// Sends records [from, to) of writer id, `batch` per send_batch (1: send), retrying queue_full.
errc send_range(shm_writer& w, uint32_t id, uint64_t from, uint64_t to, size_t batch = 1) {
  std::vector<std::vector<uint8_t>> bufs(batch, std::vector<uint8_t>(kSpread + 16));
  std::vector<const_buffer> msgs(batch);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (uint64_t seq = from; seq < to;) {
    const size_t k = std::min<uint64_t>(batch, to - seq);
    for (size_t i = 0; i < k; ++i) {
      msgs[i] = {bufs[i].data(), test::make_record(id, seq + i, kSpread, bufs[i].data())};
    }
    const errc e = w.send_batch(msgs.data(), k);
    if (e == errc::ok) {
      seq += k;
    } else if (e != errc::queue_full || std::chrono::steady_clock::now() > end) {
      return e;
    } else {
      std::this_thread::yield();
    }
  }
  return errc::ok;
}

// Polls r until sink holds want records (or the deadline passes). Returns whether it did.
bool poll_until(shm_reader& r, const seq_sink& sink, uint64_t want) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sink.total < want && std::chrono::steady_clock::now() < end) {
    if (r.poll(want - sink.total) == 0) std::this_thread::yield();
  }
  return sink.total == want;
}

// The child of SigkilledReaderIsFollowedByOneThatResumesExactly: reads exactly `half` records,
// says so on fd, then waits for its SIGKILL.
[[noreturn]] void reader_child(const std::string& url, uint64_t half, int fd) {
  auto* sink = new seq_sink({0});
  auto* r = new shm_reader(sink->callbacks());
  char c = r->open(url, patient_cfg()) == errc::ok ? 'y' : 'n';
  (void)!write(fd, &c, 1);
  c = poll_until(*r, *sink, half) && sink->bad == 0 ? 'h' : 'b';
  (void)!write(fd, &c, 1);
  for (;;) pause();
}

TEST_F(ShmPersist, SigkilledReaderIsFollowedByOneThatResumesExactly) {
  const std::string name = test::unique_name("persist-kill");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  constexpr uint64_t kFirst = 3000, kTotal = 5000, kHalf = 1503;  // 1503: inside a batch of 10
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t parent = getpid();
  const pid_t pid = fork();  // before any thread exists in this process
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    test::die_with_parent(parent);
    reader_child(url, kHalf, p[1]);
  }
  char c = 0;
  ASSERT_EQ(read(p[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(send_range(w, 0, 0, kFirst, 10), errc::ok);
  ASSERT_EQ(read(p[0], &c, 1), 1);
  ASSERT_EQ(c, 'h');  // the child consumed exactly kHalf records, in order
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  close(p[0]);
  close(p[1]);
  EXPECT_FALSE(w.reader_alive());
  // Writers keep writing into the dead reader's ring: no not_connected.
  ASSERT_EQ(send_range(w, 0, kFirst, kTotal - 100, 1), errc::ok);
  ASSERT_EQ(send_range(w, 0, kTotal - 100, kTotal, 7), errc::ok);

  seq_sink sink({kHalf});  // the child's records must not come again
  shm_config cfg = patient_cfg();
  cfg.spin_us = 0;
  shm_reader r(sink.callbacks());
  ASSERT_EQ(r.open(url, cfg), errc::ok) << r.last_error().detail;
  EXPECT_TRUE(r.reattached());
  EXPECT_TRUE(w.reader_alive());
  EXPECT_TRUE(poll_until(r, sink, kTotal - kHalf));
  EXPECT_EQ(sink.bad, 0u);
  EXPECT_EQ(sink.next[0], kTotal);
  EXPECT_EQ(r.poll(100), 0u);
  EXPECT_EQ(r.metrics().checksum_failures, 0u);
  EXPECT_EQ(r.metrics().records_read, kTotal);  // the counters continue the child's

  // The writer attached to the dead incarnation still wakes the new one once it sleeps.
  ASSERT_EQ(r.start(&loop), errc::ok);
  shm_region_info info;
  EXPECT_TRUE(run_until(
      &loop, [&] { return shm_inspect(url, &info) == errc::ok && info.reader_sleeping; }));
  EXPECT_EQ(info.reader_incarnation, 2u);
  ASSERT_EQ(send_range(w, 0, kTotal, kTotal + 1), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return sink.total == kTotal - kHalf + 1; }));
  EXPECT_GE(w.metrics().wakeups, 1u);
  r.close();
}

// The child of ReaderKilledInsideItsCallbackGetsThatBatchAgain: polls in callback batches of 10
// and, inside the batch that holds record 500, writes the batch's first sequence to fd and waits
// for its SIGKILL there.
[[noreturn]] void dying_in_callback_child(const std::string& url, int fd) {
  shm_config cfg = patient_cfg();
  cfg.batch_max = 10;
  auto* r = new shm_reader({[fd](const shm_record* recs, size_t n) {
    uint32_t w = 0;
    uint64_t first = 0, last = 0;
    if (!test::check_record(recs[0].data, recs[0].size, kSpread, &w, &first) ||
        !test::check_record(recs[n - 1].data, recs[n - 1].size, kSpread, &w, &last)) {
      _exit(3);
    }
    if (last < 500) return;
    (void)!write(fd, &first, sizeof first);
    for (;;) pause();
  }});
  if (r->open(url, cfg) != errc::ok) _exit(1);
  const uint64_t ready = ~uint64_t{0};
  (void)!write(fd, &ready, sizeof ready);
  for (;;) {
    if (r->poll(1000) == 0) std::this_thread::yield();
  }
}

TEST_F(ShmPersist, ReaderKilledInsideItsCallbackGetsThatBatchAgain) {
  const std::string name = test::unique_name("persist-incb");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    test::die_with_parent(parent);
    dying_in_callback_child(url, p[1]);
  }
  struct reap {  // a failed assertion below must not leave the child polling forever
    pid_t pid;
    ~reap() {
      if (pid <= 0) return;
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } child{pid};
  uint64_t first = 0;
  ASSERT_EQ(read(p[0], &first, sizeof first), static_cast<ssize_t>(sizeof first));
  ASSERT_EQ(first, ~uint64_t{0});  // the child's reader is open
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(send_range(w, 0, 0, 1000, 3), errc::ok);
  ASSERT_EQ(read(p[0], &first, sizeof first), static_cast<ssize_t>(sizeof first));
  kill(pid, SIGKILL);  // inside the callback of the batch [first, first + 10)
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  child.pid = -1;
  close(p[0]);
  close(p[1]);
  EXPECT_GT(first, 490u);
  EXPECT_LE(first, 500u);
  seq_sink sink({first});  // that batch again, then everything after it, nothing before it
  shm_reader r(sink.callbacks());
  ASSERT_EQ(r.open(url, patient_cfg()), errc::ok);
  EXPECT_TRUE(poll_until(r, sink, 1000 - first));
  EXPECT_EQ(sink.bad, 0u);
  EXPECT_EQ(r.poll(10), 0u);
}

// close(keep) then a new reader, for each kind of region.
void keep_and_reopen(const std::string& url) {
  SCOPED_TRACE(url);
  const shm_config cfg = small_cfg();
  shm_writer w;
  {
    seq_sink sink({0});
    shm_reader r(sink.callbacks());
    ASSERT_EQ(r.open(url, cfg), errc::ok);
    EXPECT_FALSE(r.reattached());
    ASSERT_EQ(w.open(url), errc::ok);
    ASSERT_EQ(send_range(w, 0, 0, 100, 7), errc::ok);
    EXPECT_TRUE(poll_until(r, sink, 40));
    r.close(shm_close_mode::keep);
  }
  EXPECT_FALSE(w.reader_alive());
  shm_region_info info;
  ASSERT_EQ(shm_inspect(url, &info), errc::ok);
  EXPECT_EQ(info.reader_state, 3u);
  ASSERT_EQ(send_range(w, 0, 100, 200, 1), errc::ok);  // still accepted: the reader comes back
  seq_sink sink({40});
  shm_reader r(sink.callbacks());
  ASSERT_EQ(r.open(url, cfg), errc::ok) << r.last_error().detail;
  EXPECT_TRUE(r.reattached());
  EXPECT_TRUE(w.reader_alive());
  EXPECT_TRUE(poll_until(r, sink, 160));
  EXPECT_EQ(sink.bad, 0u);
  r.close();  // remove: now writers are told
  EXPECT_EQ(w.send("x", 1), errc::not_connected);
}

TEST_F(ShmPersist, CloseWithKeepThenReopenLosesNothing) {
  const std::string name = test::unique_name("persist-keep");
  const int key = test::unique_key();
  shm_cleanup cleanup{name, key};
  char sysv[64];
  std::snprintf(sysv, sizeof sysv, "shm://0x%x", key);
  keep_and_reopen("shm://" + name);
  EXPECT_FALSE(test::posix_exists(name));
  keep_and_reopen(sysv);
  EXPECT_FALSE(test::sysv_exists(key));
  keep_and_reopen("mem://" + name);
}

// Two readers reattaching one detached SysV segment at once: only one takes it. The second opens
// while the first is between winning the region and taking it over (a test hook there). Before,
// it judged the first by the previous reader's state and start time, took the region as well,
// and both drained one ring.
TEST_F(ShmPersist, TwoReadersReattachingOneSysVSegmentAtOnceOnlyOneTakesIt) {
  const int key = test::unique_key();
  shm_cleanup cleanup{"", key};
  char url[64];
  std::snprintf(url, sizeof url, "shm://0x%x", key);
  {
    shm_reader r0({[](const shm_record*, size_t) {}});
    ASSERT_EQ(r0.open(url, small_cfg()), errc::ok);
    r0.close(shm_close_mode::keep);
  }
  struct race {
    shm_reader second{{[](const shm_record*, size_t) {}}};
    const char* url = nullptr;
    int runs = 0;
    errc got = errc::ok;
  } c;
  c.url = url;
  shm_detail::region_access::set_claim_hook(
      [](void* u) {
        auto* c = static_cast<race*>(u);
        if (c->runs++ == 0) c->got = c->second.open(c->url, small_cfg());
      },
      &c);
  shm_reader first({[](const shm_record*, size_t) {}});
  const errc e = first.open(url, small_cfg());
  shm_detail::region_access::set_claim_hook(nullptr, nullptr);
  ASSERT_EQ(e, errc::ok) << first.last_error().detail;
  EXPECT_TRUE(first.reattached());
  EXPECT_EQ(c.runs, 1) << "the second reader won the region too";
  EXPECT_EQ(c.got, errc::busy) << to_string(c.got);
  c.second.close(shm_close_mode::remove);
  first.close(shm_close_mode::remove);
  EXPECT_FALSE(test::sysv_exists(key));
}

// Two readers creating one POSIX region at once: the second opens between the first one's
// shm_open(O_EXCL) and its flock (a test hook there), so it meets the first one's object empty and
// unlocked, takes it for a dead creator's, unlinks it and creates its own. With judge_holds, a
// stand-in for that second reader still holds the first one's object's flock when the first
// takes it. Before, in the first case both open()s returned ok and the first reader owned a region
// no writer could reach; in the second the first one's error path unlinked the second one's name
// and returned queue_full.
struct create_race {
  std::string name;
  bool judge_holds = false;
  int runs = 0;
  int held = -1;  // the stand-in judge's descriptor of the first reader's object
  size_t delivered[2] = {0, 0};
  errc got = errc::ok;
  shm_reader second{test::records_to(
      [](void* u, const shm_record*, size_t n) { static_cast<create_race*>(u)->delivered[1] += n; },
      this)};
  static void open_second(void* u) {
    auto* c = static_cast<create_race*>(u);
    if (c->runs++ != 0) return;
    const std::string path = "/" + c->name;
    if (c->judge_holds) {
      c->held = shm_open(path.c_str(), O_RDWR, 0);
      if (c->held < 0 || flock(c->held, LOCK_EX | LOCK_NB) != 0) return;
      shm_unlink(path.c_str());
    }
    c->got = c->second.open("shm://" + c->name, small_cfg());
  }
};

void two_readers_create_at_once(const char* what, bool judge_holds) {
  create_race c;
  c.name = test::unique_name(what);
  c.judge_holds = judge_holds;
  shm_cleanup cleanup{c.name};
  const std::string url = "shm://" + c.name;
  shm_reader first(test::records_to(
      [](void* u, const shm_record*, size_t n) { static_cast<create_race*>(u)->delivered[0] += n; },
      &c));
  shm_detail::region_access::set_create_hook(&create_race::open_second, &c);
  const errc e = first.open(url, small_cfg());
  shm_detail::region_access::set_create_hook(nullptr, nullptr);
  if (c.held >= 0) close(c.held);
  ASSERT_GE(c.runs, 1);
  EXPECT_TRUE((e == errc::ok) != (c.got == errc::ok))
      << "first " << to_string(e) << ", second " << to_string(c.got);
  EXPECT_EQ(e == errc::ok ? c.got : e, errc::busy) << first.last_error().detail;
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(w.send("x", 1), errc::ok);
  EXPECT_EQ(first.poll(16) + c.second.poll(16), 1u);
  EXPECT_EQ(c.delivered[e == errc::ok ? 0 : 1], 1u) << "the writer reached the other reader";
  w.close();
  first.close(shm_close_mode::remove);
  c.second.close(shm_close_mode::remove);
  EXPECT_FALSE(test::posix_exists(c.name));
}

TEST_F(ShmPersist, TwoReadersCreatingOnePosixRegionAtOnceOneGetsBusy) {
  two_readers_create_at_once("persist-create-race", false);
}

TEST_F(ShmPersist, ACreatorMeetingAJudgeOfItsEmptyObjectGetsBusyAndLeavesTheNameAlone) {
  two_readers_create_at_once("persist-create-judged", true);
}

TEST_F(ShmPersist, IncompatibleRegionIsRefusedNamingTheFieldAndLeftIntact) {
  const std::string name = test::unique_name("persist-incompat");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  shm_config cfg = small_cfg();
  cfg.ring_bytes = 65536;
  shm_writer w;
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, cfg), errc::ok);
    ASSERT_EQ(w.open(url), errc::ok);
    ASSERT_EQ(send_range(w, 0, 0, 10), errc::ok);
    r.close(shm_close_mode::keep);
  }
  shm_config bigger = cfg;
  bigger.ring_bytes = 131072;
  shm_reader r2;
  EXPECT_EQ(r2.open(url, bigger), errc::bad_layout);
  const std::string d = r2.last_error().detail;
  EXPECT_NE(d.find("ring_bytes"), std::string::npos) << d;
  EXPECT_NE(d.find("65536"), std::string::npos) << d;
  EXPECT_NE(d.find("131072"), std::string::npos) << d;
  EXPECT_NE(d.find("uvbus_shm_inspect --drain " + url), std::string::npos) << d;
  EXPECT_NE(d.find("--remove " + url), std::string::npos) << d;
  shm_config other_node = cfg;
  other_node.node_size = 128;
  EXPECT_EQ(r2.open(url, other_node), errc::bad_layout);
  EXPECT_NE(r2.last_error().detail.find("node_size"), std::string::npos);
  // Intact: writers still commit, and a reader with the region's config gets everything.
  ASSERT_EQ(send_range(w, 0, 10, 11), errc::ok);
  seq_sink sink({0});
  shm_reader r3(sink.callbacks());
  ASSERT_EQ(r3.open(url, cfg), errc::ok);
  EXPECT_TRUE(r3.reattached());
  EXPECT_TRUE(poll_until(r3, sink, 11));
  EXPECT_EQ(sink.bad, 0u);
}

TEST_F(ShmPersist, WriterCommitsWhileNoReaderThenALoopReaderReceives) {
  const std::string name = test::unique_name("persist-noreader");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
    r.close(shm_close_mode::keep);
  }
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);  // a detached region accepts writers
  EXPECT_FALSE(w.reader_alive());
  ASSERT_EQ(send_range(w, 0, 0, 500, 3), errc::ok);
  seq_sink sink({0});
  shm_reader r(sink.callbacks());
  ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
  ASSERT_EQ(r.start(&loop), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return sink.total == 500; }));
  ASSERT_EQ(send_range(w, 0, 500, 1000, 1), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return sink.total == 1000; }));
  EXPECT_EQ(sink.bad, 0u);
  r.close();
}

// The child of WriterKilledMidWriteWhileTheReaderIsDownIsSkippedAfterReattach: commits records
// 0..4 of writer 1, then is held inside record 5 (reserved, not committed) until SIGKILL.
[[noreturn]] void torn_writer_child(const std::string& url, int fd) {
  auto* w = new shm_writer();
  if (w->open(url) != errc::ok || send_range(*w, 1, 0, 5) != errc::ok) _exit(1);
  shm_detail::writer_access::set_test_hook(
      *w,
      [](void* f) {
        (void)!write(*static_cast<int*>(f), "h", 1);
        for (;;) pause();
      },
      &fd);
  (void)send_range(*w, 1, 5, 6);
  _exit(2);
}

TEST_F(ShmPersist, WriterKilledMidWriteWhileTheReaderIsDownIsSkippedAfterReattach) {
  const std::string name = test::unique_name("persist-torn");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
    r.close(shm_close_mode::keep);
  }
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    test::die_with_parent(parent);
    torn_writer_child(url, p[1]);
  }
  char c = 0;
  ASSERT_EQ(read(p[0], &c, 1), 1);  // record 5 is reserved and will never be committed
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  close(p[0]);
  close(p[1]);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(send_range(w, 0, 0, 100, 4), errc::ok);
  seq_sink sink({0, 0});
  shm_reader r(sink.callbacks());
  ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
  EXPECT_TRUE(r.reattached());
  EXPECT_TRUE(poll_until(r, sink, 105));  // 5 of the dead writer, 100 of ours, never record 5
  EXPECT_EQ(sink.bad, 0u);
  EXPECT_EQ(sink.next[1], 5u);
  EXPECT_EQ(sink.next[0], 100u);
  EXPECT_EQ(r.metrics().abandoned, 1u);
  EXPECT_EQ(r.poll(10), 0u);
}

// Polls r until done() (or a generous deadline). Returns done().
template <class Pred>
bool poll_while_not(shm_reader& r, Pred&& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < end) {
    if (r.poll(16) == 0) std::this_thread::yield();
  }
  return done();
}

// A reader built before consumed_pos was stored first, killed between its two cursor stores:
// read_pos is ahead of consumed_pos. read_pos only ever passes records whose callback returned,
// so every record before it was consumed: the region must be reattached, resuming at read_pos.
TEST_F(ShmPersist, ReadPosAheadOfConsumedPosIsReattachedAndResumesThere) {
  const std::string name = test::unique_name("persist-rp-ahead");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  shm_writer w;
  uint64_t cut = 0;  // consumed_pos after the first callback batch
  {
    seq_sink sink({0});
    shm_reader r(sink.callbacks());
    ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
    ASSERT_EQ(w.open(url), errc::ok);
    ASSERT_EQ(send_range(w, 0, 0, 30), errc::ok);
    ASSERT_TRUE(poll_until(r, sink, 10));
    shm_region_info info;
    ASSERT_EQ(shm_inspect(url, &info), errc::ok);
    cut = info.consumed_pos;
    ASSERT_TRUE(poll_until(r, sink, 20));
    r.close(shm_close_mode::keep);
  }
  raw_region raw(name);
  ASSERT_NE(raw.p, MAP_FAILED);
  ASSERT_GT(raw.hdr()->read_pos.load(), cut);
  raw.hdr()->consumed_pos.store(cut);  // the second store the killed reader never made
  ASSERT_EQ(send_range(w, 0, 30, 40), errc::ok);
  seq_sink sink({20});  // 10..19 were consumed: never again; 20..39 all, in order
  shm_reader r(sink.callbacks());
  ASSERT_EQ(r.open(url, small_cfg()), errc::ok) << r.last_error().detail;
  EXPECT_TRUE(r.reattached());
  EXPECT_TRUE(poll_until(r, sink, 20));
  EXPECT_EQ(sink.bad, 0u);
  EXPECT_EQ(r.poll(10), 0u);
  r.close(shm_close_mode::keep);  // the repaired cursor is stored
  shm_region_info info;
  ASSERT_EQ(shm_inspect(url, &info), errc::ok);
  EXPECT_LE(info.read_pos, info.consumed_pos);
}

// A kept region whose reader read nothing: a batch of three 100-byte messages 'a' 'b' 'c' at
// position 0 (a body of 3 * 112 bytes, 6 nodes), then records 'd' at 6 and 'e' at 8 (2 nodes each).
void fill_unread(const std::string& url) {
  shm_reader r;
  shm_writer w;
  ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
  ASSERT_EQ(w.open(url), errc::ok);
  const std::string a(100, 'a'), b(100, 'b'), c(100, 'c'), d(100, 'd'), e(100, 'e');
  const const_buffer batch[3] = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  ASSERT_EQ(w.send_batch(batch, 3), errc::ok);
  ASSERT_EQ(w.send(d.data(), d.size()), errc::ok);
  ASSERT_EQ(w.send(e.data(), e.size()), errc::ok);
  r.close(shm_close_mode::keep);
}

// Reattaches url and polls it dry: the first bytes of what it delivered, or why open() failed.
std::string reattach_and_read(const std::string& url) {
  test::collected got;
  shm_reader r(test::records_to(test::collected::cb, &got));
  if (const errc e = r.open(url, small_cfg()); e != errc::ok) {
    return std::string("refused ") + to_string(e) + ": " + r.last_error().detail;
  }
  for (size_t n = 1; n != 0;) n = r.poll(16);
  std::string firsts;
  for (const std::string& m : got.recs) firsts += m.empty() ? '?' : m[0];
  r.close(shm_close_mode::keep);
  return firsts;
}

// A resume position inside a record (a damaged consumed_pos or read_pos) was reattached: the reader
// waited there for a head no writer stamps, delivered nothing, and writers got queue_full for ever
// once the ring filled. Now: bad_layout naming the cursors, the region left intact.
TEST_F(ShmPersist, AResumePositionInsideARecordIsRefusedAndTheRegionLeftIntact) {
  const struct {
    uint64_t rp, cp;
    bool stamp;  // head 7 carries position 7's stamp, as if a record started there
    const char* why;
  } cases[] = {{0, 7, false, "no record starts at the resume position (resume position 7"},
               {7, 7, false, "no record starts at the resume position (resume position 7"},
               {0, 7, true, "the records from read_pos step past the resume position 7"}};
  for (const auto& k : cases) {
    const std::string name = test::unique_name("persist-midrec");
    shm_cleanup cleanup{name};
    fill_unread("shm://" + name);
    raw_region raw(name);
    ASSERT_NE(raw.p, MAP_FAILED);
    const uint64_t head7 = raw.head(7)->load();
    raw.hdr()->read_pos.store(k.rp);
    raw.hdr()->consumed_pos.store(k.cp);
    if (k.stamp) raw.head(7)->store(shm_detail::make_ctl(7, 1, shm_detail::kCommitted));
    const std::string got = reattach_and_read("shm://" + name);
    EXPECT_EQ(got.find("refused bad_layout"), 0u) << got;
    EXPECT_NE(got.find(k.why), std::string::npos) << got;
    raw.hdr()->read_pos.store(0);
    raw.hdr()->consumed_pos.store(0);
    raw.head(7)->store(head7);
    EXPECT_EQ(reattach_and_read("shm://" + name), "abcde");  // nothing lost
  }
}

// consumed_batch_off must be where an item of the batch at the resume position ends. Before, one
// past the body skipped the rest of the batch uncounted, and one inside an item was reattached.
TEST_F(ShmPersist, AConsumedBatchOffsetThatEndsNoItemIsRefused) {
  const struct {
    uint64_t off;
    const char* want;  // what the reader delivers, or the start of why it refused
  } cases[] = {{448, "refused bad_layout"}, {50, "refused bad_layout"}, {112, "bcde"}, {336, "de"}};
  for (const auto& k : cases) {
    const std::string name = test::unique_name("persist-batchoff");
    shm_cleanup cleanup{name};
    fill_unread("shm://" + name);
    raw_region raw(name);
    ASSERT_NE(raw.p, MAP_FAILED);
    raw.hdr()->consumed_batch_off.store(k.off);
    const std::string got = reattach_and_read("shm://" + name);
    EXPECT_EQ(got.substr(0, std::string(k.want).size()), k.want) << k.off;
    EXPECT_EQ(got[0] == 'r', got.find("consumed_batch_off") != std::string::npos) << got;
  }
}

// A writer that died between its claim and its write_pos advance while no other writer sent:
// the reader skips the claim after the abandon timeout, so consumed_pos passes write_pos (and
// read_pos too once reclaim released the nodes). The reattaching reader must accept it, and no
// record before or after the dead claim may be lost.
void dead_claim_then_reattach(const char* what, bool reclaimed) {
  SCOPED_TRACE(what);
  const std::string name = test::unique_name(what);
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  seq_sink sink({0});
  shm_writer w;
  {
    shm_reader r(sink.callbacks());
    ASSERT_EQ(r.open(url, small_cfg()), errc::ok);
    ASSERT_EQ(w.open(url), errc::ok);
    ASSERT_EQ(send_range(w, 0, 0, 5), errc::ok);
    ASSERT_TRUE(poll_until(r, sink, 5));
    raw_region raw(name);
    ASSERT_NE(raw.p, MAP_FAILED);
    const uint64_t wp = raw.hdr()->write_pos.load();
    // The dead writer's claim of 2 nodes: its head says WRITING, write_pos never advanced.
    raw.head(wp)->store(shm_detail::make_ctl(wp, 2, shm_detail::kWriting));
    ASSERT_TRUE(poll_while_not(r, [&] { return r.metrics().abandoned == 1; }));
    if (reclaimed) {
      ASSERT_TRUE(poll_while_not(r, [&] { return raw.hdr()->read_pos.load() == wp + 2; }));
    }
    EXPECT_EQ(raw.hdr()->write_pos.load(), wp);
    EXPECT_EQ(raw.hdr()->consumed_pos.load(), wp + 2);
    r.close(shm_close_mode::keep);
  }
  shm_reader r(sink.callbacks());
  ASSERT_EQ(r.open(url, small_cfg()), errc::ok) << r.last_error().detail;
  EXPECT_TRUE(r.reattached());
  ASSERT_EQ(send_range(w, 0, 5, 105, 4), errc::ok);
  EXPECT_TRUE(poll_until(r, sink, 105));
  EXPECT_EQ(sink.bad, 0u);
  EXPECT_EQ(sink.next[0], 105u);
  EXPECT_EQ(r.metrics().abandoned, 1u);
  EXPECT_EQ(r.poll(10), 0u);
}

TEST_F(ShmPersist, CursorsPastADeadWritersUnadvancedClaimAreReattached) {
  dead_claim_then_reattach("persist-deadclaim-held", false);
  dead_claim_then_reattach("persist-deadclaim-freed", true);
}

}  // namespace
}  // namespace uvbus::shm_persist_test
