// The stream channel under operating-system limits: a listener and dials out of descriptors
// (RLIMIT_NOFILE lowered in a forked child, so no other test is disturbed).
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
#include <vector>

#include "stream/stream_harness.h"

namespace uvbus::test {
namespace {

constexpr uint64_t kDeadlineMs = 20000;  // generous for ASan: a deadline, never a speed claim

// Lowers the soft RLIMIT_NOFILE to the lowest free descriptor: no new one can be made until
// restore(). The old limit into *old.
bool exhaust_descriptors(rlimit* old) {
  getrlimit(RLIMIT_NOFILE, old);
  const int lowest_free = ::dup(0);
  ::close(lowest_free);
  rlimit low = *old;
  low.rlim_cur = static_cast<rlim_t>(lowest_free);
  return setrlimit(RLIMIT_NOFILE, &low) == 0;
}

// True once the peer closed fd (EOF or reset); what arrived is dropped.
bool peer_closed(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

// Runs the loop one iteration at a time for about ms (a timer ends the window); the iterations.
uint64_t iterations_in(uv_loop_t* loop, uint64_t ms) {
  uv_timer_t t;
  bool fired = false;
  uv_timer_init(loop, &t);
  t.data = &fired;
  uv_timer_start(&t, [](uv_timer_t* h) { *static_cast<bool*>(h->data) = true; }, ms, 0);
  uint64_t n = 0;
  while (!fired) {
    uv_run(loop, UV_RUN_ONCE);
    ++n;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&t), nullptr);
  uv_run(loop, UV_RUN_NOWAIT);
  return n;
}

template <class Pred>
bool run_for(uv_loop_t* loop, Pred pred) {
  const uint64_t until = uv_now(loop) + kDeadlineMs;
  while (!pred()) {
    if (uv_now(loop) > until) return false;
    uv_run(loop, UV_RUN_ONCE);
  }
  return true;
}

// Runs body(loop) in a forked child; its exit code (0: all well), or -1 if it died.
int in_child(int (*body)(uv_loop_t*)) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    const int rc = body(&loop);
    std::fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int listener_out_of_descriptors(uv_loop_t* loop) {
  recorder rec;
  std::vector<std::string> logs;
  stream_callbacks cb = rec.callbacks();
  cb.on_log = [&](log_level, const std::string& text) { logs.push_back(text); };
  int rc = 0;
  {
    stream_channel ch(loop, stream_config{}, cb);
    listener_id l;
    if (ch.listen("ipv4://127.0.0.1:0", &l) != errc::ok) return 10;
    const int client = dial(ch.listener_port(l));
    if (client < 0) return 11;
    rlimit old{};
    if (!exhaust_descriptors(&old)) return 12;
    const uint64_t spins = iterations_in(loop, 500);
    const bool closed = run_for(loop, [&] { return peer_closed(client); });
    setrlimit(RLIMIT_NOFILE, &old);
    std::fprintf(stderr, "iterations %llu, waiting client closed %d, accepted %zu, logs %zu\n",
                 static_cast<unsigned long long>(spins), closed ? 1 : 0, rec.accepted.size(),
                 logs.size());
    for (const auto& s : logs) std::fprintf(stderr, "  log: %s\n", s.c_str());
    if (spins > 200) rc = 2;
    if (!closed && rc == 0) rc = 3;
    ::close(client);
    const int again = dial(ch.listener_port(l));
    if (!run_for(loop, [&] { return !rec.accepted.empty(); }) && rc == 0) rc = 5;
    ::close(again);
    ch.close();
  }
  uv_run(loop, UV_RUN_DEFAULT);
  return rc;
}

// libuv (uv__emfile_trick) takes the waiting clients off the backlog and closes them with a
// descriptor it keeps in reserve; it does not tell the channel, so this is counted nowhere.
TEST(StreamLimits, AListenerOutOfDescriptorsShedsWaitingClientsAndRecovers) {
  // 2: the loop spun; 3: the waiting client hung; 5: no recovery.
  EXPECT_EQ(in_child(listener_out_of_descriptors), 0);
}

int dials_out_of_descriptors(uv_loop_t* loop) {
  recorder rec;
  int rc = 0;
  {
    stream_channel ch(loop, stream_config{}, rec.callbacks());
    listener_id l;
    if (ch.listen("ipv4://127.0.0.1:0", &l) != errc::ok) return 10;
    const std::string port = std::to_string(ch.listener_port(l));
    rlimit old{};
    if (!exhaust_descriptors(&old)) return 12;
    connection_id lit, dns, uds;
    listener_id l2;
    const errc e0 = ch.listen("ipv4://127.0.0.1:0", &l2);
    const std::string d0 = ch.last_error().detail;
    const errc e1 = ch.connect("ipv4://127.0.0.1:" + port, &lit);
    const std::string d1 = ch.last_error().detail;
    const errc e2 = ch.connect("dns://127.0.0.1:" + port, &dns);
    const errc e3 = ch.connect("unix:///tmp/uvbus-limits-none.sock", &uds);
    const bool ended = run_for(loop, [&] { return rec.connected.size() == 2; });
    setrlimit(RLIMIT_NOFILE, &old);
    std::fprintf(stderr, "listen: %s (%s)\nliteral: %s (%s)\n", to_string(e0), d0.c_str(),
                 to_string(e1), d1.c_str());
    for (const auto& [id, st] : rec.connected) {
      std::fprintf(stderr, "  on_connected %llu: %s\n", static_cast<unsigned long long>(id),
                   to_string(st));
    }
    // Refused at once, the detail naming the system's reason.
    if (e0 == errc::ok || d0.find("too many open files") == std::string::npos) rc = 2;
    if (e1 != errc::io_error || d1.find("too many open files") == std::string::npos) rc = 3;
    // Failing from the loop, with the system error (not a caller error such as invalid_argument).
    if (e2 != errc::ok || e3 != errc::ok || !ended) return 4;
    if (rec.connected[dns.value] != errc::io_error) rc = 5;
    if (rec.connected[uds.value] != errc::io_error) rc = 6;
    ch.close();
  }
  uv_run(loop, UV_RUN_DEFAULT);
  return rc;
}

TEST(StreamLimits, ListenAndDialsOutOfDescriptorsFailWithTheReason) {
  // 2: listen's detail, 3: a literal connect's detail, 5: a dns dial's reason, 6: a unix dial's.
  EXPECT_EQ(in_child(dials_out_of_descriptors), 0);
}

}  // namespace
}  // namespace uvbus::test
