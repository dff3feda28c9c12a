// The shm API's conventions: validate and open errors that name the field or URL, the records
// callback's contract (stop and close from inside it), would_block, and the thread contracts
// (a reader belongs to its thread; a writer may be used from any thread, one at a time).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <uv.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "shm/layout.h"
#include "shm/test_hook.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_api_test {
namespace {

shm_config small_ring() {
  shm_config cfg;
  cfg.ring_bytes = 4096;
  cfg.node_size = 64;
  cfg.max_record_size = 1024;
  cfg.batch_max = 2;
  return cfg;
}

TEST(ShmApi, ValidateNamesTheFieldAndTheRule) {
  shm_config cfg = small_ring();
  std::string why;
  EXPECT_EQ(shm_validate(cfg, &why), errc::ok);
  cfg.node_size = 100;
  EXPECT_EQ(shm_validate(cfg, &why), errc::invalid_argument);
  EXPECT_NE(why.find("shm_config.node_size (100)"), std::string::npos) << why;
  EXPECT_NE(why.find("power of two"), std::string::npos) << why;
  cfg = small_ring();
  cfg.max_record_size = 4000;
  EXPECT_EQ(shm_validate(cfg, &why), errc::invalid_argument);
  EXPECT_NE(why.find("shm_config.max_record_size (4000)"), std::string::npos) << why;
  cfg = small_ring();
  cfg.abandon_timeout_us = 0;
  EXPECT_EQ(shm_validate(cfg), errc::invalid_argument);  // the detail is optional
  // 0 released a skipped record's nodes at once: a merely slow writer's late copy could land on
  // the records written into them since (docs/shm.md "Writer merely slow").
  cfg = small_ring();
  cfg.reclaim_timeout_us = 0;
  EXPECT_EQ(shm_validate(cfg, &why), errc::invalid_argument);
  EXPECT_NE(why.find("shm_config.reclaim_timeout_us must be non-zero"), std::string::npos) << why;
}

// batch_max sizes an array open() allocates and zero-fills up front (16 bytes a record): before,
// any value was accepted, 0xffffffff failed open() with a bare no_memory and 2^30 zeroed 16 GiB.
// open_image checked none of its cfg (abandon_timeout_us = 0 was taken).
TEST(ShmApi, BatchMaxIsBoundedAndOpenImageValidatesItsConfigNamingTheField) {
  shm_config cfg = small_ring();
  std::string why;
  cfg.batch_max = shm_max_reader_batch;
  EXPECT_EQ(shm_validate(cfg, &why), errc::ok) << why;
  for (const uint32_t bad : {shm_max_reader_batch + 1, uint32_t{1} << 30, 0xffffffffu}) {
    cfg.batch_max = bad;
    EXPECT_EQ(shm_validate(cfg, &why), errc::invalid_argument) << bad;
    EXPECT_NE(why.find("shm_config.batch_max (" + std::to_string(bad) + ")"), std::string::npos)
        << why;
    shm_reader r;
    EXPECT_EQ(r.open("mem://" + test::unique_name("api-batch"), cfg), errc::invalid_argument);
    EXPECT_NE(r.last_error().detail.find("batch_max"), std::string::npos) << r.last_error().detail;
  }
  const shm_config good = small_ring();
  test::image img(shm_region_size(good));
  ASSERT_EQ(shm_format_image(img.p, img.size, good), errc::ok);
  for (int field = 0; field < 2; ++field) {
    cfg = good;
    (field == 0 ? cfg.batch_max : cfg.abandon_timeout_us) = field == 0 ? 0xffffffffu : 0;
    shm_reader r;
    EXPECT_EQ(r.open_image(img.p, img.size, cfg), errc::invalid_argument) << field;
    EXPECT_NE(r.last_error().detail.find(field == 0 ? "shm_config.batch_max"
                                                    : "shm_config.abandon_timeout_us"),
              std::string::npos)
        << r.last_error().detail;
  }
}

// shm_inspect's detail overload promised a detail for bad_url or unsupported_scheme, but a valid
// URL of another scheme got unsupported_scheme with the detail left empty.
TEST(ShmApi, InspectOfANonShmUrlSaysWhyInItsDetail) {
  for (const char* url : {"ipv4://1.2.3.4:5", "unix:///x"}) {
    shm_region_info info;
    std::string why;
    EXPECT_EQ(shm_inspect(url, &info, &why), errc::unsupported_scheme) << url;
    EXPECT_NE(why.find(url), std::string::npos) << url << ": " << why;
    EXPECT_NE(why.find("only shm:// and mem://"), std::string::npos) << url << ": " << why;
  }
}

TEST(ShmApi, OpenErrorsRecordTheUrlAndTheReason) {
  const std::string name = test::unique_name("api");
  shm_reader r;
  shm_config bad = small_ring();
  bad.ring_bytes = 1000;
  EXPECT_EQ(r.open("mem://" + name, bad), errc::invalid_argument);
  EXPECT_EQ(r.last_error().code, errc::invalid_argument);
  EXPECT_NE(r.last_error().detail.find("mem://" + name), std::string::npos)
      << r.last_error().detail;
  EXPECT_NE(r.last_error().detail.find("shm_config.ring_bytes (1000)"), std::string::npos);
  EXPECT_EQ(r.open("ipv4://127.0.0.1:1", small_ring()), errc::unsupported_scheme);
  EXPECT_NE(r.last_error().detail.find("ipv4://127.0.0.1:1"), std::string::npos);

  ASSERT_EQ(r.open("mem://" + name, small_ring()), errc::ok);
  EXPECT_EQ(r.open("mem://" + name, small_ring()), errc::wrong_state);
  shm_reader second;
  EXPECT_EQ(second.open("mem://" + name, small_ring()), errc::busy);
  EXPECT_NE(second.last_error().detail.find("a live reader already owns"), std::string::npos)
      << second.last_error().detail;

  shm_writer w;
  EXPECT_EQ(w.open("mem://" + name + "-none"), errc::not_found);
  EXPECT_EQ(w.last_error().code, errc::not_found);
  EXPECT_NE(w.last_error().detail.find("shm_writer::open(mem://" + name + "-none)"),
            std::string::npos)
      << w.last_error().detail;
  shm_writer_options opt;
  opt.expect_node_size = 128;
  EXPECT_EQ(w.open("mem://" + name, opt), errc::bad_layout);
  EXPECT_NE(w.last_error().detail.find("expect_node_size"), std::string::npos)
      << w.last_error().detail;
  EXPECT_EQ(w.open("mem://" + name), errc::ok);
  EXPECT_EQ(w.last_error().code, errc::bad_layout);  // ok leaves it unchanged
}

TEST(ShmApi, AWriterRefusesAnObjectCutShorterThanItsHeaderAnnouncesNamingBoth) {
  // Another process of the uid cut the reader's object short: a writer touching a page past the
  // end gets SIGBUS. It was refused with "header region_size does not match its ring or exceeds
  // the mapped size", naming neither size; now the detail names both. However short the cut (to
  // the header page, or by one node), the same; restored, the object attaches.
  const std::string name = test::unique_name("cut");
  test::shm_cleanup clean{name};
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, small_ring()), errc::ok);
  const int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  const auto full = static_cast<size_t>(st.st_size);
  for (const size_t size : {full - 64, size_t{shm_detail::kHeaderSize}}) {
    SCOPED_TRACE(size);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    shm_writer w;
    EXPECT_EQ(w.open("shm://" + name), errc::bad_layout);
    const std::string& d = w.last_error().detail;
    EXPECT_NE(
        d.find("the object is " + std::to_string(size) +
               " bytes, its header announces region_size " + std::to_string(full) + ": cut short"),
        std::string::npos)
        << d;
  }
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(full)), 0);
  close(fd);
  shm_writer w;
  EXPECT_EQ(w.open("shm://" + name), errc::ok) << w.last_error().detail;
}

