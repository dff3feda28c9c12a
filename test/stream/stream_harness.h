// Test harness for the stream channel: one loop, channels whose callbacks record every event.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "uvbus/stream.h"

namespace uvbus::test {

// A blocking TCP socket connected to 127.0.0.1:port (reads and writes time out after 30 s, so a
// test that goes wrong ends instead of hanging), or -1.
inline int dial(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{30, 0};  // a test that goes wrong ends instead of hanging
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

// Records every callback of one channel. Connections are keyed by id value (ids never dangle,
// and they are unique in the process).
struct recorder {
  struct failed_range {
    uint64_t conn;
    uint64_t first;
    uint64_t last;
    errc reason;
  };
  std::vector<connection_id> accepted;
  std::vector<uint64_t> accepted_ids;
  std::map<uint64_t, errc> connected;     // id -> status
  std::map<uint64_t, errc> disconnected;  // id -> reason
  std::map<uint64_t, std::vector<std::string>> received;
  std::map<uint64_t, uint64_t> written;        // id -> highest written_through reported
  std::map<uint64_t, uint64_t> written_calls;  // id -> number of on_written calls
  std::vector<failed_range> failed;
  std::map<uint64_t, int> writable;
  std::map<uint64_t, connection_id> live;  // connected/accepted and not yet ended
  std::vector<std::pair<log_level, std::string>> logs;

  // Optional hooks run after recording (for tests that react: echo, resend, disconnect).
  std::function<void(connection_id, const uint8_t*, size_t)> on_received_hook;
  std::function<void(connection_id)> on_writable_hook;
  std::function<void(connection_id)> on_accepted_hook;
  std::function<void(connection_id, errc)> on_connected_hook;
  std::function<void(connection_id, uint64_t)> on_written_hook;
  bool keep_payloads = true;
  uint64_t received_count = 0;

  // Packets of conn reported failed (the sum of its ranges).
  uint64_t failed_count(uint64_t conn) const {
    uint64_t n = 0;
    for (const failed_range& f : failed) {
      if (f.conn == conn) n += f.last - f.first + 1;
    }
    return n;
  }
  // Every packet 1..accepted of conn covered exactly once: written through some N, failed N+1..
  void expect_exact(uint64_t conn, uint64_t accepted) const {
    const auto w = written.find(conn);
    const uint64_t through = w == written.end() ? 0 : w->second;
    EXPECT_EQ(through + failed_count(conn), accepted) << "conn " << conn;
  }

  stream_callbacks callbacks() {
    stream_callbacks cb;
    cb.on_log = [this](log_level lv, const std::string& m) { logs.emplace_back(lv, m); };
    cb.on_accepted = [this](connection_id c) {
      accepted.push_back(c);
      accepted_ids.push_back(c.value);
      live[c.value] = c;
      if (on_accepted_hook) on_accepted_hook(c);
    };
    cb.on_connected = [this](connection_id c, errc s) {
      EXPECT_EQ(connected.count(c.value), 0u) << "on_connected twice";
      connected[c.value] = s;
      if (s == errc::ok) live[c.value] = c;
      if (on_connected_hook) on_connected_hook(c, s);
    };
    cb.on_disconnected = [this](connection_id c, errc reason) {
      EXPECT_EQ(disconnected.count(c.value), 0u) << "on_disconnected twice";
      disconnected[c.value] = reason;
      live.erase(c.value);
    };
    cb.on_received = [this](connection_id c, const uint8_t* d, size_t n) {
      ++received_count;
      if (keep_payloads) received[c.value].emplace_back(reinterpret_cast<const char*>(d), n);
      if (on_received_hook) on_received_hook(c, d, n);
    };
    cb.on_written = [this](connection_id c, uint64_t through) {
      uint64_t& w = written[c.value];
      EXPECT_GT(through, w) << "on_written must move forward";
      EXPECT_EQ(disconnected.count(c.value), 0u) << "on_written after on_disconnected";
      for (const failed_range& f : failed) EXPECT_NE(f.conn, c.value) << "on_written after failure";
      w = through;
      ++written_calls[c.value];
      if (on_written_hook) on_written_hook(c, through);
    };
    cb.on_send_failed = [this](connection_id c, uint64_t first, uint64_t last, errc reason) {
      const auto w = written.find(c.value);
      EXPECT_EQ(first, (w == written.end() ? 0 : w->second) + 1) << "gap or overlap";
      EXPECT_LE(first, last);
      EXPECT_NE(reason, errc::ok);
      EXPECT_EQ(disconnected.count(c.value), 0u) << "on_send_failed after on_disconnected";
      failed.push_back({c.value, first, last, reason});
    };
    cb.on_writable = [this](connection_id c) {
      ++writable[c.value];
      if (on_writable_hook) on_writable_hook(c);
    };
    return cb;
  }
};

// The current metrics of a connection (all zero once it is gone).
inline stream_connection_metrics cm(const stream_channel* ch, connection_id c) {
  stream_connection_metrics m;
  (void)ch->connection_metrics(c, &m);
  return m;
}

// A listening IPv4 socket on a free port and a duplicate of it, the "other holder": shutting the
// duplicate down makes every accept() on the socket fail (EINVAL) until listen() again.
inline bool listening_pair(int* s, int* other) {
  *s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (*s < 0 || ::bind(*s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(*s, 16) != 0) {
    return false;
  }
  *other = ::dup(*s);
  return *other >= 0;
}

// The local port of socket fd (0 if it has none).
inline uint16_t port_of(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return 0;
  return ntohs(sa.sin_port);
}

// A channel (default config) and its recorder for a scenario run in a forked child on the child's
// loop (limits_util.h's in_child): scenarios report by exit code, not by gtest assertions.
struct child_channel {
  explicit child_channel(uv_loop_t* loop) : ch(loop, stream_config{}, rec.callbacks()) {}

  // Listens on url: 0, or 10 if refused.
  int listen(const std::string& url = "ipv4://127.0.0.1:0") {
    return ch.listen(url, &l) == errc::ok ? 0 : 10;
  }
  // A blocking client of the listener (dial()), or -1.
  [[nodiscard]] int dial_listener() const { return dial(ch.listener_port(l)); }
  // How many log lines contain `what`.
  [[nodiscard]] size_t lines_with(const char* what) const {
    size_t n = 0;
    for (const auto& [lv, t] : rec.logs) n += t.find(what) != std::string::npos ? 1 : 0;
    return n;
  }
  // Prints the log lines to stderr (the child's output, shown when its test fails).
  void print_logs() const {
    for (const auto& [lv, t] : rec.logs) std::fprintf(stderr, "  log: %s\n", t.c_str());
  }

  recorder rec;  // before ch: the channel's callbacks point into it
  stream_channel ch;
  listener_id l;
};

// Runs scenario(c) (c: a child_channel on loop), then closes the channel and runs the loop until
// every handle is closed; the scenario's code (0: all well).
template <class Scenario>
int with_child_channel(uv_loop_t* loop, Scenario&& scenario) {
  int rc = 0;
  {
    child_channel c(loop);
    rc = scenario(c);
    c.ch.close();
  }
  uv_run(loop, UV_RUN_DEFAULT);
  return rc;
}

// A loop plus helpers; the loop is checked to be empty (every handle closed) at the end.
class stream_fixture : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    channels_.clear();
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "a handle was left open";
  }

  stream_channel* make_channel(recorder* rec, const stream_config& cfg = {}) {
    channels_.push_back(std::make_unique<stream_channel>(&loop_, cfg, rec->callbacks()));
    return channels_.back().get();
  }

  template <class Pred>
  bool run(Pred&& pred, std::chrono::milliseconds deadline = std::chrono::milliseconds(20000)) {
    return run_until(&loop_, std::forward<Pred>(pred), deadline);
  }

  uv_loop_t loop_{};
  std::vector<std::unique_ptr<stream_channel>> channels_;
};

}  // namespace uvbus::test
