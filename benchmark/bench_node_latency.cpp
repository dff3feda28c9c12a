// Bus node round-trip latency:
//
//   uvbus_bench_node_latency URL [--size 64] [--round-trips 100000] [--warmup 5000] [--no-shm]
//                            [--shm NAME] [--client-cpu 0] [--server-cpu 1] [--load-rate R]
//
// Forks a root node 0x1000 (pinned to --server-cpu) listening on URL (port 0 allowed) and, with
// --shm, on shm://NAME-s; it echoes every data message back to its source with send_data(). The
// client node 0x1001 (pinned to --client-cpu, listening on shm://NAME-c with --shm) registers to it
// and keeps one message in flight, timing every round trip into a histogram. With --shm and
// without --no-shm both directions use shared memory (the nodes choose it: same host, rings
// offered); otherwise the stream. Prints p50/p90/p99/p99.9/max in microseconds and a JSON line,
// with the client's CPU per round trip (getrusage user + system over the measured round trips).
// --load-rate R: latency under load. The client also sends R data messages a second of the same
// size to the server (type 3, R/1000 from a 1 ms timer, as a game server's tick would), which
// drops them; the JSON line adds the load achieved and how many send_data() refused.
#include <uv.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_node.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

// The server: drops the background load (type 3), echoes every other message to its source.
int run_server(const std::string& url, const std::string& shm, int ready_fd) {
  return run_root_server(url, shm, ready_fd,
                         [](node& self, bus_id src, uint32_t type, const uint8_t* p, size_t n) {
                           if (type == 3) return;  // background load
                           (void)self.send_data(src, type, p, n);
                         });
}

// The background load of --load-rate: sends what is due since the first tick.
struct load_gen {
  node* n = nullptr;
  double rate = 0;
  double t0 = 0;
  uint64_t sent = 0;
  uint64_t refused = 0;
  std::vector<uint8_t> msg;
  bool on = true;
  void tick() {
    if (!on) return;
    if (t0 == 0) t0 = mono_now();
    const auto due = static_cast<uint64_t>((mono_now() - t0) * rate);
    while (sent < due) {
      if (n->send_data(0x1000, 3, msg.data(), msg.size()) != errc::ok) {
        ++refused;  // queue full: this tick's remainder is dropped, not queued up
        sent = due;
        break;
      }
      ++sent;
    }
  }
};

// Keeps one message in flight warmup + rounds times, timing the measured ones into *hist; the
// client's CPU per measured round trip goes to *cpu_ns. false if a send fails for good.
bool ping_loop(uv_loop_t* loop, node& n, bool* reply, const std::vector<uint8_t>& buf, long warmup,
               long rounds, histogram* hist, double* cpu_ns) {
  double cpu0 = 0;
  for (long i = 0; i < warmup + rounds; ++i) {
    if (i == warmup) cpu0 = rusage_cpu();
    *reply = false;
    const uint64_t t0 = mono_ns();
    errc e = errc::ok;
    // Under --load-rate the link's queue (or the flow's window) may be full: the ping waits for
    // room like any message would, and that wait is part of its round trip.
    while ((e = n.send_data(0x1000, 1, buf.data(), buf.size())) == errc::queue_full) {
      uv_run(loop, UV_RUN_NOWAIT);
    }
    if (e != errc::ok) {
      std::fprintf(stderr, "latency: send_data: %s\n", to_string(e));
      return false;
    }
    while (!*reply) uv_run(loop, UV_RUN_ONCE);
    const uint64_t dt = mono_ns() - t0;
    if (i >= warmup) hist->add(dt);
  }
  *cpu_ns = rounds > 0 ? (rusage_cpu() - cpu0) * 1e9 / static_cast<double>(rounds) : 0;
  return true;
}

void print_result(const std::string& url, const char* channel, size_t size, long rounds,
                  const histogram& hist, double cpu_ns, const load_gen& load, double load_secs) {
  auto us = [&](double q) { return static_cast<double>(hist.quantile(q)) / 1000.0; };
  std::printf(
      "[latency] node via %s size=%zu round_trips=%ld p50=%.1fus p90=%.1fus p99=%.1fus "
      "p99.9=%.1fus max=%.1fus client_cpu=%.0fns/rt\n",
      channel, size, rounds, us(0.5), us(0.9), us(0.99), us(0.999),
      static_cast<double>(hist.max()) / 1000.0, cpu_ns);
  std::printf(
      "{\"bench\":\"node_latency\",\"url\":\"%s\",\"channel\":\"%s\",\"size\":%zu,"
      "\"round_trips\":%ld,\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
      "\"p999_us\":%.1f,\"max_us\":%.1f,\"client_cpu_ns_per_rt\":%.0f,\"load_rate\":%.0f,"
      "\"load_achieved\":%.0f,\"load_refused\":%llu}\n",
      url.c_str(), channel, size, rounds, us(0.5), us(0.9), us(0.99), us(0.999),
      static_cast<double>(hist.max()) / 1000.0, cpu_ns, load.rate,
      load_secs > 0 ? static_cast<double>(load.sent) / load_secs : 0.0,
      static_cast<unsigned long long>(load.refused));
}

}  // namespace

int main(int argc, char** argv) {
  options o = options::parse(argc, argv);
  if (o.url.empty()) {
    std::fprintf(stderr,
                 "usage: %s URL [--size 64] [--round-trips N] [--warmup N] [--no-shm] [--shm NAME] "
                 "[--client-cpu C] [--server-cpu C] [--load-rate R]\n",
                 argv[0]);
    return 2;
  }
  const size_t size = static_cast<size_t>(o.get_int("size", 64));
  const long rounds = o.get_int("round-trips", 100000);
  const long warmup = o.get_int("warmup", 5000);
  const std::string shm = o.get("shm");
  const bool use_shm = !shm.empty() && !o.flag("no-shm");
  const forked_server server = fork_server(o, "latency", [&](int ready_fd) {
    return run_server(o.url, use_shm ? shm : std::string(), ready_fd);
  });
  if (server.url.empty()) return 1;
  const std::string& url = server.url;
  uv_loop_t loop;
  uv_loop_init(&loop);
  bool reply = false;
  bool down = false;
  node_callbacks cb;
  cb.on_down = [&](errc) { down = true; };
  cb.on_data = [&](bus_id, uint32_t, const uint8_t*, size_t) { reply = true; };
  node n(&loop, 0x1001, client_config(url, use_shm ? shm : std::string()), cb);
  const char* channel = start_client(&loop, n);
  if (channel == nullptr) return 1;
  std::vector<uint8_t> buf(size, 0x5A);
  load_gen load;
  load.n = &n;
  load.rate = std::strtod(o.get("load-rate", "0").c_str(), nullptr);
  load.msg.assign(size, 'L');
  uv_timer_t load_timer;
  uv_timer_init(&loop, &load_timer);
  load_timer.data = &load;
  if (load.rate > 0) {
    uv_timer_start(
        &load_timer, [](uv_timer_t* t) { static_cast<load_gen*>(t->data)->tick(); }, 1, 1);
  }
  histogram hist;
  double cpu_ns = 0;
  if (!ping_loop(&loop, n, &reply, buf, warmup, rounds, &hist, &cpu_ns)) return 1;
  load.on = false;
  const double load_secs = load.t0 == 0 ? 0 : mono_now() - load.t0;
  uv_close(reinterpret_cast<uv_handle_t*>(&load_timer), nullptr);
  stop_server(&loop, n, &down, buf.data(), server.pid);
  print_result(url, channel, size, rounds, hist, cpu_ns, load, load_secs);
  return 0;
}
