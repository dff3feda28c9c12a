// uvbus_shm_inspect --drain / --remove, run as the built binary (UVBUS_SHM_INSPECT_PATH).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_tool_test {
namespace {

using test::shm_cleanup;

// Runs the tool with args; returns its exit status (-1 if it did not exit) and its stdout.
int run_tool(const std::string& args, std::string* out) {
  const std::string cmd = std::string(UVBUS_SHM_INSPECT_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  out->clear();
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

shm_config tool_cfg() {
  shm_config c;
  c.ring_bytes = 65536;
  c.max_record_size = 4096;
  return c;
}

TEST(ShmTool, DrainAndRemoveRefuseALiveReader) {
  const std::string name = test::unique_name("tool-live");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  shm_reader r;
  ASSERT_EQ(r.open(url, tool_cfg()), errc::ok);
  std::string out;
  EXPECT_EQ(run_tool("--drain " + url, &out), 3) << out;
  EXPECT_EQ(run_tool("--remove " + url, &out), 3) << out;
  EXPECT_NE(out.find("live reader"), std::string::npos) << out;
  EXPECT_TRUE(test::posix_exists(name));
  EXPECT_EQ(run_tool("--remove --force " + url, &out), 0) << out;
  EXPECT_FALSE(test::posix_exists(name));
  {  // the forced-out reader's close() must not remove a newer region of the same name
    shm_reader r2;
    ASSERT_EQ(r2.open(url, tool_cfg()), errc::ok);
    EXPECT_FALSE(r2.reattached());
    r.close();
    EXPECT_TRUE(test::posix_exists(name));
  }
  EXPECT_FALSE(test::posix_exists(name));
  EXPECT_EQ(run_tool("--drain " + url, &out), 2) << out;  // no such region
  EXPECT_EQ(run_tool("--drain", &out), 2) << out;         // usage
  EXPECT_EQ(run_tool("--help", &out), 0);
  EXPECT_NE(out.find("exit status"), std::string::npos) << out;
}

TEST(ShmTool, DrainReadsAClosedRegionOfAnyRingSizeThenRemoveDeletesIt) {
  const std::string name = test::unique_name("tool-drain");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  shm_writer w;
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, tool_cfg()), errc::ok);
    ASSERT_EQ(w.open(url), errc::ok);
    for (int i = 0; i < 5; ++i) ASSERT_EQ(w.send("0123456789", 3 + i), errc::ok);
    const const_buffer batch[] = {{"ab", 2}, {"cdef", 4}};
    ASSERT_EQ(w.send_batch(batch, 2), errc::ok);
    r.close(shm_close_mode::keep);
  }
  std::string out;
  EXPECT_EQ(run_tool("--drain " + url, &out), 0) << out;
  EXPECT_NE(out.find("record 1: 3 bytes, checksum ok"), std::string::npos) << out;
  EXPECT_NE(out.find("record 7: 4 bytes, checksum ok"), std::string::npos) << out;
  EXPECT_NE(out.find("7 records, 31 bytes"), std::string::npos) << out;
  shm_region_info info;
  ASSERT_EQ(shm_inspect(url, &info), errc::ok);
  EXPECT_EQ(info.consumed_pos, info.write_pos);
  EXPECT_EQ(info.reader_state, 3u);  // left closed with keep
  EXPECT_EQ(w.send("late", 4), errc::ok);
  EXPECT_EQ(run_tool("--drain --quiet " + url, &out), 0) << out;
  EXPECT_NE(out.find("1 records, 4 bytes"), std::string::npos) << out;
  EXPECT_EQ(run_tool("--remove " + url, &out), 0) << out;
  EXPECT_FALSE(test::posix_exists(name));
  EXPECT_EQ(w.send("gone", 4), errc::not_connected);
}

// --drain --out FILE consumed every record and exited 0 when FILE could not be written (a full
// disk): the records were gone from the ring and missing from FILE. It now stops at the first
// record it cannot write, says so, exits 2, and the records behind it stay in the region.
TEST(ShmTool, DrainStopsAtTheFirstRecordItCannotWrite) {
  const std::string name = test::unique_name("tool-full");
  const std::string url = "shm://" + name;
  shm_cleanup cleanup{name};
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, tool_cfg()), errc::ok);
    shm_writer w;
    ASSERT_EQ(w.open(url), errc::ok);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(w.send("record", 6), errc::ok);
    r.close(shm_close_mode::keep);
  }
  std::string out;
  EXPECT_EQ(run_tool("--drain " + url + " --quiet --out /dev/full", &out), 2) << out;
  EXPECT_NE(out.find("/dev/full"), std::string::npos) << out;
  EXPECT_NE(out.find("1 record consumed and not written"), std::string::npos) << out;
  EXPECT_EQ(run_tool("--drain --quiet " + url, &out), 0) << out;  // the other two stayed
  EXPECT_NE(out.find("2 records, 12 bytes"), std::string::npos) << out;
}

// A URL the parser refuses printed only "bad_url: the address could not be parsed" (the parser's
// reason was dropped), and a mem:// region, which no other process can ever reach, "not_found".
// Both now say what is wrong; the API gives the reason too (shm_inspect's detail overload).
TEST(ShmTool, ABadUrlSaysWhatIsWrongAndMemIsRefusedAsUnreachable) {
  const struct {
    std::string args;
    const char* says;
  } cases[] = {
      {"shm://0x", "is not a SysV key"},
      {"shm://0x1ffffffff", "is not a SysV key"},
      {"shm://", "no name"},
      {"shm://../x", "a name holds no '/'"},
      {"--drain shm://..", "name directories"},
      {"--remove shm://", "no name"},
      {"mem://x", "no other process can inspect, drain or remove it"},
      {"--drain mem://x", "no other process can inspect, drain or remove it"},
  };
  for (const auto& c : cases) {
    std::string out;
    EXPECT_EQ(run_tool(c.args, &out), 2) << c.args << ": " << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.args << ": " << out;
  }
  shm_region_info info;
  std::string why;
  EXPECT_EQ(shm_inspect("shm://0x", &info, &why), errc::bad_url);
  EXPECT_NE(why.find("is not a SysV key"), std::string::npos) << why;
}

}  // namespace
}  // namespace uvbus::shm_tool_test
