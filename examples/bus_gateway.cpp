// A gateway and two logic nodes on a uvbus bus.
//
//   uvbus_example_bus                 all three nodes in this process, on one loop
//   uvbus_example_bus gateway         only the gateway (listens on 127.0.0.1:17000)
//   uvbus_example_bus logic 1|2       only logic node 1 or 2 (registers to the gateway)
//
// Run the three roles in three terminals to see a real bus: kill the gateway and start it again,
// and the logic nodes reconnect by themselves. The gateway (bus id 0x10000, owning the subnet
// 0x10000/16) plays a front end: every 500 ms it forwards a "player request" to the logic node
// that owns the player (even players to logic 1, odd to logic 2). Logic nodes answer the gateway
// and tell each other about every tenth player (a sibling message: they connect directly on the
// first one). On one host, data moves over shared memory; the nodes pick it by themselves.
#include <uv.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "uvbus/node.h"

namespace {

using uvbus::bus_id;

constexpr bus_id kGateway = 0x10000;
constexpr bus_id kLogic[] = {0x10001, 0x10002};
constexpr uint32_t kRequest = 1;
constexpr uint32_t kAnswer = 2;
constexpr uint32_t kGossip = 3;
const char* const kGatewayUrl = "ipv4://127.0.0.1:17000";
const char* const kToken = "example-token";  // the same secret on every node of the bus

std::string shm_name(const char* who) {
  return "shm://uvbus-example-" + std::string(who) + "-" + std::to_string(getuid());
}

std::unique_ptr<uvbus::node> make_gateway(uv_loop_t* loop) {
  uvbus::node_config cfg;
  cfg.listen = {kGatewayUrl, shm_name("gateway")};
  cfg.subnets = {{kGateway, 16}};  // logic nodes take ids 0x10001..0x1ffff
  cfg.access_tokens = {kToken};
  uvbus::node_callbacks cb;
  cb.on_data = [](bus_id from, uint32_t, const uint8_t* p, size_t n) {
    std::printf("gateway: answer from logic %#llx: %.*s\n", static_cast<unsigned long long>(from),
                static_cast<int>(n), reinterpret_cast<const char*>(p));
  };
  cb.on_endpoint_added = [](const uvbus::endpoint_info& e) {
    std::printf("gateway: logic %#llx registered (pid %u, data over %s)\n",
                static_cast<unsigned long long>(e.id), e.info.pid, to_string(e.data_channel));
  };
  cb.on_endpoint_removed = [](const uvbus::endpoint_info& e, uvbus::errc why) {
    std::printf("gateway: logic %#llx gone (%s)\n", static_cast<unsigned long long>(e.id),
                to_string(why));
  };
  return std::make_unique<uvbus::node>(loop, kGateway, cfg, cb);
}

std::unique_ptr<uvbus::node> make_logic(uv_loop_t* loop, int which) {
  const bus_id me = kLogic[which - 1];
  const bus_id other = kLogic[2 - which];
  uvbus::node_config cfg;
  cfg.parent_urls = {kGatewayUrl};
  cfg.listen = {"ipv4://127.0.0.1:0", shm_name(which == 1 ? "logic1" : "logic2")};
  cfg.access_tokens = {kToken};
  auto holder = std::make_shared<uvbus::node*>(nullptr);
  uvbus::node_callbacks cb;
  cb.on_data = [holder, me, other](bus_id from, uint32_t type, const uint8_t* p, size_t n) {
    const std::string text(reinterpret_cast<const char*>(p), n);
    if (type == kGossip) {
      std::printf("logic %#llx: sibling %#llx says %s\n", static_cast<unsigned long long>(me),
                  static_cast<unsigned long long>(from), text.c_str());
      return;
    }
    const std::string answer = "done: " + text;
    (void)(*holder)->send_data(from, kAnswer, answer.data(), answer.size());
    const int player =
        static_cast<int>(std::strtol(text.c_str() + text.find('#') + 1, nullptr, 10));
    if (player % 10 == 0) {
      const std::string gossip = "I served player #" + std::to_string(player);
      (void)(*holder)->send_data(other, kGossip, gossip.data(), gossip.size());
    }
  };
  cb.on_up = [me](bus_id parent) {
    std::printf("logic %#llx: registered with %#llx\n", static_cast<unsigned long long>(me),
                static_cast<unsigned long long>(parent));
  };
  cb.on_down = [me](uvbus::errc why) {
    if (why == uvbus::errc::closed) return;  // our own stop()
    std::printf("logic %#llx: lost the gateway (%s), reconnecting\n",
                static_cast<unsigned long long>(me), to_string(why));
  };
  cb.on_registration = [me](uvbus::errc e, const std::string& detail) {
    if (e != uvbus::errc::ok) {
      std::printf("logic %#llx: registration failed: %s %s\n", static_cast<unsigned long long>(me),
                  to_string(e), detail.c_str());
    }
  };
  cb.on_report = [me](const uvbus::delivery_report& r) {
    if (r.status != uvbus::errc::ok) {
      std::printf("logic %#llx: message %llu to %#llx failed: %s\n",
                  static_cast<unsigned long long>(me),
                  static_cast<unsigned long long>(r.message_id),
                  static_cast<unsigned long long>(r.target), to_string(r.status));
    }
  };
  auto n = std::make_unique<uvbus::node>(loop, me, cfg, cb);
  *holder = n.get();
  return n;
}

struct app {
  std::unique_ptr<uvbus::node> gateway;
  std::vector<std::unique_ptr<uvbus::node>> logic;
  uv_signal_t sig{};
  uv_timer_t tick{};
  int player = 0;
  int limit = 0;  // stop after this many requests (0: run until Ctrl-C)

