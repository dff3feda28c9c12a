// Shared pieces of the uvbus sender/receiver benchmarks:
//
//   <binary> URL [--min BYTES] [--max BYTES] [--seconds S] [other --flags]
//
// Payload format (every channel): bytes [0,8) the sequence number (little endian), bytes [8,16)
// the writer id (little endian, 0 for a single sender), the rest a slice of a pseudo-random pool
// that every process generates identically, at an offset derived from the sequence number
// (fill_body); the size is uniform in [min, max] and also derived from the sequence number, so the
// receiver can check size and every byte without any shared state. Payloads shorter than 16 bytes
// carry as much of the header as fits (min must be >= 8).
// The end of a run is a message with seq = kEndSeq whose bytes [16,24) hold the count sent.
//
// The receiver prints one line per second to stdout:
//   [recv] t=3 msgs/s=2512345 MB/s=170.3 cpu%=98 rss_kib=5120
// and a final JSON line starting with {"bench":...} (see json_line()). Every sender and receiver
// also reports cpu_ns_per_msg: user + system CPU (getrusage) over the measured interval divided by
// the messages of that interval -- the per-message budget a game server pays (cpu_counter).
#pragma once

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "uvbus/histogram.h"
#include "uvbus/tls.h"

namespace uvbus::bench {

inline constexpr uint64_t kEndSeq = ~uint64_t{0};

struct options {
  std::string url;
  size_t min = 8;
  size_t max = 128;
  double seconds = 10;
  std::map<std::string, std::string> extra;  // any other --key value, or --flag (value "1")

  // Accepts `URL --key value ... --flag`. A flag is a --key followed by another --key or nothing.
  static options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        o.url = a;
        continue;
      }
      std::string key = a.substr(2);
      std::string val = "1";
      if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) val = argv[++i];
      if (key == "min") {
        o.min = std::strtoull(val.c_str(), nullptr, 10);
      } else if (key == "max") {
        o.max = std::strtoull(val.c_str(), nullptr, 10);
      } else if (key == "seconds") {
        o.seconds = std::strtod(val.c_str(), nullptr);
      } else {
        o.extra[key] = val;
      }
    }
    if (o.min < 8) o.min = 8;
    if (o.max < o.min) o.max = o.min;
    return o;
  }
  bool flag(const std::string& k) const { return extra.count(k) != 0; }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = extra.find(k);
    return it == extra.end() ? def : it->second;
  }
  long get_int(const std::string& k, long def) const {
    auto it = extra.find(k);
    return it == extra.end() ? def : std::strtol(it->second.c_str(), nullptr, 10);
  }
};

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline void put_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t get_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Size of message `seq` of writer `writer`, uniform in [min, max].
inline size_t payload_size(uint64_t seq, uint64_t writer, size_t min, size_t max) {
  if (min == max) return min;
  // Multiply-shift instead of a 64-bit modulo (a division costs ~25 cycles per message).
  const uint64_t r = mix64(seq ^ (writer << 48)) >> 32;
  return min + static_cast<size_t>((r * (max - min + 1)) >> 32);
}

// The body of every payload (bytes [16, n)) is a slice of one pool of pseudo-random bytes, the
// same in every process, at an offset derived from the sequence number: generating it is one
// memcpy and checking it one memcmp, so the harness stays far cheaper than the channel measured
// (a word-by-word generator cost the raw shm ring a third of its small-message rate).
inline constexpr size_t kPoolSpan = size_t{1} << 20;  // offsets in [0, 1 MiB)

inline std::vector<uint8_t> make_pool() {
  std::vector<uint8_t> p(2 * kPoolSpan);
  for (size_t i = 0; i < p.size(); i += 8) {
    const uint64_t r = mix64(i ^ 0x5EED5EEDull);
    std::memcpy(&p[i], &r, 8);
  }
  return p;
}
inline const std::vector<uint8_t> g_payload_pool = make_pool();

inline size_t pool_offset(uint64_t seq) {
  return static_cast<size_t>(mix64(seq) >> 44);
}

[[gnu::always_inline]] inline void fill_body(uint8_t* p, size_t n, uint64_t seq) {
  const uint8_t* src = g_payload_pool.data() + pool_offset(seq);
  for (size_t i = 16; i < n; i += kPoolSpan) std::memcpy(p + i, src, std::min(n - i, kPoolSpan));
}

