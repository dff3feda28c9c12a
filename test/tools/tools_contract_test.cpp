// Promises of the uvbus tool no other test checks: ping's p50/p99 are nearest-rank (docs/tools.md),
// a payload file that cannot be read (a directory) and a bad `top --metrics` URL are usage errors,
// `shm inspect` never drains or removes, `--count 0`, `top --interval-ms 0` and signed numbers are
// refused, every `--count` up to 4294967295 ends, and `call --help`; a payload file over the
// message limit and a metrics page over 64 MiB are refused, a malformed metrics page converts to
// JSON, JSON strings are UTF-8; a metrics timeout or garbage answer is not "could not connect", a
// page with a NUL prints whole, single-dash arguments and an option given twice are refused, `shm`
// output that cannot be written fails, a closed stdout stays closed; ids with a leading zero are
// decimal, options a subcommand does not take are refused, `metrics --json` and `top --json` are
// JSON whatever the numbers, and `shm drain`'s quiet time does not wrap; `top --metrics` has no
// rate without the previous scrape and is refused with --json, top's levels are the gauges (and
// its help says so), JSON label objects have each key once, and an empty option value is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common.h"
#include "page_server.h"
#include "shm/shm_test_util.h"
#include "test_util.h"
#include "top_links.h"
#include "uvbus/shm.h"

namespace uvbus::tools_contract_test {
namespace {

// `sh -c cmd` with stderr folded into stdout; the exit status appended as "rc=N".
std::string sh(const std::string& cmd) {
  return uvbus::test::command_output("(" + cmd + ") 2>&1; echo rc=$?");
}

// `uvbus ARGS` with no parent to reach (a usage error must come before joining): exit 2 and `want`
// in what it printed.
::testing::AssertionResult usage_error(const std::string& args, const std::string& want) {
  const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " " + args +
                             " --parent ipv4://127.0.0.1:1 --timeout-ms 3000");
  if (out.find("rc=2") == std::string::npos || out.find(want) == std::string::npos) {
    return ::testing::AssertionFailure()
           << args << ": expected exit 2 and \"" << want << "\", got: " << out;
  }
  return ::testing::AssertionSuccess();
}

// docs/tools.md: `uvbus ping` prints min/avg/p50/p99/max "(nearest rank)": the value of rank
// ceil(p/100 * n). The summary took index round(p/100 * (n - 1)): p50 of 4 echoes was the 3rd.
TEST(ToolsContract, PingPercentilesAreNearestRank) {
  using uvbus_tool::nearest_rank;
  EXPECT_EQ(nearest_rank({4, 1, 3, 2}, 50), 2);  // rank 2 of 4
  EXPECT_EQ(nearest_rank({2, 1}, 50), 1);
  EXPECT_EQ(nearest_rank({7}, 50), 7);
  EXPECT_EQ(nearest_rank({}, 50), 0);
  std::vector<double> v;
  for (int i = 1; i <= 200; ++i) v.push_back(i);
  EXPECT_EQ(nearest_rank(v, 99), 198);  // rank 198 of 200
  EXPECT_EQ(nearest_rank(v, 50), 100);
  v.resize(100);
  EXPECT_EQ(nearest_rank(v, 99), 99);  // 99 * 100 / 100 is rank 99, not a hair above
  EXPECT_EQ(nearest_rank(v, 100), 100);
}

// "2 usage: ... missing argument": `@FILE` that cannot be read. A directory opened and read as
// an empty payload: the tool went on to join (exit 3 here, with no parent) or sent 0 bytes.
TEST(ToolsContract, PayloadFileThatCannotBeReadIsAUsageError) {
  const std::string tool = UVBUS_TOOL_PATH;
  for (const char* cmd : {"send", "call"}) {
    const std::string out =
        sh(tool + " " + cmd + " 0x10000 1 @/ --parent ipv4://127.0.0.1:1 --timeout-ms 3000");
    EXPECT_NE(out.find("rc=2"), std::string::npos) << cmd << ": " << out;
    EXPECT_NE(out.find("cannot read payload file '/'"), std::string::npos) << cmd << ": " << out;
  }
}

// `@FILE` was read whole whatever its size: `@/dev/zero` read for ever (memory without bound), a
// 256 MiB file was read into memory and only then refused (message_too_large, after joining; exit 3
// here, with no parent). A payload over the tool node's message limit (64 KiB) can never be sent:
// at most that much + 1 is read, and the refusal names the file and the limit, before joining.
// A call's payload is at most message_limit - 13 (node::call: the call block takes 13 bytes): a
// 65 530-byte call was read, joined, and refused then (exit 1, "message_too_large", the file not
// named); now exit 2 before joining like any payload over the limit.
TEST(ToolsContract, PayloadFileOverTheMessageLimitIsRefused) {
  const std::string path = "/tmp/" + uvbus::test::unique_name("tool-huge");
  ASSERT_EQ(sh("truncate -s 256M " + path), "rc=0\n");  // sparse: no disk taken
  EXPECT_TRUE(usage_error("send 0x10000 1 @" + path,
                          "payload file '" + path + "' is larger than 65536 bytes"));
  EXPECT_TRUE(usage_error("call 0x10000 1 @" + path,
                          "payload file '" + path + "' is larger than 65523 bytes"));
  std::remove(path.c_str());
  EXPECT_TRUE(usage_error("send 0x10000 1 @/dev/zero",
                          "payload file '/dev/zero' is larger than 65536 bytes"));
  ASSERT_EQ(sh("head -c 65530 /dev/zero >" + path), "rc=0\n");
  EXPECT_TRUE(usage_error("call 0x10000 1 @" + path,
                          "payload file '" + path + "' is larger than 65523 bytes"));
  // Each limit exactly is not refused here (it goes on to join: exit 3, no parent).
  for (const auto& [cmd, size] : {std::pair<const char*, int>{"send", 65536}, {"call", 65523}}) {
    ASSERT_EQ(sh("head -c " + std::to_string(size) + " /dev/zero >" + path), "rc=0\n");
    const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " " + cmd + " 0x10000 1 @" + path +
                               " --parent ipv4://127.0.0.1:1 --timeout-ms 3000");
    EXPECT_NE(out.find("rc=3"), std::string::npos) << cmd << ": " << out;
  }
  std::remove(path.c_str());
}

