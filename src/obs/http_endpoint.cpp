// http_endpoint: libmicrohttpd in external-polling epoll mode, its epoll fd watched by a uv_poll_t
// and its timeouts by a uv_timer_t, so requests are served on the loop thread.
#include "obs/http_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

namespace uvbus::obs {

struct http_endpoint::loop_part {
  uv_poll_t poll{};
  uv_timer_t timer{};
  int open = 0;  // handles not yet closed
  http_endpoint* owner = nullptr;
};

namespace {

errc bad(std::string* detail, const std::string& why) {
  if (detail != nullptr) *detail = why;
  return errc::bad_url;
}

void close_part(http_endpoint::loop_part* p) {
  p->owner = nullptr;
  const auto done = [](uv_handle_t* h) {
    auto* pp = static_cast<http_endpoint::loop_part*>(h->data);
    if (--pp->open == 0) delete pp;
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&p->poll), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&p->timer), done);
}

// A bound, listening, non-blocking socket for u; its port into *port.
errc listen_socket(const http_url& u, int* fd_out, uint16_t* port, std::string* detail) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (u.ipv6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(u.port);
    if (inet_pton(AF_INET6, u.host.c_str(), &in6->sin6_addr) != 1) {
      return bad(detail, "metrics URL: host \"" + u.host + "\" is not an IPv6 literal");
    }
    len = sizeof *in6;
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(u.port);
    if (inet_pton(AF_INET, u.host.c_str(), &in->sin_addr) != 1) {
      return bad(detail, "metrics URL: host \"" + u.host + "\" is not an IPv4 literal");
    }
    len = sizeof *in;
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (detail != nullptr) *detail = std::string("metrics endpoint: socket: ") + std::strerror(err);
    return errc_from_errno(-err);
  }
  const int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (u.ipv6) (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 16) != 0) {
    const int err = errno;
    ::close(fd);
    if (detail != nullptr) *detail = std::string("metrics endpoint: ") + std::strerror(err);
    return errc_from_errno(-err);
  }
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  (void)getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  *port = ntohs(u.ipv6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  *fd_out = fd;
  return errc::ok;
}

}  // namespace

errc parse_http_url(std::string_view url, http_url* out, std::string* detail) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return bad(detail, "metrics URL \"" + std::string(url) + "\": not http://HOST:PORT[/PATH]");
  }
  std::string_view rest = url.substr(kScheme.size());
  http_url u;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad(detail, "metrics URL: unclosed '['");
    u.host = std::string(rest.substr(1, close - 1));
    u.ipv6 = true;
    rest = rest.substr(close + 1);
  } else {
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos) return bad(detail, "metrics URL: no port");
    u.host = std::string(rest.substr(0, colon));
    rest = rest.substr(colon);
  }
  if (u.host == "localhost") u.host = "127.0.0.1";
  // The host must be a literal (no name lookup): checked here, so node::validate() refuses what
  // start() could not bind, not start() alone.
  in6_addr probe{};
  if (inet_pton(u.ipv6 ? AF_INET6 : AF_INET, u.host.c_str(), &probe) != 1) {
    return bad(detail, "metrics URL: host \"" + u.host + "\" is not an " +
                           (u.ipv6 ? "IPv6" : "IPv4") + " literal (nor localhost)");
  }
  if (rest.empty() || rest[0] != ':') return bad(detail, "metrics URL: no port");
  rest = rest.substr(1);
  const size_t slash = rest.find('/');
  const std::string_view port = rest.substr(0, slash);
  unsigned long p = 0;
  if (port.empty() || port.size() > 5) return bad(detail, "metrics URL: bad port");
  for (const char c : port) {
    if (c < '0' || c > '9') return bad(detail, "metrics URL: bad port");
    p = p * 10 + static_cast<unsigned long>(c - '0');
  }
  if (p > 65535) return bad(detail, "metrics URL: port above 65535");
  u.port = static_cast<uint16_t>(p);
  u.path = slash == std::string_view::npos ? "/metrics" : std::string(rest.substr(slash));
  // Requests are matched by their path alone: one with a query or a fragment would never match.
  if (u.path.find_first_of("?#") != std::string::npos) {
    return bad(detail, "metrics URL: path \"" + u.path + "\" has a query or fragment");
  }
  // libmicrohttpd decodes %XX in a request's path before we compare it: "/a%20b" would never match.
  if (u.path.find('%') != std::string::npos) {
    return bad(detail, "metrics URL: path \"" + u.path + "\" has a '%' (write it unescaped)");
  }
  *out = std::move(u);
  return errc::ok;
}

http_endpoint::~http_endpoint() {
  stop();
}