// The first min(n, 16) bytes of message `seq` of `writer`: its sequence number and writer id.
[[gnu::always_inline]] inline void put_head(uint8_t* out, size_t n, uint64_t seq, uint64_t writer) {
  if (n >= 16) {
    // Two 8-byte stores (little-endian hosts, as verify_payload). A copy of min(n, 16) bytes from
    // a stack buffer read it back with loads at the destination's misalignment, and each load that
    // straddled two of the buffer's stores waited for them to reach the cache (store-to-load
    // forwarding fails): 31 % of the stream sender's loop samples went to that copy.
    std::memcpy(out, &seq, 8);
    std::memcpy(out + 8, &writer, 8);
    return;
  }
  uint8_t head[16];
  put_le64(head, seq);
  put_le64(head + 8, writer);
  std::memcpy(out, head, n);
}

// Writes message `seq` of `writer` into out (room for max bytes); returns its size. Always
// inline: a benchmark that calls it from several places would otherwise get an out-of-line copy
// in some of its modes (about 45 instructions a message more) and compare modes unfairly.
[[gnu::always_inline]] inline size_t make_payload(uint64_t seq, uint64_t writer, size_t min,
                                                  size_t max, uint8_t* out) {
  const size_t n = payload_size(seq, writer, min, max);
  put_head(out, n, seq, writer);
  fill_body(out, n, seq);
  return n;
}

// The end-of-run message: seq = kEndSeq, writer, count sent. 24 bytes.
inline size_t make_end(uint64_t writer, uint64_t count, uint8_t* out) {
  put_le64(out, kEndSeq);
  put_le64(out + 8, writer);
  put_le64(out + 16, count);
  return 24;
}

// Checks one received payload against what writer `writer` sends as message `seq`.
inline bool verify_payload(const uint8_t* p, size_t n, uint64_t seq, uint64_t writer, size_t min,
                           size_t max) {
  if (n != payload_size(seq, writer, min, max)) return false;
  if (n >= 16) {  // two word compares: a memcmp call here cost ~9 % of a raw shm receiver
    uint64_t head[2];
    std::memcpy(head, p, 16);
    if (head[0] != seq || head[1] != writer) return false;  // little-endian hosts
  } else {
    uint8_t want[16];
    put_le64(want, seq);
    put_le64(want + 8, writer);
    if (std::memcmp(p, want, n) != 0) return false;
  }
  const uint8_t* src = g_payload_pool.data() + pool_offset(seq);
  for (size_t i = 16; i < n; i += kPoolSpan) {
    if (std::memcmp(p + i, src, std::min(n - i, kPoolSpan)) != 0) return false;
  }
  return true;
}

inline double mono_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
// User + system CPU seconds from getrusage: who = RUSAGE_SELF (the process) or RUSAGE_THREAD (the
// calling thread, for benchmarks that run several roles in one process).
inline double rusage_cpu(int who = RUSAGE_SELF) {
  rusage ru{};
  if (getrusage(who, &ru) != 0) return 0;
  const auto sec = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
  };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// CPU nanoseconds per message over an interval: start() when it begins, ns_per_msg(n) at its end.
// With RUSAGE_THREAD, both calls must come from the thread being measured.
class cpu_counter {
 public:
  explicit cpu_counter(int who = RUSAGE_SELF) : who_(who) { start(); }
  void start() { c0_ = rusage_cpu(who_); }
  double seconds() const { return rusage_cpu(who_) - c0_; }
  double ns_per_msg(uint64_t msgs) const {
    return msgs == 0 ? 0 : seconds() * 1e9 / static_cast<double>(msgs);
  }

 private:
  int who_;
  double c0_ = 0;
};

