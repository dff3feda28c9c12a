// http_endpoint on its own test loop: GET/HEAD, 404 by the handler, 405 and bodies refused, 100
// clients at once within the connection limit, stalled/garbage/oversized/slow-byte clients, the
// idle timeout and the request deadline, the per-address limit, stop() with a client connected and
// a loop that closes cleanly. curl runs on a helper thread.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "obs/http_endpoint.h"
#include "test_util.h"

namespace uvbus::obs::endpoint_test {
namespace {

// Generous for ASan and a shared machine: a deadline only, never a claim about speed.
constexpr std::chrono::milliseconds kDeadline{90000};
constexpr const char* kBody = "# TYPE demo_up gauge\ndemo_up 1\n";

// A raw TCP client of the endpoint, for what curl will not do (say nothing, send garbage).
class raw_client {
 public:
  explicit raw_client(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(port);
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // Completes in the listen backlog: the loop need not run.
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&in), sizeof in) == 0;
  }
  ~raw_client() { ::close(fd_); }
  raw_client(const raw_client&) = delete;
  raw_client& operator=(const raw_client&) = delete;

  [[nodiscard]] bool connected() const { return connected_; }
  // Sends what the socket takes now; the bytes sent, or -1 once the server has gone.
  ssize_t send_some(const std::string& s) {
    const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return n;
  }
  // Reads what has arrived into received(); true once the server closed (EOF or reset).
  bool closed() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        received_.append(buf, static_cast<size_t>(n));
        continue;
      }
      return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    }
  }
  [[nodiscard]] const std::string& received() const { return received_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string received_;
};

struct http_result {
  int status = 0;  // 0: no HTTP answer (curl's 000)
  std::string out;
};

class HttpEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    ep_.reset();                     // the destructor stops it
    uv_run(&loop_, UV_RUN_DEFAULT);  // the endpoint's close callbacks
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "a handle was left open";
  }

  // Starts ep_ with a handler that serves /metrics and answers 404 for any other path.
  errc start(const http_limits& limits = {},
             const std::string& url = "http://127.0.0.1:0/metrics") {
    if (!ep_) ep_ = std::make_unique<http_endpoint>();
    const errc e = ep_->set_limits(limits);
    if (e != errc::ok) return e;
    const auto handler = [this](std::string_view path, http_response* out) {
      on_loop_thread_ = on_loop_thread_ && std::this_thread::get_id() == loop_thread_;
      ++handled_;
      last_path_ = std::string(path);
      if (path != "/metrics") {
        out->status = 404;
        out->body = "not found\n";
        return;
      }
      out->body = kBody;
    };
    return ep_->start(&loop_, url, handler, &why_);
  }

  // Runs cmd on a helper thread while the loop serves (and notes the most connections seen).
  std::string serve_while(const std::string& cmd) {
    std::string out;
    std::atomic<bool> finished{false};
    std::thread t([&] {
      out = test::command_output(cmd);
      finished = true;
    });
    const bool ok = test::run_until(
        &loop_,
        [&] {
          most_connections_ = std::max(most_connections_, ep_->connections());
          return finished.load();
        },
        kDeadline);
    t.join();
    EXPECT_TRUE(ok) << "did not finish: " << cmd;
    return out;
  }

  // curl once (extra: its options); stdout and the status code.
  http_result fetch(const std::string& url, const std::string& extra = "") {
    const std::string out =
        serve_while("curl -s -m 60 " + extra + " -w '\\n%{http_code}' '" + url + "'");
    http_result r;
    const size_t nl = out.rfind('\n');
    r.out = nl == std::string::npos ? out : out.substr(0, nl);
    r.status = nl == std::string::npos
                   ? 0
                   : static_cast<int>(std::strtol(out.c_str() + nl + 1, nullptr, 10));
    return r;
  }

  // Runs the loop until pred() holds (false: the deadline passed first).
  template <class Pred>
  bool serve_until(Pred&& pred) {
    return test::run_until(&loop_, std::forward<Pred>(pred), kDeadline);
  }

  uv_loop_t loop_{};
  std::unique_ptr<http_endpoint> ep_;
  std::string why_;
  std::thread::id loop_thread_ = std::this_thread::get_id();
  bool on_loop_thread_ = true;
  int handled_ = 0;
  std::string last_path_;
  unsigned most_connections_ = 0;
};

