// Bus node receiver (benchmark contract of docs/benchmark.md, at the node level):
//
//   uvbus_bench_node_recv URL [--min B] [--max B] [--seconds S] [--ready FILE] [--shm NAME]
//                             [--relay URL2]
//   uvbus_bench_node_recv URL --relay-of PARENT_URL [--shm NAME] [--ready FILE] [--seconds S]
//
// Runs the root node 0x1000 listening on URL (and on shm://NAME when given, so senders on this
// host write their data into shared memory). With --relay URL2 it also runs, on the same loop, a
// relay node 0x1100 (a child of the root) listening on URL2 (and shm://NAME-relay): a sender
// registered to the relay then reaches the root through it (forwarded). --ready FILE receives the
// URL a sender must register to. Verifies every payload and sequence number, prints a line per
// second and a final JSON line, and exits after the end message (or S + 5 s after the first).
// --relay-of PARENT_URL runs only the relay node 0x1100, as a process of its own registered to
// PARENT_URL (a receiver started first), and exits when its parent goes away.
#include <uv.h>

#include <cstdio>
#include <memory>
#include <string>

#include "bench_common.h"
#include "uvbus/node.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

struct receiver {
  options o;
  seq_receiver in;
  double deadline = 0;
  uv_timer_t tick{};  // the per-100-ms meter tick; closed by receive_until_end

  void on_message(const uint8_t* p, size_t n) {
    if (in.take(p, n, o.min, o.max)) deadline = mono_now() + o.seconds + 5;
  }
};

node_config bench_config() {
  node_config c;
  c.message_limit = size_t{64} * 1024;
  c.heartbeat_interval_ms = 1000;
  c.heartbeat_timeout_ms = 10000;
  c.sibling_direct = false;
  return c;
}

// The relay node 0x1100's config: listening on url (and shm://SHM-relay), a child of parent_url.
node_config relay_config(const std::string& url, const std::string& shm,
                         const std::string& parent_url) {
  node_config pc = bench_config();
  pc.listen = {url};
  if (!shm.empty()) pc.listen.push_back("shm://" + shm + "-relay");
  pc.subnets = {{0x1100, 8}};
  pc.parent_urls = {parent_url};
  return pc;
}

// --relay-of: only the relay node 0x1100, registered to parent_url; runs until the parent goes.
int run_relay_process(const options& o, uv_loop_t* loop, const std::string& shm,
                      const std::string& parent_url) {
  node_config pc = relay_config(o.url, shm, parent_url);
  pc.reconnect_min_ms = pc.reconnect_max_ms = 60000;  // the parent going away ends the run
  bool down = false;
  node_callbacks pcb;
  pcb.on_down = [&down](errc) { down = true; };
  node relay(loop, 0x1100, pc, pcb);
  if (const errc e = relay.start(); e != errc::ok) {
    std::fprintf(stderr, "relay: start: %s\n", to_string(e));
    return 1;
  }
  const double give_up = mono_now() + 10;
  while (!relay.up() && mono_now() < give_up) uv_run(loop, UV_RUN_ONCE);
  if (!relay.up() || !write_ready(o.get("ready"), relay.listen_urls()[0])) return 1;
  const double hard = mono_now() + o.seconds + 60;
  while (!down && mono_now() < hard) uv_run(loop, UV_RUN_ONCE);
  std::printf("[relay] forwarded=%llu dropped=%llu\n",
              static_cast<unsigned long long>(relay.counters().forwarded),
              static_cast<unsigned long long>(relay.counters().forward_dropped));
  return 0;
}

// --relay URL2: a relay node 0x1100 on the same loop, a child of the root at root_url.
std::unique_ptr<node> start_inprocess_relay(uv_loop_t* loop, const std::string& relay_url,
                                            const std::string& shm, const std::string& root_url) {
  auto relay = std::make_unique<node>(loop, 0x1100, relay_config(relay_url, shm, root_url),
                                      node_callbacks{});
  if (const errc e = relay->start(); e != errc::ok) {
    std::fprintf(stderr, "recv: start relay: %s\n", to_string(e));
    return nullptr;
  }
  while (!relay->up()) uv_run(loop, UV_RUN_ONCE);
  return relay;
}

// Runs the loop until the end message, the run's deadline or the hard deadline; ticks the meter.
void receive_until_end(receiver* r, uv_loop_t* loop) {
  const double hard_deadline = mono_now() + r->o.seconds + 60;
  uv_timer_t& tick = r->tick;
  uv_timer_init(loop, &tick);
  tick.data = r;
  uv_timer_start(
      &tick,
      [](uv_timer_t* t) {
        auto* self = static_cast<receiver*>(t->data);
        if (self->in.started) self->in.m.tick();
      },
      100, 100);
  while (!r->in.got_end && mono_now() < hard_deadline &&
         (r->deadline == 0 || mono_now() < r->deadline)) {
    uv_run(loop, UV_RUN_ONCE);
  }
  if (!r->in.got_end) {
    std::fprintf(stderr, "recv: no end message\n");
    ++r->in.errors;
  }
  uv_timer_stop(&tick);
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  receiver r;
  r.o = options::parse(argc, argv);
  if (r.o.url.empty()) {
    std::fprintf(stderr,
                 "usage: %s URL [--min B] [--max B] [--seconds S] [--ready FILE] [--shm NAME] "
                 "[--relay URL2]\n",
                 argv[0]);
    return 2;
  }
  uv_loop_t loop;
  uv_loop_init(&loop);
  const std::string shm = r.o.get("shm");
  const std::string relay_url = r.o.get("relay");
  const std::string relay_of = r.o.get("relay-of");
  if (!relay_of.empty()) return run_relay_process(r.o, &loop, shm, relay_of);

  node_config rc = bench_config();
  rc.listen = {r.o.url};
  if (!shm.empty()) rc.listen.push_back("shm://" + shm);
  rc.subnets = {{0x1000, 12}};
  node_callbacks cb;
  cb.on_data = [&r](bus_id, uint32_t, const uint8_t* p, size_t n) { r.on_message(p, n); };
  node root(&loop, 0x1000, rc, cb);
  if (const errc e = root.start(); e != errc::ok) {
    std::fprintf(stderr, "recv: start root: %s\n", to_string(e));
    return 1;
  }
  std::string sender_url = root.listen_urls()[0];
  std::unique_ptr<node> relay;
  if (!relay_url.empty()) {
    relay = start_inprocess_relay(&loop, relay_url, shm, sender_url);
    if (!relay) return 1;
    sender_url = relay->listen_urls()[0];
  }
  std::printf("[recv] root 0x1000 on %s%s; senders register to %s\n", root.listen_urls()[0].c_str(),
              shm.empty() ? "" : (" and shm://" + shm).c_str(), sender_url.c_str());
  std::fflush(stdout);
  if (!write_ready(r.o.get("ready"), sender_url)) return 1;
  receive_until_end(&r, &loop);
  const uint64_t fwd = relay ? relay->counters().forwarded : 0;
  char extra[160];
  std::snprintf(extra, sizeof extra, R"(,"relay_in_process":%s,"shm":%s,"forwarded":%llu)",
                relay ? "true" : "false", shm.empty() ? "false" : "true",
                static_cast<unsigned long long>(fwd));
  json_line("node", r.o, r.in.m, r.in.errors, extra);
  relay.reset();
  root.stop();
  for (int i = 0; i < 100 && uv_loop_alive(&loop); ++i) uv_run(&loop, UV_RUN_NOWAIT);
  return r.in.errors == 0 ? 0 : 1;
}