inline long rss_kib() {
  // Current RSS from /proc (max RSS from getrusage would hide a leak's shape).
  FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0;
  long resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * 4;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Per-second reporting at the receiver. Call tick() often (e.g. from a 100 ms timer or after each
// batch); it prints a line whenever a second has passed. msgs()/bytes() are the totals so far.
class meter {
 public:
  explicit meter(const char* tag) : tag_(tag) { reset_clock(); }

  void reset_clock() {
    t0_ = last_t_ = mono_now();
    c0_ = last_c_ = cpu_now();
    ru_.start();
    msgs0_ = msgs_;
  }
  void add(size_t bytes) {
    ++msgs_;
    bytes_ += bytes;
  }
  void tick() {
    const double now = mono_now();
    if (now - last_t_ < 1.0) return;
    const double dt = now - last_t_;
    const double c = cpu_now();
    const double mps = static_cast<double>(msgs_ - last_msgs_) / dt;
    const double mbps = static_cast<double>(bytes_ - last_bytes_) / dt / 1e6;
    const double cpu = (c - last_c_) / dt * 100;
    ++second_;
    std::printf("[%s] t=%d msgs/s=%.0f MB/s=%.1f cpu%%=%.0f rss_kib=%ld\n", tag_, second_, mps,
                mbps, cpu, rss_kib());
    std::fflush(stdout);
    if (msgs_ != last_msgs_) {  // idle seconds (before the first message) are not samples
      per_sec_msgs_.push_back(mps);
      per_sec_mb_.push_back(mbps);
      per_sec_cpu_.push_back(cpu);
    }
    last_t_ = now;
    last_c_ = c;
    last_msgs_ = msgs_;
    last_bytes_ = bytes_;
  }

  uint64_t msgs() const { return msgs_; }
  uint64_t bytes() const { return bytes_; }
  double elapsed() const { return mono_now() - t0_; }
  double cpu_pct() const { return (cpu_now() - c0_) / std::max(elapsed(), 1e-9) * 100; }
  // User + system CPU (getrusage) since reset_clock(), per message received since then.
  double cpu_ns_per_msg() const { return ru_.ns_per_msg(msgs_ - msgs0_); }
  // Median of the per-second samples, first sample dropped (warm-up) when there are 3 or more.
  double median_msgs() const { return med(per_sec_msgs_); }
  double median_mb() const { return med(per_sec_mb_); }
  double median_cpu() const { return med(per_sec_cpu_); }

 private:
  static double med(const std::vector<double>& v) {
    if (v.size() >= 3) return median(std::vector<double>(v.begin() + 1, v.end()));
    return median(v);
  }
  const char* tag_;
  int second_ = 0;
  uint64_t msgs_ = 0, bytes_ = 0, last_msgs_ = 0, last_bytes_ = 0, msgs0_ = 0;
  cpu_counter ru_;
  double t0_ = 0, last_t_ = 0, c0_ = 0, last_c_ = 0;
  std::vector<double> per_sec_msgs_, per_sec_mb_, per_sec_cpu_;
};

// The receiving end of one sender (writer 0), in order: checks every payload's size, sequence
// number and bytes, counts it in m, and checks the end message's count.
struct seq_receiver {
  meter m{"recv"};
  uint64_t next_seq = 0;
  uint64_t errors = 0;
  uint64_t end_count = 0;  // what the end message said was sent
  bool got_end = false;
  bool started = false;  // a payload came (m's clock starts at the first)

  // Takes one message; true if it is the run's first payload (the caller may start a deadline).
  [[gnu::always_inline]] inline bool take(const uint8_t* p, size_t n, size_t min, size_t max) {
    if (n >= 8 && get_le64(p) == kEndSeq) {
      got_end = true;
      end_count = n >= 24 ? get_le64(p + 16) : 0;
      if (n < 24 || end_count != next_seq) ++errors;
      return false;
    }
    const bool first = !started;
    if (first) {
      started = true;
      m.reset_clock();
    }
    if (!verify_payload(p, n, next_seq, 0, min, max)) {
      if (errors < 5) {
        std::fprintf(stderr, "recv: payload %llu (%zu bytes) is wrong\n",
                     static_cast<unsigned long long>(next_seq), n);
      }
      ++errors;
    }
    ++next_seq;
    m.add(n);
    return first;
  }
};

// The final machine-readable line. extra_json is spliced in as-is (e.g. ",\"writers\":2").
inline void json_line(const char* bench, const options& o, const meter& m, uint64_t errors,
                      const std::string& extra_json = "") {
  std::printf(
      "{\"bench\":\"%s\",\"url\":\"%s\",\"min\":%zu,\"max\":%zu,\"seconds\":%.1f,"
      "\"msgs\":%" PRIu64 ",\"bytes\":%" PRIu64
      ",\"msgs_per_s\":%.0f,\"mb_per_s\":%.1f,\"cpu_pct\":%.0f,\"cpu_ns_per_msg\":%.1f,"
      "\"rss_kib\":%ld,\"errors\":%" PRIu64 "%s}\n",
      bench, o.url.c_str(), o.min, o.max, o.seconds, m.msgs(), m.bytes(), m.median_msgs(),
      m.median_mb(), m.median_cpu(), m.cpu_ns_per_msg(), rss_kib(), errors, extra_json.c_str());
  std::fflush(stdout);
}

// Latency samples: the library's latency_histogram (log-linear, within 1/32 of the exact value,
// constant memory however many samples) behind the benchmarks' names.
class histogram {
 public:
  void add(uint64_t ns) { h_.record(ns); }
  uint64_t count() const { return h_.count(); }
  uint64_t max() const { return h_.max(); }
  // The q-quantile (0 < q <= 1), in ns.
  uint64_t quantile(double q) const { return h_.value_at_percentile(q * 100.0); }
  void merge(const histogram& other) { h_.merge(other.h_); }

 private:
  uvbus::latency_histogram h_;
};

// --ready FILE: the URL a peer must use, written atomically (a temp file renamed; the runner waits
// for the file). True if done (or no file was asked for).
inline bool write_ready(const std::string& ready, const std::string& url) {
  if (ready.empty()) return true;
  const std::string tmp = ready + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr || std::fprintf(f, "%s\n", url.c_str()) < 0 || std::fclose(f) != 0 ||
      std::rename(tmp.c_str(), ready.c_str()) != 0) {
    std::perror("--ready");
    return false;
  }
  return true;
}

// Reads a forked server's first line (its URL, or "ERROR ...") from the pipe, without the
// newline, and closes the pipe.
inline std::string read_server_url(int fd) {
  char buf[512] = {};
  size_t got = 0;
  while (got < sizeof buf - 1) {
    const ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
    if (buf[got - 1] == '\n') break;
  }
  close(fd);
  std::string url(buf, got);
  while (!url.empty() && url.back() == '\n') url.pop_back();
  return url;
}

// A forked server's side of the pipe: writes `line` (its URL, or "ERROR ...") and a newline, and
// closes the pipe. False if the write failed.
inline bool tell_parent(int fd, std::string line) {
  line += '\n';
  const bool ok = write(fd, line.data(), line.size()) >= 0;
  close(fd);
  return ok;
}

// Pins the calling process to one CPU (cpu < 0: leaves it where it is).
inline void pin_cpu(long cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<int>(cpu), &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) std::perror("sched_setaffinity");
}