// A /dev/shm mounted with `options` in a private mount namespace (false where this machine
// refuses one).
bool private_dev_shm(const char* options) {
  const auto uid = getuid();
  const auto gid = getgid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return false;
  const auto put = [](const char* path, const std::string& text) {
    FILE* f = std::fopen(path, "w");
    if (f == nullptr) return false;
    const bool ok = std::fputs(text.c_str(), f) >= 0;
    return std::fclose(f) == 0 && ok;
  };
  put("/proc/self/setgroups", "deny");
  return put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") &&
         put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1") &&
         mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
         mount("tmpfs", "/dev/shm", "tmpfs", 0, options) == 0;
}

// Runs fn(name) in a forked child: its exit status, or 128 + the signal that ended it.
int in_child(int (*fn)(const std::string&), const std::string& name) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    test::die_with_parent(parent);
    _exit(fn(name));
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int no_room(void* /*user*/) {
  return ENOSPC;
}

// The checks of RegionLargerThanDevShmIsRefusedAtOpen, in a child: 0 when all hold.
int refused_for_want_of_room(const std::string& name) {
  const bool real =
      private_dev_shm("size=4m");  // else a /dev/shm without room is faked at the reserve step
  if (!real) shm_detail::region_access::set_reserve_hook(no_room, nullptr);
  shm_config cfg;
  cfg.ring_bytes = size_t{16} << 20;
  shm_reader r;
  const errc e = r.open("shm://" + name, cfg);
  if (e == errc::ok) return 10;  // before the fix: ok, and the first writer past 4 MiB got SIGBUS
  if (e != errc::no_memory) return 11;
  const std::string& d = r.last_error().detail;
  if (d.find("/dev/shm") == std::string::npos ||
      d.find(std::to_string(shm_region_size(cfg))) == std::string::npos) {
    return 12;
  }
  if (test::posix_exists(name)) return 13;  // the refused object is not left behind
  // Reattach: a kept region with a record, its pages no longer all available: refused, intact.
  shm_detail::region_access::set_reserve_hook(nullptr, nullptr);
  if (r.open("shm://" + name, small_ring()) != errc::ok) return 14;
  shm_writer w;
  if (w.open("shm://" + name) != errc::ok || w.send("kept", 4) != errc::ok) return 15;
  r.close(shm_close_mode::keep);
  shm_detail::region_access::set_reserve_hook(no_room, nullptr);
  if (r.open("shm://" + name, small_ring()) != errc::no_memory) return 16;
  shm_detail::region_access::set_reserve_hook(nullptr, nullptr);
  if (r.open("shm://" + name, small_ring()) != errc::ok || !r.reattached()) return 17;
  char buf[8];
  size_t len = 0;
  if (r.try_receive(buf, sizeof buf, &len) != errc::ok || len != 4) return 18;
  return 0;
}

