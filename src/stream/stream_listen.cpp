// Stream listening: listen() on tcp/dns/unix URLs, unix socket files, accept, max_connections and
// the caps on unregistered connections.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>

#include "stream/stream_impl.h"
#include "stream/test_access.h"

namespace uvbus {

namespace {

std::string sockaddr_url(const sockaddr* sa) {
  char ip[INET6_ADDRSTRLEN] = {};
  char buf[INET6_ADDRSTRLEN + 32];
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    uv_ip4_name(in, ip, sizeof ip);
    std::snprintf(buf, sizeof buf, "ipv4://%s:%u", ip, unsigned{ntohs(in->sin_port)});
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    uv_ip6_name(in6, ip, sizeof ip);
    std::snprintf(buf, sizeof buf, "ipv6://[%s]:%u", ip, unsigned{ntohs(in6->sin6_port)});
  } else {
    return {};
  }
  return buf;
}

uint16_t sockaddr_port(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  }
  return 0;
}

// Why fd can not serve as a listener of the URL kind a (empty if it can), from the socket itself.
std::string listening_fd_problem(int fd, const address& a, sockaddr_storage* bound) {
  int v = 0;
  socklen_t len = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) != 0) {
    return std::string("not a socket (") + std::strerror(errno) + ")";
  }
  if (v != SOCK_STREAM) return "not a stream socket";
  len = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0 || v == 0) return "not listening";
  socklen_t blen = sizeof *bound;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(bound), &blen) != 0) {
    return std::string("getsockname failed (") + std::strerror(errno) + ")";
  }
  const int family = bound->ss_family;
  if (a.kind == scheme::unix_socket) {
    if (family != AF_UNIX) return "not a unix socket";
    const auto* sun = reinterpret_cast<const sockaddr_un*>(bound);
    const size_t n =
        blen > offsetof(sockaddr_un, sun_path) ? blen - offsetof(sockaddr_un, sun_path) : 0;
    const std::string path(sun->sun_path, strnlen(sun->sun_path, n));
    if (path != a.host) return "bound to \"" + path + "\"";
    return {};
  }
  if (family != AF_INET && family != AF_INET6) return "not a TCP socket";
  if (a.kind != scheme::dns) {
    sockaddr_storage want{};
    if (literal_sockaddr(a, &want) == errc::ok && want.ss_family != family) {
      return family == AF_INET ? "an IPv4 socket" : "an IPv6 socket";
    }
  }
  const uint16_t port = sockaddr_port(reinterpret_cast<const sockaddr*>(bound));
  if (a.port != 0 && a.port != port) return "bound to port " + std::to_string(port);
  return {};
}

}  // namespace

namespace detail {

int stream_access::drop_reserve(stream_channel& ch) noexcept {
  const int fd = ch.impl_->reserve_fd;
  if (fd >= 0) ::close(fd);
  ch.impl_->reserve_fd = -1;
  return fd;
}

source_key source_of(const sockaddr* sa) noexcept {
  source_key k;
  if (sa->sa_family == AF_INET) {
    k.family = 4;
    std::memcpy(k.bytes.data(), &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      k.family = 4;  // the same host whichever socket family it reached us through
      std::memcpy(k.bytes.data(), in6->sin6_addr.s6_addr + 12, 4);
    } else {
      k.family = 6;
      std::memcpy(k.bytes.data(), in6->sin6_addr.s6_addr, 16);
    }
  }
  return k;
}

}  // namespace detail

