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
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "uvbus/node.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

constexpr uint32_t kCallType = 1;
constexpr uint32_t kStopType = 2;

node_config call_config() {
  node_config c;
  c.heartbeat_interval_ms = 1000;
  c.heartbeat_timeout_ms = 30000;
  c.sibling_direct = false;
  return c;
}

int run_server(const std::string& url, const std::string& shm, int ready_fd) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  node_config c = call_config();
  c.listen = {url};
  if (!shm.empty()) c.listen.push_back("shm://" + shm + "-s");
  c.subnets = {{0x1000, 12}};
  node* self = nullptr;
  bool stop = false;
  node_callbacks cb;
  cb.on_endpoint_removed = [&](const endpoint_info&, errc) { stop = true; };
  cb.on_data = [&](bus_id, uint32_t type, const uint8_t* p, size_t n) {
    if (type == kStopType) {
      stop = true;
      return;
    }
    const reply_handle* req = self->incoming_request();
    if (req == nullptr) return;
    reply_handle h = *req;
    (void)self->reply(h, p, n);
  };
  node n(&loop, 0x1000, c, cb);
  self = &n;
  const errc e = n.start();
  std::string msg = e == errc::ok ? n.listen_urls()[0] : std::string("ERROR ") + to_string(e);
  msg += '\n';
  if (write(ready_fd, msg.data(), msg.size()) < 0) return 1;
  close(ready_fd);
  if (e != errc::ok) return 1;
  while (!stop) uv_run(&loop, UV_RUN_ONCE);
  n.stop();
  for (int i = 0; i < 1000 && uv_loop_alive(&loop); ++i) uv_run(&loop, UV_RUN_ONCE);
  return 0;
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
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    pin_cpu(o.get_int("server-cpu", 1));
    _exit(run_server(o.url, shm, fds[1]));
  }
  close(fds[1]);
  pin_cpu(o.get_int("client-cpu", 0));
  const std::string url = read_server_url(fds[0]);
  if (url.empty() || url.rfind("ERROR", 0) == 0) {
    std::fprintf(stderr, "call: server failed: %s\n", url.c_str());
    return 1;
  }
  uv_loop_t loop;
  uv_loop_init(&loop);
  node_config c = call_config();
  c.parent_urls = {url};
  c.enable_shm = !shm.empty();
  if (!shm.empty()) c.listen = {"shm://" + shm + "-c"};
  bool down = false;
  node_callbacks cb;
  cb.on_down = [&](errc) { down = true; };
  node n(&loop, 0x1001, c, cb);
  if (n.start() != errc::ok) return 1;
  while (!n.up()) uv_run(&loop, UV_RUN_ONCE);
  const auto peers = n.peers();
  const char* channel = peers.empty() ? "?" : to_string(peers[0].data_channel);
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
  (void)n.send_data(0x1000, kStopType, k.buf.data(), 1);
  n.stop();
  for (int i = 0; i < 1000 && !down; ++i) uv_run(&loop, UV_RUN_ONCE);
  int status = 0;
  waitpid(child, &status, 0);
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
