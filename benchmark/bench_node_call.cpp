// Bus request/reply throughput and round trip:
//
//   uvbus_bench_node_call URL [--size 64] [--outstanding 1] [--seconds 5] [--shm NAME]
//                         [--client-cpu 0] [--server-cpu 1]
//
// Forks a root node 0x1000 (pinned to --server-cpu) listening on URL (port 0 allowed) and, with
// --shm, on shm://NAME-s; it answers every request (node::incoming_request) with a reply of the
// request's size. The client node 0x1001 (pinned to --client-cpu, on shm://NAME-c with --shm)
// registers to it and keeps --outstanding calls open for --seconds, timing each call from call()
// to its callback. Prints calls/s, p50/p90/p99/p99.9/max in microseconds, and a JSON line.
#include <uv.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_node.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

constexpr uint32_t kCallType = 1;

// The server: answers every request with a reply of its size.
int run_server(const std::string& url, const std::string& shm, int ready_fd) {
  return run_root_server(url, shm, ready_fd,
                         [](node& self, bus_id, uint32_t, const uint8_t* p, size_t n) {
                           const reply_handle* req = self.incoming_request();
                           if (req == nullptr) return;
                           reply_handle h = *req;
                           (void)self.reply(h, p, n);
                         });
}

// The client's state: the calls in flight and what they measured.
struct caller {
  node* n = nullptr;
  std::vector<uint8_t> buf;
  histogram hist;
  uint64_t done = 0;
  uint64_t failed = 0;
  bool measuring = true;
  errc first_error = errc::ok;

  // Starts one call; its callback records the round trip and starts the next while measuring.
  bool start_one() {
    const uint64_t t0 = mono_ns();
    const errc e =
        n->call(0x1000, kCallType, buf.data(), buf.size(), 10000, [this, t0](const call_result& r) {
          if (r.status == errc::ok) {
            ++done;
            hist.add(mono_ns() - t0);
          } else {
            ++failed;
            if (first_error == errc::ok) first_error = r.status;
          }
          if (measuring) (void)start_one();
        });
    if (e != errc::ok && first_error == errc::ok) first_error = e;
    return e == errc::ok;
  }
};

}  // namespace

int main(int argc, char** argv) {
  options o = options::parse(argc, argv);
  if (o.url.empty()) {
    std::fprintf(stderr,
                 "usage: %s URL [--size 64] [--outstanding 1] [--seconds 5] [--shm NAME] "
                 "[--client-cpu C] [--server-cpu C]\n",
                 argv[0]);
    return 2;
  }
  const size_t size = static_cast<size_t>(o.get_int("size", 64));
  const long outstanding = o.get_int("outstanding", 1);
  const double seconds = o.extra.count("seconds") != 0 ? o.seconds : 5.0;
  const std::string shm = o.get("shm");
  const forked_server server =
      fork_server(o, "call", [&](int ready_fd) { return run_server(o.url, shm, ready_fd); });
  if (server.url.empty()) return 1;
  const std::string& url = server.url;
  uv_loop_t loop;
  uv_loop_init(&loop);
  bool down = false;
  node_callbacks cb;
  cb.on_down = [&](errc) { down = true; };
  node n(&loop, 0x1001, client_config(url, shm), cb);
  const char* channel = start_client(&loop, n);
  if (channel == nullptr) return 1;
  caller k;
  k.n = &n;
  k.buf.assign(size, 0x5A);
  for (long i = 0; i < outstanding; ++i) {
    if (!k.start_one()) return 1;
  }
  const double t0 = mono_now();
  const double c0 = cpu_now();
  while (mono_now() - t0 < seconds) uv_run(&loop, UV_RUN_ONCE);
  const double elapsed = mono_now() - t0;
  const double cpu = cpu_now() - c0;
  const uint64_t calls = k.done;
  k.measuring = false;
  while (k.done + k.failed < n.counters().calls_started) uv_run(&loop, UV_RUN_ONCE);
  stop_server(&loop, n, &down, k.buf.data(), server.pid);
  if (k.failed != 0) {
    std::fprintf(stderr, "call: %llu calls failed, the first with %s\n",
                 static_cast<unsigned long long>(k.failed), to_string(k.first_error));
  }
  auto us = [&](double q) { return static_cast<double>(k.hist.quantile(q)) / 1000.0; };
  const double rate = static_cast<double>(calls) / elapsed;
  std::printf(
      "[call] node via %s size=%zu outstanding=%ld calls=%llu rate=%.0f/s client_cpu=%.0fns/call "
      "p50=%.1fus p90=%.1fus p99=%.1fus p99.9=%.1fus max=%.1fus failed=%llu\n",
      channel, size, outstanding, static_cast<unsigned long long>(calls), rate,
      calls != 0 ? cpu * 1e9 / static_cast<double>(calls) : 0.0, us(0.5), us(0.9), us(0.99),
      us(0.999), static_cast<double>(k.hist.max()) / 1000.0,
      static_cast<unsigned long long>(k.failed));
  std::printf(
      "{\"bench\":\"node_call\",\"url\":\"%s\",\"channel\":\"%s\",\"size\":%zu,"
      "\"outstanding\":%ld,\"calls_per_s\":%.0f,\"p50_us\":%.1f,\"p90_us\":%.1f,"
      "\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"failed\":%llu}\n",
      url.c_str(), channel, size, outstanding, rate, us(0.5), us(0.9), us(0.99), us(0.999),
      static_cast<double>(k.hist.max()) / 1000.0, static_cast<unsigned long long>(k.failed));
  return k.failed == 0 ? 0 : 1;
}
