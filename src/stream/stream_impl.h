// Private state of the stream channel (never installed).
#pragma once

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/frame.h"
#include "core/write_queue.h"
#include "uvbus/stream.h"

namespace uvbus {

namespace detail {

// libuv handles a connection or listener may own; the first member of each is a uv_handle_t, so a
// pointer to the union is a valid uv_handle_t* / uv_stream_t*.
union stream_handle {
  uv_handle_t handle;
  uv_stream_t stream;
  uv_tcp_t tcp;
  uv_pipe_t pipe;
};

enum class conn_state : uint8_t {
  resolving,   // dns:// name lookup in progress
  connecting,  // uv_tcp_connect / uv_pipe_connect in progress
  connected,
  draining,  // graceful disconnect: flushing the queue, then shutdown
  closing,   // ended; waiting for libuv to release the handles
};

struct listener_impl;

struct conn_impl final : stream_connection {
  explicit conn_impl(stream_channel::impl* c) : ch(c) {}
  ~conn_impl() = default;

  stream_channel::impl* ch;
  stream_handle h{};
  bool is_unix = false;
  bool handle_open = false;  // h is initialised and uv_close() has not been called on it
  bool reading = false;
  bool paused = false;
  bool writing = false;        // wreq is in flight (it carries the rest of the queue's front block)
  bool dirty = false;          // on the channel's flush list
  bool want_writable = false;  // a send() returned queue_full: call on_writable once drained
  bool reported = false;       // the final callbacks have fired
  bool connected_once = false;  // on_accepted / on_connected(ok) fired: end with on_disconnected
  bool shutting_down = false;
  conn_state state = conn_state::connecting;
  errc reason = errc::ok;
  int pending = 0;  // libuv objects still referring to this connection (handles, requests)

  std::unique_ptr<write_queue> queue;  // created on the first send
  uint8_t* prepared = nullptr;         // prepare_send(): the open reservation's frame
  size_t prepared_size = 0;            // and its payload size
  frame_decoder decoder;
  uint64_t last_read_ms = 0;  // uv_now() of the last read that returned bytes (or of the accept)

  uv_write_t wreq{};
  uv_shutdown_t sreq{};
  uv_connect_t creq{};
  uv_timer_t* timer = nullptr;      // connect timeout, only while connecting
  uv_getaddrinfo_t* gai = nullptr;  // only while resolving
  addrinfo* ai_list = nullptr;      // dns results still to try
  addrinfo* ai_next = nullptr;

  conn_impl* prev = nullptr;  // channel's list of live connections
  conn_impl* next = nullptr;
  conn_impl* dirty_next = nullptr;

  void set_id(uint64_t id) noexcept { id_ = id; }
  void set_user(void* p) noexcept { user_data_ = p; }
  void set_outbound(bool o) noexcept { outbound_ = o; }
  void set_listener(const stream_listener* l) noexcept { listener_ = l; }
  void set_peer_url(std::string u) { peer_url_ = std::move(u); }
  stream_connection_metrics& m() noexcept { return metrics_; }
  uv_stream_t* stream() noexcept { return &h.stream; }
  uv_handle_t* handle() noexcept { return &h.handle; }
  bool active() const noexcept {
    return state == conn_state::connected || state == conn_state::draining;
  }
};

struct listener_impl final : stream_listener {
  explicit listener_impl(stream_channel::impl* c) : ch(c) {}
  ~listener_impl() = default;

  stream_channel::impl* ch;
  stream_handle h{};
  bool is_unix = false;
  bool closing = false;
  std::string unix_path;  // removed on close if it is still the file we created
  uint64_t unix_dev = 0;
  uint64_t unix_ino = 0;
  listener_impl* prev = nullptr;
  listener_impl* next = nullptr;

  void set_url(std::string u, uint16_t port) {
    url_ = std::move(u);
    port_ = port;
  }
  void set_user(void* p) noexcept { user_data_ = p; }
};

}  // namespace detail

}  // namespace uvbus