// On tmpfs ftruncate only records a size: a region larger than /dev/shm's free room was accepted
// (Docker's default /dev/shm is 64 MiB) and the first process to touch a page past the room died
// of SIGBUS. Its pages are reserved at open now: no_memory naming the size and /dev/shm. A
// reattach whose pages cannot all be backed is refused too, the region left with its record.
TEST(ShmApi, RegionLargerThanDevShmIsRefusedAtOpen) {
  const std::string name = test::unique_name("room");
  test::shm_cleanup cleanup{name};
  EXPECT_EQ(in_child(refused_for_want_of_room, name), 0)
      << "see refused_for_want_of_room for the failed step (128 + a signal: died of it)";
}

// The checks of OpenReservesItsPagesUnderAOneMillisecondTimer, in a child: 0 when all hold. A
// watchdog timer SIGKILLs it after 60 s (ITIMER_REAL, which alarm() would share, is the 1 ms one).
int opens_under_a_millisecond_timer(const std::string& name) {
  sigevent ev{};
  ev.sigev_notify = SIGEV_SIGNAL;
  ev.sigev_signo = SIGKILL;
  timer_t watchdog{};
  itimerspec in_60s{};
  in_60s.it_value.tv_sec = 60;
  if (timer_create(CLOCK_MONOTONIC, &ev, &watchdog) != 0 ||
      timer_settime(watchdog, 0, &in_60s, nullptr) != 0) {
    return 20;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) {};
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  const itimerval every_ms{{0, 1000}, {0, 1000}};
  if (sigaction(SIGALRM, &sa, nullptr) != 0 || setitimer(ITIMER_REAL, &every_ms, nullptr) != 0) {
    return 21;
  }
  shm_config cfg;
  cfg.ring_bytes = size_t{256} << 20;
  shm_reader r;
  if (r.open("shm://" + name, cfg) != errc::ok) return 10;
  r.close();
  return 0;
}

// Before Linux 6.10 tmpfs stops a fallocate with EINTR whenever a signal is pending and frees the
// pages that call added: the reservation retried the whole range, so a process with a periodic
// signal opening a ring whose reservation outlasts the period never finished open(). Now signals
// are blocked around it, chunk by chunk. (On a kernel from 6.10 this passes on the old code too.)
TEST(ShmApi, OpenReservesItsPagesUnderAOneMillisecondTimer) {
  const std::string name = test::unique_name("itimer");
  test::shm_cleanup cleanup{name};
  EXPECT_EQ(in_child(opens_under_a_millisecond_timer, name), 0)
      << "see opens_under_a_millisecond_timer (128 + 9: still reserving after 60 s)";
}

// KiB of the first mapping of path in this process that are PMD-mapped shmem (huge pages).
long shmem_pmd_kb(const std::string& path) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  char line[512];
  bool in = false;
  long kb = -1;
  while (kb < 0 && std::fgets(line, sizeof line, f) != nullptr) {
    if (!in) {
      in = std::strstr(line, path.c_str()) != nullptr;
    } else if (std::strncmp(line, "ShmemPmdMapped:", 15) == 0) {
      kb = std::strtol(line + 15, nullptr, 10);
    }
  }
  std::fclose(f);
  return kb;
}

