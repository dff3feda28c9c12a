// shm.h's promises one by one, where no other test holds them: URL details, foreign objects left
// alone, on_log re-entrancy and the reattach line, thread checks of the getters, misuse guards.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shm/layout.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_contract_test {
namespace {

using test::collected;
using test::image;
using test::run_until;
using test::shm_cleanup;

struct ShmContract : ::testing::Test {
  uv_loop_t loop;
  void SetUp() override { uv_loop_init(&loop); }
  void TearDown() override {
    uv_run(&loop, UV_RUN_DEFAULT);  // let closed handles finish
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
};

shm_config tiny() {
  shm_config c;
  c.ring_bytes = 4096;
  c.node_size = 64;
  c.max_record_size = 1024;
  return c;
}

std::string sysv_url(int key) {
  char url[64];
  std::snprintf(url, sizeof url, "shm://0x%x", key);
  return url;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A bad URL's detail names what is wrong with it (parse_address knows), not just "malformed".
TEST(ShmContractUrl, ABadUrlsDetailNamesWhatIsWrong) {
  const struct {
    std::string url;
    const char* says;
  } cases[] = {
      {"shm://a/b", "a name holds no '/'"},
      {"shm://" + std::string(201, 'n'), "longer than 200 bytes"},
      {"mem://" + std::string(201, 'n'), "longer than 200 bytes"},
      {"shm://0", "is not a SysV key"},
      {"shm://0x100000000", "is not a SysV key"},
      {"shm://", "no name"},
  };
  for (const auto& c : cases) {
    shm_reader r;
    EXPECT_EQ(r.open(c.url, tiny()), errc::bad_url) << c.url;
    EXPECT_TRUE(contains(r.last_error().detail, c.says)) << r.last_error().detail;
    EXPECT_TRUE(contains(r.last_error().detail, "shm_reader::open(")) << r.last_error().detail;
    shm_writer w;
    EXPECT_EQ(w.open(c.url), errc::bad_url) << c.url;
    EXPECT_TRUE(contains(w.last_error().detail, c.says)) << w.last_error().detail;
  }
}

// open(const address&) took what parse_address refuses: SysV key 0 is IPC_PRIVATE (two readers
// both got ok, each on a private segment no writer can reach), a name with a NUL opened the part
// before it, and an empty name, one with '/', "." or ".." went to shm_open. Refused as the URL.
TEST(ShmContractUrl, AnAddressGivenDirectlyIsCheckedAsItsUrlIs) {
  const std::string nul = test::unique_name("nul");
  const std::string slashed = test::unique_name("slashed");
  shm_cleanup c1{nul};
  shm_cleanup c2{slashed};
  const auto named = [](scheme kind, std::string host) {
    address a;
    a.kind = kind;
    a.host = std::move(host);
    return a;
  };
  address key0 = named(scheme::shm, "");
  key0.shm_numeric = true;
  const struct {
    address addr;
    std::string says;
  } cases[] = {
      {key0, "is not a SysV key"},
      {named(scheme::shm, nul + std::string(1, '\0') + "junk"), "NUL"},
      {named(scheme::mem, nul + std::string(1, '\0') + "junk"), "NUL"},
      {named(scheme::shm, ""), "no name"},
      {named(scheme::shm, "a/b"), "a name holds no '/'"},
      {named(scheme::shm, ".."), "name directories"},
      {named(scheme::mem, std::string(201, 'n')), "longer than 200 bytes"},
      {named(scheme::shm, "/" + slashed), "reads back as shm://" + slashed},
  };
  for (const auto& c : cases) {
    shm_reader r;
    EXPECT_EQ(r.open(c.addr, tiny()), errc::bad_url) << c.addr.to_string();
    EXPECT_TRUE(contains(r.last_error().detail, c.says)) << r.last_error().detail;
    shm_writer w;
    EXPECT_EQ(w.open(c.addr), errc::bad_url) << c.addr.to_string();
    EXPECT_TRUE(contains(w.last_error().detail, c.says)) << w.last_error().detail;
  }
}

// Objects that cannot be uvbus regions: the reader refuses them (bad_layout) and leaves them.
// A POSIX object of 1..4095 bytes (a creator sizes it whole at once), one whose first bytes are
// zero but whose size no region has, and a SysV segment under 4096 bytes whose creator is gone.
TEST_F(ShmContract, ForeignObjectsThatCannotBeRegionsAreLeftAlone) {
  const std::string small = test::unique_name("foreign-small");
  const std::string zero = test::unique_name("foreign-zero");
  const int key = test::unique_key();
  shm_cleanup c1{small, key};
  shm_cleanup c2{zero};
  const char junk[] = "someone else's data";
  const struct {
    const std::string& name;
    off_t size;
    off_t at;
  } objs[] = {{small, 100, 0}, {zero, 8192, 64}};
  for (const auto& o : objs) {
    const int fd = shm_open(("/" + o.name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, o.size), 0);
    ASSERT_EQ(pwrite(fd, junk, sizeof junk, o.at), static_cast<ssize_t>(sizeof junk));
    close(fd);
    shm_reader r;
    EXPECT_EQ(r.open("shm://" + o.name, tiny()), errc::bad_layout) << o.name;
    EXPECT_TRUE(contains(r.last_error().detail, "not a uvbus region")) << r.last_error().detail;
    shm_writer w;
    EXPECT_EQ(w.open("shm://" + o.name), errc::bad_layout) << o.name;
    std::string why;
    EXPECT_EQ(shm_remove("shm://" + o.name, false, &why), errc::bad_layout) << why;
    shm_region_info info;
    EXPECT_EQ(shm_inspect("shm://" + o.name, &info), errc::bad_layout) << o.name;
    const int again = shm_open(("/" + o.name).c_str(), O_RDONLY, 0);
    ASSERT_GE(again, 0) << o.name << " was removed";
    struct stat st {};
    ASSERT_EQ(fstat(again, &st), 0);
    EXPECT_EQ(st.st_size, o.size);
    char back[sizeof junk] = {};
    EXPECT_EQ(pread(again, back, sizeof back, o.at), static_cast<ssize_t>(sizeof back));
    EXPECT_STREQ(back, junk);
    close(again);
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // creates a 100-byte segment and dies
    const int id = shmget(key, 100, IPC_CREAT | IPC_EXCL | 0600);
    _exit(id >= 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const int id = shmget(key, 0, 0);
  ASSERT_GE(id, 0);
  shm_reader r;
  EXPECT_EQ(r.open(sysv_url(key), tiny()), errc::bad_layout);
  EXPECT_EQ(shmget(key, 0, 0), id) << "the segment was removed";
}

// The other side of the rule above: an object of a region's size with a zero header, left by a
// creator that died before publishing it, holds no records and is replaced.
TEST_F(ShmContract, AnUnpublishedRegionOfADeadCreatorIsReplaced) {
  const std::string name = test::unique_name("unpublished");
  shm_cleanup cleanup{name};
  const int fd = shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(shm_region_size(tiny()))), 0);
  close(fd);
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, tiny()), errc::ok) << r.last_error().detail;
  EXPECT_FALSE(r.reattached());
  r.close();
  EXPECT_FALSE(test::posix_exists(name));
}

// A region image with one record whose payload byte is flipped, then a good one: a poll or a loop
// pass logs one checksum line through on_log.
struct skip_image {
  image img{shm_region_size(tiny())};
  shm_writer w;
  explicit skip_image(shm_reader& r) {
    EXPECT_EQ(test::format_and_attach(img, tiny(), w, r), errc::ok);
    EXPECT_EQ(w.send("bad", 3), errc::ok);
    EXPECT_EQ(w.send("good", 4), errc::ok);
    const size_t data = shm_detail::kHeaderSize + 64 * sizeof(shm_detail::head_word);
    img.p[data + shm_detail::kRecordHeaderSize] ^= 1;  // the first record's payload
  }
};

// on_log is a callback of the reader like on_records: close() from inside it takes effect after
// it returns (no line after it), set_callbacks() is wrong_state. Before, close() destroyed the
// engine under the pass that was logging (heap-use-after-free) and set_callbacks() destroyed the
// running std::function.
TEST_F(ShmContract, CloseAndSetCallbacksFromInsideOnLogArePoliteInPoll) {
  shm_reader r;
  skip_image s(r);
  int lines = 0;
  errc replaced = errc::ok;
  collected got;
  ASSERT_EQ(r.set_callbacks({[&](const shm_record* recs, size_t n) { got.cb(&got, recs, n); },
                             [&](log_level, const std::string&) {
                               replaced = r.set_callbacks({});
                               ++lines;
                               r.close();
                             }}),
            errc::ok);
  EXPECT_EQ(r.poll(10), 1u);
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(replaced, errc::wrong_state);
  EXPECT_FALSE(r.is_open());
  ASSERT_EQ(got.recs.size(), 1u);
  EXPECT_EQ(got.recs[0], "good");
}

TEST_F(ShmContract, CloseFromInsideOnLogOnTheLoopStopsTheReader) {
  shm_reader r;
  skip_image s(r);
  int lines = 0;
  collected got;
  ASSERT_EQ(r.set_callbacks({[&](const shm_record* recs, size_t n) { got.cb(&got, recs, n); },
                             [&](log_level, const std::string&) {
                               ++lines;
                               r.close();
                             }}),
            errc::ok);
  ASSERT_EQ(r.start(&loop), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return !r.is_open(); }));
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(got.recs.size(), 1u);
}