using uvbus::test::page_server;

// A metrics page was held whole however long it was: an endpoint (or whatever answers at the URL)
// that never ends its answer filled memory until --timeout-ms (834 MB held, 1.15 GB resident with
// --timeout-ms 2000); one of 64 MiB + 1 KiB was printed whole, exit 0. Past
// uvbus_tool::kMaxMetricsBytes (64 MiB) the transfer stops: exit 1, the URL and the limit named,
// nothing on stdout.
TEST(ToolsContract, MetricsPageOverTheLimitIsRefused) {
  page_server server("", uvbus_tool::kMaxMetricsBytes + 1024);
  ASSERT_NE(server.port(), 0);
  const std::string path = "/tmp/" + uvbus::test::unique_name("tool-page");
  const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " metrics " + server.url() +
                             " --timeout-ms 60000 >" + path);
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
  EXPECT_NE(out.find(server.url() + " answered more than 67108864 bytes"), std::string::npos)
      << out;
  EXPECT_EQ(sh("wc -c <" + path), "0\nrc=0\n");  // nothing printed
  std::remove(path.c_str());
}

// `uvbus metrics --json` of a page whose labels do not close (`x{a="b`, a cut line) threw
// std::out_of_range from substr past the line's end: terminate, exit 134. A malformed sample line
// is left out; the rest of the page is converted.
TEST(ToolsContract, MetricsJsonOfAMalformedPageDoesNotCrash) {
  for (const char* bad : {"x{a=\"b", "x{a=\"b\\", "x{a=\"b\",", "x{", "x{a", "{"}) {
    page_server server(std::string(bad) + "\ngood{k=\"v\"} 1\n");
    ASSERT_NE(server.port(), 0);
    const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " metrics " + server.url() +
                               " --json --timeout-ms 30000 | python3 -c 'import json,sys; "
                               "print(json.load(sys.stdin)[\"good\"])'");
    EXPECT_EQ(out, "[{'labels': {'k': 'v'}, 'value': 1}]\nrc=0\n") << bad;
  }
  // Values a page may spell that are no JSON numbers went out as they were: the document did not
  // parse. They are strings; JSON numbers stay numbers.
  page_server server("a 007\nb +1\nc .5\nd 1.\ne 0x10\nf -0.5e+3\ng 0\n");
  ASSERT_NE(server.port(), 0);
  const std::string out =
      sh(std::string(UVBUS_TOOL_PATH) + " metrics " + server.url() +
         " --json --timeout-ms 30000 | python3 -c 'import json,sys; "
         "d=json.load(sys.stdin); print([d[k][0][\"value\"] for k in \"abcdefg\"])'");
  EXPECT_EQ(out, "['007', '+1', '.5', '1.', '0x10', -500.0, 0]\nrc=0\n") << out;
  // Finite values up to DBL_MAX are numbers (the cut was at +-1.7e308: 1.75e308 was a string);
  // past it (1e999: no double) a string.
  page_server big("h 1.75e308\ni -1.79e308\nj 1.7976931348623157e308\nk 1e999\nl -1e999\n");
  ASSERT_NE(big.port(), 0);
  const std::string huge =
      sh(std::string(UVBUS_TOOL_PATH) + " metrics " + big.url() +
         " --json --timeout-ms 30000 | python3 -c 'import json,sys; "
         "d=json.load(sys.stdin); print([d[k][0][\"value\"] for k in \"hijkl\"])'");
  EXPECT_EQ(huge, "[1.75e+308, -1.79e+308, 1.7976931348623157e+308, '1e999', '-1e999']\nrc=0\n");
  for (const char* v : {"0", "-0", "12", "1.5", "-1e5", "1E+2", "0.0e-0"}) {
    EXPECT_TRUE(uvbus_tool::is_json_number(v)) << v;
  }
  for (const char* v : {"", "-", "007", "+1", ".5", "1.", "0x10", "1e", "Inf", "1 ", "--1"}) {
    EXPECT_FALSE(uvbus_tool::is_json_number(v)) << v;
  }
}

