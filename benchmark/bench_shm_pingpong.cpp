// Shared-memory round-trip latency over two rings:
//
//   uvbus_bench_shm_pingpong shm://NAME [--size 64] [--round-trips N] [--warmup N]
//                            [--client-cpu C] [--server-cpu S] [--uv] [--spin-us US]
//                            [--load-rate R]
//
// Forks an echo server. Each side creates the ring it reads (NAME-c2s at the server, NAME-s2c at
// the client) and writes into the other. One message in flight; every round trip is timed with
// CLOCK_MONOTONIC and kept in a histogram (p50/p90/p99/p99.9/max in µs). By default both sides
// busy-poll shm_reader::poll (the "users who poll" path); --uv runs both sides' readers on a libuv
// loop (spin, then futex sleep + uv_async wake-up), which is what a uvbus node does.
//
// --load-rate R (busy-poll mode): latency under load. The client also writes R records a second of
// the same size into the same ring, paced between polls; they start with 8 bytes of 0xFF (a ping
// starts with its send time, never that) and the server drops them. The JSON line adds the load
// achieved.
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "uvbus/shm.h"

using namespace uvbus;
using namespace uvbus::bench;

namespace {

errc open_writer(shm_writer& w, const std::string& url) {
  errc e = errc::not_found;
  const double give_up = mono_now() + 10;
  while ((e = w.open(url)) != errc::ok && mono_now() < give_up) usleep(1000);
  return e;
}

void send_retry(shm_writer& w, const void* p, size_t n) {
  errc e;
  while ((e = w.send(p, n)) == errc::queue_full || e == errc::abandoned) __builtin_ia32_pause();
  if (e != errc::ok) {
    std::fprintf(stderr, "send: %s\n", to_string(e));
    _exit(1);
  }
}

struct side {
  shm_reader reader;
  shm_writer writer;
  std::vector<uint8_t> buf;
  uint64_t remaining = 0;  // client: round trips still to do
  uint64_t warmup = 0;
  uint64_t t_sent = 0;
  histogram hist;
  bool server = false;
  uv_loop_t* loop = nullptr;
  // Background load (--load-rate): records per second, written so far, since when (ns).
  double load_rate = 0;
  uint64_t load_sent = 0;
  uint64_t load_full = 0;
  uint64_t load_t0 = 0;
  std::vector<uint8_t> load_msg;
  double cpu0 = 0;  // client: getrusage at the first measured round trip, and at the last
  double cpu1 = 0;
};

// A background-load record: its first 8 bytes are all 0xFF.
bool is_load(const shm_record& r) {
  return r.size >= 8 && get_le64(r.data) == ~uint64_t{0};
}

// Writes the load records due by now (a full ring drops the rest of this turn's records).
void send_load(side* s) {
  const uint64_t now = mono_ns();
  if (s->load_t0 == 0) s->load_t0 = now;
  const auto due =
      static_cast<uint64_t>(static_cast<double>(now - s->load_t0) * 1e-9 * s->load_rate);
  while (s->load_sent < due) {
    const errc e = s->writer.send(s->load_msg.data(), s->load_msg.size());
    if (e != errc::ok) {
      ++s->load_full;
      s->load_sent = due;
      return;
    }
    ++s->load_sent;
  }
}

void client_send(side* s) {
  s->t_sent = mono_ns();
  std::memcpy(s->buf.data(), &s->t_sent, 8);
  send_retry(s->writer, s->buf.data(), s->buf.size());
}

// Server: echo every record. Client: time it and send the next one.
void on_records(void* user, const shm_record* recs, size_t n) {
  auto* s = static_cast<side*>(user);
  for (size_t i = 0; i < n; ++i) {
    if (s->server) {
      if (is_load(recs[i])) continue;  // background load: dropped
      send_retry(s->writer, recs[i].data, recs[i].size);
      if (recs[i].size == 1) s->reader.stop();  // the client's "quit"
      continue;
    }
    const uint64_t now = mono_ns();
    if (s->warmup > 0) {
      if (--s->warmup == 0) s->cpu0 = rusage_cpu();
    } else {
      s->hist.add(now - s->t_sent);
      --s->remaining;
    }
    if (s->remaining == 0) {
      s->cpu1 = rusage_cpu();
      s->reader.stop();
      return;
    }
    client_send(s);
  }
}

// The busy-polling client: one ping in flight, and the background load between polls.
void run_poll_client(side* s, double load_rate) {
  (void)s->reader.set_callbacks(
      {[s](const shm_record* recs, size_t n) { on_records(s, recs, n); }});
  client_send(s);
  s->load_rate = load_rate;
  s->load_msg.assign(s->buf.size(), 0xFF);
  if (s->load_rate > 0) {
    while (s->remaining > 0) {
      (void)s->reader.poll(64);
      send_load(s);
    }
  } else {
    while (s->remaining > 0) (void)s->reader.poll(64);
  }
}

int run_side(side& s, bool uv) {
  (void)s.reader.set_callbacks(
      {[&s](const shm_record* recs, size_t n) { on_records(&s, recs, n); }});
  if (!uv) {
    bool done = false;
    while (!done) {
      (void)s.reader.poll(64);
      done = s.server ? !s.reader.is_open() || s.remaining == 1 : s.remaining == 0;
    }
    return 0;
  }
  uv_loop_t loop;
  uv_loop_init(&loop);
  s.loop = &loop;
  if (s.reader.start(&loop) != errc::ok) return 1;
  if (!s.server) client_send(&s);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return 0;
}

void print_result(const std::string& url, bool uv, size_t size, const side& s) {
  auto us = [&](double q) { return static_cast<double>(s.hist.quantile(q)) / 1000.0; };
  std::printf("[pingpong] mode=%s size=%zu round_trips=%" PRIu64
              " p50=%.2fus p90=%.2fus p99=%.2fus p99.9=%.2fus max=%.2fus\n",
              uv ? "uv" : "poll", size, s.hist.count(), us(0.5), us(0.9), us(0.99), us(0.999),
              static_cast<double>(s.hist.max()) / 1000.0);
  std::printf(
      "{\"bench\":\"shm_pingpong\",\"url\":\"%s\",\"mode\":\"%s\",\"size\":%zu,"
      "\"round_trips\":%" PRIu64
      ",\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,"
      "\"max_us\":%.2f,\"load_rate\":%.0f,\"load_achieved\":%.0f,\"load_full\":%" PRIu64
      ",\"client_cpu_ns_per_rt\":%.0f}\n",
      url.c_str(), uv ? "uv" : "poll", size, s.hist.count(), us(0.5), us(0.9), us(0.99), us(0.999),
      static_cast<double>(s.hist.max()) / 1000.0, s.load_rate,
      s.load_t0 == 0
          ? 0.0
          : static_cast<double>(s.load_sent) / (static_cast<double>(mono_ns() - s.load_t0) * 1e-9),
      s.load_full,
      s.hist.count() > 0 ? (s.cpu1 - s.cpu0) * 1e9 / static_cast<double>(s.hist.count()) : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  const options o = options::parse(argc, argv);
  const auto size = static_cast<size_t>(std::max<long>(o.get_int("size", 64), 8));
  const auto trips = static_cast<uint64_t>(o.get_int("round-trips", 200000));
  const auto warm = static_cast<uint64_t>(o.get_int("warmup", 10000));
  const bool uv = o.flag("uv");
  shm_config cfg;
  cfg.ring_bytes = 1 << 20;
  cfg.spin_us = static_cast<uint32_t>(o.get_int("spin-us", 50));
  const std::string c2s = o.url + "-c2s", s2c = o.url + "-s2c";

  const pid_t pid = fork();
  if (pid == 0) {  // echo server
    pin_cpu(o.get_int("server-cpu", 1));
    side s;
    s.server = true;
    if (s.reader.open(c2s, cfg) != errc::ok || open_writer(s.writer, s2c) != errc::ok) _exit(1);
    if (!uv) {
      // Poll until the client's 1-byte quit message has been echoed.
      struct ctx {
        side* s;
        bool quit = false;
      } cx{&s};
      (void)s.reader.set_callbacks({[&cx](const shm_record* r, size_t n) {
        for (size_t i = 0; i < n; ++i) {
          if (is_load(r[i])) continue;  // background load: dropped
          send_retry(cx.s->writer, r[i].data, r[i].size);
          if (r[i].size == 1) cx.quit = true;
        }
      }});
      while (!cx.quit) (void)s.reader.poll(64);
    } else {
      run_side(s, true);
    }
    s.writer.close();
    s.reader.close();
    _exit(0);
  }
  pin_cpu(o.get_int("client-cpu", 0));
  side s;
  s.buf.assign(size, 0xab);
  s.remaining = trips;
  s.warmup = warm;
  if (warm == 0) s.cpu0 = rusage_cpu();
  if (const errc e = s.reader.open(s2c, cfg); e != errc::ok) {
    std::fprintf(stderr, "open %s: %s\n", s2c.c_str(), to_string(e));
    kill(pid, SIGKILL);
    return 1;
  }
  if (const errc e = open_writer(s.writer, c2s); e != errc::ok) {
    std::fprintf(stderr, "open %s: %s\n", c2s.c_str(), to_string(e));
    kill(pid, SIGKILL);
    return 1;
  }
  if (!uv) {
    run_poll_client(&s, std::strtod(o.get("load-rate", "0").c_str(), nullptr));
  } else {
    run_side(s, true);
  }
  const uint8_t quit = 0;
  send_retry(s.writer, &quit, 1);
  int st = 0;
  waitpid(pid, &st, 0);
  print_result(o.url, uv, size, s);
  s.writer.close();
  s.reader.close();
  return 0;
}
