// Posting from another thread against direct send_data(), node to node over TCP:
//
//   uvbus_bench_node_post [--mode post|direct] [--min B] [--max B] [--seconds S]
//
// One process: a receiver root node on a thread with its own loop (ipv4://127.0.0.1, a port the
// system picks) and a sender node registered to it on the main thread's loop. direct: the loop
// thread calls send_data() as fast as it takes them (queue_full: run the loop until on_writable),
// as bench_node_send does. post: a producer thread calls node::post() as fast as it takes them
// (queue_full: yield and retry) while the main thread only runs the loop. Both send numbered
// payloads of min..max bytes; the receiver counts what arrives in the measured window. Prints one
// line: mode, messages/s and MB/s received, the sender process's CPU %.
#include <uv.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "uvbus/node.h"

using namespace uvbus;
using namespace uvbus::bench;

namespace {

constexpr bus_id kReceiver = 0x1000;
constexpr bus_id kSender = 0x1001;

node_config base_config() {
  node_config c;
  c.listen = {"ipv4://127.0.0.1:0"};
  c.enable_shm = false;
  c.heartbeat_interval_ms = 1000;
  c.heartbeat_timeout_ms = 10000;
  c.sibling_direct = false;
  return c;
}

// The receiver: a root node on its own thread, counting messages and bytes.
struct receiver {
  std::atomic<uint64_t> msgs{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> quit{false};
  std::atomic<bool> ready{false};
  std::string url;
  std::thread th;

  void start() {
    th = std::thread([this] { run(); });
    while (!ready) std::this_thread::yield();
  }
  void run() {
    uv_loop_t loop;
    uv_loop_init(&loop);
    node_config c = base_config();
    c.subnets = {{kReceiver, 8}};
    node_callbacks cb;
    cb.on_data = [this](bus_id, uint32_t, const uint8_t*, size_t n) {
      msgs.fetch_add(1, std::memory_order_relaxed);
      bytes.fetch_add(n, std::memory_order_relaxed);
    };
    {
      node n(&loop, kReceiver, c, cb);
      if (n.start() != errc::ok) std::abort();
      url = n.listen_urls().at(0);
      ready = true;
      while (!quit) uv_run(&loop, UV_RUN_ONCE);
    }
    while (uv_run(&loop, UV_RUN_NOWAIT) != 0) {
    }
    uv_loop_close(&loop);
  }
};

// The producer thread of post mode: posts until told to stop.
void produce(node* n, const options& o, const std::atomic<bool>* stop) {
  std::vector<uint8_t> buf(o.max + 16);
  uint64_t seq = 0;
  while (!stop->load(std::memory_order_relaxed)) {
    const size_t len = make_payload(seq, 0, o.min, o.max, buf.data());
    const errc e = n->post(kReceiver, 1, buf.data(), len);
    if (e == errc::ok) {
      ++seq;
    } else if (e == errc::queue_full) {
      std::this_thread::yield();
    } else {
      std::fprintf(stderr, "post: %s\n", to_string(e));
      std::abort();
    }
  }
}

// direct mode: send until queue_full, then let the loop drain the link.
void send_burst(node* n, const options& o, uint64_t* seq, std::vector<uint8_t>* buf,
                bool* writable) {
  for (int k = 0; k < 4096; ++k) {
    const size_t len = make_payload(*seq, 0, o.min, o.max, buf->data());
    const errc e = n->send_data(kReceiver, 1, buf->data(), len);
    if (e == errc::queue_full) {
      *writable = false;
      return;
    }
    if (e != errc::ok) {
      std::fprintf(stderr, "send: %s\n", to_string(e));
      std::abort();
    }
    ++*seq;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const options o = options::parse(argc, argv);
  const std::string mode = o.get("mode", "post");
  if (mode != "post" && mode != "direct") {
    std::fprintf(stderr, "usage: %s [--mode post|direct] [--min B] [--max B] [--seconds S]\n",
                 argv[0]);
    return 2;
  }
  receiver r;
  r.start();
  uv_loop_t loop;
  uv_loop_init(&loop);
  node_config c = base_config();
  c.listen.clear();
  c.parent_urls = {r.url};
  bool writable = true;
  node_callbacks cb;
  cb.on_writable = [&](bus_id) { writable = true; };
  auto n = std::make_unique<node>(&loop, kSender, c, cb);
  if (n->start() != errc::ok) return 1;
  while (!n->up()) uv_run(&loop, UV_RUN_ONCE);

  std::atomic<bool> stop{false};
  std::thread producer;
  if (mode == "post") producer = std::thread(produce, n.get(), o, &stop);
  std::vector<uint8_t> buf(o.max + 16);
  uint64_t seq = 0;
  // Warm up for a tenth of the time, then measure what the receiver gets.
  const double warm_end = mono_now() + o.seconds / 10;
  double t0 = 0;
  double c0 = 0;
  cpu_counter loop_cpu(RUSAGE_THREAD);  // the sender node's loop thread (this one)
  cpu_counter all_cpu;                  // the process: + producer thread and receiver thread
  uint64_t m0 = 0;
  uint64_t b0 = 0;
  double t_end = 0;
  for (;;) {
    const double now = mono_now();
    if (t0 == 0 && now >= warm_end) {
      t0 = now;
      c0 = cpu_now();
      loop_cpu.start();
      all_cpu.start();
      m0 = r.msgs;
      b0 = r.bytes;
      t_end = t0 + o.seconds;
    }
    if (t0 != 0 && now >= t_end) break;
    if (mode == "direct" && writable) send_burst(n.get(), o, &seq, &buf, &writable);
    uv_run(&loop, (mode == "direct" && writable) ? UV_RUN_NOWAIT : UV_RUN_ONCE);
  }
  const double secs = mono_now() - t0;
  const double cpu = (cpu_now() - c0) / secs * 100;
  const uint64_t msgs = r.msgs - m0;
  const uint64_t bytes = r.bytes - b0;
  const double loop_ns = loop_cpu.ns_per_msg(msgs);
  const double all_ns = all_cpu.ns_per_msg(msgs);
  stop = true;
  if (producer.joinable()) producer.join();
  std::printf(
      "[node_post] mode=%s size=%zu-%zu msgs/s=%.0f MB/s=%.1f cpu%%=%.0f loop_cpu_ns/msg=%.1f "
      "process_cpu_ns/msg=%.1f\n",
      mode.c_str(), o.min, o.max, static_cast<double>(msgs) / secs,
      static_cast<double>(bytes) / secs / 1e6, cpu, loop_ns, all_ns);
  std::fflush(stdout);
  n.reset();
  while (uv_run(&loop, UV_RUN_NOWAIT) != 0) {
  }
  uv_loop_close(&loop);
  r.quit = true;
  r.th.join();
  return 0;
}