// "errors name what was wrong": `uvbus metrics` and `uvbus shm` refused a bad command line with
// their usage text alone (an unknown option, a second URL, a flag without its value, a flag the
// verb does not take), naming nothing. Each refusal now names the argument (exit 2 as before).
TEST(ToolsContract, MetricsAndShmRefusalsNameTheArgument) {
  const std::string tool = UVBUS_TOOL_PATH;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"metrics http://127.0.0.1:1/m --bogus", "unknown option '--bogus'"},
      {"metrics http://127.0.0.1:1/m http://127.0.0.1:2/m",
       "unexpected argument 'http://127.0.0.1:2/m'"},
      {"metrics http://127.0.0.1:1/m --timeout-ms", "--timeout-ms needs a value"},
      {"metrics", "no URL"},
      {"shm inspect shm://x --bogus", "unknown option '--bogus'"},
      {"shm inspect shm://x shm://y", "unexpected argument 'shm://y'"},
      {"shm drain shm://x --out", "--out needs a value"},
      {"shm inspect shm://x --quiet", "--quiet only with drain"},
      {"shm inspect shm://x --out f", "--out only with drain"},
      {"shm inspect shm://x --force", "--force only with remove"},
      {"shm drain shm://x --json", "--json only with inspect"},
      {"shm inspect", "no region URL"},
      {"shm drain", "no region URL"}};
  for (const auto& [args, want] : cases) {
    const std::string out = sh(std::string(tool).append(" ").append(args));
    EXPECT_NE(out.find("rc=2"), std::string::npos) << args << ": " << out;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out.substr(0, 200);
  }
}

