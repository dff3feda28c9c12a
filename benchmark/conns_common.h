// uvbus_bench_conns: what the receiver (bench_conns.cpp) and its client processes
// (conns_client.cpp) share: the run's plan, and the clients' entry point.
#pragma once

#include <cstddef>

namespace uvbus::bench::conns {

struct plan {
  size_t conns = 1000;
  double rate = 1;  // messages per second per connection
  double seconds = 10;
  int procs = 4;
  bool unix_sock = false;
  bool echo = false;
  int loops = 1;  // receiver loop threads (TCP: one channel each on one port)
  size_t min = 64;
  size_t max = 320;
};

// A client process's work: `count` connections, global indexes [first, first + count), driven by
// the receiver through the control pipe ctl_fd (the URL line, 'g', 'q'; EOF: disconnect and
// exit). Returns the process's exit code.
int run_client(const plan& p, size_t first, size_t count, int ctl_fd);

}  // namespace uvbus::bench::conns
