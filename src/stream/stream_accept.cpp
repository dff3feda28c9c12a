// Stream accepting: the listeners' accept loop (a uv_poll_t on each listening socket, accept4() a
// bounded number per event), out of descriptors (the reserve, shedding, a timed retry),
// max_connections and the caps on unregistered connections.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "stream/stream_impl.h"
#include "stream/test_access.h"

namespace uvbus {

namespace detail {

int stream_access::drop_reserve(stream_channel& ch) noexcept {
  const int fd = ch.impl_->reserve_fd;
  if (fd >= 0) ::close(fd);
  ch.impl_->reserve_fd = -1;
  return fd;
}

uint64_t stream_access::accept_errors(const stream_channel& ch) noexcept {
  return ch.impl_->accept_errors;
}

std::string sockaddr_url(const sockaddr* sa) {
  char ip[INET6_ADDRSTRLEN] = {};
  char buf[INET6_ADDRSTRLEN + 48];
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    uv_ip4_name(in, ip, sizeof ip);
    std::snprintf(buf, sizeof buf, "ipv4://%s:%u", ip, unsigned{ntohs(in->sin_port)});
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    uv_ip6_name(in6, ip, sizeof ip);
    char scope[16] = {};  // a link-local peer is only reachable through its interface
    if (in6->sin6_scope_id != 0) std::snprintf(scope, sizeof scope, "%%%u", in6->sin6_scope_id);
    std::snprintf(buf, sizeof buf, "ipv6://[%s%s]:%u", ip, scope, unsigned{ntohs(in6->sin6_port)});
  } else {
    return {};
  }
  return buf;
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

errc stream_channel::impl::start_polling(listener_impl* l) {
  int r = uv_poll_init(loop, &l->poll, l->fd);
  if (r != 0) return sys_fail(r);
  l->poll.data = l;
  l->poll_open = true;
  ++handles;
  r = uv_poll_start(&l->poll, UV_READABLE, poll_cb);
  return r == 0 ? errc::ok : sys_fail(r);
}

void stream_channel::impl::poll_cb(uv_poll_t* h, int status, int /*events*/) {
  auto* l = static_cast<listener_impl*>(h->data);
  impl* self = l->ch;
  if (self->closed || l->closing) return;
  if (status < 0) {
    self->accept_failed(l, -status);
    return;
  }
  self->on_readable(l);
}

// Level-triggered: clients left in the backlog after kAcceptBatch make the socket readable again
// at the next loop turn, after every other ready handle had its turn.
void stream_channel::impl::on_readable(listener_impl* l) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    const int fd =
        ::accept4(l->fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    const int err = fd < 0 ? errno : 0;
    if (fd >= 0 || err == EAGAIN || err == EWOULDBLOCK) {
      if (l->failed_tries != 0) {
        log_event(kLogAcceptFailed, log_level::info,
                  l->url + ": accepting again after " + std::to_string(l->failed_tries) +
                      " failed attempts");
        l->failed_tries = 0;
        // on_log may have closed the listener (or the channel): the client goes with it.
        if (closed || l->closing) {
          if (fd >= 0) ::close(fd);
          return;
        }
      }
    }
    if (fd >= 0) {
      take_accepted(l, fd, peer);
      // A callback may have closed the listener or the channel.
      if (closed || l->closing) return;
      continue;
    }
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == ECONNABORTED || err == EINTR) continue;  // that client is gone; the next one
    accept_failed(l, err);
    return;
  }
}

