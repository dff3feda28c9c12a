// Helpers shared by the test suites.
#pragma once

#include <uv.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>

namespace uvbus::test {

// Runs the loop until pred() holds or the deadline passes; returns pred(). Never sleeps: the loop
// blocks in epoll only until the next event or until a short timer fires to re-check the deadline.
template <class Pred>
bool run_until(uv_loop_t* loop, Pred&& pred,
               std::chrono::milliseconds deadline = std::chrono::milliseconds(10000)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  uv_timer_t tick;
  uv_timer_init(loop, &tick);
  // The tick wakes uv_run(UV_RUN_ONCE) so a deadline is noticed even when no I/O arrives.
  uv_timer_start(
      &tick, [](uv_timer_t*) {}, 10, 10);
  bool ok = pred();
  while (!ok && std::chrono::steady_clock::now() < end) {
    uv_run(loop, UV_RUN_ONCE);
    ok = pred();
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
  uv_run(loop, UV_RUN_NOWAIT);  // let the close callback run so `tick` can go out of scope
  return ok;
}

// First thing in a forked child that waits to be killed: it gets SIGKILL when the test process
// ends, however it ends. Otherwise a failed assertion before the test's kill() leaves the child
// alive, holding ctest's output pipe, and ctest waits for it until its timeout. `parent`: getpid()
// taken before the fork (a parent already gone by then ends the child at once).
inline void die_with_parent(pid_t parent) {
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
}

// Runs cmd with popen() (sh -c) and returns what it wrote to stdout.
inline std::string command_output(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

// A name unique to this process and test, for unix socket paths and shared-memory names.
inline std::string unique_name(const char* what) {
  static int counter = 0;
  char buf[128];
  std::snprintf(buf, sizeof buf, "uvbus-test-%s-%d-%d", what, static_cast<int>(getpid()),
                ++counter);
  return buf;
}

}  // namespace uvbus::test
