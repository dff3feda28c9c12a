// stream_config::tcp_reuse_port: several channels listening on one TCP port (SO_REUSEPORT), on one
// loop and on a loop thread each; the port refused to a channel without it; unix listeners
// unaffected.
#include <gtest/gtest.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "stream/stream_harness.h"
#include "test_util.h"

namespace uvbus::test::stream_reuse_port_test {
namespace {

class StreamReusePort : public stream_fixture {};

stream_config reusing() {
  stream_config cfg;
  cfg.tcp_reuse_port = true;
  return cfg;
}

std::string local_url(uint16_t port) {
  return "ipv4://127.0.0.1:" + std::to_string(port);
}

constexpr size_t kClients = 64;

// Connects kClients clients to port from `client`; each sends its own text once connected.
void dial_all(stream_channel* client, recorder* rec, uint16_t port) {
  rec->on_connected_hook = [client](connection_id c, errc s) {
    if (s != errc::ok) return;
    const std::string text = "client " + std::to_string(c.value);
    EXPECT_EQ(client->send(c, text.data(), text.size()), errc::ok);
  };
  for (size_t i = 0; i < kClients; ++i) {
    ASSERT_EQ(client->connect(local_url(port)), errc::ok) << client->last_error().detail;
  }
}

// Two channels of one loop listen on one port: the kernel spreads the clients over both (by a
// hash of each connection's ports: that one of them gets none of 64 has a chance of 2^-63), and
// every client's message arrives once, at the channel that accepted it.
TEST_F(StreamReusePort, TwoChannelsOnOnePortShareItsClients) {
  recorder ra;
  recorder rb;
  recorder rc;
  stream_channel* a = make_channel(&ra, reusing());
  stream_channel* b = make_channel(&rb, reusing());
  stream_channel* client = make_channel(&rc);
  listener_id la;
  listener_id lb;
  ASSERT_EQ(a->listen("ipv4://127.0.0.1:0", &la), errc::ok) << a->last_error().detail;
  const uint16_t port = a->listener_port(la);
  ASSERT_EQ(b->listen(local_url(port), &lb), errc::ok) << b->last_error().detail;
  EXPECT_EQ(b->listener_port(lb), port);
  dial_all(client, &rc, port);
  ASSERT_TRUE(run([&] { return ra.received_count + rb.received_count == kClients; }));
  EXPECT_GT(ra.accepted.size(), 0u);
  EXPECT_GT(rb.accepted.size(), 0u);
  EXPECT_EQ(ra.accepted.size() + rb.accepted.size(), kClients);
  std::set<std::string> texts;
  for (const recorder* r : {&ra, &rb}) {
    for (const auto& [conn, msgs] : r->received) {
      EXPECT_EQ(msgs.size(), 1u) << "connection " << conn;
      texts.insert(msgs.begin(), msgs.end());
    }
  }
  EXPECT_EQ(texts.size(), kClients);
}

// The port of a reusing listener is refused to a channel without the option (Linux shares a port
// only among sockets that all set SO_REUSEPORT), and a reusing channel cannot take the port of a
// listener without it either.
TEST_F(StreamReusePort, EverySocketOnThePortMustSetIt) {
  recorder ra;
  recorder rb;
  recorder rc;
  stream_channel* reuser = make_channel(&ra, reusing());
  stream_channel* plain = make_channel(&rb);
  stream_channel* reuser2 = make_channel(&rc, reusing());
  listener_id l;
  ASSERT_EQ(reuser->listen("ipv4://127.0.0.1:0", &l), errc::ok);
  EXPECT_EQ(plain->listen(local_url(reuser->listener_port(l))), errc::address_in_use);
  EXPECT_NE(plain->last_error().detail.find(std::to_string(reuser->listener_port(l))),
            std::string::npos)
      << plain->last_error().detail;
  listener_id lp;
  ASSERT_EQ(plain->listen("ipv4://127.0.0.1:0", &lp), errc::ok);
  EXPECT_EQ(reuser2->listen(local_url(plain->listener_port(lp))), errc::address_in_use);
}

// Unix listeners ignore the option: one listens and carries data as without it, and a second
// listener on the same path is still refused.
TEST_F(StreamReusePort, UnixListenersAreUnaffected) {
  recorder ra;
  recorder rb;
  stream_channel* a = make_channel(&ra, reusing());
  stream_channel* b = make_channel(&rb, reusing());
  const std::string url = "unix://@" + unique_name("reuse-port");
  ASSERT_EQ(a->listen(url), errc::ok) << a->last_error().detail;
  EXPECT_EQ(b->listen(url), errc::address_in_use);
  connection_id c;
  ASSERT_EQ(b->connect(url, &c), errc::ok);
  ASSERT_TRUE(run([&] { return rb.connected.count(c.value) == 1; }));
  ASSERT_EQ(b->send(c, "hi", 2), errc::ok);
  ASSERT_TRUE(run([&] { return ra.received_count == 1; }));
}

// A server channel on a loop thread of its own: echoes every message, counts what it accepted.
// Stopped from the test's thread through an async handle.
struct server_thread {
  uv_loop_t loop{};
  uv_async_t stop{};
  std::unique_ptr<stream_channel> ch;
  std::atomic<size_t> accepted{0};
  std::atomic<size_t> received{0};
  std::promise<uint16_t> listening;  // its port, 0 if listen() failed
  std::thread thread;