// "Reattached" is said once per open, from the reader's loop (or poll), and never by a start()
// that fails. Before, start() called on_log itself, before it could still fail, at every start.
TEST_F(ShmContract, TheReattachLineIsLoggedOncePerOpenAndNeverByAFailedStart) {
  const std::string url = "mem://" + test::unique_name("relog");
  {
    shm_reader r0;
    ASSERT_EQ(r0.open(url, tiny()), errc::ok);
    r0.close(shm_close_mode::keep);
  }
  std::vector<std::string> lines;
  shm_reader r({[](const shm_record*, size_t) {},
                [&](log_level, const std::string& text) { lines.push_back(text); }});
  ASSERT_EQ(r.open(url, tiny()), errc::ok);
  ASSERT_TRUE(r.reattached());
  ASSERT_EQ(r.start(&loop), errc::ok);
  EXPECT_TRUE(lines.empty()) << "on_log ran inside start()";
  EXPECT_EQ(r.start(&loop), errc::wrong_state);
  EXPECT_TRUE(run_until(&loop, [&] { return !lines.empty(); }));
  r.stop();
  ASSERT_EQ(r.start(&loop), errc::ok);
  uv_run(&loop, UV_RUN_NOWAIT);
  r.close();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "reattached")) << lines[0];
}

