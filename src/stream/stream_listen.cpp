// Stream listening: listening sockets made here for tcp/dns/unix URLs (unix socket files, abstract
// unix names) or inherited (listen_fd), detach_listener and close_listener; the accept loop is
// stream_accept.cpp.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>

#include "stream/stream_impl.h"

namespace uvbus {

namespace {

uint16_t sockaddr_port(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  }
  return 0;
}

// Whether two bound addresses of one family (AF_INET or AF_INET6) are the same IP address.
bool same_ip(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  }
  return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                     &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, sizeof(in6_addr)) == 0;
}

std::string ip_text(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* at = a.ss_family == AF_INET
                       ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in&>(a).sin_addr)
                       : &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
  return ::inet_ntop(a.ss_family, at, text, sizeof text) != nullptr ? text : "?";
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
    const std::string host = detail::unix_host(reinterpret_cast<const sockaddr_un*>(bound), blen);
    if (host != a.host) return "bound to \"" + host + "\"";
    return {};
  }
  if (family != AF_INET && family != AF_INET6) return "not a TCP socket";
  if (a.kind != scheme::dns) {  // an IP literal: that family and that address
    sockaddr_storage want{};
    if (literal_sockaddr(a, &want) == errc::ok) {
      if (want.ss_family != family) return family == AF_INET ? "an IPv4 socket" : "an IPv6 socket";
      if (!same_ip(want, *bound)) return "bound to " + ip_text(*bound);
    }
  }
  const uint16_t port = sockaddr_port(reinterpret_cast<const sockaddr*>(bound));
  if (a.port != 0 && a.port != port) return "bound to port " + std::to_string(port);
  return {};
}

}  // namespace

namespace detail {

socklen_t unix_sockaddr(const std::string& host, sockaddr_un* out) noexcept {
  std::memset(out, 0, sizeof *out);
  out->sun_family = AF_UNIX;
  const size_t at = offsetof(sockaddr_un, sun_path);
  if (is_abstract(host)) {  // sun_path[0] stays '\0'; the name is the bytes after it, no NUL
    if (host.size() > sizeof out->sun_path) return 0;
    std::memcpy(out->sun_path + 1, host.data() + 1, host.size() - 1);
    return static_cast<socklen_t>(at + host.size());
  }
  if (host.size() >= sizeof out->sun_path) return 0;
  std::memcpy(out->sun_path, host.c_str(), host.size() + 1);
  return static_cast<socklen_t>(at + host.size() + 1);
}

std::string unix_host(const sockaddr_un* sun, socklen_t len) {
  const size_t at = offsetof(sockaddr_un, sun_path);
  const size_t n = len > at ? std::min<size_t>(len - at, sizeof sun->sun_path) : 0;
  if (n > 0 && sun->sun_path[0] == '\0') return "@" + std::string(sun->sun_path + 1, n - 1);
  return {sun->sun_path, strnlen(sun->sun_path, n)};
}

}  // namespace detail

// A file socket whose listener is dead is replaced; one with a live listener, or a file that is
// not a socket, is refused.
errc stream_channel::impl::replace_stale_file(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return errc::ok;
  if (!S_ISSOCK(st.st_mode)) return errc::already_exists;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return sys_fail(-errno);
  sockaddr_un sun{};
  const socklen_t len = detail::unix_sockaddr(path, &sun);
  const int r = ::connect(fd, reinterpret_cast<sockaddr*>(&sun), len);
  const int err = r == 0 ? 0 : errno;
  ::close(fd);
  if (r == 0 || err == EAGAIN || err == EINPROGRESS) return errc::address_in_use;
  if (err != ECONNREFUSED) return sys_fail(-err);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return sys_fail(-errno);
  log_later(kLogStaleFile, log_level::info,
            "unix://" + path + ": replaced a stale socket file nobody listened on");
  return errc::ok;
}

// "@name": a Linux abstract socket, no file (nothing to replace, chmod or remove; the kernel
// refuses a name already bound with address_in_use).
errc stream_channel::impl::listen_unix(listener_impl* l, const std::string& path) {
  sockaddr_un sun{};
  const socklen_t len = detail::unix_sockaddr(path, &sun);
  if (len == 0) return errc::invalid_argument;
  const bool abstract = detail::is_abstract(path);
  l->is_unix = true;
  const errc stale = abstract ? errc::ok : replace_stale_file(path);
  if (stale != errc::ok) return stale;
  l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->fd < 0) return sys_fail(-errno);
  if (::bind(l->fd, reinterpret_cast<sockaddr*>(&sun), len) != 0) return sys_fail(-errno);
  if (!abstract) {
    l->unix_path = path;  // ours to remove from here on (remove_socket_file())
    struct stat st {};
    if (stat(path.c_str(), &st) == 0) {
      l->unix_dev = st.st_dev;
      l->unix_ino = st.st_ino;
    }
    // Before listen(): nobody can connect yet, so there is no window with the default mode.
    if (chmod(path.c_str(), static_cast<mode_t>(cfg.unix_socket_mode)) != 0) {
      return sys_fail(-errno);
    }
  }
  if (::listen(l->fd, cfg.backlog) != 0) return sys_fail(-errno);
  l->url = "unix://" + path;
  return start_polling(l);
}