// JSON text is UTF-8: bytes that are not well-formed UTF-8 (a stray 0xff, a cut sequence, an
// overlong form, an encoded surrogate, a code point above U+10FFFF) went through as they were and
// made every --json document holding them invalid. Each such byte is U+FFFD; UTF-8 passes.
TEST(ToolsContract, JsonStringsAreValidUtf8) {
  using uvbus_tool::json_str;
  EXPECT_EQ(json_str("a\xff"), "\"a\\ufffd\"");
  EXPECT_EQ(json_str("\xc3"), "\"\\ufffd\"");                                   // cut
  EXPECT_EQ(json_str("\xc0\xaf"), "\"\\ufffd\\ufffd\"");                        // overlong '/'
  EXPECT_EQ(json_str("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");             // U+D800
  EXPECT_EQ(json_str("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // > U+10FFFF
  EXPECT_EQ(json_str("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"),
            "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
  EXPECT_EQ(json_str("q\"\\\n\x01"), "\"q\\\"\\\\\\n\\u0001\"");
}

// docs/tools.md, exit 2: "bad metrics URL". `top --metrics` took any text and went on to join
// (exit 3 here, with no parent; with one, every poll's scrape failed and the exit was 0).
TEST(ToolsContract, TopRefusesABadMetricsUrl) {
  EXPECT_TRUE(usage_error("top 0x10000 --once --metrics ftp://127.0.0.1:1/metrics",
                          "ftp://127.0.0.1:1/metrics"));
}

// docs/tools.md: "`uvbus shm inspect shm://name` prints the header, fill and counters without
// attaching". The verb was prepended to the rest, so `inspect --remove URL` removed the region and
// `inspect --drain URL` drained it.
TEST(ToolsContract, ShmInspectNeverDrainsOrRemoves) {
  const std::string url = "shm://" + uvbus::test::unique_name("obsrev-shm");
  uvbus::shm_reader reader;
  ASSERT_EQ(reader.open(url, uvbus::test::small_ring_config()), uvbus::errc::ok);
  reader.close(uvbus::shm_close_mode::keep);  // a closed reader: drain and remove would proceed
  const std::string t = UVBUS_TOOL_PATH;
  for (const char* flag : {"--remove", "--drain"}) {
    std::string cmd = t + " shm inspect ";
    cmd += flag;
    cmd += " " + url;
    const std::string out = sh(cmd);
    EXPECT_NE(out.find("rc=2"), std::string::npos) << flag << ": " << out;
    EXPECT_NE(out.find(std::string("unknown option '") + flag + "'"), std::string::npos) << out;
  }
  EXPECT_NE(sh(t + " shm inspect " + url).find("rc=0"), std::string::npos);  // still there
  EXPECT_NE(sh(t + " shm remove " + url).find("rc=0"), std::string::npos);
}

// "--count N": N echoes, N tables. `--count 0` silently meant 4 echoes (ping) and no end (top);
// refused as `--timeout-ms 0` is (exit 2, before joining: exit 3 here, with no parent, before).
TEST(ToolsContract, CountZeroIsRefused) {
  for (const char* cmd : {"ping", "top"}) {
    EXPECT_TRUE(usage_error(std::string(cmd) + " 0x10000 --count 0", "bad value '0' for --count"));
  }
}

// `ping --count 4294967295` and `top --count 4294967295` never ended: both loops counted in 32
// bits, so after round 4294967295 the number wrapped to 0, which is <= the count. Every count in
// the accepted range (1..4294967295) ends after exactly that many rounds; 0 (top's default) has
// no end, past 4294967295 too.
TEST(ToolsContract, EveryCountEndsAfterExactlyThatManyRounds) {
  using uvbus_tool::round_counter;
  for (const uint32_t count : {1u, 2u, 3u, 4294967294u, 4294967295u}) {
    const uint32_t skip = count > 3 ? count - 3 : 0;  // resume 3 rounds before the end
    round_counter r(count, skip);
    uint64_t ran = 0;
    while (r.next() && ran < 10) ++ran;
    EXPECT_EQ(ran, count - skip) << count;
    EXPECT_EQ(r.number(), count) << count;
    EXPECT_FALSE(r.next()) << count;  // and stays ended
  }
  round_counter forever(0, 4294967295u);
  EXPECT_TRUE(forever.next());
  EXPECT_EQ(forever.number(), 4294967296u);
  // The range, named: past it, or not a number, is a usage error naming the option and value.
  for (const char* cmd : {"ping", "top"}) {
    for (const char* v : {"4294967296", "99999999999999999999", "x", "0"}) {
      EXPECT_TRUE(usage_error(std::string(cmd) + " 0x10000 --count " + v,
                              std::string("bad value '") + v + "' for --count (1..4294967295)"));
    }
    // The top of the range is taken (the tool goes on to join: exit 3 here, with no parent).
    const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " " + cmd +
                               " 0x10000 --count 4294967295 --parent ipv4://127.0.0.1:1 "
                               "--timeout-ms 3000");
    EXPECT_NE(out.find("rc=3"), std::string::npos) << cmd << ": " << out;
  }
}

// Numbers are digits: strtoul also took a leading '+' or blank (`--count +3`, `--count ' 3'`,
// `--timeout-ms +5`, ids like `+0x10`), which the docs never promised.
TEST(ToolsContract, NumbersWithASignOrLeadingBlankAreRefused) {
  uint32_t v = 0;
  uint64_t id = 0;
  EXPECT_FALSE(uvbus_tool::parse_u32("+3", &v));
  EXPECT_FALSE(uvbus_tool::parse_u32(" 3", &v));
  EXPECT_FALSE(uvbus_tool::parse_u32("-3", &v));
  EXPECT_TRUE(uvbus_tool::parse_u32("3", &v));
  EXPECT_EQ(v, 3u);
  EXPECT_FALSE(uvbus_tool::parse_id("+0x10", &id));
  EXPECT_FALSE(uvbus_tool::parse_id(" 16", &id));
  EXPECT_TRUE(uvbus_tool::parse_id("0x10", &id));
  EXPECT_EQ(id, 16u);
  EXPECT_TRUE(usage_error("ping 0x10000 --count +3", "bad value '+3' for --count"));
}

// docs/tools.md: an id is "decimal or 0x hex". strtoull's base 0 read a leading zero as octal:
// `uvbus ping 0100` pinged node 64 and `09` was refused.
TEST(ToolsContract, IdsWithALeadingZeroAreDecimal) {
  uint64_t id = 0;
  EXPECT_TRUE(uvbus_tool::parse_id("010", &id));
  EXPECT_EQ(id, 10u);
  EXPECT_TRUE(uvbus_tool::parse_id("09", &id));
  EXPECT_EQ(id, 9u);
  EXPECT_TRUE(uvbus_tool::parse_id("0X1f", &id));
  EXPECT_EQ(id, 31u);
  EXPECT_FALSE(uvbus_tool::parse_id("0x", &id));
  EXPECT_FALSE(uvbus_tool::parse_id("0b1", &id));
  EXPECT_FALSE(uvbus_tool::parse_id("00", &id));
}

// `top --interval-ms 0` silently meant the default 1000 ms: refused as `--count 0` is (exit 2,
// before joining). ping keeps 0 (its default: echoes back to back).
TEST(ToolsContract, TopIntervalZeroIsRefused) {
  EXPECT_TRUE(usage_error("top 0x10000 --interval-ms 0", "bad value '0' for --interval-ms"));
}

// An option given twice silently took the last value (`ping --count 3 --count 5` sent 5 echoes,
// `--parent A ... --parent B` joined B). It is a usage error naming the option, exit 2, for every
// subcommand, flags too (`--json --json`), the same value twice too.
TEST(ToolsContract, AnOptionGivenTwiceIsRefused) {
  // {subcommand and arguments, the option given twice}; usage_error passes --parent and
  // --timeout-ms after them.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ping 0x10000 --count 3 --count 5", "--count"},
      {"top 0x10000 --interval-ms 5 --interval-ms 6", "--interval-ms"},
      {"routes 0x10000 --json --json", "--json"},
      {"top 0x10000 --once --once", "--once"},
      {"send 0x10000 1 x --id 0x5 --id 0x6", "--id"},
      {"counters 0x10000 --token a --token a", "--token"},
      {"top 0x10000 --metrics http://127.0.0.1:1/a --metrics http://127.0.0.1:1/b", "--metrics"},
      {"nodes --parent ipv4://127.0.0.1:2", "--parent"},
      {"call 0x10000 1 x --timeout-ms 10", "--timeout-ms"},
      {"metrics http://127.0.0.1:1/m --json --json", "--json"},
      {"metrics http://127.0.0.1:1/m --timeout-ms 5 --timeout-ms 5", "--timeout-ms"},
      {"shm inspect shm://x --json --json", "--json"},
      {"shm drain shm://x --quiet --quiet", "--quiet"},
      {"shm drain shm://x --out /tmp/a --out /tmp/b", "--out"},
      {"shm remove shm://x --force --force", "--force"}};
  for (const auto& [args, option] : cases) {
    std::string want = "uvbus " + args.substr(0, args.find(' '));
    want.append(": option ").append(option).append(" given twice");
    EXPECT_TRUE(usage_error(args, want));
  }
}

// An option a subcommand does not take was accepted and ignored: `send ID 1 x --count 100` sent
// one message, exit 0. It is a usage error naming the option, exit 2, before joining; as is
// `top --once --count 5` (one table drawn).
TEST(ToolsContract, AnOptionTheSubcommandDoesNotTakeIsRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"send 0x10000 1 x --count 100", "--count"},
      {"call 0x10000 1 x --interval-ms 5", "--interval-ms"},
      {"ping 0x10000 --metrics http://127.0.0.1:1/m", "--metrics"},
      {"ping 0x10000 --once", "--once"},
      {"counters 0x10000 --once", "--once"},
      {"routes 0x10000 --count 2", "--count"},
      {"nodes --interval-ms 5", "--interval-ms"}};
  for (const auto& [args, option] : cases) {
    const std::string cmd = args.substr(0, args.find(' '));
    std::string want = "uvbus " + cmd;
    want.append(": option ").append(option).append(" does not apply to ").append(cmd);
    EXPECT_TRUE(usage_error(args, want));
  }
  EXPECT_TRUE(usage_error("top 0x10000 --once --count 5",
                          "uvbus top: options --once and --count cannot be given together"));
}

