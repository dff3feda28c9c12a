// Stream dialing: connect(), dns resolution with fallback over every address, connect timeout
// (each address of a dns answer gets its share), unix dials to a path or an abstract name.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "stream/stream_impl.h"
#include "stream/test_access.h"

namespace uvbus {

namespace detail {

void stream_access::set_dns_answer(stream_channel& ch, std::vector<sockaddr_storage> addrs) {
  ch.impl_->test_dns_answer = std::move(addrs);
}

}  // namespace detail

void stream_channel::impl::on_connected(conn_impl* c) {
  close_timer(c);
  std::vector<sockaddr_storage>().swap(c->addrs);
  if (c->is_unix) {
    apply_unix_options(c);
  } else {
    apply_tcp_options(c);
  }
  if (c->tls_ctx && !c->secure) {  // TLS: on_connected once the handshake completed
    tls_start(c);
    return;
  }
  c->state = conn_state::connected;
  c->connected_once = true;
  ++retired.connections_connected;
  start_reading(c);
  if (cb.on_connected && c->active()) {
    const detail::callback_scope scope(this);
    cb.on_connected(c->id, errc::ok);
  }
}

void stream_channel::impl::apply_tcp_options(conn_impl* c) {
  uv_tcp_nodelay(&c->h.tcp, cfg.tcp_nodelay ? 1 : 0);
  if (cfg.tcp_keepalive) uv_tcp_keepalive(&c->h.tcp, 1, cfg.keepalive_delay_s);
}

// Both ends of a unix connection (see stream_config::unix_send_buffer). A refusal is not an error:
// the connection works with the kernel's default, only slower.
void stream_channel::impl::apply_unix_options(conn_impl* c) {
  if (cfg.unix_send_buffer == 0) return;
  int bytes = static_cast<int>(cfg.unix_send_buffer);
  (void)uv_send_buffer_size(&c->h.handle, &bytes);
}

void stream_channel::impl::connect_cb(uv_connect_t* req, int status) {
  auto* c = static_cast<conn_impl*>(req->data);
  impl* self = c->ch;
  // Cancelled (the close path reports) or abandoned (its handle is closing; the next address
  // follows from the close callback).
  if (c->state == conn_state::closing || !c->handle_open) return;
  if (status == 0) {
    self->on_connected(c);
    return;
  }
  const errc e = from_uv(status);
  if (c->next_addr < c->addrs.size()) {
    self->abandon_attempt(c, e);
    return;
  }
  self->end_conn(c, e);
}

void stream_channel::impl::abandon_attempt(conn_impl* c, errc e) {
  // Try the next resolved address on a fresh handle once this one is closed.
  c->handle_open = false;
  c->reason = e;
  uv_close(c->handle(), [](uv_handle_t* h) {
    auto* cc = static_cast<conn_impl*>(h->data);
    if (cc->state == conn_state::closing) {
      cc->ch->release(cc);
      return;
    }
    --cc->pending;
    cc->ch->try_next_address(cc);
  });
}

int stream_channel::impl::start_tcp_connect(conn_impl* c, const sockaddr* sa) {
  int r = uv_tcp_init(loop, &c->h.tcp);
  if (r != 0) return r;
  c->h.handle.data = c;
  c->handle_open = true;
  ++c->pending;
  c->creq.data = c;
  return uv_tcp_connect(&c->creq, &c->h.tcp, sa, connect_cb);
}

void stream_channel::impl::try_next_address(conn_impl* c) {
  while (c->next_addr < c->addrs.size()) {
    const sockaddr_storage& ss = c->addrs[c->next_addr++];
    const int r = start_tcp_connect(c, reinterpret_cast<const sockaddr*>(&ss));
    if (r == 0) {
      c->state = conn_state::connecting;
      if (c->timer != nullptr) {
        // This attempt's share of the time left: the rest split evenly over the addresses left,
        // so one that never answers cannot use up the time of those after it.
        const uint64_t now = uv_now(loop);
        const uint64_t left = c->dial_deadline_ms > now ? c->dial_deadline_ms - now : 0;
        const uint64_t tries = c->addrs.size() - c->next_addr + 1;
        uv_timer_start(c->timer, connect_timer_cb, left / tries, 0);
      }
      return;
    }
    c->reason = from_uv(r);
    if (c->handle_open) {
      // Failed synchronously on this handle (out of descriptors, say): close it and go on from
      // its close callback, with the error as it was.
      connect_cb(&c->creq, r);
      return;
    }
  }
  end_conn(c, c->reason == errc::ok ? errc::resolve_failed : c->reason);
}

void stream_channel::impl::resolved_cb(uv_getaddrinfo_t* req, int status, addrinfo* res) {
  auto* c = static_cast<conn_impl*>(req->data);
  impl* self = c->ch;
  delete req;
  c->gai = nullptr;
  if (c->state == conn_state::closing) {
    if (res != nullptr) uv_freeaddrinfo(res);
    self->release(c);
    return;
  }
  --c->pending;
  if (status != 0 || res == nullptr) {
    if (res != nullptr) uv_freeaddrinfo(res);
    self->end_conn(c, errc::resolve_failed);
    return;
  }
  errc e = errc::resolve_failed;
  try {
    if (!self->test_dns_answer.empty()) {
      c->addrs = self->test_dns_answer;
    } else {
      for (const addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
        sockaddr_storage ss{};
        std::memcpy(&ss, ai->ai_addr, std::min<size_t>(ai->ai_addrlen, sizeof ss));
        c->addrs.push_back(ss);
      }
    }
  } catch (const std::bad_alloc&) {
    e = errc::no_memory;
  }
  uv_freeaddrinfo(res);
  c->next_addr = 0;
  c->reason = e;
  self->try_next_address(c);
}

void stream_channel::impl::connect_timer_cb(uv_timer_t* t) {
  auto* c = static_cast<conn_impl*>(t->data);
  c->ch->connect_timed_out(c);
}

void stream_channel::impl::connect_timed_out(conn_impl* c) {
  if (c->abstract_due) {  // not a timeout: an abstract dial's outcome, due now
    c->abstract_due = false;
    connect_cb(&c->creq, c->abstract_status);
    return;
  }
  if (c->state == conn_state::connecting && c->handle_open && c->next_addr < c->addrs.size()) {
    abandon_attempt(c, errc::timeout);  // this address's share is used up; the timer goes on
    return;
  }
  end_conn(c, errc::timeout);
}

void stream_channel::impl::start_connect_timer(conn_impl* c) {
  if (cfg.connect_timeout_ms == 0) return;
  auto* t = new (std::nothrow) uv_timer_t;
  if (t == nullptr) return;  // no timeout then: the kernel's applies
  uv_timer_init(loop, t);
  t->data = c;
  c->timer = t;
  ++c->pending;
  c->dial_deadline_ms = uv_now(loop) + cfg.connect_timeout_ms;
  uv_timer_start(t, connect_timer_cb, cfg.connect_timeout_ms, 0);
}

errc stream_channel::impl::connect(std::string_view url, connection_id* out, void* user) {
  address a;
  const errc pe = check_url(url, &a);
  if (pe != errc::ok) return pe;
  if (a.kind != scheme::unix_socket && a.port == 0) {
    return fail(errc::bad_url, std::string(url) + ": port 0 cannot be connected to");
  }
  conn_impl* c = new_conn(true, user);
  if (c == nullptr) return fail(errc::no_memory, std::string(url) + ": out of memory");
  c->peer_url = std::string(url);
  errc e = errc::ok;
  int sys = 0;  // libuv's error, named in the detail
  if (a.kind == scheme::unix_socket) {
    c->is_unix = true;
    c->state = conn_state::connecting;
    sys = start_unix_connect(c, a.host);
    e = from_uv(sys);
  } else if (a.kind == scheme::dns) {
    c->state = conn_state::resolving;
    auto* req = new (std::nothrow) uv_getaddrinfo_t;
    if (req == nullptr) {
      e = errc::no_memory;
    } else {
      req->data = c;
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      char port[8];
      std::snprintf(port, sizeof port, "%u", unsigned{a.port});
      const int r = uv_getaddrinfo(loop, req, resolved_cb, a.host.c_str(), port, &hints);
      if (r != 0) {
        delete req;
        e = from_uv(sys = r);
      } else {
        c->gai = req;
        ++c->pending;
      }
    }
  } else {
    sockaddr_storage ss;
    e = literal_sockaddr(a, &ss);
    if (e == errc::ok) {
      c->state = conn_state::connecting;
      sys = start_tcp_connect(c, reinterpret_cast<sockaddr*>(&ss));
      e = from_uv(sys);
    }
  }
  if (e != errc::ok) {
    // No callback for this connection: drop it silently once libuv lets go of it.
    c->reported = true;
    end_conn(c, e);
    std::string detail = std::string(url) + ": " + to_string(e);
    if (sys != 0) detail += std::string(" (") + uv_strerror(sys) + ")";
    return fail(e, detail);
  }
  start_connect_timer(c);
  if (c->abstract_due && !finish_abstract_dial(c)) {
    c->reported = true;
    end_conn(c, errc::no_memory);
    return fail(errc::no_memory, std::string(url) + ": out of memory");
  }
  if (out != nullptr) *out = c->id;
  return errc::ok;
}

int stream_channel::impl::start_unix_connect(conn_impl* c, const std::string& host) {
  const int r = uv_pipe_init(loop, &c->h.pipe, 0);
  if (r != 0) return r;
  c->h.handle.data = c;
  c->handle_open = true;
  ++c->pending;
  c->creq.data = c;
  if (!detail::is_abstract(host)) {
    uv_pipe_connect(&c->creq, &c->h.pipe, host.c_str(), connect_cb);
    return 0;
  }
  // A unix connect() completes or fails at once (a full backlog: EAGAIN, as libuv reports it for
  // a path); whichever, the outcome comes from the loop, as for a path. Errors making the socket
  // too (out of descriptors: io_error from the loop, as uv_pipe_connect does).
  sockaddr_un sun{};
  const socklen_t len = detail::unix_sockaddr(host, &sun);
  c->abstract_due = true;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    c->abstract_status = -errno;
    return 0;
  }
  const int o = uv_pipe_open(&c->h.pipe, fd);
  if (o != 0) {
    ::close(fd);
    c->abstract_status = o;
    return 0;
  }
  int st = 0;
  do {
    st = ::connect(fd, reinterpret_cast<const sockaddr*>(&sun), len);
  } while (st != 0 && errno == EINTR);
  c->abstract_status = st == 0 ? 0 : -errno;
  return 0;
}

bool stream_channel::impl::finish_abstract_dial(conn_impl* c) {
  if (c->timer == nullptr) {  // connect_timeout_ms 0: a timer for this alone
    c->timer = new (std::nothrow) uv_timer_t;
    if (c->timer == nullptr) return false;
    uv_timer_init(loop, c->timer);
    c->timer->data = c;
    ++c->pending;
  }
  uv_timer_start(c->timer, connect_timer_cb, 0, 0);
  return true;
}

}  // namespace uvbus