TEST_F(HttpEndpointTest, ServesGetAndHeadFromTheLoopThread) {
  http_limits every;
  every.render_interval_ms = 0;  // each request reaches the handler (sharing: EndpointRender.*)
  ASSERT_EQ(start(every), errc::ok) << why_;
  const std::string url = ep_->url();
  EXPECT_NE(ep_->port(), 0);
  EXPECT_EQ(url, "http://127.0.0.1:" + std::to_string(ep_->port()) + "/metrics");

  const http_result get = fetch(url);
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.out, kBody);
  const http_result head = fetch(url, "-I -o /dev/null");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.out, "");
  const http_result query = fetch(url + "?debug=1");
  EXPECT_EQ(query.status, 200);  // the handler sees the path without the query
  EXPECT_EQ(last_path_, "/metrics");
  const http_result other = fetch(url + "/x");
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(last_path_, "/metrics/x");

  EXPECT_EQ(handled_, 4);
  EXPECT_EQ(ep_->requests(), 4u);
  EXPECT_TRUE(on_loop_thread_);
  // The content type is the Prometheus text format's.
  const http_result headers = fetch(url, "-D - -o /dev/null");
  EXPECT_NE(headers.out.find("Content-Type: text/plain; version=0.0.4"), std::string::npos)
      << headers.out;
}

TEST_F(HttpEndpointTest, RefusesOtherMethodsAndRequestBodies) {
  ASSERT_EQ(start(), errc::ok) << why_;
  const std::string url = ep_->url();
  const http_result post = fetch(url, "-X POST -D - -o /dev/null");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.out.find("Allow: GET, HEAD"), std::string::npos) << post.out;
  EXPECT_EQ(fetch(url, "-X PUT").status, 405);
  EXPECT_EQ(fetch(url, "-X DELETE").status, 405);
  // A GET with a body: the connection is closed, no answer.
  EXPECT_EQ(fetch(url, "-X GET --data-binary 'a=1'").status, 0);
  EXPECT_EQ(handled_, 0);
  EXPECT_EQ(fetch(url).status, 200);  // and the endpoint still serves
}

TEST_F(HttpEndpointTest, StartErrorsSayWhatIsWrong) {
  ep_ = std::make_unique<http_endpoint>();
  EXPECT_EQ(start({}, "http://127.0.0.1/metrics"), errc::bad_url);
  EXPECT_NE(why_.find("port"), std::string::npos) << why_;
  EXPECT_EQ(start({}, "http://example.org:80/metrics"), errc::bad_url);
  EXPECT_NE(why_.find("example.org"), std::string::npos) << why_;
  EXPECT_EQ(start({}, "https://127.0.0.1:0/"), errc::bad_url);
  EXPECT_EQ(ep_->port(), 0);
  EXPECT_EQ(ep_->url(), "");
  http_limits zero;
  zero.max_connections = 0;
  EXPECT_EQ(ep_->set_limits(zero), errc::invalid_argument);

  ASSERT_EQ(start(), errc::ok) << why_;
  EXPECT_EQ(ep_->set_limits({}), errc::wrong_state);
  std::string why;
  EXPECT_EQ(ep_->start(&loop_, "http://127.0.0.1:0/", nullptr, &why), errc::wrong_state);
  http_endpoint second;  // the same port, taken
  EXPECT_EQ(second.start(&loop_, ep_->url(), nullptr, &why), errc::address_in_use);
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(second.port(), 0);
}

TEST_F(HttpEndpointTest, ServesIpv6) {
  ASSERT_EQ(start({}, "http://[::1]:0/m"), errc::ok) << why_;
  EXPECT_EQ(ep_->url(), "http://[::1]:" + std::to_string(ep_->port()) + "/m");
  EXPECT_EQ(fetch(ep_->url(), "-g").status, 404);  // the handler serves /metrics only
  EXPECT_EQ(last_path_, "/m");
}

TEST_F(HttpEndpointTest, HundredClientsAtOnceStayWithinTheConnectionLimit) {
  http_limits l;
  l.max_per_address = 0;  // all from loopback: the total limit alone
  ASSERT_EQ(start(l), errc::ok) << why_;
  const std::string out = serve_while(
      "curl -s --parallel --parallel-immediate --parallel-max 100 -m 60 -o /dev/null "
      "-w '%{http_code}\\n' '" +
      ep_->url() + "?[1-100]' 2>/dev/null");
  int ok = 0;
  size_t at = 0;
  for (size_t nl = out.find('\n'); nl != std::string::npos; at = nl + 1, nl = out.find('\n', at)) {
    const std::string code = out.substr(at, nl - at);
    ok += code == "200" ? 1 : 0;
  }
  // All of them: the ones over the limit wait in the listen backlog (or retry their SYN).
  EXPECT_EQ(ok, 100) << out;
  EXPECT_LE(most_connections_, http_endpoint::kMaxConnections);
  EXPECT_TRUE(serve_until([&] { return ep_->connections() == 0; }));
  EXPECT_EQ(fetch(ep_->url()).status, 200);
  std::printf("100 parallel clients: %d served, at most %u connections at once\n", ok,
              most_connections_);
}