  void start(uint16_t port) {
    thread = std::thread([this, port] { run(port); });
  }
  void run(uint16_t port) {
    uv_loop_init(&loop);
    stream_callbacks cb;
    cb.on_accepted = [this](connection_id) { ++accepted; };
    cb.on_received = [this](connection_id c, const uint8_t* d, size_t n) {
      ++received;
      EXPECT_EQ(ch->send(c, d, n), errc::ok);
    };
    ch = std::make_unique<stream_channel>(&loop, reusing(), std::move(cb));
    stop.data = this;
    uv_async_init(&loop, &stop, [](uv_async_t* h) {
      static_cast<server_thread*>(h->data)->ch->close();
      uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr);
    });
    listener_id l;
    const bool ok = ch->listen(local_url(port), &l) == errc::ok;
    listening.set_value(ok ? ch->listener_port(l) : 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    ch.reset();
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
  void finish() {
    uv_async_send(&stop);
    thread.join();
  }
};

// What the option is for: one channel per loop thread, all on one port. Every client gets its
// echo back from the thread that accepted it, and both threads took clients.
TEST_F(StreamReusePort, ALoopThreadPerChannelServesOnePort) {
  server_thread s1;
  server_thread s2;
  s1.start(0);
  std::future<uint16_t> f1 = s1.listening.get_future();
  ASSERT_EQ(f1.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const uint16_t port = f1.get();
  s2.start(port);
  std::future<uint16_t> f2 = s2.listening.get_future();
  ASSERT_EQ(f2.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const uint16_t port2 = f2.get();
  if (port == 0 || port2 != port) {
    s1.finish();
    s2.finish();
    FAIL() << "listen failed: ports " << port << ", " << port2;
  }
  recorder rc;
  stream_channel* client = make_channel(&rc);
  dial_all(client, &rc, port);
  const bool echoed = run([&] { return rc.received_count == kClients; });
  s1.finish();
  s2.finish();
  ASSERT_TRUE(echoed) << rc.received_count << " echoes";
  EXPECT_EQ(s1.accepted + s2.accepted, kClients);
  EXPECT_GT(s1.accepted.load(), 0u);
  EXPECT_GT(s2.accepted.load(), 0u);
  for (const auto& [conn, msgs] : rc.received) {
    ASSERT_EQ(msgs.size(), 1u) << "connection " << conn;
    EXPECT_EQ(msgs[0], "client " + std::to_string(conn));
  }
}

}  // namespace
}  // namespace uvbus::test::stream_reuse_port_test