// `shm drain` ends once nothing arrived for 200 ms and twice the region's abandon timeout. Twice a
// timeout of 2^31 us or more wrapped in 32 bits (0x80000064 us: 200 us, so 200 ms): the drain
// ended long before a half-written record was skipped and the records behind it flowed.
TEST(ToolsContract, ShmDrainQuietTimeDoesNotWrap) {
  EXPECT_EQ(uvbus_tool::drain_quiet_us(0), 200000u);
  EXPECT_EQ(uvbus_tool::drain_quiet_us(4000), 200000u);
  EXPECT_EQ(uvbus_tool::drain_quiet_us(150000), 300000u);
  EXPECT_EQ(uvbus_tool::drain_quiet_us(0x80000064u), uint64_t{0x1000000c8});
  EXPECT_EQ(uvbus_tool::drain_quiet_us(0xffffffffu), uint64_t{0x1fffffffe});
}

// `top --json` wrote each counter's entry with snprintf into 64 bytes: a value near UINT64_MAX
// from a hostile node, at a rate that large, cut the entry and the line was no JSON.
TEST(ToolsContract, TopJsonOfHugeCountersIsWhole) {
  const uint64_t big = ~uint64_t{0};
  const std::string o =
      uvbus_tool::top_json(big, 0.001, {{"a", big, 1.8e22}, {"b_now", 7, 0}, {"c", 0, 0.5}});
  EXPECT_EQ(o,
            "{\"node\":\"0xffffffffffffffff\",\"seconds\":0.001,\"counters\":{"
            "\"a\":{\"value\":18446744073709551615,\"per_second\":18000000000000000000000.000},"
            "\"b_now\":{\"value\":7,\"per_second\":0.000},"
            "\"c\":{\"value\":0,\"per_second\":0.500}}}");
}

