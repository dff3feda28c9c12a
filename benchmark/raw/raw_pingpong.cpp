// The round-trip floors (tcp-pingpong, unix-pingpong, shm-pingpong): one message in flight, echoed
// back; blocking read()/write() with TCP_NODELAY, or two shared-memory rings published at once and
// busy-polled. Every round trip is timed; exact percentiles of all of them.
//
// Under load (--load-rate R) the client also sends R messages a second of the ping's size on the
// same link, which the echo side drops (their first 8 bytes are kLoadSeq), as the uvbus ping-pong
// benchmarks do: over sockets the messages due are written together once a millisecond (a game
// server's tick), at most kLoadBurstBytes a tick; over shm the records due are written before each
// ping and between polls, and a full ring drops the rest of them.
#include <sys/mman.h>
#include <sys/socket.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <vector>

#include "raw/raw_common.h"
#include "raw/raw_ring.h"

namespace uvbus::raw {

namespace {

constexpr size_t kPingRing = 1u << 20;
constexpr uint64_t kLoadSeq = bench::kEndSeq - 1;
constexpr size_t kLoadBurstBytes = size_t{2} << 20;  // the uvbus stream queue's default size
constexpr uint64_t kTickNs = 1000000;

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

// The background load: how many messages are due, sent, dropped (no room), since when.
struct load_pacer {
  double rate = 0;
  uint64_t t0 = 0, last = 0, sent = 0, dropped = 0;
  uint64_t due(uint64_t now) {
    if (t0 == 0) t0 = now;
    last = now;
    return static_cast<uint64_t>(static_cast<double>(now - t0) * 1e-9 * rate);
  }
  [[nodiscard]] double achieved() const {
    return last > t0 ? static_cast<double>(sent) / (static_cast<double>(last - t0) * 1e-9) : 0;
  }
};

// Sends one message and waits for its echo; false when the link broke.
class transport {
 public:
  explicit transport(double load_rate) { load.rate = load_rate; }
  virtual ~transport() = default;
  virtual bool round_trip(const uint8_t* msg, uint8_t* echo, size_t n) = 0;
  load_pacer load;
};

class socket_transport : public transport {
 public:
  socket_transport(int fd, double load_rate) : transport(load_rate), fd_(fd) {}
  bool round_trip(const uint8_t* msg, uint8_t* echo, size_t n) override {
    return send_load(n) && write_all(fd_, msg, n) && read_all(fd_, echo, n);
  }

 private:
  // Once a millisecond: every load message due, in one write.
  bool send_load(size_t n) {
    if (load.rate <= 0) return true;
    const uint64_t now = now_ns();
    if (now < next_tick_) return true;
    next_tick_ = now + kTickNs;
    const uint64_t due = load.due(now);
    const size_t k = std::min<uint64_t>(due - load.sent, kLoadBurstBytes / n);
    load.dropped += due - load.sent - k;
    load.sent = due;
    if (k == 0) return true;
    if (burst_.size() < k * n) {  // more load messages than ever before: mark the new ones
      const size_t had = burst_.size() / n;
      burst_.resize(k * n);
      for (size_t i = had; i < k; ++i) bench::put_le64(burst_.data() + i * n, kLoadSeq);
    }
    return write_all(fd_, burst_.data(), k * n);
  }
  int fd_;
  uint64_t next_tick_ = 0;
  std::vector<uint8_t> burst_;
};

class shm_transport : public transport {
 public:
  shm_transport(shm_pipe out, shm_pipe in, double load_rate)
      : transport(load_rate), w_(out.writer()), r_(in.reader()) {}
  bool round_trip(const uint8_t* msg, uint8_t* echo, size_t n) override {
    send_load(n);
    std::memcpy(w_.reserve(n) + 8, msg, n);
    w_.commit(n);
    size_t got = 0;
    while (got == 0) {
      got = r_.poll([&](const uint8_t* rec, size_t len) {
        std::memcpy(echo, rec + 8, std::min(len, n));
        return true;
      });
      if (got == 0) {
        send_load(n);
        cpu_relax();
      }
    }
    return true;
  }

 private:
  void send_load(size_t n) {
    if (load.rate <= 0) return;
    const uint64_t due = load.due(now_ns());
    for (; load.sent < due; ++load.sent) {
      uint8_t* rec = w_.try_reserve(n);
      if (rec == nullptr) {
        load.dropped += due - load.sent;
        load.sent = due;
        return;
      }
      bench::put_le64(rec + 8, kLoadSeq);
      w_.commit(n);
    }
  }
  ring_writer w_;
  ring_reader r_;
};

// The echo side: returns messages as they come, drops the load, until the end message (first 8
// bytes all ones). Reads as much as there is, so a tick's load costs a few reads, not one each.
int serve_socket(int fd, size_t n) {
  std::vector<uint8_t> buf(std::max<size_t>(n, size_t{64} << 10) + n);
  size_t have = 0;
  for (;;) {
    const ssize_t r = read(fd, buf.data() + have, buf.size() - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 1;
    have += static_cast<size_t>(r);
    size_t off = 0;
    for (; have - off >= n; off += n) {
      const uint64_t seq = bench::get_le64(buf.data() + off);
      if (seq == kLoadSeq) continue;
      if (!write_all(fd, buf.data() + off, n)) return 1;
      if (seq == bench::kEndSeq) return 0;
    }
    std::memmove(buf.data(), buf.data() + off, have - off);
    have -= off;
  }
}

int serve_shm(shm_pipe in, shm_pipe out) {
  ring_reader r = in.reader();
  ring_writer w = out.writer();
  bool done = false;
  while (!done) {
    const size_t got = r.poll([&](const uint8_t* rec, size_t len) {
      if (bench::get_le64(rec + 8) == kLoadSeq) return true;
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
              R"("p90_us":%.3f,"p99_us":%.3f,"p999_us":%.3f,"max_us":%.3f,"load_rate":%.0f,)"
              R"("load_achieved":%.0f,"load_dropped":%)" PRIu64 R"(,"mismatches":%)" PRIu64
              R"(,"verified":%s})"
              "\n",
              s.name.c_str(), s.size, rtt.size(), at(0), at(0.5), at(0.9), at(0.99), at(0.999),
              static_cast<double>(rtt.back()) / 1e3, t.load.rate, t.load.achieved(), t.load.dropped,
              mismatches, mismatches == 0 ? "true" : "false");
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
  socket_transport t(fd, s.load_rate);
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
  shm_transport t(to_server, to_client, s.load_rate);
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
