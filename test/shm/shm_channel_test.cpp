// The channel end to end: POSIX and SysV regions, the libuv reader, threads over mem://.
#include <gtest/gtest.h>

#include <dirent.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "shm/layout.h"
#include "shm/test_hook.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_channel_test {
namespace {

using test::run_until;
using test::shm_cleanup;
using namespace std::chrono_literals;

struct ShmChannel : ::testing::Test {
  uv_loop_t loop;
  void SetUp() override { uv_loop_init(&loop); }
  void TearDown() override {
    uv_run(&loop, UV_RUN_DEFAULT);  // let closed handles finish
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
};

// Per-writer order and integrity checker for records made by test::make_record.
struct order_check {
  size_t spread;
  std::vector<uint64_t> next;
  uint64_t total = 0;
  uint64_t bad = 0;
  order_check(size_t writers, size_t sp) : spread(sp), next(writers, 0) {}
  static void cb(void* u, const shm_record* r, size_t n) {
    auto* self = static_cast<order_check*>(u);
    for (size_t i = 0; i < n; ++i) {
      uint32_t w;
      uint64_t seq;
      if (!test::check_record(r[i].data, r[i].size, self->spread, &w, &seq) ||
          w >= self->next.size() || seq != self->next[w]) {
        ++self->bad;
        continue;
      }
      ++self->next[w];
      ++self->total;
    }
  }
};

// Sends count records of writer id, retrying while the ring is full and re-sending a record the
// reader skipped as abandoned (it was not delivered), so the reader sees exactly 0..count-1.
errc send_all(shm_writer& w, uint32_t id, uint64_t count, size_t spread) {
  std::vector<uint8_t> buf(spread + 16);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (uint64_t seq = 0; seq < count;) {
    const size_t n = test::make_record(id, seq, spread, buf.data());
    const errc e = w.send(buf.data(), n);
    if (e == errc::ok) {
      ++seq;
    } else if (e == errc::queue_full || e == errc::abandoned) {
      if (std::chrono::steady_clock::now() > end) return errc::timeout;  // never hang a test
      std::this_thread::yield();
    } else {
      return e;
    }
  }
  return errc::ok;
}

TEST_F(ShmChannel, OneWriterMillionRandomSizeRecordsArriveIntactAndInOrder) {
  const std::string name = test::unique_name("million");
  shm_cleanup cleanup{name};
  shm_config cfg;
  cfg.ring_bytes = 1 << 20;
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, cfg), errc::ok);
  order_check chk(1, 200);
  ASSERT_EQ(test::start_with(r, &loop, order_check::cb, &chk), errc::ok);
  constexpr uint64_t kCount = 1000000;
  errc result = errc::closed;
  std::thread t([&] {
    shm_writer w;
    result = w.open("shm://" + name);
    if (result == errc::ok) result = send_all(w, 0, kCount, 200);
  });
  EXPECT_TRUE(run_until(
      &loop, [&] { return chk.total + chk.bad >= kCount; }, std::chrono::seconds(120)));
  t.join();
  EXPECT_EQ(result, errc::ok);
  EXPECT_EQ(chk.total, kCount);
  EXPECT_EQ(chk.bad, 0u);
  const shm_metrics m = r.metrics();
  EXPECT_EQ(m.records_read, kCount);
  EXPECT_EQ(m.records_written, kCount);  // the writer flushed its counters at close
  EXPECT_EQ(m.checksum_failures, 0u);
  r.close();
  EXPECT_FALSE(test::posix_exists(name));
}

TEST_F(ShmChannel, IdleReaderSleepsAndAWriterWakesIt) {
  const std::string name = test::unique_name("idle");
  shm_cleanup cleanup{name};
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  cfg.spin_us = 0;
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, cfg), errc::ok);
  order_check chk(1, 50);
  ASSERT_EQ(test::start_with(r, &loop, order_check::cb, &chk), errc::ok);
  shm_region_info info;
  EXPECT_TRUE(run_until(&loop, [&] {
    return shm_inspect("shm://" + name, &info) == errc::ok && info.reader_sleeping;
  }));
  shm_writer w;
  ASSERT_EQ(w.open("shm://" + name), errc::ok);
  uint8_t buf[64];
  for (uint64_t seq = 0; seq < 3; ++seq) {
    const size_t n = test::make_record(0, seq, 50, buf);
    ASSERT_EQ(w.send(buf, n), errc::ok);
    EXPECT_TRUE(run_until(&loop, [&] { return chk.total == seq + 1; }));
    // Let it fall asleep again before the next one, so each send needs a wake-up.
    EXPECT_TRUE(run_until(&loop, [&] {
      return shm_inspect("shm://" + name, &info) == errc::ok && info.reader_sleeping;
    }));
  }
  EXPECT_EQ(w.metrics().wakeups, 3u);
  EXPECT_EQ(chk.bad, 0u);
}