bool stream_channel::impl::admit_unregistered(const listener_impl* l, conn_impl* c) {
  const uint32_t total = cfg.max_unregistered;
  const uint32_t per = cfg.max_unregistered_per_address;
  const auto it = unregistered_by_source.find(c->source);
  const uint32_t from_source = it == unregistered_by_source.end() ? 0 : it->second;
  const char* cap = nullptr;
  uint32_t value = 0;
  if (total != 0 && retired.unregistered_open >= total) {
    ++retired.rejected_unregistered;
    cap = "max_unregistered";
    value = total;
  } else if (per != 0 && from_source >= per) {
    ++retired.rejected_per_address;
    cap = "max_unregistered_per_address";
    value = per;
  }
  if (cap != nullptr) {
    ++retired.connections_rejected;
    log_event(kLogUnregistered, log_level::warn,
              l->url + ": connection from " + (c->is_unix ? "a unix socket" : c->peer_url) +
                  " rejected: " + cap + " (" + std::to_string(value) + ") reached");
    return false;
  }
  if (it != unregistered_by_source.end()) {
    ++it->second;
  } else {
    unregistered_by_source.emplace(c->source, 1);
  }
  ++retired.unregistered_open;
  c->unregistered = true;
  return true;
}

void stream_channel::impl::forget_unregistered(conn_impl* c) {
  if (!c->unregistered) return;
  c->unregistered = false;
  --retired.unregistered_open;
  const auto it = unregistered_by_source.find(c->source);
  if (it != unregistered_by_source.end() && --it->second == 0) unregistered_by_source.erase(it);
}

void stream_channel::impl::connection_cb(uv_stream_t* server, int status) {
  auto* l = static_cast<listener_impl*>(server->data);
  l->ch->on_incoming(l, status);
}

