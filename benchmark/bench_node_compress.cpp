// End-to-end throughput of a compressed bus link: a root node and a child node, each on its own
// loop thread (pinned to cpu 0 and 1), over TCP loopback, the child sending game-like snapshot
// messages (benchmark/corpus.h) to the root as fast as the link takes them, once per codec.
//
//   uvbus_bench_node_compress [--size B] [--format json|binary] [--seconds S] [--codecs LIST]
//                             [--level N]
//
// Prints one line per codec: messages/s, payload MB/s, bytes on the wire per payload byte, and
// CPU nanoseconds per message on each side (getrusage RUSAGE_THREAD). Delivery is end_to_end (the
// default), so every message counted was delivered and acknowledged.
#include <sys/resource.h>
#include <uv.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "corpus.h"
#include "uvbus/node.h"

namespace uvbus::bench {
namespace {

constexpr bus_id kRoot = 0x1000;
constexpr bus_id kChild = 0x1001;

uint64_t thread_cpu_ns() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  const auto ns = [](const timeval& t) {
    return static_cast<uint64_t>(t.tv_sec) * 1000000000ull +
           static_cast<uint64_t>(t.tv_usec) * 1000;
  };
  return ns(ru.ru_utime) + ns(ru.ru_stime);
}

struct result {
  uint64_t messages = 0;
  double seconds = 0;
  uint64_t raw_bytes = 0;   // compressed bodies before
  uint64_t wire_bytes = 0;  // ... after
  uint64_t compressed = 0;
  uint64_t send_cpu_ns = 0;
  uint64_t recv_cpu_ns = 0;
};

node_config base(compression_codec c, int level) {
  node_config cfg;
  cfg.listen = {"ipv4://127.0.0.1:0"};
  cfg.enable_shm = false;
  cfg.compression = c;
  cfg.compression_level = level;
  return cfg;
}

// The root: counts deliveries on its own thread until woken through *wake; *cpu gets its CPU.
void run_root(compression_codec c, int level, std::atomic<uv_async_t*>* wake, std::string* url,
              std::atomic<uint64_t>* got, uint64_t* cpu) {
  pin_cpu(1);
  uv_loop_t loop;
  uv_loop_init(&loop);
  uv_async_t stop;
  stop.data = &loop;
  uv_async_init(&loop, &stop, [](uv_async_t* a) { uv_stop(static_cast<uv_loop_t*>(a->data)); });
  node_config cfg = base(c, level);
  cfg.subnets = {subnet{0x1000, 12}};
  node_callbacks cb;
  cb.on_data = [got](bus_id, uint32_t, const uint8_t*, size_t) {
    got->fetch_add(1, std::memory_order_relaxed);
  };
  auto n = std::make_unique<node>(&loop, kRoot, cfg, std::move(cb));
  if (n->start() != errc::ok) std::abort();
  *url = n->listen_urls().at(0);
  const uint64_t c0 = thread_cpu_ns();
  wake->store(&stop);
  uv_run(&loop, UV_RUN_DEFAULT);
  *cpu = thread_cpu_ns() - c0;
  n.reset();
  uv_close(reinterpret_cast<uv_handle_t*>(&stop), nullptr);
  while (uv_loop_alive(&loop) != 0) uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
}

result run_codec(compression_codec c, int level, const std::vector<std::vector<uint8_t>>& corpus,
                 double seconds) {
  std::atomic<uv_async_t*> wake{nullptr};
  std::atomic<uint64_t> got{0};
  std::string url;
  result r;
  std::thread root(run_root, c, level, &wake, &url, &got, &r.recv_cpu_ns);
  while (wake.load() == nullptr) std::this_thread::yield();
  pin_cpu(0);
  uv_loop_t loop;
  uv_loop_init(&loop);
  node_config cfg = base(c, level);
  cfg.listen.clear();
  cfg.parent_urls = {url};
  bool up = false;
  node_callbacks cb;
  cb.on_up = [&](bus_id) { up = true; };
  auto n = std::make_unique<node>(&loop, kChild, cfg, std::move(cb));
  if (n->start() != errc::ok) std::abort();
  while (!up) uv_run(&loop, UV_RUN_ONCE);
  const uint64_t got0 = got.load();
  const uint64_t t0 = mono_ns();
  const uint64_t c0 = thread_cpu_ns();
  const uint64_t end = t0 + static_cast<uint64_t>(seconds * 1e9);
  size_t i = 0;
  while (mono_ns() < end) {
    for (int k = 0; k < 64; ++k) {
      const std::vector<uint8_t>& m = corpus[i % corpus.size()];
      if (n->send_data(kRoot, 1, m.data(), m.size()) != errc::ok) break;
      ++i;
    }
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  r.send_cpu_ns = thread_cpu_ns() - c0;
  r.seconds = static_cast<double>(mono_ns() - t0) / 1e9;
  r.messages = got.load() - got0;
  const node_counters k = n->counters();
  r.raw_bytes = k.compressed_raw_bytes;
  r.wire_bytes = k.compressed_wire_bytes;
  r.compressed = k.compressed_sent;
  n.reset();
  uv_async_send(wake.load());
  root.join();
  while (uv_loop_alive(&loop) != 0) uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  return r;
}

int run(int argc, char** argv) {
  const options o = options::parse(argc, argv);
  const size_t size = static_cast<size_t>(o.get_int("size", 2048));
  const double seconds = o.flag("seconds") ? o.seconds : 3;
  const corpus_format f =
      o.get("format", "json") == "binary" ? corpus_format::binary : corpus_format::json;
  const int level = static_cast<int>(o.get_int("level", 0));
  const std::vector<std::vector<uint8_t>> corpus = make_corpus(1, 64, size, f);
  std::printf("# node over TCP loopback, %zu B %s snapshots, %.1f s per codec, level %d\n", size,
              to_string(f), seconds, level);
  std::printf("%-6s %12s %10s %10s %14s %14s\n", "codec", "msg/s", "MB/s", "wire/raw",
              "send ns/msg", "recv ns/msg");
  const std::string list = o.get("codecs", "none,lz4,zstd");
  for (const char* name : {"none", "lz4", "zstd"}) {
    if (list.find(name) == std::string::npos) continue;
    compression_codec c = compression_codec::none;
    if (std::string(name) == "lz4") c = compression_codec::lz4;
    if (std::string(name) == "zstd") c = compression_codec::zstd;
    const result r = run_codec(c, level, corpus, seconds);
    const double rate = static_cast<double>(r.messages) / r.seconds;
    const double ratio = r.raw_bytes == 0
                             ? 1.0
                             : static_cast<double>(r.wire_bytes) / static_cast<double>(r.raw_bytes);
    const double per = r.messages == 0 ? 0 : 1.0 / static_cast<double>(r.messages);
    std::printf("%-6s %12.0f %10.1f %10.3f %14.0f %14.0f\n", name, rate,
                rate * static_cast<double>(size) / 1e6, ratio,
                static_cast<double>(r.send_cpu_ns) * per, static_cast<double>(r.recv_cpu_ns) * per);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace uvbus::bench

int main(int argc, char** argv) {
  return uvbus::bench::run(argc, argv);
}