// Every subcommand's --help (tool_test.cpp checks all but call's).
TEST(ToolsContract, CallHelpIsItsUsage) {
  const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " call --help");
  EXPECT_NE(out.find("usage: uvbus call ID TYPE"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
}

// `top --help` called the levels "*_now, *_bytes" (compressed_raw_bytes and compressed_wire_bytes
// are counters with a rate; flow_targets, flow_sources and peers are levels) and never named
// --metrics. It lists the levels top takes (is_counters_level) and --metrics URL.
TEST(ToolsContract, TopHelpNamesTheLevelsAndMetrics) {
  const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " top --help");
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
  EXPECT_NE(out.find("[--metrics URL]"), std::string::npos) << out;
  EXPECT_EQ(out.find("*_bytes"), std::string::npos) << out;
  for (const char* l : {"pending_now", "flow_unacked_bytes", "flow_targets", "flow_sources",
                        "flow_buffer_bytes", "peers"}) {
    EXPECT_NE(out.find(l), std::string::npos) << l << ": " << out;
  }
}

// An empty value was taken as no option: `--parent ""` joined UVBUS_PARENT (docs/tools.md: the
// option wins), `top --metrics ""` dropped the link table without a word. Refused, exit 2.
TEST(ToolsContract, AnEmptyOptionValueIsRefused) {
  const std::string t = std::string("UVBUS_PARENT=ipv4://127.0.0.1:1 ") + UVBUS_TOOL_PATH;
  std::string out = sh(t + " routes 0x10000 --parent '' --timeout-ms 3000");
  EXPECT_NE(out.find("rc=2"), std::string::npos) << out;
  EXPECT_NE(out.find("bad value '' for --parent"), std::string::npos) << out;
  out = sh(t + " top 0x10000 --metrics '' --timeout-ms 3000");
  EXPECT_NE(out.find("rc=2"), std::string::npos) << out;
  EXPECT_NE(out.find("bad value '' for --metrics"), std::string::npos) << out;
}