uint64_t stream_channel::impl::shed_backlog(listener_impl* l) {
  uv_os_fd_t fd = -1;
  if (uv_fileno(&l->h.handle, &fd) != 0) return 0;
  if (reserve_fd >= 0) ::close(reserve_fd);
  reserve_fd = -1;
  uint64_t n = 0;
  int s = -1;
  while ((s = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0 || errno == EINTR) {
    if (s >= 0) ::close(s);
    n += s >= 0 ? 1 : 0;
  }
  // The slot stays free: accept() takes a descriptor before it looks at the backlog, so libuv's
  // next one ends its loop (EAGAIN) only if there is one. Reopened when this loop turn is over.
  uv_timer_start(
      &reserve_timer, [](uv_timer_t* t) { (void)static_cast<impl*>(t->data)->reopen_reserve(); }, 0,
      0);
  return n;
}

bool stream_channel::impl::reopen_reserve() {
  if (reserve_fd < 0 && !closed && !listeners.empty()) {
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  return reserve_fd >= 0;
}

void stream_channel::impl::on_incoming(listener_impl* l, int status) {
  if (status < 0 && !closed) {
    // Out of descriptors libuv takes the waiting clients off the backlog with a reserve descriptor
    // of its own; an error here means that failed (its reserve lost to another thread or process)
    // and it calls again at once for as long as the accept fails: shed them with ours, so that
    // its next accept finds the backlog empty instead of spinning in this loop turn for ever.
    const bool out_of_fds = status == UV_EMFILE || status == UV_ENFILE;
    const uint64_t shed = out_of_fds ? shed_backlog(l) : 0;
    log_event(kLogAcceptFailed, log_level::error,
              l->url + ": accept failed: " + uv_strerror(status) +
                  (out_of_fds ? "; " + std::to_string(shed) + " waiting clients closed" : ""));
  }
  if (status < 0 || closed) return;
  // Without a reserve (just used, or lost) and no descriptor to make one: this client's becomes
  // it, or libuv's next accept would fail with nothing left to shed the backlog with.
  const bool starved = reserve_fd < 0 && !reopen_reserve() && (errno == EMFILE || errno == ENFILE);
  conn_impl* c = new_conn(false, nullptr);
  if (c == nullptr) return;
  c->is_unix = l->is_unix;
  c->listener = l->id;
  int r = c->is_unix ? uv_pipe_init(loop, &c->h.pipe, 0) : uv_tcp_init(loop, &c->h.tcp);
  if (r != 0) {
    c->reported = true;
    end_conn(c, from_uv(r));
    return;
  }
  c->h.handle.data = c;
  c->handle_open = true;
  ++c->pending;
  r = uv_accept(server_of(l), c->stream());
  if (r != 0) {
    c->reported = true;
    end_conn(c, from_uv(r));
    return;
  }
  if (c->is_unix) {
    apply_unix_options(c);
    c->peer_url = l->url;
    c->source.family = 1;
  } else {
    apply_tcp_options(c);
    sockaddr_storage ss{};
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->h.tcp, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      c->peer_url = sockaddr_url(reinterpret_cast<sockaddr*>(&ss));
      c->source = detail::source_of(reinterpret_cast<sockaddr*>(&ss));
    }
  }
  if (starved) {
    ++retired.connections_rejected;
    log_event(kLogAcceptFailed, log_level::error,
              l->url + ": connection from " + c->peer_url +
                  " closed: out of descriptors (its descriptor is kept in reserve)");
    c->reported = true;
    end_conn(c, errc::busy);
    (void)reopen_reserve();
    return;
  }
  if (cfg.max_connections != 0 && retired.connections_open > cfg.max_connections) {
    // Accepted only to take it off the backlog: over the cap, it is closed unannounced.
    ++retired.connections_rejected;
    log_event(kLogRejected, log_level::warn,
              l->url + ": connection from " + c->peer_url + " rejected: max_connections (" +
                  std::to_string(cfg.max_connections) + ") reached");
    c->reported = true;
    end_conn(c, errc::busy);
    return;
  }
  if (!admit_unregistered(l, c)) {
    c->reported = true;
    end_conn(c, errc::busy);
    return;
  }
  if (l->tls_ctx) {  // TLS: on_accepted once the handshake completed
    c->tls_ctx = l->tls_ctx;
    c->last_read_ms = uv_now(loop);
    tls_start(c);
    return;
  }
  accepted(c);
}

void stream_channel::impl::accepted(conn_impl* c) {
  c->state = conn_state::connected;
  c->connected_once = true;
  c->last_read_ms = uv_now(loop);
  ++retired.connections_accepted;
  start_reading(c);
  if (cb.on_accepted && c->active()) {
    const detail::callback_scope scope(this);
    cb.on_accepted(c->id);
  }
}

errc stream_channel::impl::listen_unix(listener_impl* l, const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) return errc::invalid_argument;
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return errc::already_exists;
    // A socket file: replace it only if nobody listens on it any more.
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return sys_fail(-errno);
    sockaddr_un sun{};
    sun.sun_family = AF_UNIX;
    std::memcpy(sun.sun_path, path.c_str(), path.size() + 1);
    const int r = ::connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof sun);
    const int err = r == 0 ? 0 : errno;
    ::close(fd);
    if (r == 0 || err == EAGAIN || err == EINPROGRESS) return errc::address_in_use;
    if (err != ECONNREFUSED) return sys_fail(-err);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return sys_fail(-errno);
    log_event(kLogStaleFile, log_level::info,
              "unix://" + path + ": replaced a stale socket file nobody listened on");
  }
  int r = uv_pipe_init(loop, &l->h.pipe, 0);
  if (r != 0) return sys_fail(r);
  l->h.handle.data = l;
  ++handles;
  l->is_unix = true;
  // Bound here rather than with uv_pipe_bind(): libuv would unlink the file when the handle
  // closes, also after detach_listener() gave the socket to another process. The file is ours
  // to remove (remove_socket_file()).
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return sys_fail(-errno);
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path, path.c_str(), path.size() + 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sun), sizeof sun) != 0) {
    const int err = errno;
    ::close(fd);
    return sys_fail(-err);
  }
  r = uv_pipe_open(&l->h.pipe, fd);
  if (r != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return sys_fail(r);
  }
  l->unix_path = path;
  if (stat(path.c_str(), &st) == 0) {
    l->unix_dev = st.st_dev;
    l->unix_ino = st.st_ino;
  }
  // Before listen(): nobody can connect yet, so there is no window with the default mode.
  if (chmod(path.c_str(), static_cast<mode_t>(cfg.unix_socket_mode)) != 0) {
    return sys_fail(-errno);
  }
  r = uv_listen(&l->h.stream, cfg.backlog, connection_cb);
  if (r != 0) return sys_fail(r);
  l->url = "unix://" + path;
  return errc::ok;
}

