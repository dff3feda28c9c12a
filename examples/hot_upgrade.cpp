// Example: upgrading a logic node under load without losing or duplicating a message (the planned
// restart of docs/bus.md). scripts/hot_upgrade.sh runs it: a root, a sender and a logic node that
// is replaced by a new process again and again while the sender keeps sending.
//
//   uvbus_example_hot_upgrade root URL_FILE [URL]
//       a root node (0x100, subnet 0x100/8) on URL (default: a free TCP port); writes its URL into
//       URL_FILE. On SIGTERM it stops (its children reconnect to the next process on URL).
//   uvbus_example_hot_upgrade logic PARENT_URL SHM_NAME STATE_FILE LOG_FILE
//       logic node 0x102: receives over its shm ring, appends each message's number to LOG_FILE.
//       On SIGTERM it stops (keeping its ring), writes node::flow_positions() to STATE_FILE and
//       exits; started again with an existing STATE_FILE it inherits those positions.
//   uvbus_example_hot_upgrade sender PARENT_URL COUNT
//       node 0x101: sends COUNT numbered messages to 0x102 (about 2000 per second), waits for
//       every report and prints "reports ok=N failed=M reconnects=R"; exits 0 only if every
//       report is ok.
// With HOT_UPGRADE_HANDOVER=PATH in the environment, root and logic hand over with
// uvbus/handover.h instead: on SIGTERM the process detaches its listening sockets, stops, and
// sends sockets and flow positions to the process waiting at PATH; a process started with
// HOT_UPGRADE_TAKEOVER=1 as well first waits at PATH for them (peers never see a refused
// connection: their attempts wait in the inherited sockets' backlog). SIGINT stops a process
// without a hand-over (the last one).
#include <unistd.h>
#include <uv.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "uvbus/handover.h"
#include "uvbus/node.h"

using namespace uvbus;