errc http_endpoint::start(uv_loop_t* loop, std::string_view url, http_handler handler,
                          std::string* detail) {
  if (daemon_ != nullptr) return errc::wrong_state;
  http_url u;
  errc e = parse_http_url(url, &u, detail);
  if (e != errc::ok) return e;
  int fd = -1;
  e = listen_socket(u, &fd, &port_, detail);
  if (e != errc::ok) return e;
  auto access = [](void* cls, MHD_Connection* c, const char* path, const char* method, const char*,
                   const char*, size_t* upload_size, void** state) -> MHD_Result {
    return static_cast<MHD_Result>(on_request(cls, c, path, method, upload_size, state));
  };
  MHD_NotifyConnectionCallback notify = [](void* cls, MHD_Connection* c, void**,
                                           MHD_ConnectionNotificationCode toe) {
    on_connection(cls, c, toe == MHD_CONNECTION_NOTIFY_STARTED);
  };
  const unsigned flags = MHD_USE_EPOLL | (u.ipv6 ? MHD_USE_IPv6 : 0);

  // CONNECTION_TIMEOUT is an idle timeout (every byte restarts it): the request's own deadline is
  // kept here (deadlines_), and PER_IP_CONNECTION_LIMIT keeps one host from taking every slot.
  loop_ = loop;
  errno = 0;  // what libmicrohttpd met (its epoll descriptor, say), for the detail
  daemon_ = MHD_start_daemon(flags, 0, nullptr, nullptr, access, this, MHD_OPTION_LISTEN_SOCKET, fd,
                             MHD_OPTION_CONNECTION_LIMIT, limits_.max_connections,
                             MHD_OPTION_PER_IP_CONNECTION_LIMIT, limits_.max_per_address,
                             MHD_OPTION_CONNECTION_TIMEOUT, limits_.timeout_seconds,
                             MHD_OPTION_CONNECTION_MEMORY_LIMIT, limits_.connection_memory,
                             MHD_OPTION_NOTIFY_CONNECTION, notify, this, MHD_OPTION_END);
  if (daemon_ == nullptr) {
    const int err = errno;
    ::close(fd);
    if (detail != nullptr) {
      *detail = "metrics endpoint: libmicrohttpd did not start";
      if (err != 0) *detail += std::string(" (") + std::strerror(err) + ")";
    }
    return err == ENOMEM ? errc::no_memory : errc::io_error;
  }
  listen_fd_ = fd;
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const MHD_DaemonInfo* info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_EPOLL_FD);
  part_ = new loop_part;
  part_->owner = this;
  part_->poll.data = part_->timer.data = part_;
  uv_poll_init(loop, &part_->poll, info->epoll_fd);
  uv_timer_init(loop, &part_->timer);
  part_->open = 2;
  uv_poll_start(&part_->poll, UV_READABLE, poll_cb);
  handler_ = std::move(handler);
  path_ = u.path;
  url_ = "http://" + (u.ipv6 ? "[" + u.host + "]" : u.host) + ":" + std::to_string(port_) + u.path;
  run_daemon();
  return errc::ok;
}

errc http_endpoint::set_limits(const http_limits& limits) {
  if (daemon_ != nullptr) return errc::wrong_state;
  if (limits.max_connections == 0 || limits.timeout_seconds == 0 || limits.connection_memory == 0) {
    return errc::invalid_argument;
  }
  limits_ = limits;
  return errc::ok;
}

unsigned http_endpoint::connections() const noexcept {
  if (daemon_ == nullptr) return 0;
  const MHD_DaemonInfo* info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return info == nullptr ? 0 : info->num_connections;
}

void http_endpoint::poll_cb(uv_poll_t* h, int, int) {
  auto* p = static_cast<loop_part*>(h->data);
  if (p->owner != nullptr) p->owner->run_daemon();
}

void http_endpoint::run_daemon() {
  if (backoff_) {  // the pause after a backlog that could be neither accepted nor shed is over
    backoff_ = false;
    uv_poll_start(&part_->poll, UV_READABLE, poll_cb);
  }
  // At the connection limit libmicrohttpd takes its listening socket out of its epoll set, and puts
  // it back only at the start of a later run. When this run closed connections, that later run
  // must be now: otherwise nothing would wake us again for the clients waiting in the backlog (an
  // endpoint that once reached its limit would never accept again).
  const unsigned before = connections();
  (void)expire_connections();
  MHD_run(daemon_);
  if (connections() < before) MHD_run(daemon_);
  if (connections() == 0) accept_stuck_backlog();
  uint64_t next = expire_connections();  // what is left pending after this run
  if (backoff_) next = std::min<uint64_t>(next, kBackoffMs);
  MHD_UNSIGNED_LONG_LONG timeout = 0;
  if (MHD_get_timeout(daemon_, &timeout) == MHD_YES && timeout < next) next = timeout;
  if (next != std::numeric_limits<uint64_t>::max()) {
    uv_timer_start(
        &part_->timer,
        [](uv_timer_t* t) {
          auto* p = static_cast<loop_part*>(t->data);
          if (p->owner != nullptr) p->owner->run_daemon();
        },
        next, 0);
  } else {
    uv_timer_stop(&part_->timer);
  }
}