uint64_t stream_channel::impl::shed_backlog(listener_impl* l, int* end) {
  if (reserve_fd >= 0) ::close(reserve_fd);
  reserve_fd = -1;
  uint64_t n = 0;
  *end = 0;
  for (int i = 0; i < kShedBatch; ++i) {
    const int s = ::accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (s >= 0) {
      ::close(s);
      ++n;
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    *end = errno;
    break;
  }
  (void)reopen_reserve();
  return n;
}

bool stream_channel::impl::reopen_reserve() {
  if (reserve_fd < 0 && !closed && !listeners.empty()) {
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  return reserve_fd >= 0;
}

void stream_channel::impl::accept_failed(listener_impl* l, int err) {
  const bool out_of_fds = err == EMFILE || err == ENFILE;
  std::string line = l->url + ": accept failed: " + uv_strerror(-err);
  if (out_of_fds && reserve_fd >= 0) {
    // The reserve's slot takes the waiting clients one at a time and closes them, so they are
    // told at once instead of waiting for descriptors that may never come.
    int end = 0;
    const uint64_t shed = shed_backlog(l, &end);
    retired.connections_rejected += shed;
    if (end == 0 || end == EAGAIN || end == EWOULDBLOCK) {
      // (None waiting: accept() takes a descriptor before it looks at the backlog.)
      if (shed != 0) {
        log_event(kLogAcceptFailed, log_level::error,
                  line + "; " + std::to_string(shed) + " waiting clients closed");
      }
      return;
    }
    // No room even so: a soft RLIMIT_NOFILE below the descriptors held, say.
    line += shed != 0
                ? "; " + std::to_string(shed) + " waiting clients closed, then " + uv_strerror(-end)
                : "; closing the reserve descriptor made no room";
    err = end;
  } else if (out_of_fds) {
    line += "; no reserve descriptor to close the waiting clients with";
  }
  // Nothing makes room now, or the kernel is short of memory, or the socket is broken: accept()
  // would fail again at once, so the listener waits for the timer instead of spinning. Its clients
  // stay in the backlog and are accepted once accept() works again.
  ++accept_errors;
  if (l->failed_tries++ == 0) {
    log_event(kLogAcceptFailed, log_level::error,
              line + "; trying again every " + std::to_string(kAcceptRetryMs) + " ms");
  }
  pause_accepting(l);
}

void stream_channel::impl::pause_accepting(listener_impl* l) {
  if (!l->poll_open || l->waiting) return;
  uv_poll_stop(&l->poll);
  l->waiting = true;
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&accept_timer)) == 0) {
    uv_timer_start(
        &accept_timer, [](uv_timer_t* t) { static_cast<impl*>(t->data)->resume_accepting(); },
        kAcceptRetryMs, 0);
  }
}

// Runs no callback, so the walk cannot lose its place: a waiting listener has failed at least
// once (failed_tries >= 1, reset only by an accept that works), so accept_failed() does not log a
// failed uv_poll_start() (EEXIST, the only error it has); and it is not EMFILE, so no shedding.
void stream_channel::impl::resume_accepting() {
  (void)reopen_reserve();
  for (listener_impl* l = listeners.front(); l != nullptr; l = detail::listener_list::next(l)) {
    if (!l->waiting) continue;
    l->waiting = false;
    const int r = uv_poll_start(&l->poll, UV_READABLE, poll_cb);
    if (r != 0) accept_failed(l, -r);
  }
}

void stream_channel::impl::take_accepted(listener_impl* l, int fd, const sockaddr_storage& peer) {
  // Without a reserve (just used, or lost) and no descriptor to make one: this client's becomes
  // it, or the next accept failing out of descriptors would have nothing to shed the backlog with.
  const bool starved = reserve_fd < 0 && !reopen_reserve() && (errno == EMFILE || errno == ENFILE);
  const auto* sa = reinterpret_cast<const sockaddr*>(&peer);
  conn_impl* c = starved ? nullptr : new_conn(false, nullptr);
  if (c == nullptr) {
    ++retired.connections_rejected;
    log_event(kLogAcceptFailed, log_level::error,
              l->url + ": connection from " + (l->is_unix ? l->url : detail::sockaddr_url(sa)) +
                  (starved ? " closed: out of descriptors (its descriptor is kept in reserve)"
                           : " closed: out of memory"));
    ::close(fd);
    (void)reopen_reserve();
    return;
  }
  c->is_unix = l->is_unix;
  c->listener = l->id;
  int r = c->is_unix ? uv_pipe_init(loop, &c->h.pipe, 0) : uv_tcp_init(loop, &c->h.tcp);
  if (r == 0) {
    c->h.handle.data = c;
    c->handle_open = true;
    ++c->pending;
    r = c->is_unix ? uv_pipe_open(&c->h.pipe, fd) : uv_tcp_open(&c->h.tcp, fd);
  }
  if (r != 0) {
    ::close(fd);
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
    c->peer_url = detail::sockaddr_url(sa);
    c->source = detail::source_of(sa);
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
    refresh_listener_tls(l);
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

}  // namespace uvbus
