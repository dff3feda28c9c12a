// Test harness for the stream channel: one loop, channels whose callbacks record every event.
#pragma once

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "uvbus/stream.h"

namespace uvbus::test {

// Records every callback of one channel. Connections are keyed by id (pointers die with them).
struct recorder {
  struct written {
    uint64_t conn;
    uint64_t tag;
    errc status;
  };
  std::vector<stream_connection*> accepted;  // dangling once disconnected: use accepted_ids
  std::vector<uint64_t> accepted_ids;
  std::map<uint64_t, errc> connected;     // id -> status
  std::map<uint64_t, errc> disconnected;  // id -> reason
  std::map<uint64_t, std::vector<std::string>> received;
  std::vector<written> writes;
  std::map<uint64_t, int> writable;
  std::map<uint64_t, stream_connection*> live;  // connected/accepted and not yet ended

  // Optional hooks run after recording (for tests that react: echo, resend, disconnect).
  std::function<void(stream_connection*, const uint8_t*, size_t)> on_received_hook;
  std::function<void(stream_connection*)> on_writable_hook;
  std::function<void(stream_connection*)> on_accepted_hook;
  std::function<void(stream_connection*, errc)> on_connected_hook;
  bool keep_payloads = true;
  uint64_t received_count = 0;

  stream_callbacks callbacks() {
    stream_callbacks cb;
    cb.ctx = this;
    cb.on_accepted = [](void* ctx, stream_connection* c) {
      auto* r = static_cast<recorder*>(ctx);
      r->accepted.push_back(c);
      r->accepted_ids.push_back(c->id());
      r->live[c->id()] = c;
      if (r->on_accepted_hook) r->on_accepted_hook(c);
    };
    cb.on_connected = [](void* ctx, stream_connection* c, errc s) {
      auto* r = static_cast<recorder*>(ctx);
      EXPECT_EQ(r->connected.count(c->id()), 0u) << "on_connected twice";
      r->connected[c->id()] = s;
      if (s == errc::ok) r->live[c->id()] = c;
      if (r->on_connected_hook) r->on_connected_hook(c, s);
    };
    cb.on_disconnected = [](void* ctx, stream_connection* c, errc reason) {
      auto* r = static_cast<recorder*>(ctx);
      EXPECT_EQ(r->disconnected.count(c->id()), 0u) << "on_disconnected twice";
      r->disconnected[c->id()] = reason;
      r->live.erase(c->id());
    };
    cb.on_received = [](void* ctx, stream_connection* c, const uint8_t* d, size_t n) {
      auto* r = static_cast<recorder*>(ctx);
      ++r->received_count;
      if (r->keep_payloads) {
        r->received[c->id()].emplace_back(reinterpret_cast<const char*>(d), n);
      }
      if (r->on_received_hook) r->on_received_hook(c, d, n);
    };
    cb.on_written = [](void* ctx, stream_connection* c, uint64_t tag, errc s) {
      static_cast<recorder*>(ctx)->writes.push_back({c->id(), tag, s});
    };
    cb.on_writable = [](void* ctx, stream_connection* c) {
      auto* r = static_cast<recorder*>(ctx);
      ++r->writable[c->id()];
      if (r->on_writable_hook) r->on_writable_hook(c);
    };
    return cb;
  }
};

// A loop plus helpers; the loop is checked to be empty (every handle closed) at the end.
class stream_fixture : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    channels_.clear();
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "a handle was left open";
  }

  stream_channel* make_channel(recorder* rec, const stream_config& cfg = {}) {
    channels_.push_back(std::make_unique<stream_channel>(&loop_, cfg, rec->callbacks()));
    return channels_.back().get();
  }

  template <class Pred>
  bool run(Pred&& pred, std::chrono::milliseconds deadline = std::chrono::milliseconds(20000)) {
    return run_until(&loop_, std::forward<Pred>(pred), deadline);
  }

  uv_loop_t loop_{};
  std::vector<std::unique_ptr<stream_channel>> channels_;
};

}  // namespace uvbus::test
