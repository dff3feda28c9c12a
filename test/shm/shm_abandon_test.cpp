// A stalled writer's record that the reader abandons: its nodes stay held across a reader that
// dies before storing its cursor past it, and a slow callback does not make the reader abandon a
// writer that has only just begun.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "shm/test_hook.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_abandon_test {
namespace {

using namespace std::chrono_literals;
using test::shm_cleanup;

shm_config abandon_cfg(uint32_t abandon_us) {
  shm_config c;
  c.ring_bytes = size_t{1} << 20;
  c.max_record_size = 4096;
  c.abandon_timeout_us = abandon_us;
  c.reclaim_timeout_us = 60000000;  // held records are released by their writer, not by time
  c.batch_max = 1;                  // each record its own callback, inside the read loop
  c.spin_us = 0;
  return c;
}

void spin_for(std::chrono::milliseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) std::this_thread::yield();
}

// Waits for pid to end (true), or kills it after the deadline (false).
bool reap(pid_t pid, std::chrono::seconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return true;
    std::this_thread::yield();
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return false;
}

// A writer child that reserves the region's first record and stalls inside it (it says 'h' on
// `said`) until the parent writes a byte on `go`; then it finishes its send, which the reader has
// abandoned meanwhile: exit status 0 when that send returned abandoned.
[[noreturn]] void stalled_writer(const std::string& url, int said, int go) {
  auto* w = new shm_writer();
  if (w->open(url) != errc::ok) _exit(1);
  static int fds[2];
  fds[0] = said;
  fds[1] = go;
  shm_detail::writer_access::set_test_hook(
      *w,
      [](void*) {
        char c = 'h';
        (void)!write(fds[0], &c, 1);
        (void)!read(fds[1], &c, 1);
      },
      nullptr);
  _exit(w->send("stalled", 7) == errc::abandoned ? 0 : 2);
}

// A reader child that abandons the stalled record, takes the first record behind it and dies in
// that callback, before its cursor is stored past the abandoned record.
[[noreturn]] void dying_reader(const std::string& url) {
  auto* r = new shm_reader({[](const shm_record*, size_t) { _exit(0); }});
  if (r->open(url, abandon_cfg(2000)) != errc::ok) _exit(1);
  for (;;) {
    if (r->poll(16) == 0) std::this_thread::yield();
  }
}

