// Bus node sender (benchmark contract of docs/benchmark.md, at the node level):
//
//   uvbus_bench_node_send PARENT_URL [--min B] [--max B] [--seconds S] [--no-shm] [--id ID]
//                                    [--target ID]
//
// Registers node --id (default 0x1001; 0x1101 under the receiver's relay) to PARENT_URL and sends
// numbered payloads to --target (default 0x1000) for S seconds, as fast as send_data() takes them
// (until queue_full; then it waits for on_writable over a stream link, or polls a full ring).
// The node picks the channel: shared memory when the parent is on this host and offers a ring,
// unless --no-shm. Then the end message, a graceful stop, and a summary line.
#include <uv.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#include "uvbus/node.h"

using namespace uvbus;
using namespace uvbus::bench;

int main(int argc, char** argv) {
  options o = options::parse(argc, argv);
  if (o.url.empty()) {
    std::fprintf(stderr,
                 "usage: %s PARENT_URL [--min B] [--max B] [--seconds S] [--no-shm] [--id ID] "
                 "[--target ID]\n",
                 argv[0]);
    return 2;
  }
  const bus_id id = std::strtoull(o.get("id", "0x1001").c_str(), nullptr, 0);
  const bus_id target = std::strtoull(o.get("target", "0x1000").c_str(), nullptr, 0);
  uv_loop_t loop;
  uv_loop_init(&loop);
  node_config c;
  c.parent_urls = {o.url};
  c.enable_shm = !o.flag("no-shm");
  c.heartbeat_interval_ms = 1000;
  c.heartbeat_timeout_ms = 10000;
  c.sibling_direct = false;
  bool down = false;
  bool writable = true;
  int exit_code = 0;
  node_callbacks cb;
  cb.on_writable = [&](bus_id) { writable = true; };
  cb.on_down = [&](errc) { down = true; };
  cb.on_registration = [&](errc e, const std::string& d) {
    if (e != errc::ok) {
      std::fprintf(stderr, "send: registration: %s %s\n", to_string(e), d.c_str());
      exit_code = 1;
    }
  };
  node n(&loop, id, c, cb);
  if (const errc e = n.start(); e != errc::ok) {
    std::fprintf(stderr, "send: start: %s\n", to_string(e));
    return 1;
  }
  const double give_up = mono_now() + 10;
  while (!n.up() && exit_code == 0 && mono_now() < give_up) uv_run(&loop, UV_RUN_ONCE);
  if (!n.up()) {
    std::fprintf(stderr, "send: never registered\n");
    return 1;
  }
  endpoint_info parent;
  (void)n.peers().empty();
  const auto peers = n.peers();
  const char* channel = peers.empty() ? "?" : to_string(peers[0].data_channel);
  // A full stream link says when it has drained (on_writable): wait for that rather than retrying.
  // A full ring has no such signal: poll it.
  const bool stream_link = !peers.empty() && peers[0].data_channel == channel_kind::stream;

  std::vector<uint8_t> buf(o.max + 16);
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t refused = 0;
  const double t0 = mono_now();
  const double c0 = cpu_now();
  const double t_end = t0 + o.seconds;
  while (exit_code == 0) {
    if (mono_now() >= t_end) break;
    for (int k = 0; k < 4096; ++k) {
      const size_t len = make_payload(seq, 0, o.min, o.max, buf.data());
      const errc e = n.send_data(target, 1, buf.data(), len);
      if (e == errc::queue_full) {
        ++refused;
        if (stream_link) writable = false;
        break;
      }
      if (e != errc::ok) {
        std::fprintf(stderr, "send: %s\n", to_string(e));
        exit_code = 1;
        break;
      }
      ++seq;
      bytes += len;
    }
    uv_run(&loop, writable ? UV_RUN_NOWAIT : UV_RUN_ONCE);
  }
  const double secs = mono_now() - t0;
  const double cpu = (cpu_now() - c0) / secs * 100;
  uint8_t end[24];
  const size_t elen = make_end(0, seq, end);
  for (;;) {
    const errc e = n.send_data(target, 1, end, elen);
    if (e == errc::ok) break;
    if (e != errc::queue_full) {
      std::fprintf(stderr, "send end: %s\n", to_string(e));
      exit_code = 1;
      break;
    }
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  std::printf(
      "[send] node 0x%llx via %s: msgs=%llu msgs/s=%.0f MB/s=%.1f cpu%%=%.0f refused=%llu\n",
      static_cast<unsigned long long>(id), channel, static_cast<unsigned long long>(seq),
      static_cast<double>(seq) / secs, static_cast<double>(bytes) / secs / 1e6, cpu,
      static_cast<unsigned long long>(refused));
  std::fflush(stdout);
  n.stop();
  const double stop_by = mono_now() + 10;
  while (!down && mono_now() < stop_by) uv_run(&loop, UV_RUN_ONCE);
  return exit_code;
}