// Whether a thread of this process is inside FUTEX_WAIT for the value 1 on a word at
// reader_sleeping's offset in its page (the sleeping loop reader's helper), from
// /proc/self/task/*/syscall: "<nr> <addr> <op> <val> ..." while a thread is blocked in a syscall.
bool helper_waits_on_the_sleeping_word() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || found) continue;
    FILE* f = std::fopen(("/proc/self/task/" + std::string(e->d_name) + "/syscall").c_str(), "r");
    if (f == nullptr) continue;
    char line[256] = {};
    if (std::fgets(line, sizeof line, f) != nullptr) {
      char* p = line;
      uint64_t w[4] = {};  // the syscall number, then its first three arguments
      for (uint64_t& v : w) v = std::strtoull(p, &p, 0);
      found = w[0] == SYS_futex &&
              w[1] % 4096 == offsetof(shm_detail::region_header, reader_sleeping) &&
              w[2] == FUTEX_WAIT && w[3] == 1;
    }
    std::fclose(f);
  }
  closedir(d);
  return found;
}

// Whether this thread's /proc/self/task/<tid>/syscall parses to a syscall number (the read in
// progress). Without it (gVisor, a kernel built without it) no helper can be seen asleep.
bool task_syscalls_readable() {
  const std::string path = "/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/syscall";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return false;
  char line[256] = {};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  char* end = line;
  (void)std::strtoll(line, &end, 0);
  return got && end != line;
}

// A reader that sleeps at once when the ring is dry.
shm_config sleepy_config() {
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  cfg.spin_us = 0;
  return cfg;
}

// Opens r on name with cfg, starts it into chk and runs the loop until its helper sleeps on the
// region's futex word. Skips the test where /proc cannot show that (the caller checks IsSkipped).
void start_asleep(uv_loop_t* loop, shm_reader& r, const std::string& name, const shm_config& cfg,
                  order_check& chk) {
  if (!task_syscalls_readable()) {
    GTEST_SKIP() << "/proc/self/task/*/syscall gives no syscall number here: the test cannot "
                    "see the reader's helper asleep on the futex";
  }
  ASSERT_EQ(r.open("shm://" + name, cfg), errc::ok);
  ASSERT_EQ(test::start_with(r, loop, order_check::cb, &chk), errc::ok);
  ASSERT_TRUE(run_until(
      loop, [] { return helper_waits_on_the_sleeping_word(); }, 30s));
}

// A writer stopped or killed between swapping reader_sleeping from 1 to 0 and its futex_wake: the
// helper slept on in FUTEX_WAIT without a timeout, later writers saw 0 and woke no one, and
// nothing was ever delivered again. The helper now looks at the ring every 200 ms.
TEST_F(ShmChannel, AWakeUpLostByAStoppedWriterDelaysDeliveryOnlyBriefly) {
  const std::string name = test::unique_name("lostwake");
  shm_cleanup cleanup{name};
  shm_reader r;
  order_check chk(1, 50);
  start_asleep(&loop, r, name, sleepy_config(), chk);
  if (IsSkipped() || HasFatalFailure()) return;
  test::raw_region raw(name);
  ASSERT_NE(raw.p, MAP_FAILED);
  ASSERT_EQ(raw.hdr()->reader_sleeping.exchange(0), 1u);  // the stopped writer's exchange(0)
  shm_writer w;
  ASSERT_EQ(w.open("shm://" + name), errc::ok);
  uint8_t buf[64];
  for (uint64_t seq = 0; seq < 3; ++seq) {
    ASSERT_EQ(w.send(buf, test::make_record(0, seq, 50, buf)), errc::ok);
  }
  EXPECT_TRUE(run_until(
      &loop, [&] { return chk.total == 3; }, 30s))
      << chk.total << " delivered";
  EXPECT_EQ(chk.bad, 0u);
  r.close();
}

