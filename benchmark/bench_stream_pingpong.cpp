// Stream channel round-trip latency:
//
//   uvbus_bench_stream_pingpong URL [--size 64] [--round-trips 200000] [--warmup 10000]
//                                   [--client-cpu 0] [--server-cpu 1] [--load-rate R]
//
// Forks an echo server (its own process and loop, pinned to --server-cpu) listening on URL (port
// 0 allowed); the client (pinned to --client-cpu) keeps one message in flight, times every round
// trip with CLOCK_MONOTONIC into a histogram and prints p50/p90/p99/p99.9/max in microseconds plus
// a JSON line. Both sides use the channel's defaults (TCP_NODELAY on).
//
// --load-rate R: latency under load. The client also sends R messages a second of the same size
// on the same connection (from a 1 ms timer: R/1000 per tick, what a game server's tick does);
// they start with the byte 'L' and the server drops them. The JSON line adds the load achieved.
#include <sys/wait.h>
#include <uv.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "uvbus/stream.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

int run_server(const std::string& url, int ready_fd) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  stream_channel* chp = nullptr;
  stream_callbacks cb;
  cb.on_received = [&chp](connection_id c, const uint8_t* p, size_t n) {
    if (n == 0 || p[0] != 'L') (void)chp->send(c, p, n);  // background load is dropped
  };
  cb.on_disconnected = [&chp](connection_id, errc) { chp->close(); };
  stream_channel ch(&loop, stream_config{}, cb);
  chp = &ch;
  listener_id l;
  const errc e = ch.listen(url, &l);
  if (!tell_parent(ready_fd,
                   e == errc::ok ? ch.listener_url(l) : std::string("ERROR ") + to_string(e)) ||
      e != errc::ok) {
    return 1;
  }
  while (!ch.closed()) uv_run(&loop, UV_RUN_ONCE);
  uv_run(&loop, UV_RUN_DEFAULT);
  return 0;
}

struct client {
  stream_channel* ch = nullptr;
  connection_id conn;
  std::vector<uint8_t> msg;
  long warmup = 0;
  long round_trips = 0;
  long done = 0;
  uint64_t t0 = 0;
  histogram h;
  double cpu0 = 0;  // getrusage at the first measured round trip, and at the last
  double cpu1 = 0;
  bool finished = false;
  bool failed = false;
  // Background load (--load-rate): messages per second, sent so far, since when, refused.
  double load_rate = 0;
  uint64_t load_sent = 0;
  uint64_t load_refused = 0;
  double load_t0 = 0;
  std::vector<uint8_t> load_msg;

  void send_load() {
    if (conn.value == 0 || finished) return;
    if (load_t0 == 0) load_t0 = mono_now();
    const auto due = static_cast<uint64_t>((mono_now() - load_t0) * load_rate);
    while (load_sent < due) {
      if (ch->send(conn, load_msg.data(), load_msg.size()) != errc::ok) {
        ++load_refused;  // queue full: this tick's remainder is dropped, not queued up
        load_sent = due;
        break;
      }
      ++load_sent;
    }
  }

  void ping() {
    t0 = mono_ns();
    if (ch->send(conn, msg.data(), msg.size()) != errc::ok) failed = finished = true;
  }
  void pong(size_t n) {
    const uint64_t t = mono_ns();
    if (n != msg.size()) failed = true;
    if (done == warmup) cpu0 = rusage_cpu();
    if (done >= warmup) h.add(t - t0);
    if (++done == warmup + round_trips) {
      cpu1 = rusage_cpu();
      finished = true;
      return;
    }
    ping();
  }

  stream_callbacks callbacks() {
    stream_callbacks cb;
    cb.on_connected = [this](connection_id c, errc st) {
      if (st != errc::ok) {
        std::fprintf(stderr, "pingpong: connect: %s\n", to_string(st));
        failed = finished = true;
        return;
      }
      conn = c;
      ping();
    };
    cb.on_received = [this](connection_id, const uint8_t*, size_t n) { pong(n); };
    cb.on_disconnected = [this](connection_id, errc) {
      if (!finished) failed = finished = true;
    };
    return cb;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const options o = options::parse(argc, argv);
  if (o.url.empty()) {
    std::fprintf(stderr,
                 "usage: %s URL [--size 64] [--round-trips N] [--warmup N] [--client-cpu C] "
                 "[--server-cpu C]\n",
                 argv[0]);
    return 2;
  }
  const size_t size = static_cast<size_t>(o.get_int("size", 64));
  const forked_server server =
      fork_server(o, "pingpong", [&](int ready_fd) { return run_server(o.url, ready_fd); });
  if (server.url.empty()) return 1;
  const std::string& url = server.url;

  client c;
  c.msg.assign(size, 0x5a);
  c.warmup = o.get_int("warmup", 10000);
  c.round_trips = o.get_int("round-trips", 200000);
  c.load_rate = std::strtod(o.get("load-rate", "0").c_str(), nullptr);
  c.load_msg.assign(size, 'L');
  uv_loop_t loop;
  uv_loop_init(&loop);
  stream_channel ch(&loop, stream_config{}, c.callbacks());
  c.ch = &ch;
  uv_timer_t load_timer;
  uv_timer_init(&loop, &load_timer);
  load_timer.data = &c;
  if (c.load_rate > 0) {
    uv_timer_start(
        &load_timer, [](uv_timer_t* t) { static_cast<client*>(t->data)->send_load(); }, 1, 1);
  }
  if (ch.connect(url) != errc::ok) c.failed = c.finished = true;
  while (!c.finished) uv_run(&loop, UV_RUN_ONCE);
  const double load_secs = c.load_t0 == 0 ? 0 : mono_now() - c.load_t0;
  uv_close(reinterpret_cast<uv_handle_t*>(&load_timer), nullptr);
  ch.close();
  uv_run(&loop, UV_RUN_DEFAULT);
  int status = 0;
  waitpid(server.pid, &status, 0);

  const double us = 1e-3;
  std::printf(
      "[pingpong] %s size=%zu round_trips=%llu p50=%.1fus p90=%.1fus p99=%.1fus "
      "p99.9=%.1fus max=%.1fus\n",
      o.url.c_str(), size, static_cast<unsigned long long>(c.h.count()),
      static_cast<double>(c.h.quantile(0.5)) * us, static_cast<double>(c.h.quantile(0.9)) * us,
      static_cast<double>(c.h.quantile(0.99)) * us, static_cast<double>(c.h.quantile(0.999)) * us,
      static_cast<double>(c.h.max()) * us);
  std::printf(
      "{\"bench\":\"stream_pingpong\",\"url\":\"%s\",\"size\":%zu,\"round_trips\":%llu,"
      "\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,"
      "\"load_rate\":%.0f,\"load_achieved\":%.0f,\"load_refused\":%llu,\"errors\":%d,"
      "\"client_cpu_ns_per_rt\":%.0f}\n",
      o.url.c_str(), size, static_cast<unsigned long long>(c.h.count()),
      static_cast<double>(c.h.quantile(0.5)) * us, static_cast<double>(c.h.quantile(0.9)) * us,
      static_cast<double>(c.h.quantile(0.99)) * us, static_cast<double>(c.h.quantile(0.999)) * us,
      static_cast<double>(c.h.max()) * us, c.load_rate,
      load_secs > 0 ? static_cast<double>(c.load_sent) / load_secs : 0.0,
      static_cast<unsigned long long>(c.load_refused), c.failed ? 1 : 0,
      c.h.count() > 0 ? (c.cpu1 - c.cpu0) * 1e9 / static_cast<double>(c.h.count()) : 0.0);
  return c.failed ? 1 : 0;
}
