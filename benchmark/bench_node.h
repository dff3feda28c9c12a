// Shared set-up of the bus node round-trip benchmarks (bench_node_call, bench_node_latency): the
// forked root node 0x1000 that serves them, and the client node 0x1001 registered to it.
#pragma once

#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <string>

#include "bench_common.h"
#include "uvbus/node.h"

namespace uvbus::bench {

// The data type that tells the server to stop (a 1-byte message once the client is done).
inline constexpr uint32_t kStopType = 2;

// Both nodes' config: slow heartbeats, no sibling links.
inline node_config round_trip_config() {
  node_config c;
  c.heartbeat_interval_ms = 1000;
  c.heartbeat_timeout_ms = 30000;
  c.sibling_direct = false;
  return c;
}

// The server process's body: a root node 0x1000 listening on url (and, with shm, on
// shm://SHM-s), which tells the parent its URL on ready_fd and runs until a kStopType message or
// the client's endpoint goes. Every other data message goes to
// on_data(node&, bus_id src, uint32_t type, const uint8_t*, size_t). Returns the exit status.
template <class OnData>
int run_root_server(const std::string& url, const std::string& shm, int ready_fd, OnData on_data) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  node_config c = round_trip_config();
  c.listen = {url};
  if (!shm.empty()) c.listen.push_back("shm://" + shm + "-s");
  c.subnets = {{0x1000, 12}};
  node* self = nullptr;
  bool stop = false;
  node_callbacks cb;
  cb.on_endpoint_removed = [&](const endpoint_info&, errc) { stop = true; };
  cb.on_data = [&](bus_id src, uint32_t type, const uint8_t* p, size_t n) {
    if (type == kStopType) {
      stop = true;
      return;
    }
    on_data(*self, src, type, p, n);
  };
  node n(&loop, 0x1000, c, cb);
  self = &n;
  const errc e = n.start();
  if (!tell_parent(ready_fd,
                   e == errc::ok ? n.listen_urls()[0] : std::string("ERROR ") + to_string(e)) ||
      e != errc::ok) {
    return 1;
  }
  while (!stop) uv_run(&loop, UV_RUN_ONCE);
  n.stop();
  for (int i = 0; i < 1000 && uv_loop_alive(&loop); ++i) uv_run(&loop, UV_RUN_ONCE);
  return 0;
}

// The client node 0x1001's config: registered to url; with shm, shared memory enabled and
// listening on shm://SHM-c.
inline node_config client_config(const std::string& url, const std::string& shm) {
  node_config c = round_trip_config();
  c.parent_urls = {url};
  c.enable_shm = !shm.empty();
  if (!shm.empty()) c.listen = {"shm://" + shm + "-c"};
  return c;
}

// Starts the client node and runs the loop until it is up. Returns the data channel its first
// peer uses ("?" when none), nullptr if start() failed.
inline const char* start_client(uv_loop_t* loop, node& n) {
  if (n.start() != errc::ok) return nullptr;
  while (!n.up()) uv_run(loop, UV_RUN_ONCE);
  const auto peers = n.peers();
  return peers.empty() ? "?" : to_string(peers[0].data_channel);
}

// Tells the server to stop (a kStopType message of one byte of msg), stops the client node, runs
// the loop until *down (on_down) or for 1000 turns, and reaps the server process.
inline void stop_server(uv_loop_t* loop, node& n, const bool* down, const uint8_t* msg,
                        pid_t server) {
  (void)n.send_data(0x1000, kStopType, msg, 1);
  n.stop();
  for (int i = 0; i < 1000 && !*down; ++i) uv_run(loop, UV_RUN_ONCE);
  int status = 0;
  waitpid(server, &status, 0);
}

}  // namespace uvbus::bench