namespace {

node_config base() {
  node_config c;
  c.heartbeat_interval_ms = 500;
  c.heartbeat_timeout_ms = 3000;
  c.reconnect_min_ms = 20;
  c.reconnect_max_ms = 200;
  c.sibling_direct = false;
  return c;
}

const char* handover_path() {
  return std::getenv("HOT_UPGRADE_HANDOVER");
}

// With a hand-over path: the listening sockets kept open for the next process.
handover_state g_handover;
bool g_final = false;  // SIGINT: the last stop, nobody to hand over to
uv_signal_t g_int;

// Stops the node on SIGTERM (with a hand-over path, after detaching its listeners); the loop ends
// when its on_down(closed) has run.
void stop_on_sigterm(uv_loop_t* loop, uv_signal_t* sig, node* n) {
  uv_signal_init(loop, sig);
  sig->data = n;
  uv_signal_start(
      sig,
      [](uv_signal_t* s, int) {
        auto* nn = static_cast<node*>(s->data);
        if (handover_path() != nullptr) (void)nn->detach_listeners(&g_handover.listeners);
        nn->stop();
      },
      SIGTERM);
  uv_signal_init(loop, &g_int);
  g_int.data = n;
  uv_signal_start(
      &g_int,
      [](uv_signal_t* s, int) {
        g_final = true;
        static_cast<node*>(s->data)->stop();
      },
      SIGINT);
}

// The process's end, as node.h asks of every node (one whose start() failed too): stop() (a
// goodbye; idempotent, nothing for a node never started), destroy it, close this process's own
// handles (signals, timers: null for one never initialized) and run the loop until all of it has
// closed. Returns rc, or 1 if the loop still holds a handle.
int finish(uv_loop_t* loop, std::unique_ptr<node> n, std::initializer_list<uv_handle_t*> handles,
           int rc) {
  for (uv_handle_t* h : handles) {
    if (h != nullptr && !uv_is_closing(h)) uv_close(h, nullptr);
  }
  if (n) n->stop();
  uv_run(loop, UV_RUN_DEFAULT);  // the goodbye flushed, the links closed
  n.reset();
  uv_run(loop, UV_RUN_DEFAULT);  // the node's handles closed
  if (uv_loop_close(loop) != 0) {
    std::fprintf(stderr, "hot_upgrade: the loop still has open handles at exit\n");
    return 1;
  }
  return rc;
}

uv_handle_t* as_handle(void* h) {
  return static_cast<uv_handle_t*>(h);
}

// The new process: waits for the old one's sockets and positions (HOT_UPGRADE_TAKEOVER=1).
bool take_over(node_config* c, const char* who) {
  if (handover_path() == nullptr || std::getenv("HOT_UPGRADE_TAKEOVER") == nullptr) return true;
  handover_state st;
  std::string why;
  if (const errc e = handover_receive(handover_path(), 30000, &st, &why); e != errc::ok) {
    std::fprintf(stderr, "%s: hand-over: %s %s\n", who, to_string(e), why.c_str());
    return false;
  }
  c->inherit_listeners = std::move(st.listeners);
  c->inherit_flow_positions = std::move(st.flow_positions);
  return true;
}

// The old process, its node stopped: gives sockets and positions to the next one.
int hand_over(const node& n, const char* who) {
  if (handover_path() == nullptr || g_final) return 0;
  g_handover.flow_positions = n.flow_positions();
  std::string why;
  const errc e = handover_send(handover_path(), g_handover, 30000, &why);
  for (const inherited_listener& l : g_handover.listeners) close(l.fd);
  if (e == errc::ok) return 0;
  std::fprintf(stderr, "%s: hand-over: %s %s\n", who, to_string(e), why.c_str());
  return 1;
}

int run_root(const char* url_file, const char* url) {
  uv_loop_t* loop = uv_default_loop();
  node_config c = base();
  c.listen = {url != nullptr ? url : "ipv4://127.0.0.1:0"};
  c.subnets = {{0x100, 8}};
  node_callbacks cb;
  cb.on_down = [](errc why) {
    if (why == errc::closed) uv_stop(uv_default_loop());
  };
  if (!take_over(&c, "root")) return 1;
  auto n = std::make_unique<node>(loop, 0x100, c, cb);
  if (const errc e = n->start(); e != errc::ok) {
    std::fprintf(stderr, "root: start: %s %s\n", to_string(e), n->last_error().detail.c_str());
    return finish(loop, std::move(n), {}, 1);
  }
  std::ofstream(url_file) << n->listen_urls().at(0) << "\n";
  uv_signal_t term;
  stop_on_sigterm(loop, &term, n.get());
  uv_run(loop, UV_RUN_DEFAULT);
  const int rc = hand_over(*n, "root");
  return finish(loop, std::move(n), {as_handle(&term), as_handle(&g_int)}, rc);
}

struct logic_state {
  node* n = nullptr;
  std::FILE* log = nullptr;
  std::string state_file;
  uv_signal_t term{};
};

int run_logic(const char* parent, const char* shm_name, const char* state_file, const char* log) {
  uv_loop_t* loop = uv_default_loop();
  logic_state st;
  st.state_file = state_file;
  st.log = std::fopen(log, "a");
  if (st.log == nullptr) return 1;
  node_config c = base();
  c.parent_urls = {parent};
  c.listen = {std::string("shm://") + shm_name};
  c.keep_shm_inbox = true;  // the next process reads what is written into the ring meanwhile
  std::ifstream in(state_file, std::ios::binary);
  c.inherit_flow_positions.assign(std::istreambuf_iterator<char>(in), {});
  if (!take_over(&c, "logic")) return 1;
  node_callbacks cb;
  cb.on_data = [&st](bus_id, uint32_t, const uint8_t* p, size_t size) {
    uint64_t v = 0;
    if (size >= 8) std::memcpy(&v, p, 8);
    std::fprintf(st.log, "%llu\n", static_cast<unsigned long long>(v));
  };
  cb.on_down = [&st](errc why) {
    if (why != errc::closed) return;  // a lost parent: it reconnects by itself
    const std::vector<uint8_t> pos = st.n->flow_positions();
    std::ofstream(st.state_file, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(pos.data()), static_cast<std::streamsize>(pos.size()));
    std::fflush(st.log);
    uv_stop(uv_default_loop());
  };
  if (std::getenv("HOT_UPGRADE_LOG") != nullptr) {
    cb.on_log = [](log_level, const std::string& m) {
      std::fprintf(stderr, "logic: %s\n", m.c_str());
    };
  }
  auto n = std::make_unique<node>(loop, 0x102, c, cb);
  st.n = n.get();
  if (const errc e = n->start(); e != errc::ok) {
    std::fprintf(stderr, "logic: start: %s %s\n", to_string(e), n->last_error().detail.c_str());
    std::fclose(st.log);
    return finish(loop, std::move(n), {}, 1);
  }
  stop_on_sigterm(loop, &st.term, n.get());
  uv_run(loop, UV_RUN_DEFAULT);
  std::fclose(st.log);
  const int rc = hand_over(*n, "logic");
  return finish(loop, std::move(n), {as_handle(&st.term), as_handle(&g_int)}, rc);
}

int run_sender(const char* parent, uint64_t count) {
  uv_loop_t* loop = uv_default_loop();
  uint64_t ok = 0;
  uint64_t failed = 0;
  uint64_t sent = 0;
  node_callbacks cb;
  cb.on_report = [&](const delivery_report& r) {
    if (r.status == errc::ok) {
      ++ok;
    } else {
      ++failed;
      std::fprintf(stderr, "sender: message %llu failed: %s\n",
                   static_cast<unsigned long long>(r.message_id), to_string(r.status));
    }
  };
  node_config c = base();
  c.parent_urls = {parent};
  c.delivery_timeout_ms = 30000;
  auto n = std::make_unique<node>(loop, 0x101, c, cb);
  if (const errc e = n->start(); e != errc::ok) {
    std::fprintf(stderr, "sender: start: %s %s\n", to_string(e), n->last_error().detail.c_str());
    return finish(loop, std::move(n), {}, 1);
  }
  uv_timer_t t;
  uv_timer_init(loop, &t);
  struct ctx {
    node* n;
    uint64_t* sent;
    uint64_t count;
  } x{n.get(), &sent, count};
  t.data = &x;
  uv_timer_start(
      &t,
      [](uv_timer_t* h) {
        auto* c = static_cast<ctx*>(h->data);
        for (int i = 0; i < 2 && *c->sent < c->count; ++i) {
          const uint64_t v = *c->sent;
          if (c->n->send_data(0x102, 1, &v, sizeof v) != errc::ok) break;
          ++*c->sent;
        }
        if (*c->sent == c->count) uv_timer_stop(h);
      },
      1, 1);
  while (ok + failed < count) uv_run(loop, UV_RUN_ONCE);
  std::printf("reports ok=%llu failed=%llu reconnects=%llu\n", static_cast<unsigned long long>(ok),
              static_cast<unsigned long long>(failed),
              static_cast<unsigned long long>(n->counters().reconnects));
  return finish(loop, std::move(n), {as_handle(&t)}, failed == 0 ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "root" && (argc == 3 || argc == 4))
    return run_root(argv[2], argc == 4 ? argv[3] : nullptr);
  if (role == "logic" && argc == 6) return run_logic(argv[2], argv[3], argv[4], argv[5]);
  if (role == "sender" && argc == 4)
    return run_sender(argv[2], std::strtoull(argv[3], nullptr, 10));
  std::fprintf(stderr,
               "usage: %s root URL_FILE [URL] | logic PARENT_URL SHM_NAME STATE_FILE LOG_FILE | "
               "sender PARENT_URL COUNT\n",
               argv[0]);
  return 2;
}