// As libuv binds: SO_REUSEADDR (a restarted listener does not wait for TIME_WAIT), IPv6 only on
// an IPv6 socket (an IPv4 listener may take the same port); SO_REUSEPORT with tcp_reuse_port.
errc stream_channel::impl::listen_tcp(listener_impl* l, const sockaddr* sa) {
  const bool v6 = sa->sa_family == AF_INET6;
  l->fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->fd < 0) return sys_fail(-errno);
  const int on = 1;
  if (setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
      (v6 && setsockopt(l->fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on) != 0) ||
      (cfg.tcp_reuse_port && setsockopt(l->fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0)) {
    return sys_fail(-errno);
  }
  const socklen_t len = v6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::bind(l->fd, sa, len) != 0) return sys_fail(errno == EAFNOSUPPORT ? UV_EINVAL : -errno);
  if (::listen(l->fd, cfg.backlog) != 0) return sys_fail(-errno);
  sockaddr_storage ss{};
  socklen_t slen = sizeof ss;
  if (getsockname(l->fd, reinterpret_cast<sockaddr*>(&ss), &slen) != 0) return sys_fail(-errno);
  l->url = detail::sockaddr_url(reinterpret_cast<sockaddr*>(&ss));
  l->port = sockaddr_port(reinterpret_cast<sockaddr*>(&ss));
  return start_polling(l);
}

void stream_channel::impl::discard_listener(listener_impl* l) {
  if (l->is_unix && !l->unix_path.empty()) remove_socket_file(l);
  const int fd = l->fd;
  l->fd = -1;
  if (l->poll_open) {
    l->poll_open = false;
    // The handle exists: libuv needs its close callback before the memory goes. uv_close() takes
    // the socket out of epoll, which needs the descriptor still open: closed first, a socket that
    // lives on in a duplicate (detach_listener(), a hand-over) stayed registered, and woke every
    // loop turn while a client waited in its backlog.
    uv_close(reinterpret_cast<uv_handle_t*>(&l->poll), [](uv_handle_t* h) {
      auto* ll = static_cast<listener_impl*>(h->data);
      impl* self = ll->ch;
      delete ll;
      self->handle_released();
    });
  } else {
    delete l;
  }
  if (fd >= 0) ::close(fd);  // a poll handle never closes its descriptor
}

errc stream_channel::impl::listen(std::string_view url, listener_id* out, void* user) {
  address a;
  const errc pe = check_url(url, &a);
  if (pe != errc::ok) return pe;
  auto* l = new (std::nothrow) listener_impl(this);
  if (l == nullptr) return fail(errc::no_memory, std::string(url) + ": out of memory");
  l->user_data = user;
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
      sys_error = r;  // the resolver's reason, in the detail
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
    discard_listener(l);
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
  l->fd = fd;
  sys_error = 0;
  // listen() again applies our backlog.
  e = ::listen(fd, cfg.backlog) != 0 ? sys_fail(-errno) : start_polling(l);
  if (e != errc::ok) {
    discard_listener(l);
    return fail(e, what + uv_strerror(sys_error));
  }
  if (l->is_unix) {
    l->url = "unix://" + a.host;
    struct stat st {};
    if (!detail::is_abstract(a.host) && stat(a.host.c_str(), &st) == 0) {
      l->unix_path = a.host;
      l->unix_dev = st.st_dev;
      l->unix_ino = st.st_ino;
    }
  } else {
    l->url = detail::sockaddr_url(reinterpret_cast<sockaddr*>(&bound));
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
  if (l->fd < 0) return fail(errc::closed, l->url + ": no socket");
  const int d = fcntl(l->fd, F_DUPFD_CLOEXEC, 0);
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
  unlink(l);
  if (listeners.empty() && reserve_fd >= 0) {  // needed only while something listens
    ::close(reserve_fd);
    reserve_fd = -1;
  }
  discard_listener(l);
  return errc::ok;
}

}  // namespace uvbus
