// A front end that uses every core: one loop thread per core, each with its own stream channel, all
// listening on one TCP port (stream_config::tcp_reuse_port). The kernel hands each new connection
// to one of them; the connection then lives on that loop's thread for good.
//
//   uvbus_example_multi_loop [LOOPS] [CLIENTS]
//
// Starts LOOPS echo servers (default: the number of cores, at least 2) on 127.0.0.1, port chosen by
// the first, then CLIENTS clients (default 100) on the main thread, each sending one message and
// waiting for its echo. Prints how many connections each loop served and exits 0 when every client
// got its echo (1 otherwise, or after 30 s).
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "uvbus/stream.h"

namespace {

using uvbus::connection_id;
using uvbus::errc;
using uvbus::stream_channel;

// One loop thread and its channel. Everything but `served` and `stop` belongs to that thread.
struct echo_loop {
  uv_loop_t loop{};
  uv_async_t stop{};  // uv_async_send() from any thread ends the loop
  std::unique_ptr<stream_channel> ch;
  std::atomic<int> served{0};
  std::thread thread;

  // Listens on `url` (port 0: a free one) and runs until stopped; the promise gets the port, or 0
  // if listen() failed.
  void run(const std::string& url, std::promise<uint16_t>* port) {
    uv_loop_init(&loop);
    uvbus::stream_config cfg;
    cfg.tcp_reuse_port = true;  // every channel on the port sets it
    uvbus::stream_callbacks cb;
    cb.on_accepted = [this](connection_id) { ++served; };
    // The received bytes are the channel's until the callback returns: send() copies them.
    cb.on_received = [this](connection_id c, const uint8_t* data, size_t size) {
      (void)ch->send(c, data, size);
    };
    ch = std::make_unique<stream_channel>(&loop, cfg, std::move(cb));  // on its own loop's thread
    stop.data = this;
    uv_async_init(&loop, &stop, [](uv_async_t* h) {
      static_cast<echo_loop*>(h->data)->ch->close();
      uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr);
    });
    uvbus::listener_id l;
    const errc e = ch->listen(url, &l);
    if (e != errc::ok) {
      std::fprintf(stderr, "listen %s: %s (%s)\n", url.c_str(), uvbus::to_string(e),
                   ch->last_error().detail.c_str());
    }
    port->set_value(e == errc::ok ? ch->listener_port(l) : 0);
    uv_run(&loop, UV_RUN_DEFAULT);  // until `stop`
    ch.reset();
    uv_run(&loop, UV_RUN_DEFAULT);  // the channel's handles close
    uv_loop_close(&loop);
  }
};

// Starts a loop thread listening on `url`; its port, or 0.
uint16_t start(echo_loop* l, const std::string& url) {
  std::promise<uint16_t> port;
  std::future<uint16_t> got = port.get_future();
  l->thread = std::thread([l, url, &port] { l->run(url, &port); });
  return got.get();
}

// CLIENTS connections from one channel on the main loop, one message each; true when every echo
// came back within 30 s.
bool run_clients(uint16_t port, int clients) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  int echoes = 0;
  int failed = 0;
  uvbus::stream_callbacks cb;
  stream_channel* self = nullptr;
  cb.on_connected = [&self, &failed](connection_id c, errc status) {
    const std::string hello = "hello from connection " + std::to_string(c.value);
    if (status != errc::ok || self->send(c, hello.data(), hello.size()) != errc::ok) ++failed;
  };
  cb.on_received = [&echoes](connection_id, const uint8_t*, size_t) { ++echoes; };
  cb.on_disconnected = [&failed](connection_id, errc) { ++failed; };  // before its echo
  // Wakes the loop now and then, so that the deadline is seen even if nothing arrives.
  uv_timer_t tick;
  uv_timer_init(&loop, &tick);
  uv_timer_start(
      &tick, [](uv_timer_t*) {}, 100, 100);
  bool ok = false;
  {
    stream_channel client(&loop, {}, std::move(cb));
    self = &client;
    for (int i = 0; i < clients; ++i) {
      if (client.connect("ipv4://127.0.0.1:" + std::to_string(port)) != errc::ok) ++failed;
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (echoes < clients && failed == 0 && std::chrono::steady_clock::now() < give_up) {
      uv_run(&loop, UV_RUN_ONCE);
    }
    ok = echoes == clients;
    client.close();  // no callback from here on
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  std::printf("%d of %d clients got their echo\n", echoes, clients);
  return ok;
}

// argv[i] as a number in [lo, hi], `fallback` when absent, -1 when not such a number.
long arg(int argc, char** argv, int i, long fallback, long lo, long hi) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  const long v = std::strtol(argv[i], &end, 10);
  return end != argv[i] && *end == '\0' && v >= lo && v <= hi ? v : -1;
}

}  // namespace

int main(int argc, char** argv) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const auto loops = static_cast<int>(arg(argc, argv, 1, std::max(2, cores), 1, 256));
  const auto clients = static_cast<int>(arg(argc, argv, 2, 100, 1, 10000));
  if (loops < 0 || clients < 0) {
    std::fprintf(stderr, "usage: %s [LOOPS 1-256] [CLIENTS 1-10000]\n", argv[0]);
    return 2;
  }
  std::vector<std::unique_ptr<echo_loop>> servers;
  uint16_t port = 0;
  for (int i = 0; i < loops; ++i) {
    servers.push_back(std::make_unique<echo_loop>());
    // The first picks a free port; the others listen on the same one.
    const uint16_t got = start(servers.back().get(), "ipv4://127.0.0.1:" + std::to_string(port));
    if (got == 0) break;
    port = got;
  }
  const bool all_up = servers.size() == static_cast<size_t>(loops) && port != 0;
  const bool ok = all_up && run_clients(port, clients);
  for (auto& s : servers) {
    uv_async_send(&s->stop);
    s->thread.join();
  }
  for (size_t i = 0; i < servers.size(); ++i) {
    std::printf("loop %zu served %d connections\n", i, servers[i]->served.load());
  }
  return ok ? 0 : 1;
}