// A writer (records of writer id 1) on its own thread that claims its record's nodes and stalls
// before the copy, leaving the head in kWriting as a writer killed mid-write does, until finish().
struct stalled_sender {
  shm_writer w;
  std::promise<void> claimed;
  std::promise<void> go;
  std::shared_future<void> go_f{go.get_future()};
  std::thread t;
  errc result = errc::closed;
  explicit stalled_sender(const std::string& url) {
    if (w.open(url) != errc::ok) return;
    shm_detail::writer_access::set_test_hook(
        w,
        [](void* u) {
          auto* self = static_cast<stalled_sender*>(u);
          self->claimed.set_value();
          self->go_f.wait();
        },
        this);
    t = std::thread([this] {
      uint8_t buf[64];
      result = w.send(buf, test::make_record(1, 0, 50, buf));
    });
    claimed.get_future().wait();
  }
  errc finish() {
    if (!t.joinable()) return result;
    go.set_value();
    t.join();
    return result;
  }
  ~stalled_sender() { finish(); }
  stalled_sender(const stalled_sender&) = delete;
  stalled_sender& operator=(const stalled_sender&) = delete;
};

// The reader slept on a dry ring (no abandon deadline); a writer then claimed the head and never
// finished, and one behind it committed and was stopped before its wake-up (the word stays 1). The
// capped wait saw the word 1 and the head not ready (kWriting) and slept on: the record behind
// waited for some later writer's send. Now a capped wait that finds the head claimed since the
// reader slept wakes the loop, which times the claim out as abandoned and delivers the one behind.
TEST_F(ShmChannel, ARecordLeftUnfinishedAtTheHeadDelaysTheOneBehindOnlyBriefly) {
  const std::string name = test::unique_name("inflight");
  shm_cleanup cleanup{name};
  shm_config cfg = sleepy_config();
  cfg.abandon_timeout_us = 20000;
  shm_reader r;
  order_check chk(2, 50);
  start_asleep(&loop, r, name, cfg, chk);
  if (IsSkipped() || HasFatalFailure()) return;
  stalled_sender a("shm://" + name);
  ASSERT_TRUE(a.t.joinable());
  test::raw_region raw(name);
  ASSERT_NE(raw.p, MAP_FAILED);
  // The commit behind wakes no one, and the word is back to 1 as if its writer never looked.
  ASSERT_EQ(raw.hdr()->reader_sleeping.exchange(0), 1u);
  shm_writer b;
  ASSERT_EQ(b.open("shm://" + name), errc::ok);
  uint8_t buf[64];
  ASSERT_EQ(b.send(buf, test::make_record(0, 0, 50, buf)), errc::ok);
  raw.hdr()->reader_sleeping.store(1);
  EXPECT_TRUE(run_until(
      &loop, [&] { return chk.total == 1; }, 30s))
      << "the record behind the unfinished one was not delivered";
  EXPECT_EQ(a.finish(), errc::abandoned);
  EXPECT_EQ(chk.bad, 0u);
  r.close();
}

TEST_F(ShmChannel, WriterGetsNotConnectedOnceTheReaderClosed) {
  const std::string name = test::unique_name("closed");
  shm_cleanup cleanup{name};
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, cfg), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open("shm:///" + name), errc::ok);  // the libatbus spelling
  EXPECT_TRUE(w.reader_alive());
  EXPECT_EQ(w.send("x", 1), errc::ok);
  r.close();
  EXPECT_FALSE(test::posix_exists(name));
  EXPECT_FALSE(w.reader_alive());
  EXPECT_EQ(w.send("x", 1), errc::not_connected);
  shm_writer w2;
  EXPECT_EQ(w2.open("shm://" + name), errc::not_found);
}

TEST_F(ShmChannel, SecondReaderOnALiveRegionIsRefused) {
  const std::string name = test::unique_name("busy");
  shm_cleanup cleanup{name};
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  shm_reader a, b;
  ASSERT_EQ(a.open("shm://" + name, cfg), errc::ok);
  EXPECT_EQ(b.open("shm://" + name, cfg), errc::busy);
  shm_reader m1, m2;
  ASSERT_EQ(m1.open("mem://" + name, cfg), errc::ok);
  EXPECT_EQ(m2.open("mem://" + name, cfg), errc::busy);
  m1.close();
  EXPECT_EQ(m2.open("mem://" + name, cfg), errc::ok);
}

