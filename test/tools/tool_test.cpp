// End-to-end tests of the uvbus tool: a root node on a thread, the binary run as a subprocess;
// and the escaping of a peer's text that its output relies on (uvbus::detail::printable).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>
#include <csignal>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bus/auth.h"  // uvbus::detail::printable
#include "page_server.h"
#include "shm/shm_test_util.h"
#include "test_util.h"
#include "uvbus/node.h"
#include "uvbus/shm.h"

namespace uvbus::tool_test {
namespace {

constexpr uint64_t kRoot = 0x10000;

struct run_result {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `sh -c cmd` with stdout and stderr into files (a pipe, not a terminal).
run_result sh(const std::string& cmd) {
  static int n = 0;
  const std::string base = "/tmp/" + uvbus::test::unique_name("tool-out") + std::to_string(++n);
  const std::string full = cmd + " >" + base + ".out 2>" + base + ".err </dev/null";
  const int st = std::system(full.c_str());
  run_result r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

bool json_ok(const std::string& text) {
  const std::string path = "/tmp/" + uvbus::test::unique_name("tool-json");
  std::ofstream(path) << text;
  const run_result r =
      // The file as an argument: sh() sends </dev/null after the command, which replaced a
      // `<path` here, so every document read as valid. Strict UTF-8 (JSON text is UTF-8): text
      // from sys.stdin in a C locale would take any byte.
      sh("python3 -c 'import json,sys; [json.loads(l) for l in "
         "open(sys.argv[1], \"rb\").read().decode(\"utf-8\").splitlines() if l.strip()]' " +
         path);
  std::remove(path.c_str());
  return r.rc == 0;
}

// A root node (id 0x10000, subnets 0x10000/16, token "secret") running on its own thread.
class Bus : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::promise<std::string> url;
    auto f = url.get_future();
    thread_ = std::thread([&url] { run(&url); });
    url_ = f.get();
  }
  static void TearDownTestSuite() {
    uv_async_send(stop_);
    thread_.join();
  }
  static void run(std::promise<std::string>* url) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_async_t stop;
    bool stopping = false;
    stop.data = &stopping;
    uv_async_init(&loop, &stop, [](uv_async_t* a) { *static_cast<bool*>(a->data) = true; });
    uvbus::node_config cfg;
    cfg.listen = {"ipv4://127.0.0.1:0"};
    cfg.subnets = {{kRoot, 16}};
    cfg.access_tokens = {"secret"};
    cfg.child_grace_ms = 0;
    cfg.metrics_url = "http://127.0.0.1:0/metrics";
    cfg.name = "root-1";
    cfg.type = "root";
    // A label with a terminal's escape sequence (OSC: set the window title): text a node chose.
    cfg.labels = {{"zone", "a"}, {"evil", "\x1b]0;pwn\x07"}};
    // Requests (uvbus call) are answered in upper case, or with error 7 for "fail", error 9 with
    // an escape sequence and a NUL in its detail for "fail-raw", error 10 with C1 controls (CSI
    // raw and as UTF-8) for "fail-c1", not at all for "silent".
    std::unique_ptr<uvbus::node> n;
    uvbus::node_callbacks cb;
    cb.on_data = [&n](uvbus::bus_id, uint32_t, const uint8_t* p, size_t size) {
      const uvbus::reply_handle* req = n->incoming_request();
      if (req == nullptr) return;
      uvbus::reply_handle h = *req;
      std::string s(reinterpret_cast<const char*>(p), size);
      if (s == "fail") {
        (void)n->reply_error(h, 7, "asked to fail", 13);
        return;
      }
      if (s == "fail-raw") {
        const char detail[] = "\x1b[2Jred\0tail";
        (void)n->reply_error(h, 9, detail, sizeof detail - 1);
        return;
      }
      if (s == "fail-c1") {
        const char detail[] = "\x9bH \xc2\x9bH caf\xc3\xa9";  // CSI H: the cursor home
        (void)n->reply_error(h, 10, detail, sizeof detail - 1);
        return;
      }
      if (s == "silent") return;  // the caller's timeout decides
      for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      (void)n->reply(h, s.data(), s.size());
    };
    n = std::make_unique<uvbus::node>(&loop, kRoot, cfg, cb);
    const bool ok = n->start() == uvbus::errc::ok;
    stop_ = &stop;
    metrics_ = ok ? n->metrics_url() : "";
    url->set_value(ok ? n->listen_urls().at(0) : "");
    while (!stopping) uv_run(&loop, UV_RUN_ONCE);
    n.reset();
    uv_close(reinterpret_cast<uv_handle_t*>(&stop), nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  // The tool with this bus's parent and token and its default id (0xfffe000000000000 + pid).
  static std::string tool(const std::string& args) {
    return std::string(UVBUS_TOOL_PATH) + " " + args + " --parent " + url_ + " --token secret";
  }
  static std::thread thread_;
  static std::string url_;
  static std::string metrics_;
  static uv_async_t* stop_;
};
std::thread Bus::thread_;
std::string Bus::url_;
std::string Bus::metrics_;
uv_async_t* Bus::stop_ = nullptr;

TEST_F(Bus, RoutesAndCounters) {
  ASSERT_FALSE(url_.empty());
  run_result r = sh(tool("routes 0x10000"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  r = sh(tool("counters 0x10000"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("registrations_accepted="), std::string::npos) << r.out;
  r = sh(tool("counters 0x10000 --json"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"registrations_accepted\":"), std::string::npos) << r.out;
  r = sh(tool("routes 0x10000 --json"));
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  r = sh(tool("nodes"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("root-1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zone=a"), std::string::npos) << r.out;
  r = sh(tool("nodes --json"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"name\":\"root-1\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"labels\":{\"zone\":\"a\","), std::string::npos) << r.out;
}

TEST_F(Bus, PingSeriesAndSummary) {
  run_result r = sh(tool("ping 0x10000 --count 3 --interval-ms 10"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("seq=1 rtt="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("seq=3 rtt="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 sent, 3 answered; rtt min/avg/p50/p99/max"), std::string::npos);
  r = sh(tool("ping 0x10000 --count 3 --json"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"received\":3"), std::string::npos) << r.out;
}

TEST_F(Bus, SendReportsTheDeliveryStatus) {
  run_result r = sh(tool("send 0x10000 7 hello"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("delivered 5 bytes of type 7"), std::string::npos) << r.out;
  const std::string path = "/tmp/" + uvbus::test::unique_name("tool-payload");
  std::ofstream(path) << "from a file";
  r = sh(tool("send 0x10000 7 @" + path + " --json"));
  std::remove(path.c_str());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"bytes\":11"), std::string::npos) << r.out;
  r = sh(tool("send 0x90000 7 hello"));  // outside the root's subnets: no such node
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.err.find("unknown_route"), std::string::npos) << r.err;
}

TEST_F(Bus, CallPrintsTheReplyOrTheErrorAnswer) {
  run_result r = sh(tool("call 0x10000 7 hello"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "HELLO\n");
  r = sh(tool("call 0x10000 7 hello --json"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"reply\":\"HELLO\""), std::string::npos) << r.out;
  r = sh(tool("call 0x10000 7 fail"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.err.find("answered error 7: asked to fail"), std::string::npos) << r.err;
  r = sh(tool("call 0x90000 7 hello"));  // outside the root's subnets: no such node
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.err.find("unknown_route"), std::string::npos) << r.err;
}

TEST_F(Bus, TopOnAPipeHasNoEscapes) {
  const run_result r = sh(tool("top 0x10000 --once --interval-ms 50"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("refresh 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("data_received"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
  const run_result m = sh(tool("top 0x10000 --once --interval-ms 50 --metrics " + metrics_));
  EXPECT_EQ(m.rc, 0) << m.err;
  EXPECT_NE(m.out.find("link (peer role channel)"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find(" tool stream"), std::string::npos) << m.out;  // the tool's own link
  const run_result j = sh(tool("top 0x10000 --count 2 --interval-ms 20 --json"));
  EXPECT_EQ(j.rc, 0) << j.err;
  EXPECT_TRUE(json_ok(j.out)) << j.out;
}

// The root's heartbeat_timeouts counter (from `uvbus counters`); -1 when it could not be read.
long long root_heartbeat_timeouts(const run_result& r) {
  const size_t at = r.out.find("heartbeat_timeouts=");
  return r.rc != 0 || at == std::string::npos ? -1
                                              : std::strtoll(r.out.c_str() + at + 19, nullptr, 10);
}

// `top --metrics URL` fetched the page with a blocking libcurl call on the tool node's loop
// thread: with a stalled endpoint the node neither read nor pinged for --timeout-ms (7 s), and the
// root dropped the tool for silence (heartbeat_timeout_ms 6 000). The fetch runs off the loop.
TEST_F(Bus, TopMetricsFetchDoesNotStallTheToolNode) {
  const long long before = root_heartbeat_timeouts(sh(tool("counters 0x10000")));
  ASSERT_GE(before, 0);
  test::stall_server stall;
  ASSERT_NE(stall.port(), 0);
  const run_result r =
      sh(tool("top 0x10000 --count 1 --interval-ms 20 --timeout-ms 7000 --metrics " + stall.url()));
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("links: timeout"), std::string::npos) << r.out;
  EXPECT_EQ(root_heartbeat_timeouts(sh(tool("counters 0x10000"))), before) << r.out << r.err;
}

// `uvbus top ID | head -n 1`, `uvbus ping ... | head -n 1`: the tool's first line is read, then its
// reader goes. SIGPIPE is ignored (main sets it so), so the tool must notice the failed write
// itself: it polled (pinged) on for ever, writing into the closed pipe. It must end by itself
// (exit 1, no signal) well before the deadline.
TEST_F(Bus, TopAndPingStopWhenTheirReaderGoes) {
  const std::vector<std::vector<std::string>> runs = {
      {"top", "0x10000", "--interval-ms", "20"},
      {"top", "0x10000", "--interval-ms", "20", "--json"},
      {"ping", "0x10000", "--count", "100000", "--interval-ms", "20"}};
  for (std::vector<std::string> args : runs) {
    const std::string what = args[0] + (args.back() == "--json" ? " --json" : "");
    for (const char* extra : {"--parent", url_.c_str(), "--token", "secret"})
      args.emplace_back(extra);
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> argv{const_cast<char*>(UVBUS_TOOL_PATH)};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(UVBUS_TOOL_PATH, argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    char c = 0;
    while (::read(fds[0], &c, 1) == 1 && c != '\n') {
    }
    ::close(fds[0]);  // head -n 1 has its line and leaves
    int st = 0;
    pid_t done = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((done = ::waitpid(pid, &st, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the exit, no event
    }
    if (done == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      ADD_FAILURE() << what << ": still running 60 s after its reader went";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(st)) << what << ": ended by signal " << WTERMSIG(st);
    EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 1) << what;
  }
}

// Output that cannot be written (stdout on a full disk) is not a success: `counters`, `routes`,
// `call` and `nodes` exited 0 with their answer lost. Exit 1, the error named on stderr.
TEST_F(Bus, OutputThatCannotBeWrittenIsNotASuccess) {
  const std::string err = "/tmp/" + uvbus::test::unique_name("tool-full") + ".err";
  for (const char* args : {"counters 0x10000", "routes 0x10000 --json", "call 0x10000 7 hello",
                           "nodes", "ping 0x10000 --count 1"}) {
    const int st = std::system((tool(args) + " >/dev/full 2>" + err).c_str());
    const std::string text = slurp(err);
    EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 1) << args << ": " << text;
    EXPECT_NE(text.find("cannot write the output: No space left on device"), std::string::npos)
        << args << ": " << text;
  }
  std::remove(err.c_str());
}

// What the tool's run into a closed pipe left: its wait status and its stderr.
struct pipe_run {
  int status = -1;
  std::string err;
};

// Runs `program args` with stdout a pipe whose read end is already closed (`uvbus ... | true`
// once true has gone: the first write fails) and stderr into a file. SIGPIPE is put back to its
// default first: this process ignores it (its node's stream channel set it so) and an ignored
// signal stays ignored across exec, whereas a shell starts a pipeline's commands with the default.
pipe_run run_into_closed_pipe(const std::string& program, const std::vector<std::string>& args) {
  pipe_run r;
  const std::string err = "/tmp/" + uvbus::test::unique_name("tool-pipe") + ".err";
  std::vector<std::string> words{program};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(words.size() + 1);
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe(fds) != 0) return r;
  ::close(fds[0]);             // no reader
  const pid_t pid = ::fork();  // the child calls async-signal-safe functions only
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[1]);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (e >= 0) ::dup2(e, STDERR_FILENO);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  if (pid > 0) ::waitpid(pid, &r.status, 0);
  r.err = slurp(err);
  std::remove(err.c_str());
  return r;
}

// `uvbus metrics URL | head -c1`, `uvbus shm inspect URL | true`: metrics and shm died by SIGPIPE
// (status 141 in a shell) where the bus subcommands exited 1, and those said nothing. SIGPIPE is
// ignored in main for every subcommand: a failed write is one line on stderr and the
// subcommand's write-error status, 1 (shm keeps uvbus_shm_inspect's 2 for a write error).
TEST_F(Bus, AClosedPipeIsAWriteErrorNotASignal) {
  ASSERT_FALSE(metrics_.empty());
  const std::string region = "shm://" + uvbus::test::unique_name("tool-pipe");
  uvbus::shm_reader reader;
  ASSERT_EQ(reader.open(region, uvbus::test::small_ring_config()), uvbus::errc::ok);
  const std::vector<std::string> bus = {"--parent", url_, "--token", "secret"};
  struct run_case {
    std::string program;
    std::vector<std::string> args;
    int status;
    std::string what;  // the subcommand's name in its message
  };
  const std::string t = UVBUS_TOOL_PATH;
  std::vector<run_case> runs = {{t, {"metrics", metrics_}, 1, "metrics"},
                                {t, {"metrics", metrics_, "--json"}, 1, "metrics"},
                                {t, {"metrics", "--help"}, 1, "metrics"},
                                {t, {"shm", "inspect", region}, 2, "shm"},
                                {t, {"shm", "inspect", region, "--json"}, 2, "shm"},
                                {t, {"shm", "--help"}, 2, "shm"},
                                {UVBUS_SHM_INSPECT_PATH, {region}, 2, "shm"},
                                {t, {"--help"}, 1, "--help"},
                                {t, {"counters", "0x10000"}, 1, "counters"},
                                {t, {"nodes", "--json"}, 1, "nodes"},
                                {t, {"ping", "0x10000", "--count", "2"}, 1, "ping"},
                                {t, {"top", "0x10000", "--once", "--interval-ms", "20"}, 1, "top"}};
  for (auto& c : runs) {
    if (c.program == t && c.args[0] != "metrics" && c.args[0] != "shm" && c.args[0] != "--help")
      c.args.insert(c.args.end(), bus.begin(), bus.end());
    const std::string name = (c.program == t ? "uvbus " : "uvbus_shm_inspect ") + c.args[0] +
                             (c.args.size() > 1 ? " " + c.args[1] : "");
    const pipe_run r = run_into_closed_pipe(c.program, c.args);
    EXPECT_TRUE(WIFEXITED(r.status)) << name << ": ended by signal " << WTERMSIG(r.status);
    EXPECT_EQ(WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1, c.status) << name << ": " << r.err;
    const std::string line = "uvbus " + c.what + ": cannot write the output: Broken pipe\n";
    const size_t at = r.err.find(line);
    EXPECT_NE(at, std::string::npos) << name << ": " << r.err;
    EXPECT_EQ(r.err.find(line, at + 1), std::string::npos) << name << ": said twice: " << r.err;
  }
  reader.close(uvbus::shm_close_mode::remove);
}

// `--json` documents are UTF-8 (RFC 8259): a reply that is not (here bytes 0xff 0xfe and a cut
// sequence) passed through as raw bytes, and python3's json refused the whole document.
TEST_F(Bus, CallJsonWithABinaryReplyIsValidJson) {
  const std::string path = "/tmp/" + uvbus::test::unique_name("tool-binary");
  std::ofstream(path, std::ios::binary) << "ab\xff\xfe\xc3";
  const run_result r = sh(tool("call 0x10000 7 @" + path + " --json"));
  std::remove(path.c_str());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find(R"("reply":"AB\ufffd\ufffd\ufffd")"), std::string::npos) << r.out;
}

// top in a terminal: tmux runs it; the pane is captured until the second refresh shows.
TEST_F(Bus, TopRefreshesInATerminal) {
  const std::string sock = uvbus::test::unique_name("tmux");
  const std::string tmux = "tmux -L " + sock;
  const run_result s = sh("TERM=xterm " + tmux + " new-session -d -s top -x 120 -y 60 '" +
                          tool("top 0x10000 --interval-ms 50") + "'");
  ASSERT_EQ(s.rc, 0) << s.err;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string pane;
  unsigned refresh = 0;
  // A frame counts once it is complete (the routes section ends it): a capture may land while
  // the terminal is still drawing, and a slow poll may skip a refresh number.
  while (std::chrono::steady_clock::now() < end) {
    pane = sh(tmux + " capture-pane -p -t top").out;
    const size_t at = pane.find("  refresh ");
    refresh = at == std::string::npos ? 0 : std::strtoul(pane.c_str() + at + 10, nullptr, 10);
    if (refresh >= 3 && pane.find("routes:") != std::string::npos) break;
    std::this_thread::yield();  // polling the pane with a deadline, not waiting a fixed time
  }
  (void)sh(tmux + " kill-server");
  EXPECT_GE(refresh, 3U) << pane;
  EXPECT_EQ(pane.find("refresh 2 "), std::string::npos) << "the screen is redrawn in place";
  EXPECT_EQ(pane.find("refresh ", pane.find("refresh ") + 1), std::string::npos) << pane;
  EXPECT_NE(pane.find("data_received"), std::string::npos) << pane;
}

TEST_F(Bus, JoinErrors) {
  run_result r = sh(std::string(UVBUS_TOOL_PATH) + " routes 0x10000 --parent " + url_ +
                    " --token wrong --id 0x10200");
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(r.err.find("access_denied"), std::string::npos) << r.err;
  r = sh(std::string(UVBUS_TOOL_PATH) + " routes 0x10000 --parent " + url_ +
         " --token secret --id 0x10005");  // inside the root's subnets: a child's id
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(r.err.find("out_of_subnet"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("outside the parent's subnets"), std::string::npos) << r.err;
  r = sh(std::string(UVBUS_TOOL_PATH) + " routes 0x10000 --parent nonsense://x --id 0x10201");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("nonsense://x"), std::string::npos) << r.err;
}

// `--token ""` was taken as no option: UVBUS_TOKEN's token was sent anyway, so an operator could
// not register without a proof but by unsetting the variable (docs/tools.md: the option wins; an
// empty token is none). Now no proof is sent: this bus, which requires one, refuses.
TEST_F(Bus, AnEmptyTokenOptionSendsNoProof) {
  const run_result r = sh("UVBUS_TOKEN=secret " + std::string(UVBUS_TOOL_PATH) +
                          " routes 0x10000 --parent " + url_ + " --token ''");
  EXPECT_EQ(r.rc, 3) << r.out;
  EXPECT_NE(r.err.find("access_denied"), std::string::npos) << r.err;
}

TEST_F(Bus, MetricsTextJsonAndHttpErrors) {
  ASSERT_FALSE(metrics_.empty());
  const std::string t = UVBUS_TOOL_PATH;
  run_result r = sh(t + " metrics " + metrics_);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("# TYPE"), std::string::npos) << r.out;
  r = sh(t + " metrics " + metrics_ + " --json");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"labels\":"), std::string::npos);
  const std::string wrong = metrics_.substr(0, metrics_.rfind('/')) + "/nothing-here";
  r = sh(t + " metrics " + wrong);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("answered HTTP 404"), std::string::npos) << r.err;
}

// "escapes peer text": `call` printed an error answer's detail with %s: cut at its NUL ("red"),
// and the remote node's escape sequence (ESC [2J: clear the screen) reached the terminal. The
// detail is escaped as the join's refusal details are (uvbus::detail::printable), whole.
TEST_F(Bus, CallEscapesTheErrorDetail) {
  const run_result r = sh(tool("call 0x10000 7 fail-raw"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("answered error 9: \\x1b[2Jred\\x00tail\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
}

// A C1 control is a control too: a raw 0x9b (CSI to a terminal that takes 8-bit controls) and its
// UTF-8 form (0xc2 0x9b) in an error answer's detail reached the terminal as they were. Each of
// their bytes is escaped; the detail's "café" stays.
TEST_F(Bus, CallEscapesC1Controls) {
  const run_result r = sh(tool("call 0x10000 7 fail-c1"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("answered error 10: \\x9bH \\xc2\\x9bH caf\xc3\xa9\n"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find('\x9b'), std::string::npos) << r.err;
}

// `nodes` printed each node's name, type, host and labels as the node chose them: a label's OSC
// sequence (set the window title) reached the terminal. Each is escaped.
TEST_F(Bus, NodesEscapeWhatANodeChose) {
  const run_result r = sh(tool("nodes"));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("zone=a,evil=\\x1b]0;pwn\\x07"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
}

// `top --metrics`: the link labels come from whatever answers at the URL; an escape sequence in
// one reached the terminal. Escaped (the test's page: one link, its peer label ESC [2J).
TEST_F(Bus, TopEscapesTheLinkLabels) {
  uvbus::test::page_server page(
      "uvbus_peer_rtt_seconds{peer=\"\x1b[2J\",role=\"child\",channel=\"stream\"} 0.001\n");
  ASSERT_NE(page.port(), 0);
  const run_result r = sh(tool("top 0x10000 --once --interval-ms 20 --metrics " + page.url()));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\\x1b[2J child stream"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
}

// The tool waited timeout + 1000 ms for an answer in 32 bits: `--timeout-ms 4294967000` wrapped
// to 704 ms, and `call` reported "timeout" long before the node's own deadline. It now waits on
// (here until `timeout 3` ends it: exit 124).
TEST_F(Bus, ALargeTimeoutDoesNotWrap) {
  const run_result r = sh("timeout 3 " + tool("call 0x10000 7 silent --timeout-ms 4294967000"));
  EXPECT_EQ(r.rc, 124) << r.err;
  EXPECT_EQ(r.err.find("timeout"), std::string::npos) << r.err;
}

// printable escaped the C0 controls and DEL only: a C1 control, raw (0x9b: CSI) or as UTF-8
// (U+009B: 0xc2 0x9b), passed to the terminal. Each of its bytes is \xNN; U+00A0 on is kept.
TEST(Printable, C1ControlsAreEscapedRawOrAsUtf8) {
  using uvbus::detail::printable;
  EXPECT_EQ(printable("\x9bH"), "\\x9bH");  // CSI H: the cursor home
  EXPECT_EQ(printable("\x85"), "\\x85");
  EXPECT_EQ(printable("\xc2\x9bH"), "\\xc2\\x9bH");
  EXPECT_EQ(printable("\xc2\x80"), "\\xc2\\x80");  // U+0080, the first
  EXPECT_EQ(printable("\xc2\x85"), "\\xc2\\x85");  // NEL: a line break to some terminals
  EXPECT_EQ(printable("\xc2\x9f"), "\\xc2\\x9f");  // U+009F, the last
  EXPECT_EQ(printable("\xc2\xa0"), "\xc2\xa0");    // U+00A0, the first after them
}

// Bytes that are not part of well-formed UTF-8 (RFC 3629) are escaped one by one: a terminal may
// take them for controls (0x80..0x9f alone are C1 to one that reads 8-bit controls).
TEST(Printable, BytesThatAreNotWellFormedUtf8AreEscaped) {
  using uvbus::detail::printable;
  EXPECT_EQ(printable("a\xff"), "a\\xff");
  EXPECT_EQ(printable("\x80"), "\\x80");                                      // a lone continuation
  EXPECT_EQ(printable("\xc3"), "\\xc3");                                      // cut
  EXPECT_EQ(printable("\xe6\x97x"), "\\xe6\\x97x");                           // cut, then ASCII
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                             // overlong '/'
  EXPECT_EQ(printable("\xe0\x82\x9b"), "\\xe0\\x82\\x9b");                    // overlong U+009B
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");                    // U+D800
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");           // > U+10FFFF
  EXPECT_EQ(printable("\xf8\x88\x80\x80\x80"), "\\xf8\\x88\\x80\\x80\\x80");  // 5 bytes
  EXPECT_EQ(printable("\xc3\xc3\xa9"), "\\xc3\xc3\xa9");  // a cut sequence, then "é"
}

// Well-formed UTF-8 of code points from U+00A0 on is text, kept as it is; C0 controls and DEL are
// escaped as before.
TEST(Printable, PrintableUtf8IsKeptAndC0ControlsEscaped) {
  using uvbus::detail::printable;
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");                            // é
  EXPECT_EQ(printable("\xe6\x97\xa5\xe6\x9c\xac"), "\xe6\x97\xa5\xe6\x9c\xac");  // 日本
  EXPECT_EQ(printable("\xe2\x82\xac \xf0\x9f\x98\x80"), "\xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xf4\x8f\xbf\xbf"), "\xf4\x8f\xbf\xbf");  // U+10FFFF, the last
  EXPECT_EQ(printable(" ~"), " ~");
  EXPECT_EQ(printable("\x1b[2J\x7f\t\n"), "\\x1b[2J\\x7f\\x09\\x0a");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable(""), "");
}

TEST(Tool, UsageErrorsExitTwo) {
  const std::string t = UVBUS_TOOL_PATH;
  EXPECT_EQ(sh(t).rc, 2);
  EXPECT_EQ(sh(t + " bogus").rc, 2);
  EXPECT_EQ(sh(t + " routes --parent ipv4://127.0.0.1:1 --id 5").rc, 2);  // no id
  run_result r = sh(t + " routes zz --parent ipv4://127.0.0.1:1 --id 5");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("bad node id 'zz'"), std::string::npos) << r.err;
  EXPECT_EQ(sh(t + " ping 5 --count x --parent ipv4://127.0.0.1:1 --id 5").rc, 2);
  EXPECT_EQ(sh(t + " routes 5 --id 5").rc, 2);  // no parent
  EXPECT_EQ(sh(t + " send 5 7 --parent ipv4://127.0.0.1:1 --id 5").rc, 2);
  EXPECT_EQ(sh(t + " metrics ftp://x").rc, 2);
  // 0 would mean "no timeout" to libcurl: refused as the bus subcommands refuse it.
  r = sh(t + " metrics http://127.0.0.1:1/metrics --timeout-ms 0");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("bad value '0' for --timeout-ms"), std::string::npos) << r.err;
  r = sh(t + " routes 5 --parent ipv4://127.0.0.1:1 --id 5 --timeout-ms 0");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("bad value '0' for --timeout-ms"), std::string::npos) << r.err;
  EXPECT_EQ(sh(t + " call 5").rc, 2);
  for (const char* c : {"routes", "counters", "ping", "send", "nodes", "top", "metrics", "shm"}) {
    r = sh(t + " " + c + " --help");
    EXPECT_EQ(r.rc, 0) << c;
    EXPECT_NE(r.out.find("usage: uvbus"), std::string::npos) << c;
  }
  r = sh(t + " --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("call"), std::string::npos);
}

TEST(Tool, ShmInspectAndRemove) {
  const std::string url = "shm://" + uvbus::test::unique_name("tool-shm");
  uvbus::shm_reader reader;
  ASSERT_EQ(reader.open(url, uvbus::test::small_ring_config()), uvbus::errc::ok);
  const std::string t = UVBUS_TOOL_PATH;
  run_result r = sh(t + " shm inspect " + url);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("layout            valid"), std::string::npos) << r.out;
  r = sh(t + " shm inspect " + url + " --json");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(json_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"layout\":\"valid\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"alive\":true"), std::string::npos) << r.out;
  EXPECT_EQ(sh(t + " shm drain " + url + " --json").rc, 2);              // inspect only
  EXPECT_EQ(sh(t + " shm remove " + url).rc, 3);                         // a live reader owns it
  EXPECT_EQ(sh(std::string(UVBUS_SHM_INSPECT_PATH) + " " + url).rc, 0);  // the old name
  reader.close(uvbus::shm_close_mode::keep);
  r = sh(t + " shm drain " + url + " --quiet");
  EXPECT_EQ(r.rc, 0) << r.err;
  r = sh(t + " shm remove " + url);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(sh(t + " shm inspect " + url).rc, 2);  // gone
  EXPECT_EQ(sh(t + " shm frobnicate " + url).rc, 2);
}

TEST(Tool, MetricsUnreachableExitsThree) {
  // Port 1 on loopback: nothing listens there (connection refused).
  const run_result r = sh(std::string(UVBUS_TOOL_PATH) + " metrics http://127.0.0.1:1/metrics");
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(r.err.find("cannot fetch http://127.0.0.1:1/metrics"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace uvbus::tool_test