TEST(ShmAbandon, ARecordADeadReaderAbandonedStaysHeldForItsWriter) {
  const std::string name = test::unique_name("abandon-dead");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  {
    shm_reader r0;  // creates the region, then leaves it for the others
    ASSERT_EQ(r0.open(url, abandon_cfg(2000)), errc::ok);
    r0.close(shm_close_mode::keep);
  }
  int said[2];
  int go[2];
  ASSERT_EQ(pipe(said), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t parent = getpid();
  const pid_t wpid = fork();
  ASSERT_GE(wpid, 0);
  if (wpid == 0) {
    test::die_with_parent(parent);
    stalled_writer(url, said[1], go[0]);
  }
  char c = 0;
  ASSERT_EQ(read(said[0], &c, 1), 1);  // the record at position 0 is reserved, not committed
  {
    shm_writer b;
    ASSERT_EQ(b.open(url), errc::ok);
    for (int i = 0; i < 20; ++i) ASSERT_EQ(b.send("behind", 6), errc::ok);
  }
  const pid_t rpid = fork();
  ASSERT_GE(rpid, 0);
  if (rpid == 0) {
    test::die_with_parent(parent);
    dying_reader(url);
  }
  ASSERT_TRUE(reap(rpid, 60s)) << "the first reader did not take a record behind the stalled one";

  size_t got = 0;
  shm_reader r({[&](const shm_record*, size_t n) { got += n; }});
  ASSERT_EQ(r.open(url, abandon_cfg(2000)), errc::ok);
  while (r.poll(64) != 0) {
  }
  EXPECT_EQ(got, 20U);  // the dead reader's record comes again: it never stored past it
  shm_region_info info;
  ASSERT_EQ(shm_inspect(url, &info), errc::ok);
  EXPECT_EQ(info.read_pos, 0U) << "the abandoned record's nodes went back to the writers while "
                                  "its writer may still copy into them";
  // The writer finishes, sees its record abandoned and says so: the nodes are released.
  ASSERT_EQ(write(go[1], "g", 1), 1);
  int status = -1;
  ASSERT_EQ(waitpid(wpid, &status, 0), wpid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "its send was not abandoned";
  (void)r.poll(64);
  ASSERT_EQ(shm_inspect(url, &info), errc::ok);
  EXPECT_EQ(info.read_pos, info.write_pos);
  for (const int fd : {said[0], said[1], go[0], go[1]}) close(fd);
  r.close();
}

// A writer held inside its record until `release`, on a thread of its own.
struct held_writer {
  shm_writer w;
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  errc result = errc::ok;
  std::thread t;
  void start(const std::string& url) {
    ASSERT_EQ(w.open(url), errc::ok);
    shm_detail::writer_access::set_test_hook(
        w,
        [](void* u) {
          auto* self = static_cast<held_writer*>(u);
          self->inside = true;
          while (!self->release) std::this_thread::yield();
        },
        this);
    t = std::thread([this] { result = w.send("held", 4); });
    while (!inside) std::this_thread::yield();
  }
  void finish() {
    release = true;
    if (t.joinable()) t.join();
  }
  ~held_writer() { finish(); }
};

// X is abandoned after 200 ms; the record behind it goes to a callback that runs for 500 ms, and
// Y begins during that callback. The drain that follows must not count Y as stuck since X was
// abandoned: it was stuck for microseconds.
TEST(ShmAbandon, ASlowCallbackDoesNotAgeTheNextWritersRecord) {
  const std::string name = test::unique_name("abandon-slow");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  held_writer y;
  bool started_y = false;
  shm_reader r({[&](const shm_record*, size_t) {
    if (started_y) return;
    started_y = true;
    spin_for(500ms);
    y.start(url);
  }});
  ASSERT_EQ(r.open(url, abandon_cfg(200000)), errc::ok);
  held_writer x;
  x.start(url);
  shm_writer b;
  ASSERT_EQ(b.open(url), errc::ok);
  ASSERT_EQ(b.send("behind", 6), errc::ok);
  EXPECT_EQ(r.poll(16), 0U);  // X seen in flight: its wait starts
  spin_for(250ms);
  EXPECT_EQ(r.poll(16), 1U);  // X abandoned; the record behind it; Y seen in flight
  ASSERT_TRUE(started_y);
  EXPECT_EQ(r.poll(16), 0U);  // Y has waited microseconds, not 500 ms
  EXPECT_EQ(r.metrics().abandoned, 1U);
  x.finish();
  y.finish();
  EXPECT_EQ(x.result, errc::abandoned);
  EXPECT_EQ(y.result, errc::ok);
  EXPECT_EQ(r.poll(16), 1U);  // Y's record
  r.close();
}

// A started reader abandons a stalled writer's record and drains everything behind it; the ring
// is then full of nodes held for that writer, and the reader sleeps. When the writer finishes its
// send (abandoned) it acknowledges the record, which frees the nodes: a send must succeed well
// before reclaim_timeout_us (60 s). Before, the acknowledgement woke no one and the reader slept
// until the reclaim deadline.
TEST(ShmAbandon, AWritersAcknowledgementWakesASleepingReaderToFreeTheRing) {
  const std::string name = test::unique_name("abandon-ack-wake");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  uv_loop_t loop;
  uv_loop_init(&loop);
  shm_config cfg = test::small_ring_config();
  cfg.abandon_timeout_us = 2000;
  cfg.reclaim_timeout_us = 60000000;
  cfg.spin_us = 0;
  size_t got = 0;
  shm_reader r({[&](const shm_record*, size_t n) { got += n; }});
  ASSERT_EQ(r.open(url, cfg), errc::ok);
  ASSERT_EQ(r.start(&loop), errc::ok);
  {
    held_writer x;
    x.start(url);
    shm_writer b;
    ASSERT_EQ(b.open(url), errc::ok);
    const std::string msg(100, 'm');
    size_t sent = 0;
    // Fill until the ring refuses while the reader has read everything sent (so it is the held
    // nodes, not unread records, that fill it) and sleeps.
    ASSERT_TRUE(test::run_until(
        &loop,
        [&] {
          if (b.send(msg.data(), msg.size()) == errc::ok) ++sent;
          shm_region_info info;
          return got == sent && r.metrics().abandoned == 1 &&
                 b.send(msg.data(), msg.size()) == errc::queue_full &&
                 shm_inspect(url, &info) == errc::ok && info.reader_sleeping;
        },
        30s))
        << "sent " << sent << ", delivered " << got;
    x.finish();
    EXPECT_EQ(x.result, errc::abandoned);
    EXPECT_TRUE(test::run_until(
        &loop, [&] { return b.send(msg.data(), msg.size()) == errc::ok; }, 10s))
        << "the ring stayed full after the acknowledgement";
  }
  r.close();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace
}  // namespace uvbus::shm_abandon_test
