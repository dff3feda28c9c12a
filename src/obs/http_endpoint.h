// A small HTTP GET endpoint served from a libuv loop by libmicrohttpd (no thread of its own): the
// node's /metrics. Bounded: a few concurrent connections (a few per client address), a deadline per
// request, no request bodies, at most one render per interval.
#pragma once

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "uvbus/error.h"

struct MHD_Daemon;

namespace uvbus::obs {

struct http_response {
  int status = 200;
  std::string content_type = "text/plain; version=0.0.4; charset=utf-8";
  std::string body;
};

// Called on the loop thread for a GET or HEAD of `path` (the served path or any other: the
// handler decides, e.g. 404), at most once per http_limits::render_interval_ms for one path whose
// answer was a 200 (requests in between get that answer again). It must not stop or destroy the
// endpoint.
using http_handler = std::function<void(std::string_view path, http_response* out)>;

struct http_url {
  std::string host;  // literal address, without brackets
  bool ipv6 = false;
  uint16_t port = 0;
  std::string path;  // begins with '/'
};

// Parses http://HOST:PORT[/PATH] (HOST an IPv4 literal, a bracketed IPv6 literal or localhost;
// PATH defaults to /metrics and holds no '?', '#' or '%': requests are matched by their decoded
// path alone). Errors: bad_url with *detail naming the wrong part.
errc parse_http_url(std::string_view url, http_url* out, std::string* detail);

// What one endpoint may hold at once (the defaults are what a node uses).
struct http_limits {
  unsigned max_connections = 16;  // more wait in the listen backlog (or are refused)
  // A connection whose request is not complete this long after it was accepted is closed, however
  // steadily its bytes trickle in; one whose answer is not sent this long after that, too. Also
  // libmicrohttpd's idle timeout: a connection silent this long is closed.
  unsigned timeout_seconds = 10;
  size_t connection_memory = 32768;  // per connection: request line, headers, buffers
  // Connections open at once from one client address (an IPv4 or IPv6 address); more from it
  // are accepted and closed at once, so one host cannot take every slot. 0: no such limit.
  unsigned max_per_address = 4;
  // At most one call of the handler per this many ms for one path: a request within it of the
  // last 200 answer for its path gets that answer again (concurrent and back-to-back scrapes
  // share one render, at most this old), so a client sending requests as fast as it can costs
  // at most 1000 / render_interval_ms renders a second. 0: every request calls the handler.
  unsigned render_interval_ms = 100;
};

class http_endpoint {
 public:
  static constexpr unsigned kMaxConnections = http_limits{}.max_connections;
  static constexpr unsigned kTimeoutSeconds = http_limits{}.timeout_seconds;

  http_endpoint() = default;
  ~http_endpoint();
  http_endpoint(const http_endpoint&) = delete;
  http_endpoint& operator=(const http_endpoint&) = delete;

  // Binds url (port 0: a free port) and serves from loop. Errors: bad_url, address_in_use,
  // permission_denied, io_error, wrong_state (already started); *detail says what failed.
  errc start(uv_loop_t* loop, std::string_view url, http_handler handler, std::string* detail);
  // Before start(): other bounds (tests use a short timeout). Errors: wrong_state (started),
  // invalid_argument (a zero; max_per_address may be 0).
  errc set_limits(const http_limits& limits);
  // Closes the socket and every connection; the loop's handles close asynchronously (run the
  // loop until they have). Idempotent.
  void stop();

  [[nodiscard]] uint16_t port() const noexcept { return port_; }
  // The bound URL, e.g. http://127.0.0.1:41234/metrics (empty when not started).
  [[nodiscard]] const std::string& url() const noexcept { return url_; }
  [[nodiscard]] uint64_t requests() const noexcept { return requests_; }
  // Calls of the handler (requests() minus those served an answer already rendered).
  [[nodiscard]] uint64_t renders() const noexcept { return renders_; }
  // Connections open now (at most limits().max_connections).
  [[nodiscard]] unsigned connections() const noexcept;
  [[nodiscard]] const http_limits& limits() const noexcept { return limits_; }
  // Connections this endpoint closed because their request (or answer) missed its deadline.
  [[nodiscard]] uint64_t deadline_closes() const noexcept { return deadline_closes_; }
  // Clients closed unserved because the process (or the system) was out of descriptors when they
  // were waiting to be accepted: they are taken off the backlog and closed at once (a reserved
  // descriptor makes room for the accept), so the loop does not spin on a socket it cannot accept.
  [[nodiscard]] uint64_t shed_clients() const noexcept { return shed_clients_; }

  struct loop_part;  // the libuv handles (freed by their close callbacks)

 private:
  // An open connection's socket and the time (uv_now, ms) its request or answer must be done by.
  struct deadline {
    int fd = -1;
    uint64_t at_ms = 0;
    bool expired = false;  // shut down: libmicrohttpd closes it on its next read
  };

  void run_daemon();
  // Shuts down the sockets of connections past their deadline; the ms until the next deadline
  // (UINT64_MAX: none pending).
  uint64_t expire_connections();
  // With no connection open and the listening socket still ready after a run, libmicrohttpd could
  // not accept (EMFILE / ENFILE): it would be woken again at once, for ever. Accepts here instead:
  // a client is handed to libmicrohttpd; out of descriptors, the waiting ones are shed.
  void accept_stuck_backlog();
  static void poll_cb(uv_poll_t* h, int status, int events);
  static constexpr uint64_t kBackoffMs = 1000;  // no reserve descriptor: wait, then try again
  static void on_connection(void* cls, void* connection, bool started);
  static int on_request(void* cls, void* connection, const char* url, const char* method,
                        size_t* upload_size, void** state);
  // The handler's answer for path, or the one rendered for it less than render_interval_ms ago.
  const http_response& render(const char* path);

  MHD_Daemon* daemon_ = nullptr;
  loop_part* part_ = nullptr;
  http_handler handler_;
  http_limits limits_;
  uint16_t port_ = 0;
  std::string url_;
  std::string path_;
  uint64_t requests_ = 0;
  uint64_t renders_ = 0;
  // The last 200 answer, for render_interval_ms from rendered_ms (uv_now) on, for its path.
  http_response cached_;
  std::string cached_path_;
  uint64_t rendered_ms_ = 0;
  bool has_cached_ = false;
  http_response other_;  // the last answer that is not kept (not a 200, or no interval)
  uv_loop_t* loop_ = nullptr;
  std::unordered_map<const void*, deadline> deadlines_;  // by MHD_Connection
  uint64_t deadline_closes_ = 0;
  int listen_fd_ = -1;   // owned by libmicrohttpd while daemon_ is set
  int reserve_fd_ = -1;  // /dev/null, closed for a moment to shed clients when out of descriptors
  uint64_t shed_clients_ = 0;
  bool backoff_ = false;  // the listening side's poll is stopped until the timer runs
};

}  // namespace uvbus::obs
