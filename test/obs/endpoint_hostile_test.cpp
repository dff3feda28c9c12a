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

#include "limits_util.h"
#include "obs/http_endpoint.h"

namespace uvbus::obs::endpoint_hostile_test {
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

// Runs the loop until the server answered or closed fd (what came, into *got); false if it did
// neither within the deadline.
bool answered(uv_loop_t* loop, int fd, std::string* got) {
  const uint64_t until = uv_now(loop) + kDeadlineMs;
  while (!test::peer_closed(fd, got)) {
    if (uv_now(loop) >= until) return false;
    uv_run(loop, UV_RUN_ONCE);
  }
  return true;
}

// The child: exit 0 when all is well, else a code naming what went wrong (printed to stderr).
int out_of_descriptors_child(uv_loop_t* loop) {
  int rc = 0;
  {
    http_endpoint ep;
    std::string detail;
    if (ep.start(
            loop, "http://127.0.0.1:0/metrics",
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
    if (!test::lower_nofile(&old)) return 13;  // no new descriptor can be made
    // Out of descriptors for half a second: the loop must wait, not spin on the ready backlog.
    const uint64_t spins = test::iterations_in(loop, 500);
    std::fprintf(stderr, "loop iterations in 500 ms out of descriptors: %llu\n",
                 static_cast<unsigned long long>(spins));
    const uint64_t shed = ep.shed_clients();  // taken off the backlog and closed, unserved
    setrlimit(RLIMIT_NOFILE, &old);
    if (spins > 200) rc = 2;
    if (shed != 1 && rc == 0) rc = 5;
    // Descriptors free again: the waiting client is answered or closed, not left hanging.
    std::string got;
    if (!answered(loop, client, &got) && rc == 0) rc = 3;
    ::close(client);
    // And a new client is served.
    const int again = connect_client(ep.port());
    if (again < 0) return 14;
    (void)::send(again, req.data(), req.size(), MSG_NOSIGNAL);
    got.clear();
    (void)answered(loop, again, &got);
    ::close(again);
    if (got.find("up 1") == std::string::npos && rc == 0) rc = 4;
    ep.stop();
    uv_run(loop, UV_RUN_DEFAULT);
  }
  return rc;
}

TEST(HttpEndpointLimits, OutOfDescriptorsTheLoopWaitsAndServiceResumes) {
  // -1: the child died; 2: the loop spun; 3: the waiting client hung; 4: no service afterwards;
  // 5: not counted.
  EXPECT_EQ(test::in_child(out_of_descriptors_child), 0);
}

// start() with no descriptor left (the socket fails) and with one (libmicrohttpd's epoll fails).
int start_out_of_descriptors_child(uv_loop_t* loop) {
  int rc = 0;
  for (int spare = 0; spare < 2; ++spare) {
    http_endpoint ep;
    const int lowest_free = test::lowest_free_fd();
    rlimit old{};
    if (!test::lower_nofile(&old, static_cast<rlim_t>(spare))) return 13;
    std::string detail;
    const errc e = ep.start(
        loop, "http://127.0.0.1:0/metrics",
        [](std::string_view, http_response* r) { r->body = "up 1\n"; }, &detail);
    setrlimit(RLIMIT_NOFILE, &old);
    std::fprintf(stderr, "%d spare: %s (%s)\n", spare, to_string(e), detail.c_str());
    if (e == errc::ok) rc = 20 + spare;
    if (detail.find("Too many open files") == std::string::npos && rc == 0) rc = 2 + spare;
    ep.stop();
    uv_run(loop, UV_RUN_DEFAULT);
    // No descriptor leaked by the failed start: the lowest free one is the same again.
    if (test::lowest_free_fd() != lowest_free && rc == 0) rc = 4;
  }
  return rc;
}

TEST(HttpEndpointLimits, StartOutOfDescriptorsSaysWhy) {
  // -1: the child died; 2: no reason when the socket fails, 3: none when libmicrohttpd fails,
  // 4: a descriptor leaked, 20/21: started anyway.
  EXPECT_EQ(test::in_child(start_out_of_descriptors_child), 0);
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
    const bool done = answered(&loop, client, &got);
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
}  // namespace uvbus::obs::endpoint_hostile_test