errc stream_channel::impl::listen_tcp(listener_impl* l, const sockaddr* sa) {
  int r = uv_tcp_init(loop, &l->h.tcp);
  if (r != 0) return sys_fail(r);
  l->h.handle.data = l;
  ++handles;
  r = uv_tcp_bind(&l->h.tcp, sa, sa->sa_family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
  if (r != 0) return sys_fail(r);
  r = uv_listen(&l->h.stream, cfg.backlog, connection_cb);
  if (r != 0) return sys_fail(r);
  sockaddr_storage ss{};
  int len = sizeof ss;
  r = uv_tcp_getsockname(&l->h.tcp, reinterpret_cast<sockaddr*>(&ss), &len);
  if (r != 0) return sys_fail(r);
  l->url = sockaddr_url(reinterpret_cast<sockaddr*>(&ss));
  l->port = sockaddr_port(reinterpret_cast<sockaddr*>(&ss));
  return errc::ok;
}

errc stream_channel::impl::listen(std::string_view url, listener_id* out, void* user) {
  address a;
  const errc pe = check_url(url, &a);
  if (pe != errc::ok) return pe;
  auto* l = new (std::nothrow) listener_impl(this);
  if (l == nullptr) return fail(errc::no_memory, std::string(url) + ": out of memory");
  l->user_data = user;
  const int handles_before = handles;
  sys_error = 0;
  errc e = errc::ok;
  if (a.kind == scheme::unix_socket) {
    e = listen_unix(l, a.host);
  } else if (a.kind == scheme::dns) {
    uv_getaddrinfo_t req;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[8];
    std::snprintf(port, sizeof port, "%u", unsigned{a.port});
    // No callback: uv_getaddrinfo resolves synchronously, so listen() can report the result.
    const int r = uv_getaddrinfo(loop, &req, nullptr, a.host.c_str(), port, &hints);
    if (r != 0 || req.addrinfo == nullptr) {
      e = errc::resolve_failed;
    } else {
      e = listen_tcp(l, req.addrinfo->ai_addr);
    }
    if (r == 0) uv_freeaddrinfo(req.addrinfo);
  } else {
    sockaddr_storage ss;
    e = literal_sockaddr(a, &ss);
    if (e == errc::ok) e = listen_tcp(l, reinterpret_cast<sockaddr*>(&ss));
  }
  if (e != errc::ok) {
    if (handles != handles_before) {
      // The handle exists: libuv needs its close callback before the memory goes.
      if (l->is_unix && !l->unix_path.empty()) remove_socket_file(l);
      uv_close(&l->h.handle, [](uv_handle_t* h) {
        auto* ll = static_cast<listener_impl*>(h->data);
        impl* self = ll->ch;
        delete ll;
        self->handle_released();
      });
    } else {
      delete l;
    }
    std::string detail = std::string(url) + ": " + to_string(e);
    if (sys_error != 0) detail += std::string(" (") + uv_strerror(sys_error) + ")";
    return fail(e, detail);
  }
  l->id = listener_id{next_listener_id()};
  link(l);
  (void)reopen_reserve();
  if (out != nullptr) *out = l->id;
  return errc::ok;
}

errc stream_channel::impl::sys_fail(int uv_error) {
  sys_error = uv_error;
  return from_uv(uv_error);
}

errc stream_channel::impl::listen_fd(std::string_view url, int fd, listener_id* out, void* user) {
  address a;
  errc e = check_url(url, &a);
  const std::string what = std::string(url) + ": inherited socket " + std::to_string(fd) + " ";
  sockaddr_storage bound{};
  const std::string problem = e == errc::ok ? listening_fd_problem(fd, a, &bound) : std::string();
  auto* l = e == errc::ok && problem.empty() ? new (std::nothrow) listener_impl(this) : nullptr;
  if (l == nullptr) {
    ::close(fd);
    if (e != errc::ok) return e;
    return problem.empty() ? fail(errc::no_memory, what + "out of memory")
                           : fail(errc::invalid_argument, what + problem);
  }
  l->user_data = user;
  l->is_unix = a.kind == scheme::unix_socket;
  int r = l->is_unix ? uv_pipe_init(loop, &l->h.pipe, 0) : uv_tcp_init(loop, &l->h.tcp);
  if (r != 0) {
    ::close(fd);
    delete l;
    return fail(from_uv(r), what + uv_strerror(r));
  }
  l->h.handle.data = l;
  ++handles;
  r = l->is_unix ? uv_pipe_open(&l->h.pipe, fd) : uv_tcp_open(&l->h.tcp, fd);
  if (r != 0) ::close(fd);
  if (r == 0) r = uv_listen(&l->h.stream, cfg.backlog, connection_cb);
  if (r != 0) {
    uv_close(&l->h.handle, [](uv_handle_t* h) {
      auto* ll = static_cast<listener_impl*>(h->data);
      impl* self = ll->ch;
      delete ll;
      self->handle_released();
    });
    return fail(from_uv(r), what + uv_strerror(r));
  }
  if (l->is_unix) {
    l->unix_path = a.host;
    l->url = "unix://" + a.host;
    struct stat st {};
    if (stat(a.host.c_str(), &st) == 0) {
      l->unix_dev = st.st_dev;
      l->unix_ino = st.st_ino;
    }
  } else {
    l->url = sockaddr_url(reinterpret_cast<sockaddr*>(&bound));
    l->port = sockaddr_port(reinterpret_cast<sockaddr*>(&bound));
  }
  l->id = listener_id{next_listener_id()};
  link(l);
  (void)reopen_reserve();
  if (out != nullptr) *out = l->id;
  return errc::ok;
}

// Removes the socket file only if it is still the one this listener created (another process
// may have replaced a file it thought stale).
void stream_channel::impl::remove_socket_file(listener_impl* l) {
  struct stat st {};
  if (lstat(l->unix_path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == l->unix_dev &&
      static_cast<uint64_t>(st.st_ino) == l->unix_ino) {
    ::unlink(l->unix_path.c_str());
  }
  l->unix_path.clear();
}

errc stream_channel::impl::detach_listener(listener_impl* l, int* fd) {
  if (l == nullptr || l->closing) return errc::closed;
  uv_os_fd_t raw = -1;
  if (uv_fileno(&l->h.handle, &raw) != 0) return fail(errc::closed, l->url + ": no socket");
  const int d = fcntl(raw, F_DUPFD_CLOEXEC, 0);
  if (d < 0) {
    const int err = errno;
    return fail(errc_from_errno(-err),
                l->url + ": dup of the listening socket failed (" + std::strerror(err) + ")");
  }
  l->unix_path.clear();  // the socket file stays: it belongs to the socket, which lives on
  (void)close_listener(l);
  *fd = d;
  return errc::ok;
}

errc stream_channel::impl::close_listener(listener_impl* l) {
  if (l == nullptr || l->closing) return errc::closed;
  l->closing = true;
  if (l->is_unix) remove_socket_file(l);
  unlink(l);
  if (listeners.empty() && reserve_fd >= 0) {  // needed only while something listens
    ::close(reserve_fd);
    reserve_fd = -1;
  }
  uv_close(&l->h.handle, [](uv_handle_t* h) {
    auto* ll = static_cast<listener_impl*>(h->data);
    impl* self = ll->ch;
    delete ll;
    self->handle_released();
  });
  return errc::ok;
}

}  // namespace uvbus
