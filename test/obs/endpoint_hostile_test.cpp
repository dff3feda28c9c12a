// http_endpoint under operating-system limits: out of descriptors with a client waiting in the
// backlog (no busy loop, the client is shed and counted, service resumes once descriptors free),
// start() out of descriptors, pipelined requests.
// Each case runs in a forked child, so the lowered RLIMIT_NOFILE never touches another test.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "obs/http_endpoint.h"

namespace uvbus::obs {
namespace {

constexpr uint64_t kDeadlineMs = 20000;  // generous for ASan: a deadline, never a speed claim

// A client connected to 127.0.0.1:port (in the listen backlog: the loop need not run), or -1.
int connect_client(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&in), sizeof in) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True once the server answered or closed fd (EOF or reset).
bool answered_or_closed(int fd, std::string* got) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      got->append(buf, static_cast<size_t>(n));
      continue;
    }
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

// Runs the loop one iteration at a time for about ms (a timer ends the window); the iterations.
uint64_t iterations_in(uv_loop_t* loop, uint64_t ms) {
  uv_timer_t t;
  bool fired = false;
  uv_timer_init(loop, &t);
  t.data = &fired;
  uv_timer_start(
      &t, [](uv_timer_t* h) { *static_cast<bool*>(h->data) = true; }, ms, 0);
  uint64_t n = 0;
  while (!fired) {
    uv_run(loop, UV_RUN_ONCE);
    ++n;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&t), nullptr);
  uv_run(loop, UV_RUN_NOWAIT);
  return n;
}

// The child: exit 0 when all is well, else a code naming what went wrong (printed to stderr).
int out_of_descriptors_child() {
  uv_loop_t loop;
  uv_loop_init(&loop);
  int rc = 0;
  {
    http_endpoint ep;
    std::string detail;
    if (ep.start(
            &loop, "http://127.0.0.1:0/metrics",
            [](std::string_view, http_response* r) { r->body = "up 1\n"; }, &detail) != errc::ok) {
      return 10;
    }
    const int client = connect_client(ep.port());
    if (client < 0) return 11;
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    if (::send(client, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
      return 12;
    }
    rlimit old{};
    getrlimit(RLIMIT_NOFILE, &old);
    const int lowest_free = ::dup(0);
    ::close(lowest_free);
    rlimit low = old;
    low.rlim_cur = static_cast<rlim_t>(lowest_free);  // no new descriptor can be made
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 13;
    // Out of descriptors for half a second: the loop must wait, not spin on the ready backlog.
    const uint64_t spins = iterations_in(&loop, 500);
    std::fprintf(stderr, "loop iterations in 500 ms out of descriptors: %llu\n",
                 static_cast<unsigned long long>(spins));
    const uint64_t shed = ep.shed_clients();  // taken off the backlog and closed, unserved
    setrlimit(RLIMIT_NOFILE, &old);
    if (spins > 200) rc = 2;
    if (shed != 1 && rc == 0) rc = 5;
    // Descriptors free again: the waiting client is answered or closed, not left hanging.
    std::string got;
    const uint64_t until = uv_now(&loop) + kDeadlineMs;
    bool done = false;
    while (!(done = answered_or_closed(client, &got)) && uv_now(&loop) < until) {
      uv_run(&loop, UV_RUN_ONCE);
    }
    if (!done && rc == 0) rc = 3;
    ::close(client);
    // And a new client is served.
    const int again = connect_client(ep.port());
    if (again < 0) return 14;
    (void)::send(again, req.data(), req.size(), MSG_NOSIGNAL);
    got.clear();
    const uint64_t until2 = uv_now(&loop) + kDeadlineMs;
    while (!answered_or_closed(again, &got) && uv_now(&loop) < until2) uv_run(&loop, UV_RUN_ONCE);
    ::close(again);
    if (got.find("up 1") == std::string::npos && rc == 0) rc = 4;
    ep.stop();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  uv_loop_close(&loop);
  return rc;
}

TEST(HttpEndpointLimits, OutOfDescriptorsTheLoopWaitsAndServiceResumes) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(out_of_descriptors_child());
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  // 2: the loop spun; 3: the waiting client hung; 4: no service afterwards; 5: not counted.
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// start() with no descriptor left (the socket fails) and with one (libmicrohttpd's epoll fails).
int start_out_of_descriptors_child() {
  uv_loop_t loop;
  uv_loop_init(&loop);
  int rc = 0;
  for (int spare = 0; spare < 2; ++spare) {
    http_endpoint ep;
    rlimit old{};
    getrlimit(RLIMIT_NOFILE, &old);
    const int lowest_free = ::dup(0);
    ::close(lowest_free);
    rlimit low = old;
    low.rlim_cur = static_cast<rlim_t>(lowest_free) + static_cast<rlim_t>(spare);
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 13;
    std::string detail;
    const errc e = ep.start(
        &loop, "http://127.0.0.1:0/metrics",
        [](std::string_view, http_response* r) { r->body = "up 1\n"; }, &detail);
    setrlimit(RLIMIT_NOFILE, &old);
    std::fprintf(stderr, "%d spare: %s (%s)\n", spare, to_string(e), detail.c_str());
    if (e == errc::ok) rc = 20 + spare;
    if (detail.find("Too many open files") == std::string::npos && rc == 0) rc = 2 + spare;
    ep.stop();
    uv_run(&loop, UV_RUN_DEFAULT);
    // No descriptor leaked by the failed start: the lowest free one is the same again.
    const int again = ::dup(0);
    ::close(again);
    if (again != lowest_free && rc == 0) rc = 4;
  }
  uv_loop_close(&loop);
  return rc;
}

TEST(HttpEndpointLimits, StartOutOfDescriptorsSaysWhy) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(start_out_of_descriptors_child());
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  // 2: no reason when the socket fails, 3: none when libmicrohttpd fails, 4: a descriptor leaked,
  // 20/21: started anyway.
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Pipelined requests in one write: one answer, one render, then the connection closes (one request
// per connection), so a client cannot queue renders on one connection.
TEST(HttpEndpointHostile, PipelinedRequestsGetOneAnswerAndOneRender) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    http_endpoint ep;
    int renders = 0;
    std::string detail;
    ASSERT_EQ(ep.start(
                  &loop, "http://127.0.0.1:0/metrics",
                  [&](std::string_view, http_response* r) {
                    ++renders;
                    r->body = "up 1\n";
                  },
                  &detail),
              errc::ok);
    const int client = connect_client(ep.port());
    ASSERT_GE(client, 0);
    std::string req;
    for (int i = 0; i < 50; ++i) req += "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(client, req.data(), req.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(req.size()));
    std::string got;
    const uint64_t until = uv_now(&loop) + kDeadlineMs;
    bool done = false;
    while (!(done = answered_or_closed(client, &got)) && uv_now(&loop) < until) {
      uv_run(&loop, UV_RUN_ONCE);
    }
    ::close(client);
    EXPECT_TRUE(done);
    EXPECT_EQ(renders, 1);
    size_t answers = 0;
    for (size_t at = got.find("HTTP/1.1 200"); at != std::string::npos;
         at = got.find("HTTP/1.1 200", at + 1)) {
      ++answers;
    }
    EXPECT_EQ(answers, 1u);
    ep.stop();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace
}  // namespace uvbus::obs