TEST_F(ShmChannel, ForeignObjectWithTheSameNameIsLeftAlone) {
  const std::string name = test::unique_name("foreign");
  shm_cleanup cleanup{name};
  const int fd = shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  const char junk[] = "not a uvbus region";
  ASSERT_EQ(pwrite(fd, junk, sizeof junk, 0), static_cast<ssize_t>(sizeof junk));
  close(fd);
  shm_writer w;
  EXPECT_EQ(w.open("shm://" + name), errc::bad_layout);
  shm_reader r;
  EXPECT_EQ(r.open("shm://" + name), errc::bad_layout);
  EXPECT_TRUE(test::posix_exists(name));
  shm_region_info info;
  EXPECT_EQ(shm_inspect("shm://" + name, &info), errc::bad_layout);
}

TEST_F(ShmChannel, SysvRegionWorksAndIsRemovedOnClose) {
  const int key = test::unique_key();
  shm_cleanup cleanup{"", key};
  char url[64];
  std::snprintf(url, sizeof url, "shm://0x%x", key);
  char url_dec[64];
  std::snprintf(url_dec, sizeof url_dec, "shm://%d", key);
  shm_config cfg;
  cfg.ring_bytes = size_t{256} * 1024;
  cfg.max_record_size = 4096;
  cfg.huge_pages = true;  // falls back to normal pages when none are reserved
  shm_reader r;
  ASSERT_EQ(r.open(url, cfg), errc::ok);
  EXPECT_TRUE(test::sysv_exists(key));
  order_check chk(1, 300);
  ASSERT_EQ(test::start_with(r, &loop, order_check::cb, &chk), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open(url_dec), errc::ok);
  std::thread t([&] { EXPECT_EQ(send_all(w, 0, 5000, 300), errc::ok); });
  EXPECT_TRUE(run_until(&loop, [&] { return chk.total == 5000; }));
  t.join();
  EXPECT_EQ(chk.bad, 0u);
  r.close();
  EXPECT_FALSE(test::sysv_exists(key));
  EXPECT_EQ(w.send("x", 1), errc::not_connected);
}

