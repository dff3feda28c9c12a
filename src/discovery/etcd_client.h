// HTTP/1.1 POST requests to etcd's JSON gateway through libcurl's multi-socket interface, driven
// by a libuv loop (uv_poll per socket, one uv_timer for curl's timeouts). Unary requests and
// streams of newline-delimited JSON messages (watch). Loop thread only; nothing blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "uvbus/error.h"

typedef struct uv_loop_s uv_loop_t;  // NOLINT(modernize-use-using): matches libuv's declaration

namespace uvbus::detail {

struct http_result {
  errc code = errc::ok;  // ok: a response arrived (any HTTP status); else why not
  long status = 0;       // HTTP status
  std::string body;      // unary: the whole body (at most max_body bytes)
  std::string detail;    // curl's error text when code != ok
};

// TLS settings for https:// URLs (discovery_config's tls_* files; empty: curl's defaults).
struct etcd_tls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// Sets a curl easy handle's (CURL*) TLS options from tls: peer and host verification, and with
// ca_file set, that file as the only trust anchor (curl's built-in CA directory is unset). Every
// request of etcd_client goes through it; declared here for tests.
void set_tls_options(void* easy, const etcd_tls& tls);

class etcd_client {
 public:
  using done_fn = std::function<void(http_result& r)>;
  // A stream's messages, one line each (without the newline); the view is valid during the call.
  using line_fn = std::function<void(std::string_view line)>;

  // max_body: a unary body or one stream line above it fails the request (errc::oversize).
  etcd_client(uv_loop_t* loop, size_t max_body, etcd_tls tls = {});
  // Cancels every request without callbacks; the poll/timer handles close on the next loop turn.
  ~etcd_client();
  etcd_client(const etcd_client&) = delete;
  etcd_client& operator=(const etcd_client&) = delete;

  // POSTs `body` to url; `done` runs exactly once from the loop (never inside this call), unless
  // the request is cancelled first. Returns the request id (0 when curl refused it: no callback).
  uint64_t post(const std::string& url, std::string body, uint32_t timeout_ms, done_fn done);
  // A streaming POST (no total deadline; connect_timeout_ms to connect): on_line per message,
  // then `done` once when the stream ends or fails.
  uint64_t stream(const std::string& url, std::string body, uint32_t connect_timeout_ms,
                  line_fn on_line, done_fn done);
  // Drops a request: no callback runs for it afterwards. Unknown ids are ignored.
  void cancel(uint64_t id);
  [[nodiscard]] size_t active() const { return reqs_.size(); }
  // etcd's auth token, sent as the Authorization header of every request added from now on
  // (empty: none).
  void set_token(std::string token) { token_ = std::move(token); }

  // Internals, public for the C callbacks of etcd_client.cpp.
  struct request;
  struct poll_ctx;
  void action(int fd, int flags);  // curl_multi_socket_action, then after_action
  int on_socket(int fd, int what, void* socketp);
  void on_curl_timer(long timeout_ms);

 private:
  uint64_t add(const std::string& url, std::string body, uint32_t timeout_ms,
               uint32_t connect_timeout_ms, line_fn on_line, done_fn done);
  void deliver_lines(const std::weak_ptr<char>& alive);
  void after_action();  // delivers stream lines and finished requests (outside curl callbacks)
  void drop(uint64_t id);

  uv_loop_t* loop_;
  size_t max_body_;
  etcd_tls tls_;
  std::string token_;
  void* multi_ = nullptr;  // CURLM*
  void* timer_ = nullptr;  // uv_timer_t*, freed by its close callback
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<request>> reqs_;
  std::unordered_map<int, poll_ctx*> polls_;
  std::shared_ptr<char> life_;   // expires when destroyed (a callback may destroy us)
  std::vector<uint64_t> dirty_;  // streams that received data since the last after_action
};

}  // namespace uvbus::detail