// Whether the kernel may give a madvised mapping transparent huge pages at all.
bool thp_possible() {
  FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == nullptr) return false;
  char line[128] = {};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  return got && std::strstr(line, "[never]") == nullptr;
}

constexpr int kCannotTell = 77;

// The checks of HugePagesAreNotDefeatedByTheReservation, in a child: 0 when all hold.
int huge_pages_survive_the_reservation(const std::string& name) {
  if (!thp_possible() || !private_dev_shm("size=64m,huge=advise")) return kCannotTell;
  shm_config cfg;
  cfg.ring_bytes = size_t{8} << 20;
  cfg.huge_pages = true;
  shm_reader r;
  if (r.open("shm://" + name, cfg) != errc::ok) return 10;
  if (!r.huge_pages()) return kCannotTell;  // the advice was refused
  const long kb = shmem_pmd_kb("/dev/shm/" + name);
  if (kb < 0) return kCannotTell;  // no smaps field to tell
  return kb > 0 ? 0 : 11;
}

// The reservation fallocated before madvise(MADV_HUGEPAGE): fallocate follows no mapping, so on a
// /dev/shm mounted huge=advise it allocated 4 KiB pages, which the advised mapping then found: a
// huge_pages region got none. Now such a region is reserved through its advised mapping.
TEST(ShmApi, HugePagesAreNotDefeatedByTheReservation) {
  const std::string name = test::unique_name("huge");
  const int rc = in_child(huge_pages_survive_the_reservation, name);
  if (rc == kCannotTell) {
    GTEST_SKIP() << "no private /dev/shm mounted huge=advise, or no transparent huge pages here";
  }
  EXPECT_EQ(rc, 0) << "11: the region's mapping holds no huge page";
}

TEST(ShmApi, TryReceiveOnADryRingIsWouldBlock) {
  const std::string name = test::unique_name("api");
  shm_reader r;
  ASSERT_EQ(r.open("mem://" + name, small_ring()), errc::ok);
  uint8_t buf[16];
  size_t len = 0;
  EXPECT_EQ(r.try_receive(buf, sizeof buf, &len), errc::would_block);
  EXPECT_TRUE(is_retriable(errc::would_block));
}

// Sends n one-byte records through a fresh writer.
void send_n(const std::string& url, int n) {
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  for (int i = 0; i < n; ++i) {
    const auto b = static_cast<uint8_t>(i);
    ASSERT_EQ(w.send(&b, 1), errc::ok);
  }
}

TEST(ShmApi, StopInsideThePollCallbackEndsTheBatchRun) {
  const std::string url = "mem://" + test::unique_name("api");
  shm_reader r;
  ASSERT_EQ(r.open(url, small_ring()), errc::ok);
  send_n(url, 6);
  int calls = 0;
  ASSERT_EQ(r.set_callbacks({[&](const shm_record*, size_t n) {
    ++calls;
    EXPECT_EQ(n, 2u);  // batch_max
    if (calls == 1) r.stop();
    EXPECT_EQ(r.set_callbacks({}), errc::wrong_state);
  }}),
            errc::ok);
  EXPECT_EQ(r.poll(100), 2u);  // one batch, then stop() ends this poll
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r.poll(100), 4u);  // the rest on the next poll
  EXPECT_EQ(calls, 3);
}

TEST(ShmApi, CloseInsideThePollCallbackTakesEffectWhenItReturns) {
  const std::string url = "mem://" + test::unique_name("api");
  shm_reader r;
  ASSERT_EQ(r.open(url, small_ring()), errc::ok);
  send_n(url, 6);
  int calls = 0;
  ASSERT_EQ(r.set_callbacks({[&](const shm_record* recs, size_t n) {
    ++calls;
    r.close();
    EXPECT_FALSE(r.is_open());
    EXPECT_EQ(recs[n - 1].size, 1u);  // still readable until the callback returns
  }}),
            errc::ok);
  EXPECT_EQ(r.poll(100), 2u);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(r.is_open());
  EXPECT_EQ(r.poll(100), 0u);
  shm_writer w;
  EXPECT_EQ(w.open(url), errc::not_found);         // the region was removed
  EXPECT_EQ(r.open(url, small_ring()), errc::ok);  // and the reader can open again
}