void http_endpoint::accept_stuck_backlog() {
  pollfd p{listen_fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) != 1 || (p.revents & POLLIN) == 0) return;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int fd =
      ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {  // a client after all (one that went before it was refused): libmicrohttpd's
    (void)MHD_add_connection(daemon_, fd, reinterpret_cast<sockaddr*>(&ss), len);
    return;
  }
  if (errno != EMFILE && errno != ENFILE) return;
  if (reserve_fd_ >= 0) {
    ::close(reserve_fd_);
    reserve_fd_ = -1;
  }
  int shed = -1;
  while ((shed = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0 || errno == EINTR) {
    if (shed < 0) continue;
    ::close(shed);
    ++shed_clients_;
  }
  const bool stuck = errno == EMFILE || errno == ENFILE;  // no reserve to make room with
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (stuck) {  // the socket stays ready: stop watching for a while rather than spin on it
    uv_poll_stop(&part_->poll);
    backoff_ = true;
  }
}

uint64_t http_endpoint::expire_connections() {
  const uint64_t now = uv_now(loop_);
  uint64_t next = std::numeric_limits<uint64_t>::max();
  for (auto& [connection, d] : deadlines_) {
    if (d.expired) continue;
    if (now < d.at_ms) {
      next = std::min(next, d.at_ms - now);
      continue;
    }
    // Not closed here: the socket is libmicrohttpd's. After the shutdown its next read sees the end
    // of the stream and it closes the connection itself (the socket's epoll event wakes it).
    (void)::shutdown(d.fd, SHUT_RDWR);
    d.expired = true;
    ++deadline_closes_;
  }
  return next;
}

void http_endpoint::on_connection(void* cls, void* connection, bool started) {
  auto* self = static_cast<http_endpoint*>(cls);
  if (!started) {
    self->deadlines_.erase(connection);
    return;
  }
  const MHD_ConnectionInfo* info = MHD_get_connection_info(static_cast<MHD_Connection*>(connection),
                                                           MHD_CONNECTION_INFO_CONNECTION_FD);
  if (info == nullptr) return;
  deadline& d = self->deadlines_[connection];
  d.fd = info->connect_fd;
  d.at_ms = uv_now(self->loop_) + uint64_t{self->limits_.timeout_seconds} * 1000;
}

int http_endpoint::on_request(void* cls, void* connection, const char* url, const char* method,
                              size_t* upload_size, void** state) {
  auto* self = static_cast<http_endpoint*>(cls);
  auto* c = static_cast<MHD_Connection*>(connection);
  static int first_call_marker;
  if (*state == nullptr) {  // headers only so far: answer on the second call
    *state = &first_call_marker;
    return MHD_YES;
  }
  if (*upload_size != 0) return MHD_NO;  // no request bodies: close the connection
  http_response r;
  const bool head = std::strcmp(method, "HEAD") == 0;
  if (!head && std::strcmp(method, "GET") != 0) {
    r.status = 405;
    r.body = "only GET and HEAD\n";
  } else {
    ++self->requests_;
  }
  const http_response& a = r.status == 405 ? r : self->render(url);
  MHD_Response* resp = MHD_create_response_from_buffer(
      a.body.size(), const_cast<char*>(a.body.data()), MHD_RESPMEM_MUST_COPY);
  if (resp == nullptr) return MHD_NO;
  MHD_add_response_header(resp, "Content-Type", a.content_type.c_str());
  if (r.status == 405) MHD_add_response_header(resp, "Allow", "GET, HEAD");
  // One request per connection: an idle keep-alive connection would hold one of the few slots
  // until its timeout (a scraper reconnects every interval anyway).
  MHD_add_response_header(resp, "Connection", "close");
  const MHD_Result q = MHD_queue_response(c, static_cast<unsigned>(a.status), resp);
  MHD_destroy_response(resp);
  // The request is complete: the answer gets a deadline of its own (a client that reads it a byte
  // at a time would otherwise hold the slot, its idle timeout restarting at every byte).
  const auto it = self->deadlines_.find(connection);
  if (it != self->deadlines_.end() && !it->second.expired) {
    it->second.at_ms = uv_now(self->loop_) + uint64_t{self->limits_.timeout_seconds} * 1000;
  }
  return q;
}

const http_response& http_endpoint::render(const char* path) {
  const uint64_t now = uv_now(loop_);
  if (has_cached_ && now - rendered_ms_ < limits_.render_interval_ms && cached_path_ == path) {
    return cached_;
  }
  ++renders_;
  other_ = http_response{};
  handler_(path, &other_);
  // Only a 200 is kept, and it replaces the one kept: other answers (a 404) are cheap, and must
  // not evict the render they are not.
  if (other_.status != 200 || limits_.render_interval_ms == 0) return other_;
  std::swap(cached_, other_);
  has_cached_ = true;
  cached_path_ = path;
  rendered_ms_ = now;
  return cached_;
}

void http_endpoint::stop() {
  if (daemon_ == nullptr) return;
  uv_poll_stop(&part_->poll);  // before the daemon closes its epoll fd
  close_part(part_);
  part_ = nullptr;
  MHD_stop_daemon(daemon_);  // closes the listening socket and every connection
  daemon_ = nullptr;
  listen_fd_ = -1;
  backoff_ = false;
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  reserve_fd_ = -1;
  deadlines_.clear();
  cached_ = http_response{};
  other_ = http_response{};
  has_cached_ = false;
  url_.clear();
  port_ = 0;
}

}  // namespace uvbus::obs
