// The round-trip floors (tcp-pingpong, unix-pingpong, shm-pingpong): one message in flight, echoed
// back; blocking read()/write() with TCP_NODELAY, or two shared-memory rings published at once and
// busy-polled. Every round trip is timed; exact percentiles of all of them.
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <vector>

#include "raw/raw_common.h"
#include "raw/raw_ring.h"

namespace uvbus::raw {

namespace {

constexpr size_t kPingRing = 1u << 20;

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// One direction of the shm ping-pong: a ring whose writer publishes every record at once.
struct shm_pipe {
  ring_header* h;
  uint8_t* data;
  [[nodiscard]] ring_writer writer() const { return {h, data, kPingRing, 0}; }
  [[nodiscard]] ring_reader reader() const { return {h, data, kPingRing}; }
};

shm_pipe make_pipe(uint8_t* mem) {
  return {new (mem) ring_header(), mem + sizeof(ring_header)};
}

// Sends one message and waits for its echo; false when the echo differs or the link broke.
class transport {
 public:
  virtual ~transport() = default;
  virtual bool round_trip(const uint8_t* msg, uint8_t* echo, size_t n) = 0;
};

class socket_transport : public transport {
 public:
  explicit socket_transport(int fd) : fd_(fd) {}
  bool round_trip(const uint8_t* msg, uint8_t* echo, size_t n) override {
    return write_all(fd_, msg, n) && read_all(fd_, echo, n);
  }

 private:
  int fd_;
};

class shm_transport : public transport {
 public:
  shm_transport(shm_pipe out, shm_pipe in) : w_(out.writer()), r_(in.reader()) {}
  bool round_trip(const uint8_t* msg, uint8_t* echo, size_t n) override {
    std::memcpy(w_.reserve(n) + 8, msg, n);
    w_.commit(n);
    size_t got = 0;
    while (got == 0) {
      got = r_.poll([&](const uint8_t* rec, size_t len) {
        std::memcpy(echo, rec + 8, std::min(len, n));
        return true;
      });
      if (got == 0) cpu_relax();
    }
    return true;
  }

 private:
  ring_writer w_;
  ring_reader r_;
};

// The echo side: returns messages as they come until the end message (first 8 bytes all ones).
int serve_socket(int fd, size_t n) {
  std::vector<uint8_t> buf(n);
  while (read_all(fd, buf.data(), n)) {
    if (!write_all(fd, buf.data(), n)) return 1;
    if (bench::get_le64(buf.data()) == bench::kEndSeq) return 0;
  }
  return 1;
}

int serve_shm(shm_pipe in, shm_pipe out) {
  ring_reader r = in.reader();
  ring_writer w = out.writer();
  bool done = false;
  while (!done) {
    const size_t got = r.poll([&](const uint8_t* rec, size_t len) {
      std::memcpy(w.reserve(len) + 8, rec + 8, len);
      w.commit(len);
      done = bench::get_le64(rec + 8) == bench::kEndSeq;
      return true;
    });
    if (got == 0) cpu_relax();
  }
  return 0;
}

// Times every measured round trip; prints the JSON line; true if every echo matched.
bool client(const settings& s, transport& t) {
  std::vector<uint8_t> msg(s.size), echo(s.size);
  std::vector<uint64_t> rtt;
  rtt.reserve(s.round_trips);
  uint64_t mismatches = 0;
  const uint64_t total = s.warmup + s.round_trips;
  for (uint64_t i = 0; i < total; ++i) {
    bench::make_payload(i, 0, s.size, s.size, msg.data());
    const uint64_t t0 = now_ns();
    if (!t.round_trip(msg.data(), echo.data(), s.size)) return false;
    const uint64_t t1 = now_ns();
    if (std::memcmp(msg.data(), echo.data(), s.size) != 0) ++mismatches;
    if (i >= s.warmup) rtt.push_back(t1 - t0);
  }
  bench::put_le64(msg.data(), bench::kEndSeq);
  t.round_trip(msg.data(), echo.data(), s.size);
  std::sort(rtt.begin(), rtt.end());
  const auto at = [&](double q) {
    return static_cast<double>(rtt[std::min(
               rtt.size() - 1, static_cast<size_t>(q * static_cast<double>(rtt.size())))]) /
           1e3;
  };
  std::printf(R"({"raw":"%s","size":%zu,"round_trips":%zu,"min_us":%.3f,"p50_us":%.3f,)"
              R"("p90_us":%.3f,"p99_us":%.3f,"p999_us":%.3f,"max_us":%.3f,"mismatches":%)" PRIu64
              R"(,"verified":%s})"
              "\n",
              s.name.c_str(), s.size, rtt.size(), at(0), at(0.5), at(0.9), at(0.99), at(0.999),
              static_cast<double>(rtt.back()) / 1e3, mismatches,
              mismatches == 0 ? "true" : "false");
  std::fflush(stdout);
  return mismatches == 0;
}

int pingpong_socket(const settings& s, bool unix_socket) {
  char dir[] = "/tmp/uvbus-raw-XXXXXX";
  if (unix_socket && mkdtemp(dir) == nullptr) return 1;
  const std::string path = std::string(dir) + "/p.sock";
  std::string where;
  const int lfd = listen_for(s, unix_socket, path, &where);
  if (lfd < 0) return 1;
  int rfd = -1;
  const int pid = fork_child(
      s,
      [&](int) {
        const int fd = accept(lfd, nullptr, nullptr);
        return fd < 0 ? 1 : serve_socket(fd, s.size);
      },
      &rfd);
  if (pid < 0) return 1;
  const int fd = connect_to(s, unix_socket, where);
  socket_transport t(fd);
  const bool ok = fd >= 0 && client(s, t);
  const bool child_ok = wait_child(pid);
  close_case({fd, lfd, rfd}, unix_socket, path, dir);
  return ok && child_ok ? 0 : 1;
}

int pingpong_shm(const settings& s) {
  const size_t one = sizeof(ring_header) + kPingRing;
  auto* mem = static_cast<uint8_t*>(shared_map(2 * one));
  if (mem == nullptr) return 1;
  const shm_pipe to_server = make_pipe(mem), to_client = make_pipe(mem + one);
  int rfd = -1;
  const int pid = fork_child(
      s, [&](int) { return serve_shm(to_server, to_client); }, &rfd);
  if (pid < 0) return 1;
  shm_transport t(to_server, to_client);
  const bool ok = client(s, t);
  const bool child_ok = wait_child(pid);
  close(rfd);
  munmap(mem, 2 * one);
  return ok && child_ok ? 0 : 1;
}

}  // namespace

int run_pingpong(const settings& s, const std::string& mode) {
  if (mode == "shm") return pingpong_shm(s);
  return pingpong_socket(s, mode == "unix");
}

}  // namespace uvbus::raw