TEST_F(ShmChannel, RegionsOfADeadReaderAreReattachedWithTheirRecords) {
  const std::string name = test::unique_name("stale");
  const int key = test::unique_key();
  shm_cleanup cleanup{name, key};
  char sysv[64];
  std::snprintf(sysv, sizeof sysv, "shm://0x%x", key);
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  // A child creates both regions and dies without closing them (no threads exist yet).
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto* a = new shm_reader();
    auto* b = new shm_reader();
    const bool ok = a->open("shm://" + name, cfg) == errc::ok && b->open(sysv, cfg) == errc::ok;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(test::posix_exists(name));
  ASSERT_TRUE(test::sysv_exists(key));
  // Writers keep committing into a dead reader's ring: the records wait for the next reader.
  shm_writer w, w2;
  EXPECT_EQ(w.open("shm://" + name), errc::ok);
  EXPECT_EQ(w2.open(sysv), errc::ok);
  EXPECT_FALSE(w.reader_alive());
  EXPECT_FALSE(w2.reader_alive());
  EXPECT_EQ(w.send("kept", 4), errc::ok);
  EXPECT_EQ(w2.send("kept2", 5), errc::ok);
  shm_region_info info;
  EXPECT_EQ(shm_inspect("shm://" + name, &info), errc::ok);
  EXPECT_FALSE(info.reader_alive);
  EXPECT_EQ(info.reader_incarnation, 1u);
  shm_reader r1, r2;
  EXPECT_EQ(r1.open("shm://" + name, cfg), errc::ok);
  EXPECT_EQ(r2.open(sysv, cfg), errc::ok);
  EXPECT_TRUE(r1.reattached());
  EXPECT_TRUE(r2.reattached());
  EXPECT_TRUE(w.reader_alive());
  EXPECT_TRUE(w2.reader_alive());
  EXPECT_EQ(shm_inspect(sysv, &info), errc::ok);
  EXPECT_EQ(info.reader_incarnation, 2u);
  EXPECT_EQ(w.send("fresh", 5), errc::ok);
  char buf[16];
  size_t len = 0;
  EXPECT_EQ(r1.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(std::string(buf, len), "kept");
  EXPECT_EQ(r1.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(std::string(buf, len), "fresh");
  EXPECT_EQ(r2.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(std::string(buf, len), "kept2");
  r1.close();
  r2.close();
  EXPECT_FALSE(test::posix_exists(name));
  EXPECT_FALSE(test::sysv_exists(key));
}

TEST_F(ShmChannel, ReaderThatDiesLeavesWritersCommittingUntilFullThenRemovalIsNotConnected) {
  const std::string name = test::unique_name("dies");
  shm_cleanup cleanup{name};
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    test::die_with_parent(parent);
    shm_config cfg;
    cfg.ring_bytes = 4096;
    cfg.max_record_size = 1024;
    auto* r = new shm_reader();
    const char c = r->open("shm://" + name, cfg) == errc::ok ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  shm_writer w;
  ASSERT_EQ(w.open("shm://" + name), errc::ok);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  errc e = errc::ok;
  for (int i = 0; i < 1000 && e == errc::ok; ++i) e = w.send("0123456789", 10);
  EXPECT_EQ(e, errc::queue_full);  // the ring filled up: its records wait for the next reader
  EXPECT_FALSE(w.reader_alive());
  std::string detail;
  ASSERT_EQ(shm_remove("shm://" + name, false, &detail), errc::ok) << detail;
  EXPECT_EQ(w.send("0123456789", 10), errc::not_connected);  // removed: nobody will read it
}

TEST_F(ShmChannel, WriterKilledBetweenReserveAndCommitIsSkippedAndOthersKeepFlowing) {
  const std::string name = test::unique_name("killed");
  shm_cleanup cleanup{name};
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
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
    if (w->open("shm://" + name) != errc::ok) _exit(1);
    shm_detail::writer_access::set_test_hook(
        *w,
        [](void* fd) {
          (void)!write(*static_cast<int*>(fd), "h", 1);
          for (;;) pause();  // held mid-record until SIGKILL
        },
        &held[1]);
    (void)w->send("never committed", 15);
    _exit(2);
  }
  char c = 0;
  ASSERT_EQ(read(held[0], &c, 1), 1);  // the child has reserved its record
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(held[0]);
  close(held[1]);
  EXPECT_TRUE(WIFSIGNALED(status));

  order_check chk(1, 100);
  ASSERT_EQ(test::start_with(r, &loop, order_check::cb, &chk), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open("shm://" + name), errc::ok);
  // More than a lap of records behind the dead one: they must all arrive (after the timeout, and
  // after the held nodes are reclaimed).
  std::thread t([&] { EXPECT_EQ(send_all(w, 0, 5000, 100), errc::ok); });
  EXPECT_TRUE(run_until(
      &loop, [&] { return chk.total == 5000; }, std::chrono::seconds(30)));
  t.join();
  EXPECT_EQ(chk.bad, 0u);
  // The dead writer's record, plus any of ours a sanitizer build descheduled past the timeout
  // (each reported to us as abandoned and sent again).
  EXPECT_EQ(r.metrics().abandoned, 1u + w.metrics().writer_abandoned);
}

TEST_F(ShmChannel, FourWriterProcessesKeepPerWriterOrderAndExactTotals) {
  const std::string name = test::unique_name("procs");
  shm_cleanup cleanup{name};
  shm_config cfg;
  cfg.ring_bytes = size_t{256} * 1024;
  cfg.max_record_size = 4096;
  cfg.abandon_timeout_us = 50000;
  // Writers here are only slow, never dead: their acknowledgement, not the reclaim timeout, must
  // release skipped nodes, however long a sanitizer build keeps them descheduled.
  cfg.reclaim_timeout_us = 30 * 1000 * 1000;  // 4 writers on 2 cores get preempted mid-record
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, cfg), errc::ok);
  constexpr int kWriters = 4;
  constexpr uint64_t kEach = 25000;
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < kWriters; ++i) {  // every fork happens before the reader's thread exists
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(go[1]);
      char c;
      if (read(go[0], &c, 1) != 0) _exit(3);  // the barrier: EOF when the parent closes it
      auto* w = new shm_writer();
      if (w->open("shm://" + name) != errc::ok) _exit(1);
      const errc e = send_all(*w, static_cast<uint32_t>(i), kEach, 300);
      w->close();
      _exit(e == errc::ok ? 0 : 2);
    }
    kids.push_back(pid);
  }
  close(go[0]);
  order_check chk(kWriters, 300);
  ASSERT_EQ(test::start_with(r, &loop, order_check::cb, &chk), errc::ok);
  close(go[1]);  // start all writers at once
  EXPECT_TRUE(run_until(
      &loop, [&] { return chk.total + chk.bad >= kWriters * kEach; }, std::chrono::seconds(60)));
  for (pid_t p : kids) {
    int status = 0;
    waitpid(p, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(chk.bad, 0u);
  EXPECT_EQ(chk.total, kWriters * kEach);
  for (int i = 0; i < kWriters; ++i) EXPECT_EQ(chk.next[i], kEach) << "writer " << i;
  const shm_metrics m = r.metrics();
  EXPECT_EQ(m.records_written, kWriters * kEach);
  EXPECT_EQ(m.checksum_failures, 0u);
}

TEST_F(ShmChannel, FourWriterThreadsOverMemKeepPerWriterOrderAndExactTotals) {
  const std::string name = test::unique_name("mem");
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  cfg.abandon_timeout_us = 50000;
  // Writers here are only slow, never dead: their acknowledgement, not the reclaim timeout, must
  // release skipped nodes, however long a sanitizer build keeps them descheduled.
  cfg.reclaim_timeout_us = 30 * 1000 * 1000;
  shm_reader r;
  ASSERT_EQ(r.open("mem://" + name, cfg), errc::ok);
  order_check chk(4, 500);
  ASSERT_EQ(test::start_with(r, &loop, order_check::cb, &chk), errc::ok);
  constexpr uint64_t kEach = 30000;
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  ts.reserve(4);
  std::atomic<int> failures{0};
  for (uint32_t i = 0; i < 4; ++i) {
    ts.emplace_back([&, i] {
      shm_writer w;
      if (w.open("mem://" + name) != errc::ok) {
        ++failures;
        return;
      }
      ++ready;
      while (ready.load() < 4) std::this_thread::yield();  // barrier
      if (send_all(w, i, kEach, 500) != errc::ok) ++failures;
    });
  }
  EXPECT_TRUE(run_until(
      &loop, [&] { return chk.total + chk.bad >= 4 * kEach; }, std::chrono::seconds(60)));
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(chk.bad, 0u);
  EXPECT_EQ(chk.total, 4 * kEach);
  r.close();
  shm_writer late;
  EXPECT_EQ(late.open("mem://" + name), errc::not_found);
}

TEST_F(ShmChannel, SlowMemWriterSkippedByLoopReaderReportsAbandoned) {
  const std::string name = test::unique_name("slowmem");
  shm_config cfg;
  cfg.ring_bytes = size_t{64} * 1024;
  cfg.max_record_size = 4096;
  cfg.abandon_timeout_us = 2000;
  cfg.spin_us = 0;
  shm_reader r;
  ASSERT_EQ(r.open("mem://" + name, cfg), errc::ok);
  order_check chk(2, 50);
  ASSERT_EQ(test::start_with(r, &loop, order_check::cb, &chk), errc::ok);
  std::atomic<bool> release{false};
  errc slow_result = errc::ok;
  std::thread slow([&] {
    shm_writer w;
    if (w.open("mem://" + name) != errc::ok) return;
    shm_detail::writer_access::set_test_hook(
        w,
        [](void* u) {
          auto* rel = static_cast<std::atomic<bool>*>(u);
          while (!rel->load()) std::this_thread::yield();
        },
        &release);
    uint8_t buf[64];
    const size_t n = test::make_record(1, 0, 50, buf);
    slow_result = w.send(buf, n);
  });
  shm_writer fast;
  ASSERT_EQ(fast.open("mem://" + name), errc::ok);
  // Wait until the slow writer holds its reservation, then send behind it.
  EXPECT_TRUE(run_until(&loop, [&] {
    shm_region_info info;
    return shm_inspect("mem://" + name, &info) == errc::ok && info.write_pos > 0;
  }));
  uint8_t buf[64];
  const size_t n = test::make_record(0, 0, 50, buf);
  errc e;
  while ((e = fast.send(buf, n)) == errc::abandoned) {  // only if descheduled past the timeout
  }
  ASSERT_EQ(e, errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return chk.total == 1; }));  // delivered past the stuck one
  EXPECT_EQ(r.metrics().abandoned, 1u + fast.metrics().writer_abandoned);
  release = true;
  slow.join();
  EXPECT_EQ(slow_result, errc::abandoned);
  EXPECT_EQ(chk.bad, 0u);
}

}  // namespace
}  // namespace uvbus::shm_channel_test