// `uvbus metrics` told libcurl's errors apart only as "malformed URL" (2) or not (3, "could not
// connect"): a page that stalls after the connection is made, and an answer that is not HTTP (or
// none: the server closes), exited 3 as if nothing listened. Now: a timeout after connecting is
// exit 1 naming the timeout and the URL, garbage is exit 1; refused stays 3, "could not connect".
TEST(ToolsContract, MetricsTimeoutAndGarbageAreNotCouldNotConnect) {
  const std::string tool = UVBUS_TOOL_PATH;
  uvbus::test::stall_server stall;
  ASSERT_NE(stall.port(), 0);
  std::string out = sh(tool + " metrics " + stall.url() + " --timeout-ms 500");
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
  EXPECT_NE(out.find("timeout: no complete answer from " + stall.url() + " within 500 ms"),
            std::string::npos)
      << out;
  for (const char* garbage : {"garbage\r\n\r\n", ""}) {
    page_server server(garbage, 0, true);
    ASSERT_NE(server.port(), 0);
    out = sh(tool + " metrics " + server.url() + " --timeout-ms 30000");
    EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
    EXPECT_EQ(out.find("could not connect"), std::string::npos) << out;
  }
  int port = 0;
  {
    const uvbus::test::listener gone;  // a port nothing listens on once it is closed
    port = gone.port();
  }
  const std::string refused = "http://127.0.0.1:" + std::to_string(port) + "/metrics";
  out = sh(tool + " metrics " + refused + " --timeout-ms 30000");
  EXPECT_NE(out.find("rc=3"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot fetch " + refused + ": could not connect"), std::string::npos) << out;
}

// "prints the Prometheus text": fputs stopped at the page's first NUL (4 of 9 bytes printed).
TEST(ToolsContract, MetricsPrintsThePageWhole) {
  const std::string page("a 1\n\0b 2\n", 9);
  page_server server(page);
  ASSERT_NE(server.port(), 0);
  const std::string path = "/tmp/" + uvbus::test::unique_name("tool-nul");
  const std::string out = sh(std::string(UVBUS_TOOL_PATH) + " metrics " + server.url() +
                             " --timeout-ms 30000 >" + path);
  EXPECT_EQ(out, "rc=0\n");
  EXPECT_EQ(sh("wc -c <" + path), "9\nrc=0\n");
  std::remove(path.c_str());
}

// An argument with one dash (`-json`, `-x`) counted as a positional one: `send ID TYPE -json` sent
// the text "-json", `metrics URL -json` and `shm inspect -json` read it as a URL. Refused (exit 2,
// named); after "--" every argument is positional (a payload "-x"), `-h` there is no help.
TEST(ToolsContract, SingleDashArgumentsAreRefused) {
  for (const char* args : {"routes 0x10000 -json", "nodes -json", "top 0x10000 -json",
                           "metrics http://127.0.0.1:1/m -json", "metrics -json"}) {
    EXPECT_TRUE(usage_error(args, "unknown option '-json'"));
  }
  EXPECT_TRUE(usage_error("send 0x10000 1 -x", "unknown option '-x'"));
  EXPECT_TRUE(usage_error("call 0x10000 1 -x", "unknown option '-x'"));
  EXPECT_TRUE(usage_error("shm inspect -json shm://x", "unknown option '-json'"));
  EXPECT_TRUE(usage_error("shm inspect shm://x -j", "unknown option '-j'"));
  // After "--": a payload "-x", "-h" or "--json" goes on to join (exit 3 here, with no parent).
  for (const char* payload : {"-x", "-h", "--json"}) {
    const std::string out =
        sh(std::string(UVBUS_TOOL_PATH) +
           " send --parent ipv4://127.0.0.1:1 --timeout-ms 3000 0x10000 1 -- " + payload);
    EXPECT_NE(out.find("rc=3"), std::string::npos) << payload << ": " << out;
  }
}

// A region with n records of "record" (64 KiB ring), its reader closed with keep (drain proceeds).
std::string region_with_records(int n) {
  std::string url = "shm://" + uvbus::test::unique_name("tool-rec");
  uvbus::shm_config cfg = uvbus::test::small_ring_config();
  cfg.ring_bytes = 65536;
  uvbus::shm_reader r;
  if (r.open(url, cfg) != uvbus::errc::ok) return "";
  uvbus::shm_writer w;
  if (w.open(url) != uvbus::errc::ok) return "";
  for (int i = 0; i < n; ++i) {
    if (w.send("record", 6) != uvbus::errc::ok) return "";
  }
  r.close(uvbus::shm_close_mode::keep);
  return url;
}

// `uvbus shm` kept uvbus_shm_inspect's exit codes and never checked stdout: `shm inspect URL
// >/dev/full` exited 0 with the header lost. A write error is 2 ("open or write error"), named.
TEST(ToolsContract, ShmOutputThatCannotBeWrittenIsAWriteError) {
  const std::string url = region_with_records(3);
  ASSERT_FALSE(url.empty());
  const std::string t = UVBUS_TOOL_PATH;
  const std::vector<std::string> runs = {"shm inspect " + url, "shm inspect " + url + " --json",
                                         "shm drain " + url, "shm --help", "shm inspect --help"};
  for (const std::string& args : runs) {
    const std::string out = sh(std::string(t).append(" ").append(args).append(" >/dev/full"));
    EXPECT_NE(out.find("rc=2"), std::string::npos) << args << ": " << out;
    EXPECT_NE(out.find("cannot write the output: No space left on device"), std::string::npos)
        << args << ": " << out;
  }
  EXPECT_NE(sh(t + " shm remove " + url).find("rc=0"), std::string::npos);
}

// With stdout closed (`>&-`) the first file the tool opened took fd 1: `shm drain URL --out FILE`
// wrote its "record N" lines into FILE among the records each time stdout's buffer filled (300
// records: FILE held 11192 bytes, not 3000), and exited 0. FILE holds the records alone; the lost
// output is exit 2, as on /dev/full.
TEST(ToolsContract, AClosedStdoutIsNotTheFirstFileOpened) {
  const std::string url = region_with_records(300);
  ASSERT_FALSE(url.empty());
  const std::string path = "/tmp/" + uvbus::test::unique_name("tool-drain");
  const std::string t = UVBUS_TOOL_PATH;
  const std::string out = sh(t + " shm drain " + url + " --out " + path + " >&-");
  EXPECT_NE(out.find("rc=2"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot write the output: Bad file descriptor"), std::string::npos) << out;
  EXPECT_EQ(sh("wc -c <" + path), "3000\nrc=0\n");  // 300 x (4-byte length + "record")
  std::remove(path.c_str());
  EXPECT_NE(sh(t + " shm remove " + url).find("rc=0"), std::string::npos);
}

// A counters answer is a remote node's text: "n=007" went out as the number 007, which is no JSON.
TEST(ToolsContract, CountersJsonIsJson) {
  EXPECT_EQ(uvbus_tool::counters_json("a=007\nb=0\nc=12\nd=\ne=1x\n"),
            R"({"a":"007","b":0,"c":12,"d":"","e":"1x"})");
}

// A hostile node can repeat a counter's name: the object keeps each key once, the first value.
TEST(ToolsContract, CountersJsonHasEachKeyOnce) {
  EXPECT_EQ(uvbus_tool::counters_json("a=1\nb=2\na=3\nb=x\nc=4\n"), R"({"a":1,"b":2,"c":4})");
}

// Labels are a remote node's text: a directory entry may announce zone=a and zone=b (the wire
// takes a key twice) and a page may hold x{a="1",a="2"}; `nodes --json` and `metrics --json`
// wrote both, an object with duplicate keys. Each key is written once, with its first value.
TEST(ToolsContract, LabelsJsonHasEachKeyOnce) {
  EXPECT_EQ(uvbus_tool::labels_object({{"zone", "a"}, {"rack", "1"}, {"zone", "b"}, {"rack", "2"}}),
            R"({"zone":"a","rack":"1"})");
  EXPECT_EQ(uvbus_tool::labels_object({}), "{}");
  page_server server("x{a=\"1\",b=\"2\",a=\"3\"} 5\n");
  ASSERT_NE(server.port(), 0);
  const std::string out =
      sh(std::string(UVBUS_TOOL_PATH) + " metrics " + server.url() + " --json --timeout-ms 30000");
  EXPECT_EQ(out, "{\"x\":[{\"labels\":{\"a\":\"1\",\"b\":\"2\"},\"value\":5}]}\nrc=0\n");
}

// `top` took a level by the counter's name (peers, *_now, *_bytes): flow_targets and flow_sources,
// levels, were shown with a rate; compressed_raw_bytes and compressed_wire_bytes, counters, as
// "(level)" and "per_second":0. The levels are the counters answer's gauges, by name.
TEST(ToolsContract, TopLevelsAreTheCountersGauges) {
  using uvbus_tool::is_counters_level;
  for (const char* l : {"flow_targets", "flow_sources", "pending_now", "flow_unacked_now",
                        "flow_unacked_bytes", "flow_buffer_bytes", "peers"}) {
    EXPECT_TRUE(is_counters_level(l)) << l;
  }
  for (const char* c : {"compressed_raw_bytes", "compressed_wire_bytes", "data_sent", "peers_x"}) {
    EXPECT_FALSE(is_counters_level(c)) << c;
  }
}

// `top --metrics` took a link or family missing from the previous scrape (its fetch failed: a
// timeout, a 5xx; a peer that left peer="other" for its own series) as 0: the whole counter was
// the increase, 1e9 bytes over 50 ms shown as 2e10 out B/s. Without a previous value: "-".
TEST(ToolsContract, TopLinkRatesNeedThePreviousScrape) {
  const std::string link = "0x1 child stream";
  const uvbus_tool::links_map now = {
      {link, {{"sent_bytes_total", 1e9}, {"received_bytes_total", 3000}}}};
  // The link's row, split at blanks: peer role channel rtt_ms out in out_f in_f queue refused.
  const auto row = [&](const uvbus_tool::links_map& before) {
    const std::string t = uvbus_tool::links_table(before, now, 0.05);
    std::istringstream in(t.substr(t.find('\n') + 1));
    std::vector<std::string> cells;
    for (std::string c; in >> c;) cells.push_back(c);
    return cells;
  };
  using cells = std::vector<std::string>;
  EXPECT_EQ(row({}), (cells{"0x1", "child", "stream", "0.000", "-", "-", "-", "-", "0", "-"}));
  // The link there, sent_bytes_total not: no out rate; in: 1000 bytes over 0.05 s.
  EXPECT_EQ(row({{link, {{"received_bytes_total", 2000}}}}),
            (cells{"0x1", "child", "stream", "0.000", "-", "20000.0", "-", "-", "0", "-"}));
}

// `top --json --metrics URL` fetched the page at every poll (waiting up to --timeout-ms when it
// stalled) and wrote neither the links nor a failed scrape: the JSON tables have no place for
// them. The pair is a usage error before joining.
TEST(ToolsContract, TopRefusesMetricsWithJson) {
  EXPECT_TRUE(usage_error("top 0x10000 --json --count 3 --metrics http://127.0.0.1:1/",
                          "uvbus top: options --metrics and --json cannot be given together"));
}

}  // namespace
}  // namespace uvbus::tools_contract_test