  // Graceful stop: every node says goodbye and flushes (stop() does nothing to a node that never
  // started); uv_run returns once all have closed.
  void stop() {
    if (gateway) gateway->stop();
    for (auto& l : logic) l->stop();
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&sig))) {
      uv_close(reinterpret_cast<uv_handle_t*>(&sig), nullptr);
      uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
    }
  }

  // Starts every node; false (the refusal printed) at the first that fails.
  bool start() {
    if (gateway) {
      if (const uvbus::errc e = gateway->start(); e != uvbus::errc::ok) {
        std::fprintf(stderr, "gateway: %s %s\n", to_string(e),
                     gateway->last_error().detail.c_str());
        return false;
      }
    }
    for (auto& l : logic) {
      if (const uvbus::errc e = l->start(); e != uvbus::errc::ok) {
        std::fprintf(stderr, "logic: %s %s\n", to_string(e), l->last_error().detail.c_str());
        return false;
      }
    }
    return true;
  }

  // The end (node.h, for every node, one whose start() failed too): stop everything, run the
  // loop until it has closed, destroy the nodes, run it again until their handles have closed.
  int finish(uv_loop_t* loop, int rc) {
    stop();
    uv_run(loop, UV_RUN_DEFAULT);
    gateway.reset();
    logic.clear();
    uv_run(loop, UV_RUN_DEFAULT);
    if (uv_loop_close(loop) != 0) {
      std::fprintf(stderr, "the loop still has open handles at exit\n");
      return 1;
    }
    return rc;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "all";
  uv_loop_t* loop = uv_default_loop();
  app a;
  if (role == "all" || role == "gateway") a.gateway = make_gateway(loop);
  if (role == "all") {
    a.logic.push_back(make_logic(loop, 1));
    a.logic.push_back(make_logic(loop, 2));
    a.limit = 12;
  } else if (role == "logic") {
    a.logic.push_back(make_logic(
        loop, argc > 2 && static_cast<int>(std::strtol(argv[2], nullptr, 10)) == 2 ? 2 : 1));
  } else if (role != "gateway") {
    std::fprintf(stderr, "usage: %s [gateway | logic 1|2]\n", argv[0]);
    return 2;
  }
  // The handles stop() closes exist from here on, whatever happens next.
  uv_signal_init(loop, &a.sig);
  uv_timer_init(loop, &a.tick);
  if (!a.start()) return a.finish(loop, 1);
  a.sig.data = &a;
  uv_signal_start(
      &a.sig,
      [](uv_signal_t* s, int) {
        std::printf("stopping\n");
        static_cast<app*>(s->data)->stop();
      },
      SIGINT);

  // The gateway's front end: a player request every 500 ms to the logic node owning the player.
  a.tick.data = &a;
  if (a.gateway) {
    uv_timer_start(
        &a.tick,
        [](uv_timer_t* t) {
          auto* ap = static_cast<app*>(t->data);
          if (ap->limit != 0 && ap->player >= ap->limit) {
            ap->stop();
            return;
          }
          const int player = ++ap->player;
          const std::string req = "request of player #" + std::to_string(player);
          const uvbus::errc e =
              ap->gateway->send_data(kLogic[player % 2], kRequest, req.data(), req.size());
          if (e != uvbus::errc::ok) std::printf("gateway: cannot send: %s\n", to_string(e));
        },
        500, 500);
  }
  uv_run(loop, UV_RUN_DEFAULT);
  return a.finish(loop, 0);
}