TEST(ShmApi, CloseInsideTheLoopCallbackStopsDeliveryAndFreesTheRegion) {
  const std::string url = "mem://" + test::unique_name("api");
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, small_ring()), errc::ok);
    send_n(url, 6);
    int calls = 0;
    ASSERT_EQ(r.set_callbacks({[&](const shm_record*, size_t) {
      ++calls;
      r.close();
    }}),
              errc::ok);
    ASSERT_EQ(r.start(&loop), errc::ok);
    uv_run(&loop, UV_RUN_DEFAULT);  // returns once close() released the loop's handles
    EXPECT_EQ(calls, 1);
    EXPECT_FALSE(r.is_open());
  }
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(ShmApi, StartWithoutARecordsCallbackIsRefused) {
  const std::string url = "mem://" + test::unique_name("api");
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  shm_reader r;
  EXPECT_EQ(r.start(&loop), errc::closed);
  ASSERT_EQ(r.open(url, small_ring()), errc::ok);
  EXPECT_EQ(r.start(&loop), errc::invalid_argument);
  r.close();
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(ShmApi, AWriterMayBeUsedFromAnotherThreadThanItsOpener) {
  const std::string url = "mem://" + test::unique_name("api");
  shm_reader r;
  ASSERT_EQ(r.open(url, small_ring()), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  errc sent = errc::io_error;
  std::thread t([&] {
    const const_buffer parts[] = {{"ab", 2}, {"cd", 2}};
    sent = w.sendv(parts, 2);
  });
  t.join();
  EXPECT_EQ(sent, errc::ok);
  std::string got;
  ASSERT_EQ(r.set_callbacks({[&](const shm_record* recs, size_t) {
    got.assign(reinterpret_cast<const char*>(recs[0].data), recs[0].size);
  }}),
            errc::ok);
  EXPECT_EQ(r.poll(10), 1u);
  EXPECT_EQ(got, "abcd");
}

TEST(ShmApi, AWriterThatWakesASleepingReaderPublishesItsCounters) {
  // The region's writer-side counters are batched (kCounterFlushEvery); a writer that finds the
  // reader asleep publishes them at once, so an idle ring's totals do not lag.
  const shm_config cfg = small_ring();
  test::image img(shm_region_size(cfg));
  ASSERT_EQ(shm_format_image(img.p, img.size, cfg), errc::ok);
  auto* hdr = reinterpret_cast<shm_detail::region_header*>(img.p);
  shm_writer w;
  ASSERT_EQ(w.open_image(img.p, img.size), errc::ok);
  ASSERT_EQ(w.send("a", 1), errc::ok);
  EXPECT_EQ(hdr->records_written.load(), 0u);  // batched: not yet published
  hdr->reader_sleeping.store(1);
  ASSERT_EQ(w.send("bc", 2), errc::ok);
  EXPECT_EQ(hdr->reader_sleeping.load(), 0u);  // woken
  EXPECT_EQ(hdr->records_written.load(), 2u);
  EXPECT_EQ(hdr->bytes_written.load(), 3u);
  EXPECT_EQ(hdr->wakeups.load(), 1u);
}

#ifdef NDEBUG

TEST(ShmApi, ReaderCallsFromAForeignThreadReturnWrongThreadAndDoNothing) {
  const std::string url = "mem://" + test::unique_name("api");
  shm_reader r;
  ASSERT_EQ(r.open(url, small_ring()), errc::ok);
  send_n(url, 1);
  std::vector<errc> got;
  size_t polled = 1;
  std::thread t([&] {
    got.push_back(r.open(url, small_ring()));
    got.push_back(r.start(nullptr));
    got.push_back(r.set_callbacks({}));
    uint8_t buf[8];
    size_t len = 0;
    got.push_back(r.try_receive(buf, sizeof buf, &len));
    got.push_back(r.last_error().code);
    polled = r.poll(10);
    r.close();  // does nothing
  });
  t.join();
  for (errc e : got) EXPECT_EQ(e, errc::wrong_thread);
  EXPECT_EQ(polled, 0u);
  EXPECT_TRUE(r.is_open());
  uint8_t buf[8];
  size_t len = 0;
  EXPECT_EQ(r.try_receive(buf, sizeof buf, &len), errc::ok);  // the record is still there
}

#else

TEST(ShmApiDeathTest, ReaderCallsFromAForeignThreadAbortNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  shm_reader r;
  EXPECT_DEATH(std::thread([&] { (void)r.poll(1); }).join(),
               "shm_reader::poll called from a thread other than its loop's thread");
}

#endif

}  // namespace
}  // namespace uvbus::shm_api_test