inline uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A server process forked by a round-trip benchmark, and the URL it listens on.
struct forked_server {
  pid_t pid = -1;
  std::string url;  // empty if the server failed (then it has been reaped)
};

// Forks `serve(int ready_fd)` as a server process pinned to --server-cpu (default 1), whose exit
// status is what it returns; it must tell_parent() its URL. Pins the caller to --client-cpu
// (default 0) and reads the URL; on failure prints "<tag>: server failed: ..." and reaps it.
template <class Serve>
forked_server fork_server(const options& o, const char* tag, Serve&& serve) {
  forked_server s;
  int fds[2];
  if (pipe(fds) != 0) return s;
  s.pid = fork();
  if (s.pid == 0) {
    close(fds[0]);
    pin_cpu(o.get_int("server-cpu", 1));
    _exit(serve(fds[1]));
  }
  close(fds[1]);
  pin_cpu(o.get_int("client-cpu", 0));
  s.url = read_server_url(fds[0]);
  if (s.url.empty() || s.url.rfind("ERROR", 0) == 0) {
    std::fprintf(stderr, "%s: server failed: %s\n", tag, s.url.c_str());
    if (s.pid > 0) {
      kill(s.pid, SIGKILL);
      waitpid(s.pid, nullptr, 0);
    }
    s.url.clear();
  }
  return s;
}

// --tls [TOKEN]: TLS 1.3 in PSK mode (a fixed benchmark token when none is given).
inline tls_config psk_tls(const std::string& token) {
  tls_config t;
  t.mode = tls_mode::psk;
  t.psk_token = token == "1" ? "uvbus-benchmark-token-0001" : token;
  return t;
}

}  // namespace uvbus::bench