// A started reader keeps a records callback: start() refuses to run without one, and so does
// set_callbacks(). Before, set_callbacks({}) on a started reader returned ok and the loop went on
// consuming records into no callback: gone, counted as read, never delivered.
TEST_F(ShmContract, AStartedReaderCannotLoseItsRecordsCallback) {
  const std::string url = "mem://" + test::unique_name("nocb");
  collected got;
  shm_reader r(test::records_to(collected::cb, &got));
  ASSERT_EQ(r.open(url, tiny()), errc::ok);
  ASSERT_EQ(r.start(&loop), errc::ok);
  EXPECT_EQ(r.set_callbacks({}), errc::invalid_argument);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(w.send("x", 1), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return r.metrics().records_read == 1; }));
  ASSERT_EQ(r.set_callbacks(test::records_to(collected::cb, &got)), errc::ok);
  uv_run(&loop, UV_RUN_NOWAIT);
  EXPECT_EQ(got.recs, std::vector<std::string>{"x"});
  r.stop();
  EXPECT_EQ(r.set_callbacks({}), errc::ok);  // stopped: start() will check
  EXPECT_EQ(r.start(&loop), errc::invalid_argument);
}

// last_error() is "the last failed open()/open_image()/start()": a refused start() is recorded
// with the URL and the reason. Before, start() left it unchanged.
TEST_F(ShmContract, AFailedStartIsTheLastErrorNamingTheReason) {
  const std::string url = "mem://" + test::unique_name("start");
  shm_reader r;
  EXPECT_EQ(r.start(&loop), errc::closed);
  EXPECT_EQ(r.last_error().code, errc::closed);
  EXPECT_TRUE(contains(r.last_error().detail, "shm_reader::start(")) << r.last_error().detail;
  EXPECT_TRUE(contains(r.last_error().detail, "not open")) << r.last_error().detail;
  ASSERT_EQ(r.open(url, tiny()), errc::ok);
  EXPECT_EQ(r.start(&loop), errc::invalid_argument);
  EXPECT_TRUE(contains(r.last_error().detail, "shm_reader::start(" + url + ")"))
      << r.last_error().detail;
  EXPECT_TRUE(contains(r.last_error().detail, "on_records")) << r.last_error().detail;
  ASSERT_EQ(r.set_callbacks({[](const shm_record*, size_t) {}}), errc::ok);
  EXPECT_EQ(r.start(nullptr), errc::invalid_argument);
  EXPECT_TRUE(contains(r.last_error().detail, "loop")) << r.last_error().detail;
  ASSERT_EQ(r.start(&loop), errc::ok);
  EXPECT_EQ(r.last_error().code, errc::invalid_argument);  // ok leaves it unchanged
  EXPECT_EQ(r.start(&loop), errc::wrong_state);
  EXPECT_EQ(r.last_error().code, errc::wrong_state);
  EXPECT_TRUE(contains(r.last_error().detail, "already started")) << r.last_error().detail;
  uint8_t buf[4];
  size_t len = 0;
  EXPECT_EQ(r.try_receive(buf, sizeof buf, &len), errc::wrong_state);  // started
}