TEST_F(HttpEndpointTest, StalledAndGarbageClientsDoNotBlockOthers) {
  http_limits l;
  l.max_per_address = 0;  // all from loopback: every slot but two taken by one host
  ASSERT_EQ(start(l), errc::ok) << why_;
  std::vector<std::unique_ptr<raw_client>> silent;
  for (unsigned i = 0; i + 2 < http_endpoint::kMaxConnections; ++i) {
    silent.push_back(std::make_unique<raw_client>(ep_->port()));
    ASSERT_TRUE(silent.back()->connected());
  }
  raw_client junk(ep_->port());
  ASSERT_TRUE(junk.connected());
  const char garbage[] = "\x16\x03\x01\0 not http\r\n\r\n";  // a TLS hello's start, say
  ASSERT_GT(junk.send_some(std::string(garbage, sizeof garbage - 1)), 0);
  ASSERT_TRUE(serve_until([&] { return ep_->connections() >= silent.size(); }));
  const http_result r = fetch(ep_->url());
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.out, kBody);
  // The garbage got a 400 and its connection closed; the loop never waited for anyone.
  ASSERT_TRUE(serve_until([&] { return junk.closed(); }));
  EXPECT_EQ(junk.received().rfind("HTTP/1.1 400", 0), 0u) << junk.received();
}

TEST_F(HttpEndpointTest, IdleConnectionsAreClosedByTheTimeout) {
  http_limits l;
  l.max_connections = 4;
  l.timeout_seconds = 1;
  ASSERT_EQ(start(l), errc::ok) << why_;
  std::vector<std::unique_ptr<raw_client>> silent;
  for (unsigned i = 0; i < l.max_connections; ++i) {
    silent.push_back(std::make_unique<raw_client>(ep_->port()));
    ASSERT_TRUE(silent.back()->connected());
  }
  ASSERT_TRUE(serve_until([&] { return ep_->connections() == l.max_connections; }));
  // Every slot is taken: this scrape is served once the timer has closed an idle one.
  const http_result r = fetch(ep_->url());
  EXPECT_EQ(r.status, 200);
  ASSERT_TRUE(serve_until([&] {
    return std::all_of(silent.begin(), silent.end(), [](auto& c) { return c->closed(); });
  }));
  EXPECT_LE(most_connections_, l.max_connections);
}

// Slow bytes reset an idle timeout forever: the whole request has a deadline instead (the limit's
// worth of such clients would otherwise block every scrape).
TEST_F(HttpEndpointTest, SlowByteClientsAreClosedAtTheRequestDeadline) {
  http_limits l;
  l.max_connections = 2;
  l.timeout_seconds = 1;
  ASSERT_EQ(start(l), errc::ok) << why_;
  std::vector<std::unique_ptr<raw_client>> slow;
  for (unsigned i = 0; i < l.max_connections; ++i) {
    slow.push_back(std::make_unique<raw_client>(ep_->port()));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_GT(slow.back()->send_some("GET /metrics HTTP/1.1\r\n"), 0);
  }
  ASSERT_TRUE(serve_until([&] { return ep_->connections() == l.max_connections; }));
  // While the scrape waits for a slot, each slow client sends one more header byte every 300 ms.
  const auto begin = std::chrono::steady_clock::now();
  auto next = begin;
  std::vector<std::chrono::steady_clock::duration> lived(slow.size());
  std::string out;
  std::atomic<bool> finished{false};
  std::thread scrape([&] {
    out = test::command_output("curl -s -m 60 -w '\\n%{http_code}' '" + ep_->url() + "'");
    finished = true;
  });
  const bool ok = serve_until([&] {
    const auto now = std::chrono::steady_clock::now();
    const bool tick = now >= next;
    if (tick) next = now + std::chrono::milliseconds(300);
    bool all_closed = true;
    for (size_t i = 0; i < slow.size(); ++i) {
      if (lived[i] != std::chrono::steady_clock::duration::zero()) continue;
      if (slow[i]->closed()) {
        lived[i] = now - begin;
        continue;
      }
      all_closed = false;
      if (tick) (void)slow[i]->send_some("X");
    }
    return all_closed && finished.load();
  });
  scrape.join();
  ASSERT_TRUE(ok) << "the slow clients kept their slots or the scrape was not answered: " << out;
  EXPECT_EQ(out.substr(out.rfind('\n') + 1), "200") << out;
  for (const auto& d : lived) {
    // About the timeout after they connected; generous for ASan on a shared machine.
    EXPECT_LT(d, std::chrono::seconds(30));
  }
  for (const auto& c : slow) EXPECT_TRUE(c->received().empty()) << c->received();
  EXPECT_EQ(ep_->deadline_closes(), slow.size());  // the deadline did it, not the idle timeout
  EXPECT_EQ(fetch(ep_->url()).status, 200);
}

