// Helpers of the tests that run out of descriptors: a soft RLIMIT_NOFILE lowered to what is free,
// a forked child to do it in, the loop run until a condition or a deadline, the loop's iterations
// in a window (a busy loop shows as thousands), and a client socket read until the server answers
// or closes it.
#pragma once

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>

namespace uvbus::test {

// The lowest descriptor number free now (the next one open() or socket() returns).
inline int lowest_free_fd() {
  const int fd = ::dup(0);
  ::close(fd);
  return fd;
}

// Lowers the soft RLIMIT_NOFILE to the lowest free descriptor plus `spare`: only `spare` new
// descriptors can be made until *old is set back (setrlimit(RLIMIT_NOFILE, old)).
inline bool lower_nofile(rlimit* old, rlim_t spare = 0) {
  getrlimit(RLIMIT_NOFILE, old);
  rlimit low = *old;
  low.rlim_cur = static_cast<rlim_t>(lowest_free_fd()) + spare;
  return setrlimit(RLIMIT_NOFILE, &low) == 0;
}

// Runs body(loop) in a forked child with a loop of its own, so a lowered limit never touches
// another test; the child's exit code (0: all well), or -1 if it died (a signal: the alarm).
inline int in_child(int (*body)(uv_loop_t*)) {
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

// Runs the loop one turn at a time until pred() holds or 20 s of loop time pass (generous for
// ASan: a deadline, never a speed claim); pred(). It adds no timer: each turn waits for the next
// event (the scenario's alarm ends a turn that never does).
template <class Pred>
bool run_loop_until(uv_loop_t* loop, Pred pred) {
  constexpr uint64_t kDeadlineMs = 20000;
  const uint64_t until = uv_now(loop) + kDeadlineMs;
  while (!pred()) {
    if (uv_now(loop) > until) return false;
    uv_run(loop, UV_RUN_ONCE);
  }
  return true;
}

// Runs the loop one iteration at a time for about ms (a timer ends the window); the iterations.
inline uint64_t iterations_in(uv_loop_t* loop, uint64_t ms) {
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

// True once the peer closed fd (EOF or reset); what arrived is appended to *got (if given).
inline bool peer_closed(int fd, std::string* got = nullptr) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (got != nullptr) got->append(buf, static_cast<size_t>(n));
      continue;
    }
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

}  // namespace uvbus::test
