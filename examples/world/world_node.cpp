// One process of the "world" example (examples/world/run.sh): a gateway, logic or chat node that
// finds the rest of the bus through etcd alone (no static URL anywhere).
//
//   uvbus_example_world ROLE ID ETCD_URL        ROLE: gateway | logic | chat, ID: hex bus id
//
// - gateway: a relay owning the subnet 0x10000/16. Both gateways own it; logic and chat nodes
//   register to the lowest-id live gateway (discovery_parent_type), and to the other one when
//   that one dies. The gateway with children plays the front end: every 100 ms a "player login"
//   goes to the logic node that owns the player as a call_any() (pick(): consistent hashing on the
//   player id), and the answer is counted; a call to a logic node that dies ends at once.
// - logic: answers logins ("logic-3 owns player 42"), counts chat broadcasts.
// - chat: every 500 ms broadcasts a chat line to every logic node and prints the summary.
// Every node prints its directory when it changes. Lines start with a keyword the script greps:
// UP, DOWN, DIR, CALLS, BCAST, GOT. SIGTERM/SIGINT stop the node cleanly (its entry leaves etcd
// at once); kill -9 leaves it to the lease (3 s).
#include <uv.h>

#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "uvbus/node.h"

namespace {

using uvbus::bus_id;
using uvbus::errc;

constexpr uint32_t kLogin = 1;
constexpr uint32_t kChat = 2;
constexpr uvbus::subnet kWorld{0x10000, 16};

struct world {
  uv_loop_t* loop = nullptr;
  std::string role;
  std::unique_ptr<uvbus::node> n;
  uv_timer_t tick{};
  uv_signal_t sig_term{};
  uv_signal_t sig_int{};
  uint64_t ticks = 0;
  uint64_t player = 0;
  uint64_t calls_ok = 0;
  uint64_t calls_failed = 0;
  uint64_t broadcasts_got = 0;
  std::string last_dir;
  bool relaying = false;  // a gateway with children
};

void say(const world& w, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void say(const world& w, const char* fmt, ...) {
  std::printf("%-7s %#llx ", w.role.c_str(), static_cast<unsigned long long>(w.n ? w.n->id() : 0));
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
  std::fflush(stdout);
}

// "DIR 11 nodes: gateway 2, logic 8, chat 1", printed when it differs from the last one.
void print_directory(world& w) {
  std::map<std::string, int> by_type;
  const auto all = w.n->directory();
  for (const auto& e : all) ++by_type[e.type];
  std::string line = std::to_string(all.size()) + " nodes:";
  for (const auto& [t, c] : by_type) line += " " + t + " " + std::to_string(c) + ",";
  line.pop_back();
  if (line == w.last_dir) return;
  w.last_dir = line;
  say(w, "DIR %s", line.c_str());
}

void gateway_tick(world& w) {
  w.relaying = false;
  for (const auto& p : w.n->peers()) w.relaying |= p.role == uvbus::peer_role::child;
  if (!w.relaying) return;
  const uint64_t player = ++w.player;
  bus_id target = 0;
  const uvbus::pick_options how{uvbus::pick_policy::consistent_hash, player};
  const std::string req = "login player " + std::to_string(player);
  world* wp = &w;
  const auto counted = [wp](const uvbus::call_result& r) {
    ++(r.status == errc::ok ? wp->calls_ok : wp->calls_failed);
  };
  // The logic node that owns the player, asked as a call; if it dies first, not_connected at once.
  if (w.n->call_any("logic", {}, kLogin, req.data(), req.size(), 2000, counted, how, {}, &target) !=
      errc::ok) {
    ++w.calls_failed;  // no logic node (unknown_route), or the call refused
  }
  if (w.ticks % 10 == 0) {
    say(w, "CALLS ok %llu failed %llu (player %llu -> logic %#llx)",
        static_cast<unsigned long long>(w.calls_ok),
        static_cast<unsigned long long>(w.calls_failed), static_cast<unsigned long long>(player),
        static_cast<unsigned long long>(target));
  }
}

void chat_tick(world& w) {
  if (w.ticks % 5 != 0 || !w.n->up()) return;
  const std::string line = "chat line " + std::to_string(w.ticks / 5);
  world* wp = &w;
  const errc e =
      w.n->broadcast(uvbus::broadcast_target::of_type("logic"), kChat, line.data(), line.size(),
                     1000, [wp](const uvbus::broadcast_report& r) {
                       say(*wp, "BCAST %s reached %zu failed %zu of %zu", to_string(r.status),
                           r.reached.size(), r.failed.size(), r.expected);
                     });
  if (e != errc::ok) say(w, "BCAST refused: %s", to_string(e));
}

void on_tick(uv_timer_t* t) {
  world& w = *static_cast<world*>(t->data);
  ++w.ticks;
  print_directory(w);
  if (w.role == "gateway") gateway_tick(w);
  if (w.role == "chat") chat_tick(w);
  if (w.role == "logic" && w.ticks % 20 == 0) {
    say(w, "GOT %llu chat broadcasts", static_cast<unsigned long long>(w.broadcasts_got));
  }
}

void on_signal(uv_signal_t* s, int) {
  world& w = *static_cast<world*>(s->data);
  say(w, "STOP");
  (void)w.n->stop();
  uv_timer_stop(&w.tick);
  uv_close(reinterpret_cast<uv_handle_t*>(&w.tick), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&w.sig_term), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&w.sig_int), nullptr);
}