// One address holds at most max_per_address connections; more from it are closed at once, while
// the endpoint still has slots for others.
TEST_F(HttpEndpointTest, OneAddressHoldsAtMostItsShare) {
  http_limits l;
  l.max_per_address = 2;
  ASSERT_EQ(start(l), errc::ok) << why_;
  std::vector<std::unique_ptr<raw_client>> held;
  for (unsigned i = 0; i < l.max_per_address; ++i) {
    held.push_back(std::make_unique<raw_client>(ep_->port()));
    ASSERT_TRUE(held.back()->connected());
  }
  ASSERT_TRUE(serve_until([&] { return ep_->connections() == l.max_per_address; }));
  raw_client extra(ep_->port());
  ASSERT_TRUE(extra.connected());  // in the backlog; accepted and closed by the endpoint
  ASSERT_TRUE(serve_until([&] { return extra.closed(); }));
  EXPECT_TRUE(extra.received().empty()) << extra.received();
  EXPECT_EQ(ep_->connections(), l.max_per_address);
  EXPECT_EQ(fetch(ep_->url()).status, 0);  // curl from the same address: refused too
  held.clear();
  ASSERT_TRUE(serve_until([&] { return ep_->connections() == 0; }));
  EXPECT_EQ(fetch(ep_->url()).status, 200);
}

TEST_F(HttpEndpointTest, OversizedRequestIsRefusedNotBuffered) {
  ASSERT_EQ(start(), errc::ok) << why_;
  raw_client big(ep_->port());
  ASSERT_TRUE(big.connected());
  const std::string header = "X-Filler: " + std::string(1000, 'a') + "\r\n";
  size_t sent = 0;
  ASSERT_GT(big.send_some("GET /metrics HTTP/1.1\r\nHost: x\r\n"), 0);
  // Headers without end: far beyond the connection's memory (32 KiB).
  ASSERT_TRUE(serve_until([&] {
    if (sent < (64u << 20)) {
      const ssize_t n = big.send_some(header);
      if (n > 0) sent += static_cast<size_t>(n);
    }
    return big.closed();
  }));
  EXPECT_TRUE(big.received().empty() || big.received().rfind("HTTP/1.1 4", 0) == 0)
      << big.received().substr(0, 200);
  EXPECT_TRUE(serve_until([&] { return ep_->connections() == 0; }));
  EXPECT_EQ(handled_, 0);
  EXPECT_EQ(fetch(ep_->url()).status, 200);
}

TEST_F(HttpEndpointTest, StopWithAClientConnectedClosesItAndRestarts) {
  ASSERT_EQ(start(), errc::ok) << why_;
  raw_client half(ep_->port());
  ASSERT_TRUE(half.connected());
  ASSERT_GT(half.send_some("GET /metrics HTTP/1.1\r\nHost: x\r\n"), 0);  // no end of headers
  ASSERT_TRUE(serve_until([&] { return ep_->connections() == 1; }));
  ep_->stop();
  EXPECT_TRUE(half.closed());  // closed by stop() itself, before the loop runs again
  EXPECT_EQ(ep_->port(), 0);
  EXPECT_EQ(ep_->url(), "");
  EXPECT_EQ(ep_->connections(), 0u);
  ep_->stop();                                   // idempotent
  EXPECT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);  // nothing of the endpoint's is left active
  // The same object starts again on the same loop.
  ASSERT_EQ(start(), errc::ok) << why_;
  EXPECT_EQ(fetch(ep_->url()).status, 200);
}

}  // namespace
}  // namespace uvbus::obs::endpoint_test
