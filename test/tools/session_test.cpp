// The uvbus tool's session (tools/uvbus/session.cpp) in-process: what its node's callbacks touch
// after join() returned, when the parent goes away later (ASan: detect_stack_use_after_return);
// that it reaches the parent's children through the parent; peer_text, the escaping of a remote
// node's text.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "common.h"
#include "session.h"
#include "test_util.h"
#include "uvbus/node.h"

#if defined(__SANITIZE_ADDRESS__)
// A write into a frame that has returned is only caught with fake stack frames: on in this binary
// whatever ASAN_OPTIONS says (its own options still come after these).
extern "C" const char* __asan_default_options() {
  return "detect_stack_use_after_return=1";
}
#endif

namespace uvbus::session_test {
namespace {

constexpr uint64_t kRoot = 0x10000;
constexpr uint64_t kChild = 0x10001;
constexpr uint64_t kToolId = 0xfffe000000000001ULL;

// A root node (id 0x10000, subnets 0x10000/16) on its own thread until stop(); with_child: and
// its child 0x10001 (listening, so a sibling could dial it) on the same loop, registered before
// the constructor returns.
class root_thread {
 public:
  explicit root_thread(bool with_child = false) : with_child_(with_child) {
    std::promise<std::string> url;
    auto f = url.get_future();
    thread_ = std::thread([this, &url] { run(&url); });
    url_ = f.get();
  }
  ~root_thread() { stop(); }
  root_thread(const root_thread&) = delete;
  root_thread& operator=(const root_thread&) = delete;

  [[nodiscard]] const std::string& url() const { return url_; }
  // Destroys the node (its links close) and ends the thread.
  void stop() {
    if (!thread_.joinable()) return;
    uv_async_send(&stop_);
    thread_.join();
  }

 private:
  void run(std::promise<std::string>* url) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    bool stopping = false;
    stop_.data = &stopping;
    uv_async_init(&loop, &stop_, [](uv_async_t* a) { *static_cast<bool*>(a->data) = true; });
    uvbus::node_config cfg;
    cfg.listen = {"ipv4://127.0.0.1:0"};
    cfg.subnets = {{kRoot, 16}};
    cfg.child_grace_ms = 0;
    auto n = std::make_unique<uvbus::node>(&loop, kRoot, cfg, uvbus::node_callbacks{});
    bool ok = n->start() == uvbus::errc::ok;
    std::unique_ptr<uvbus::node> child;
    if (ok && with_child_) {
      uvbus::node_config c;
      c.listen = {"ipv4://127.0.0.1:0"};
      c.parent_urls = {n->listen_urls().at(0)};
      child = std::make_unique<uvbus::node>(&loop, kChild, c, uvbus::node_callbacks{});
      ok = child->start() == uvbus::errc::ok &&
           uvbus::test::run_until(
               &loop, [&] { return child->up(); }, std::chrono::seconds(30));
    }
    url->set_value(ok ? n->listen_urls().at(0) : "");
    while (!stopping) uv_run(&loop, UV_RUN_ONCE);
    child.reset();
    n.reset();
    uv_close(reinterpret_cast<uv_handle_t*>(&stop_), nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }

  bool with_child_;
  std::thread thread_;
  std::string url_;
  uv_async_t stop_{};
};

// join() succeeded and returned; then the parent goes away: the link's end and the failed
// reconnects report to the callbacks join() installed, which must not reach into its old frame.
TEST(ToolSession, ParentLostAfterJoinTouchesNoReturnedFrame) {
  root_thread root;
  ASSERT_FALSE(root.url().empty());
  uvbus_tool::session s;
  uvbus_tool::join_options o;
  o.parent = root.url();
  o.id = kToolId;
  ASSERT_EQ(s.join(o, {}), uvbus_tool::kExitOk);
  EXPECT_EQ(s.parent_id(), kRoot);
  root.stop();
  // The node notices the loss and retries; every failed attempt reports a registration result.
  s.run_until([] { return false; }, 2000);
  EXPECT_TRUE(s.node().running());
}

// join() gave up (a parent that accepts and never answers); the link's end later still reports.
TEST(ToolSession, JoinThatTimedOutTouchesNoReturnedFrame) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof in;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&in), len), 0);
  ASSERT_EQ(::listen(fd, 4), 0);  // connects complete in the backlog; nobody ever answers
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&in), &len), 0);
  uvbus_tool::session s;
  uvbus_tool::join_options o;
  o.parent = "ipv4://127.0.0.1:" + std::to_string(ntohs(in.sin_port));
  o.id = kToolId;
  o.timeout_ms = 200;
  EXPECT_EQ(s.join(o, {}), uvbus_tool::kExitJoin);
  ::close(fd);  // the connection in the backlog is reset: the registration attempt fails now
  s.run_until([] { return false; }, 2000);
  EXPECT_TRUE(s.node().running());
}

// node_config::join_as_tool, docs/tools.md: the tool reaches every node through the parent. The
// session left sibling_direct on: a command to the parent's child looked the child up and dialled
// it directly (from an operator's host, a private address: a black hole, the command timed out),
// and the child listed "sibling 0xfffe... via stream". Now the command goes through the parent:
// no sibling link on either side.
TEST(ToolSession, CommandsToTheParentsChildGoThroughTheParent) {
  root_thread root(true);
  ASSERT_FALSE(root.url().empty());
  uvbus_tool::session s;
  uvbus_tool::join_options o;
  o.parent = root.url();
  o.id = kToolId;
  o.timeout_ms = 20000;
  ASSERT_EQ(s.join(o, {}), uvbus_tool::kExitOk);
  const uvbus_tool::command_result echo =
      uvbus_tool::run_command(&s, kChild, uvbus::proto::command_id::echo, "x", o.timeout_ms);
  ASSERT_EQ(echo.status, uvbus::errc::ok);
  EXPECT_EQ(echo.text, "x");
  for (const uvbus::endpoint_info& p : s.node().peers()) {
    EXPECT_NE(p.role, uvbus::peer_role::sibling) << std::hex << p.id;
  }
  const uvbus_tool::command_result routes =
      uvbus_tool::run_command(&s, kChild, uvbus::proto::command_id::routes, "", o.timeout_ms);
  ASSERT_EQ(routes.status, uvbus::errc::ok);
  EXPECT_EQ(routes.text.find("sibling"), std::string::npos) << routes.text;
}

// A remote node's text for the terminal (routes, counters: `uvbus routes`, `top`): fputs wrote it
// as it came, escape sequences included, cut at a NUL. Each line escaped, the newlines kept; a
// lone 0x9b (CSI to a terminal reading 8-bit controls) too (it was kept raw).
TEST(ToolSession, PeerTextEscapesEachLine) {
  using uvbus_tool::peer_text;
  EXPECT_EQ(peer_text("a=1\nb=2\n"), "a=1\nb=2\n");
  EXPECT_EQ(peer_text(std::string("\x1b[2Jx\0y\r\n\x9b", 10)), "\\x1b[2Jx\\x00y\\x0d\n\\x9b");
  EXPECT_EQ(peer_text(""), "");
}

}  // namespace
}  // namespace uvbus::session_test
