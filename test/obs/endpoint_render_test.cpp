// http_endpoint's renders: scrapes as fast as a client can send them share one render per
// render_interval_ms; honest scrapes further apart each get a fresh one. Prints what a hostile
// scraper costs the loop with a large metrics text (a figure, never asserted).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "obs/http_endpoint.h"
#include "obs/prom_text.h"
#include "test_util.h"

namespace uvbus::obs::endpoint_render_test {
namespace {

constexpr std::chrono::milliseconds kDeadline{60000};

// One GET of path on a fresh connection (blocking, 30 s timeouts); the answer's bytes.
std::string get_once(uint16_t port, const std::string& path = "/metrics") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&in), sizeof in) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n = 0;
      while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// `threads` clients, each sending `each` requests back to back, on helper threads.
class scrapers {
 public:
  scrapers(uint16_t port, int threads, int each) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, port, each] {
        for (int i = 0; i < each; ++i) {
          if (get_once(port).find("200 OK") != std::string::npos) ++ok_;
        }
        ++done_;
      });
    }
  }
  ~scrapers() {
    for (std::thread& t : threads_) t.join();
  }
  scrapers(const scrapers&) = delete;
  scrapers& operator=(const scrapers&) = delete;
  [[nodiscard]] bool done() const { return done_.load() == static_cast<int>(threads_.size()); }
  [[nodiscard]] int ok() const { return ok_.load(); }

 private:
  std::vector<std::thread> threads_;
  std::atomic<int> done_{0};
  std::atomic<int> ok_{0};
};

class EndpointRender : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    ep_.stop();
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }
  void start(unsigned interval_ms, std::string body) {
    http_limits lim;
    lim.render_interval_ms = interval_ms;
    ASSERT_EQ(ep_.set_limits(lim), errc::ok);
    body_ = std::move(body);
    std::string why;
    ASSERT_EQ(ep_.start(
                  &loop_, "http://127.0.0.1:0/metrics",
                  [this](std::string_view, http_response* out) {
                    const auto t0 = std::chrono::steady_clock::now();
                    out->body = body_ + "render " + std::to_string(++handler_calls_) + "\n";
                    render_time_ += std::chrono::steady_clock::now() - t0;
                  },
                  &why),
              errc::ok)
        << why;
  }
  template <class Pred>
  bool run(Pred&& p) {
    return test::run_until(&loop_, std::forward<Pred>(p), kDeadline);
  }

  uv_loop_t loop_{};
  http_endpoint ep_;
  std::string body_;
  int handler_calls_ = 0;
  std::chrono::steady_clock::duration render_time_{};
};

// Back-to-back and concurrent requests within the interval: one render, every one answered.
TEST_F(EndpointRender, ScrapesWithinTheIntervalShareOneRender) {
  start(60000, "demo_up 1\n");
  scrapers s(ep_.port(), 4, 10);
  ASSERT_TRUE(run([&] { return s.done(); }));
  EXPECT_EQ(s.ok(), 40);
  EXPECT_EQ(ep_.requests(), 40u);
  EXPECT_EQ(handler_calls_, 1);
  EXPECT_EQ(ep_.renders(), 1u);
}

// Requests for another path (a 404 here) in between do not evict the kept render.
TEST_F(EndpointRender, OtherPathsDoNotEvictTheRender) {
  start(60000, "demo_up 1\n");
  ep_.stop();
  uv_run(&loop_, UV_RUN_DEFAULT);
  std::string why;
  int metrics_renders = 0;
  ASSERT_EQ(ep_.start(
                &loop_, "http://127.0.0.1:0/metrics",
                [&](std::string_view path, http_response* out) {
                  if (path != "/metrics") {
                    out->status = 404;
                    return;
                  }
                  ++metrics_renders;
                  out->body = "demo_up 1\n";
                },
                &why),
            errc::ok)
      << why;
  std::atomic<int> ok{0};
  std::thread t([&] {
    for (int i = 0; i < 10; ++i) {
      ok += get_once(ep_.port()).find("200 OK") != std::string::npos;
      ok += get_once(ep_.port(), "/other").find("404") != std::string::npos;
    }
  });
  ASSERT_TRUE(run([&] { return ep_.requests() == 20; }));
  t.join();
  EXPECT_EQ(ok.load(), 20);
  EXPECT_EQ(metrics_renders, 1);
}

// Requests further apart than the interval each get a fresh render.
TEST_F(EndpointRender, ScrapesFurtherApartAreFresh) {
  start(20, "demo_up 1\n");
  for (int i = 1; i <= 3; ++i) {
    std::string got;
    std::thread t([&] { got = get_once(ep_.port()); });
    ASSERT_TRUE(run([&] { return ep_.requests() == static_cast<uint64_t>(i); }));
    t.join();
    EXPECT_NE(got.find("render " + std::to_string(i) + "\n"), std::string::npos) << got;
    // The interval passes on the loop's clock (a timer, not a sleep).
    bool fired = false;
    uv_timer_t tm;
    uv_timer_init(&loop_, &tm);
    tm.data = &fired;
    uv_timer_start(
        &tm, [](uv_timer_t* h) { *static_cast<bool*>(h->data) = true; }, 25, 0);
    ASSERT_TRUE(run([&] { return fired; }));
    uv_close(reinterpret_cast<uv_handle_t*>(&tm), nullptr);
    uv_run(&loop_, UV_RUN_NOWAIT);
  }
  EXPECT_EQ(handler_calls_, 3);
}

// The figure: a hostile scraper (4 connections from one address, the per-address limit) against a
// metrics text of about 1 MB (20 000 labelled samples, as a node with thousands of peers writes),
// rendered by prom_text each time, with and without the interval. Printed, never asserted.
TEST_F(EndpointRender, WhatAHostileScraperCosts) {
  for (const unsigned interval : {0u, 100u}) {
    ep_.stop();
    uv_run(&loop_, UV_RUN_DEFAULT);
    http_limits lim;
    lim.render_interval_ms = interval;
    ASSERT_EQ(ep_.set_limits(lim), errc::ok);
    int calls = 0;
    std::chrono::steady_clock::duration spent{};
    std::string why;
    ASSERT_EQ(ep_.start(
                  &loop_, "http://127.0.0.1:0/metrics",
                  [&](std::string_view, http_response* out) {
                    const auto t0 = std::chrono::steady_clock::now();
                    prom_text t;
                    t.family("uvbus_peer_sent_total", "Messages sent to a peer.",
                             metric_type::counter);
                    for (int i = 0; i < 20000; ++i) {
                      const std::string peer = std::to_string(0x10000000 + i);
                      const label l[2] = {{"peer", peer}, {"channel", "ipv4"}};
                      t.sample(l, 2, 7.0 * i);
                    }
                    out->body = t.take();
                    ++calls;
                    spent += std::chrono::steady_clock::now() - t0;
                  },
                  &why),
              errc::ok)
        << why;
    const auto t0 = std::chrono::steady_clock::now();
    scrapers s(ep_.port(), 4, 50);
    ASSERT_TRUE(run([&] { return s.done(); }));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double in_handler = std::chrono::duration<double>(spent).count();
    std::printf(
        "[ render ] interval %u ms: %d requests in %.2f s, %d renders (%.0f/s), %.1f %% "
        "of the time in the handler\n",
        interval, s.ok(), wall, calls, calls / wall, 100 * in_handler / wall);
  }
}

}  // namespace
}  // namespace uvbus::obs::endpoint_render_test