// close(keep) inside on_records counts that callback batch as consumed and nothing after it: the
// next reader gets exactly the rest, from the middle of a send_batch too.
TEST_F(ShmContract, CloseWithKeepInsideTheCallbackHandsTheRestToTheNextReader) {
  const std::string url = "mem://" + test::unique_name("keepcb");
  shm_config cfg = tiny();
  cfg.batch_max = 2;
  shm_reader r;
  ASSERT_EQ(r.open(url, cfg), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  const const_buffer six[] = {{"1", 1}, {"2", 1}, {"3", 1}, {"4", 1}, {"5", 1}, {"6", 1}};
  ASSERT_EQ(w.send_batch(six, 6), errc::ok);
  ASSERT_EQ(w.send("7", 1), errc::ok);
  collected first;
  ASSERT_EQ(r.set_callbacks({[&](const shm_record* recs, size_t n) {
    first.cb(&first, recs, n);
    r.close(shm_close_mode::keep);
  }}),
            errc::ok);
  EXPECT_EQ(r.poll(10), 2u);
  EXPECT_FALSE(r.is_open());
  collected rest;
  shm_reader r2(test::records_to(collected::cb, &rest));
  ASSERT_EQ(r2.open(url, cfg), errc::ok);
  EXPECT_TRUE(r2.reattached());
  EXPECT_EQ(r2.poll(10), 5u);
  EXPECT_EQ(first.recs, (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(rest.recs, (std::vector<std::string>{"3", "4", "5", "6", "7"}));
}

// "start() may be called again" after stop(): records sent meanwhile arrive.
TEST_F(ShmContract, StopThenStartAgainDelivers) {
  const std::string url = "mem://" + test::unique_name("restart");
  collected got;
  shm_reader r(test::records_to(collected::cb, &got));
  ASSERT_EQ(r.open(url, tiny()), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open(url), errc::ok);
  ASSERT_EQ(r.start(&loop), errc::ok);
  ASSERT_EQ(w.send("a", 1), errc::ok);
  EXPECT_TRUE(run_until(&loop, [&] { return got.recs.size() == 1; }));
  r.stop();
  ASSERT_EQ(w.send("b", 1), errc::ok);
  uv_run(&loop, UV_RUN_NOWAIT);
  EXPECT_EQ(got.recs.size(), 1u);
  EXPECT_EQ(r.poll(10), 1u);  // stopped: the polling API works again
  ASSERT_EQ(w.send("c", 1), errc::ok);
  ASSERT_EQ(r.start(&loop), errc::ok);
  EXPECT_EQ(r.poll(10), 0u);  // not while started
  EXPECT_TRUE(run_until(&loop, [&] { return got.recs.size() == 3; }));
  EXPECT_EQ(got.recs, (std::vector<std::string>{"a", "b", "c"}));
}

// Empty messages are messages: send, sendv of no parts, a batch of empty ones, try_receive into
// no buffer.
TEST(ShmContractSizes, EmptyMessagesTravelEveryWay) {
  image img(shm_region_size(tiny()));  // outlives the writer and the reader
  shm_reader r;
  shm_writer w;
  ASSERT_EQ(test::format_and_attach(img, tiny(), w, r), errc::ok);
  ASSERT_EQ(w.send(nullptr, 0), errc::ok);
  ASSERT_EQ(w.sendv(nullptr, 0), errc::ok);
  const const_buffer two[] = {{nullptr, 0}, {nullptr, 0}};
  ASSERT_EQ(w.send_batch(two, 2), errc::ok);
  ASSERT_EQ(w.send_batch(nullptr, 0), errc::ok);  // nothing
  for (int i = 0; i < 4; ++i) {
    size_t len = 99;
    ASSERT_EQ(r.try_receive(nullptr, 0, &len), errc::ok) << i;
    EXPECT_EQ(len, 0u);
  }
  size_t len = 0;
  EXPECT_EQ(r.try_receive(nullptr, 0, &len), errc::would_block);
  EXPECT_EQ(r.metrics().records_read, 4u);
}

// shm_config::mode is the permission of the created region, whatever the process's umask (a
// mode of 0660 is for a group of writer processes). Before, shm_open applied the umask: 0666
// under umask 022 gave 0644, and a writer of the group got permission_denied.
TEST_F(ShmContract, TheCreatedRegionHasTheConfiguredModeWhateverTheUmask) {
  const std::string name = test::unique_name("mode");
  const int key = test::unique_key();
  shm_cleanup cleanup{name, key};
  shm_config cfg = tiny();
  cfg.mode = 0666;
  const mode_t old = umask(022);
  shm_reader p, s;
  const errc ep = p.open("shm://" + name, cfg);
  const errc es = s.open(sysv_url(key), cfg);
  umask(old);
  ASSERT_EQ(ep, errc::ok);
  ASSERT_EQ(es, errc::ok);
  const int fd = shm_open(("/" + name).c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  close(fd);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  shmid_ds ds{};
  ASSERT_EQ(shmctl(shmget(key, 0, 0), IPC_STAT, &ds), 0);
  EXPECT_EQ(ds.shm_perm.mode & 0777, 0666u);
}

// Each refused send counts once, as what it returned. Before, a send on a full ring whose name had
// been removed returned not_connected and counted in queue_full too.
TEST_F(ShmContract, ARefusedSendCountsOnceAsWhatItReturned) {
  const std::string name = test::unique_name("count");
  shm_cleanup cleanup{name};
  shm_reader r;
  ASSERT_EQ(r.open("shm://" + name, tiny()), errc::ok);
  shm_writer w;
  ASSERT_EQ(w.open("shm://" + name), errc::ok);
  const std::string rec(100, 'r');
  uint64_t full = 0;
  uint64_t gone = 0;
  errc e = errc::ok;
  while ((e = w.send(rec.data(), rec.size())) == errc::ok) {
  }
  ASSERT_EQ(e, errc::queue_full);
  ++full;
  ASSERT_EQ(shm_unlink(("/" + name).c_str()), 0);  // an operator removes the name under both
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (gone == 0 && std::chrono::steady_clock::now() < end) {
    e = w.send(rec.data(), rec.size());
    if (e == errc::queue_full) ++full;
    if (e == errc::not_connected) ++gone;
  }
  ASSERT_EQ(gone, 1u);  // the removal is checked at most once a millisecond
  EXPECT_EQ(w.send(rec.data(), rec.size()), errc::not_connected);
  ++gone;
  EXPECT_EQ(w.metrics().queue_full, full);
  EXPECT_EQ(w.metrics().not_connected, gone);
}

// shm_format_image's invalid_argument cases and shm_region_size's 0.
TEST(ShmContractSizes, FormatImageRefusesWhatCannotHoldTheRegion) {
  const size_t need = shm_region_size(tiny());
  EXPECT_EQ(need, 4096u + 64 * 8 + 4096);
  image img(need + 64);
  EXPECT_EQ(shm_format_image(nullptr, need, tiny()), errc::invalid_argument);
  EXPECT_EQ(shm_format_image(img.p, need - 1, tiny()), errc::invalid_argument);
  EXPECT_EQ(shm_format_image(img.p + 8, need, tiny()), errc::invalid_argument);  // alignment
  shm_config bad = tiny();
  bad.node_size = 100;
  EXPECT_EQ(shm_region_size(bad), 0u);
  EXPECT_EQ(shm_format_image(img.p, img.size, bad), errc::invalid_argument);
  EXPECT_EQ(reinterpret_cast<shm_detail::region_header*>(img.p)->magic.load(), 0u);  // untouched
  EXPECT_EQ(shm_format_image(img.p + 64, need, tiny()), errc::ok);
}

// coalesce() refuses a stage_bytes below 64, as documented, and nothing else: on a region whose
// max_record_size is below 64 the stage is that size. Before, any stage_bytes was refused there.
TEST(ShmContractSizes, CoalescingWorksOnARegionOfSmallRecords) {
  shm_config cfg = tiny();
  cfg.max_record_size = 40;
  image img(shm_region_size(cfg));
  shm_reader r;
  shm_writer w;
  ASSERT_EQ(test::format_and_attach(img, cfg, w, r), errc::ok);
  EXPECT_EQ(w.coalesce(nullptr, 63), errc::invalid_argument);
  ASSERT_EQ(w.coalesce(nullptr, 4096), errc::ok);
  const std::string big(40, 'b');
  ASSERT_EQ(w.send("12345678", 8), errc::ok);
  ASSERT_EQ(w.send("abcdefgh", 8), errc::ok);
  ASSERT_EQ(w.send(big.data(), big.size()), errc::ok);  // at the limit: alone, after the stage
  EXPECT_EQ(w.send(big.data(), big.size() + 1), errc::message_too_large);
  ASSERT_EQ(w.send("", 0), errc::ok);
  ASSERT_EQ(w.flush(), errc::ok);
  collected got;
  EXPECT_EQ(test::poll_with(r, collected::cb, &got, 10), 4u);
  EXPECT_EQ(got.recs, (std::vector<std::string>{"12345678", "abcdefgh", big, ""}));
  EXPECT_EQ(r.metrics().corrupt, 0u);
}

// must_exist only reattaches: not_found (and nothing created) for no region, busy for a live
// reader's, the region for a kept one; over POSIX, SysV and mem://.
TEST_F(ShmContract, MustExistOnlyReattachesAndNeverCreates) {
  const std::string name = test::unique_name("mustexist");
  const int key = test::unique_key();
  shm_cleanup cleanup{name, key};
  shm_config only = tiny();
  only.must_exist = true;
  for (const std::string& url : {"shm://" + name, sysv_url(key), "mem://" + name}) {
    shm_reader r;
    EXPECT_EQ(r.open(url, only), errc::not_found) << url;
    shm_writer w;
    EXPECT_EQ(w.open(url), errc::not_found) << url << ": a region was created";
    shm_reader live;
    ASSERT_EQ(live.open(url, tiny()), errc::ok) << url;
    EXPECT_EQ(r.open(url, only), errc::busy) << url;
    live.close(shm_close_mode::keep);
    ASSERT_EQ(r.open(url, only), errc::ok) << url;
    EXPECT_TRUE(r.reattached());
    r.close();
    EXPECT_EQ(r.open(url, only), errc::not_found) << url;
  }
  EXPECT_FALSE(test::posix_exists(name));
  EXPECT_FALSE(test::sysv_exists(key));
}

// A SysV key has one reader, in this process too.
TEST_F(ShmContract, ASecondReaderOnALiveSysvKeyIsRefused) {
  const int key = test::unique_key();
  shm_cleanup cleanup{"", key};
  shm_reader a, b;
  ASSERT_EQ(a.open(sysv_url(key), tiny()), errc::ok);
  EXPECT_EQ(b.open(sysv_url(key), tiny()), errc::busy);
  EXPECT_TRUE(contains(b.last_error().detail, "a live reader already owns"))
      << b.last_error().detail;
  a.close();
  EXPECT_FALSE(test::sysv_exists(key));
}

// A kept region grown by another process is still reattached (its header says its size); one
// truncated below its region_size is refused naming both sizes and left as it is.
TEST_F(ShmContract, AKeptRegionGrownIsReattachedAndOneTruncatedIsRefusedAndLeft) {
  const std::string grown = test::unique_name("grown");
  const std::string cut = test::unique_name("cut");
  shm_cleanup c1{grown};
  shm_cleanup c2{cut};
  const off_t size = static_cast<off_t>(shm_region_size(tiny()));
  for (const std::string* n : {&grown, &cut}) {
    shm_reader r0;
    ASSERT_EQ(r0.open("shm://" + *n, tiny()), errc::ok);
    shm_writer w;
    ASSERT_EQ(w.open("shm://" + *n), errc::ok);
    ASSERT_EQ(w.send("kept", 4), errc::ok);
    r0.close(shm_close_mode::keep);
    const int fd = shm_open(("/" + *n).c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, n == &grown ? size + 65536 : size - 64), 0);
    close(fd);
  }
  shm_writer wg;
  EXPECT_EQ(wg.open("shm://" + grown), errc::ok);
  collected got;
  shm_reader rg(test::records_to(collected::cb, &got));
  ASSERT_EQ(rg.open("shm://" + grown, tiny()), errc::ok) << rg.last_error().detail;
  EXPECT_TRUE(rg.reattached());
  EXPECT_EQ(rg.poll(10), 1u);
  EXPECT_EQ(got.recs, std::vector<std::string>{"kept"});

  shm_writer wc;
  EXPECT_EQ(wc.open("shm://" + cut), errc::bad_layout);
  shm_reader rc;
  EXPECT_EQ(rc.open("shm://" + cut, tiny()), errc::bad_layout);
  const std::string d = rc.last_error().detail;
  EXPECT_TRUE(contains(d, "region_size")) << d;
  EXPECT_TRUE(contains(d, std::to_string(size - 64))) << d;
  EXPECT_TRUE(contains(d, std::to_string(size))) << d;
  shm_region_info info;
  EXPECT_EQ(shm_inspect("shm://" + cut, &info), errc::bad_layout);
  EXPECT_EQ(info.reader_state, shm_detail::kReaderDetached);  // untouched
}

// Reattach compares max_record_size too, naming both values; the region stays for a reader with
// its own config.
TEST_F(ShmContract, AKeptRegionOfAnotherRecordLimitIsRefusedNamingBoth) {
  const std::string url = "mem://" + test::unique_name("limit");
  shm_writer w;
  {
    shm_reader r0;
    ASSERT_EQ(r0.open(url, tiny()), errc::ok);
    ASSERT_EQ(w.open(url), errc::ok);
    r0.close(shm_close_mode::keep);
  }
  ASSERT_EQ(w.send("x", 1), errc::ok);
  shm_config other = tiny();
  other.max_record_size = 512;
  shm_reader r;
  EXPECT_EQ(r.open(url, other), errc::bad_layout);
  const std::string d = r.last_error().detail;
  EXPECT_TRUE(contains(d, "max_record_size (shm_config.max_record_size) is 1024")) << d;
  EXPECT_TRUE(contains(d, "asks for 512")) << d;
  ASSERT_EQ(r.open(url, tiny()), errc::ok);
  EXPECT_TRUE(r.reattached());
  uint8_t buf[8];
  size_t len = 0;
  EXPECT_EQ(r.try_receive(buf, sizeof buf, &len), errc::ok);
  EXPECT_EQ(len, 1u);
}

#ifndef NDEBUG

TEST(ShmContractDeathTest, DestroyingTheReaderInsideEitherCallbackAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* r = new shm_reader;
        image img(shm_region_size(tiny()));
        shm_writer w;
        (void)test::format_and_attach(img, tiny(), w, *r);
        (void)w.send("x", 1);
        (void)r->set_callbacks({[r](const shm_record*, size_t) { delete r; }});
        (void)r->poll(1);
      },
      "shm_reader destroyed inside its own");
  EXPECT_DEATH(
      {
        auto* r = new shm_reader;
        skip_image s(*r);
        (void)r->set_callbacks(
            {[](const shm_record*, size_t) {}, [r](log_level, const std::string&) { delete r; }});
        (void)r->poll(10);
      },
      "shm_reader destroyed inside its own");
}

TEST(ShmContractDeathTest, GettersFromAForeignThreadAbortNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  shm_reader r;
  EXPECT_DEATH(std::thread([&] { (void)r.metrics(); }).join(),
               "shm_reader::metrics called from a thread other than its loop's thread");
  EXPECT_DEATH(std::thread([&] { (void)r.is_open(); }).join(),
               "shm_reader::is_open called from a thread other than its loop's thread");
}

#else

TEST(ShmContractThreads, GettersFromAForeignThreadSeeNothing) {
  const std::string url = "mem://" + test::unique_name("getters");
  shm_reader r;
  ASSERT_EQ(r.open(url, tiny()), errc::ok);
  bool open = true;
  size_t ring = 1;
  std::thread([&] {
    open = r.is_open();
    ring = r.ring_bytes() + r.max_record_size() + r.metrics().capacity_bytes;
  }).join();
  EXPECT_FALSE(open);
  EXPECT_EQ(ring, 0u);
  EXPECT_TRUE(r.is_open());
}

#endif

}  // namespace
}  // namespace uvbus::shm_contract_test