void on_data(world& w, bus_id from, uint32_t type, const uint8_t* p, size_t n) {
  if (type == kChat) {
    ++w.broadcasts_got;
    return;
  }
  const uvbus::reply_handle* rq = w.n->incoming_request();
  if (type != kLogin || rq == nullptr) return;
  uvbus::reply_handle h = *rq;
  const std::string req(reinterpret_cast<const char*>(p), n);
  if (req.compare(0, 6, "login ") != 0) {  // from anyone (`uvbus call`): never trust its shape
    static const char kWhy[] = "expected \"login NAME\"";
    if (w.n->reply_error(h, 400, kWhy, sizeof kWhy - 1) != errc::ok) {
      say(w, "error answer to %#llx failed", static_cast<unsigned long long>(from));
    }
    return;
  }
  const std::string ans =
      w.role + " " + std::to_string(w.n->id() & 0xff) + " owns " + req.substr(6);
  if (w.n->reply(h, ans.data(), ans.size()) != errc::ok) {
    say(w, "reply to %#llx failed", static_cast<unsigned long long>(from));
  }
}

uvbus::node_config make_config(const std::string& role, bus_id id, const char* etcd) {
  uvbus::node_config c;
  c.listen = {"ipv4://127.0.0.1:0"};
  c.name = role + "-" + std::to_string(id & 0xff);
  c.type = role;
  c.labels = {{"zone", "a"}};
  c.access_tokens = {"world-example-token"};
  c.reconnect_min_ms = 50;
  c.reconnect_max_ms = 500;
  c.discovery.etcd_endpoints = {etcd};
  c.discovery.prefix = "/uvbus-world";
  c.discovery.ttl_s = 3;
  if (role == "gateway") {
    c.subnets = {kWorld};
  } else {
    c.discovery_parent_type = "gateway";
  }
  return c;
}

int run(world& w, bus_id id, const char* etcd) {
  uvbus::node_callbacks cb;
  cb.on_data = [&w](bus_id f, uint32_t t, const uint8_t* p, size_t n) { on_data(w, f, t, p, n); };
  cb.on_up = [&w](bus_id parent) {
    say(w, "UP parent %#llx", static_cast<unsigned long long>(parent));
  };
  cb.on_down = [&w](errc why) { say(w, "DOWN %s", to_string(why)); };
  cb.on_log = [&w](uvbus::log_level lv, const std::string& m) {
    if (lv >= uvbus::log_level::info && m.find("discovery") != std::string::npos) {
      say(w, "LOG %s", m.c_str());
    }
  };
  w.n = std::make_unique<uvbus::node>(w.loop, id, make_config(w.role, id, etcd), cb);
  if (w.n->start() != errc::ok) {
    std::fprintf(stderr, "%s %#llx: %s\n", w.role.c_str(), static_cast<unsigned long long>(id),
                 w.n->last_error().detail.c_str());
    w.n.reset();  // its handles close on the loop, which runs until they have
    uv_run(w.loop, UV_RUN_DEFAULT);
    return 1;
  }
  say(w, "START listening on %s", w.n->listen_urls().front().c_str());
  uv_timer_init(w.loop, &w.tick);
  w.tick.data = &w;
  uv_timer_start(&w.tick, on_tick, 100, 100);
  uv_signal_init(w.loop, &w.sig_term);
  uv_signal_init(w.loop, &w.sig_int);
  w.sig_term.data = w.sig_int.data = &w;
  uv_signal_start(&w.sig_term, on_signal, SIGTERM);
  uv_signal_start(&w.sig_int, on_signal, SIGINT);
  uv_run(w.loop, UV_RUN_DEFAULT);
  w.n.reset();
  uv_run(w.loop, UV_RUN_DEFAULT);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "gateway") != 0 && std::strcmp(argv[1], "logic") != 0 &&
                    std::strcmp(argv[1], "chat") != 0)) {
    std::fprintf(stderr, "usage: %s gateway|logic|chat ID_HEX http://ETCD_HOST:PORT\n", argv[0]);
    return 2;
  }
  world w;
  w.role = argv[1];
  const bus_id id = std::strtoull(argv[2], nullptr, 16);
  if (id == 0) {
    std::fprintf(stderr, "ID %s: a non-zero hex bus id\n", argv[2]);
    return 2;
  }
  uv_loop_t loop;
  uv_loop_init(&loop);
  w.loop = &loop;
  const int rc = run(w, id, argv[3]);
  uv_loop_close(&loop);
  return rc;
}
