// uvbus_raw_ceiling: the machine's raw ceilings that uvbus's benchmarks compare with, as the
// project's own small program: plain sockets and shared memory, no library, no event loop.
//
//   uvbus_raw_ceiling CASE [--dist small|large|fixed64] [--seconds S] [--host 127.0.0.1|::1]
//                     [--size 64] [--round-trips N] [--warmup N] [--publish-bytes 4096]
//                     [--send-cpu 0] [--recv-cpu 1] [--no-pin] [--corrupt SEQ] [--load-rate R]
//
// CASE: tcp-coalesced, unix-coalesced, shm-ring (each also with -hash), tcp-pingpong,
// unix-pingpong, shm-pingpong. Prints one JSON line ({"raw":CASE,...}); exits 1 when the run is not
// verified (a lost, reordered or corrupt message), 2 on bad arguments. --corrupt flips one bit of
// one message after it was hashed: the run must then fail (the self-test of the verification).
// Payloads are the uvbus benchmarks' own (bench_common.h): same sizes, same per-byte check.
// --load-rate R (ping-pong cases): the same link also carries R messages a second of the ping's
// size, which the echo side drops (the floor of latency under load; raw_pingpong.cpp).
#include <sys/socket.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "raw/raw_common.h"

namespace uvbus::raw {

void pin_to(const settings& s, int cpu) {
  if (!s.pin || sysconf(_SC_NPROCESSORS_ONLN) < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) std::perror("raw: sched_setaffinity");
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int fork_child(const settings& s, const std::function<int(int)>& fn, int* read_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fds[0]);
    pin_to(s, s.recv_cpu);
    const int rc = fn(fds[1]);
    close(fds[1]);
    std::fflush(stdout);
    _exit(rc);
  }
  close(fds[1]);
  pin_to(s, s.send_cpu);
  *read_fd = fds[0];
  return pid;
}

bool wait_child(int pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool print_throughput(const settings& s, uint64_t sent, double send_cpu_ns, const recv_report& r) {
  const bool ok = r.ok != 0 && r.errors == 0 && r.msgs == sent && r.announced == sent;
  std::string extra;
  if (s.name.rfind("tcp", 0) == 0) extra += R"(,"host":")" + s.host + "\"";
  if (s.name.rfind("shm", 0) == 0)
    extra += R"(,"publish_bytes":)" + std::to_string(s.publish_bytes);
  std::printf(
      R"({"raw":"%s","dist":"%s","min":%zu,"max":%zu,"seconds":%.1f%s,)"
      R"("msgs_per_s":%.0f,"mb_per_s":%.1f,"send_cpu_ns_per_msg":%.1f,"cpu_ns_per_msg":%.1f,)"
      R"("msgs":%)" PRIu64 R"(,"sent":%)" PRIu64 R"(,"errors":%)" PRIu64 R"(,"verified":%s})"
      "\n",
      s.name.c_str(), s.dist.c_str(), s.min, s.max, s.seconds, extra.c_str(), r.msgs_per_s,
      r.mb_per_s, send_cpu_ns, r.cpu_ns_per_msg, r.msgs, sent, r.errors, ok ? "true" : "false");
  std::fflush(stdout);
  return ok;
}

namespace {

bool set_dist(settings& s, const std::string& d) {
  s.dist = d;
  if (d == "small") {
    s.min = 8, s.max = 128;
  } else if (d == "large") {
    s.min = 8, s.max = 16384;
  } else if (d == "fixed64") {
    s.min = s.max = 64;
  } else {
    return false;
  }
  return true;
}

// Returns false (after saying which argument was wrong) on a bad command line.
bool parse(int argc, char** argv, settings* out) {
  const bench::options o = bench::options::parse(argc, argv);
  settings s;
  s.name = o.url;
  s.hash = s.name.size() > 5 && s.name.compare(s.name.size() - 5, 5, "-hash") == 0;
  if (!set_dist(s, o.get("dist", "small"))) {
    std::fprintf(stderr, "raw: --dist must be small, large or fixed64 (got '%s')\n",
                 o.get("dist").c_str());
    return false;
  }
  s.seconds = o.seconds;
  s.host = o.get("host", s.host);
  s.publish_bytes = static_cast<size_t>(o.get_int("publish-bytes", 4096));
  s.size = static_cast<size_t>(o.get_int("size", 64));
  s.round_trips = static_cast<uint64_t>(o.get_int("round-trips", 200000));
  s.warmup = static_cast<uint64_t>(o.get_int("warmup", 10000));
  s.send_cpu = static_cast<int>(o.get_int("send-cpu", 0));
  s.recv_cpu = static_cast<int>(o.get_int("recv-cpu", 1));
  s.pin = !o.flag("no-pin");
  s.load_rate = std::strtod(o.get("load-rate", "0").c_str(), nullptr);
  if (o.flag("corrupt")) s.corrupt_seq = static_cast<uint64_t>(o.get_int("corrupt", 0));
  if (s.seconds <= 0 || s.size < 16 || s.size > 65536 || s.round_trips == 0 ||
      !(s.load_rate >= 0)) {
    std::fprintf(stderr,
                 "raw: --seconds must be > 0, --size 16..65536, --round-trips > 0, "
                 "--load-rate >= 0\n");
    return false;
  }
  *out = s;
  return true;
}

}  // namespace
}  // namespace uvbus::raw

int main(int argc, char** argv) {
  using namespace uvbus::raw;
  settings s;
  if (!parse(argc, argv, &s)) return 2;
  signal(SIGPIPE, SIG_IGN);
  const std::string base = s.hash ? s.name.substr(0, s.name.size() - 5) : s.name;
  if (base == "tcp-coalesced") return run_stream(s, false);
  if (base == "unix-coalesced") return run_stream(s, true);
  if (base == "shm-ring") return run_shm_ring(s);
  if (!s.hash &&
      (s.name == "tcp-pingpong" || s.name == "unix-pingpong" || s.name == "shm-pingpong")) {
    return run_pingpong(s, s.name.substr(0, s.name.find('-')));
  }
  std::fprintf(stderr,
               "raw: unknown case '%s' (tcp-coalesced, unix-coalesced, shm-ring, each also -hash; "
               "tcp-pingpong, unix-pingpong, shm-pingpong)\n",
               s.name.c_str());
  return 2;
}
