// The stream channel: construction and destruction, connection/listener bookkeeping, the
// partial-frame sweep, close(), metrics, and the public API forwarding to the impl.
#include <uv.h>
#include <csignal>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

#include "stream/stream_impl.h"

namespace uvbus {

using detail::add_totals;
using detail::conn_impl;
using detail::conn_state;
using detail::kMinMergeBuffer;
using detail::listener_impl;

namespace detail {

errc from_uv(int status) noexcept {
  if (status == UV_EOF) return errc::connection_reset;
  if (status == UV_EAI_NONAME || status == UV_EAI_AGAIN || status == UV_EAI_FAIL ||
      status == UV_EAI_NODATA || status == UV_EAI_FAMILY || status == UV_EAI_SERVICE) {
    return errc::resolve_failed;
  }
  if (status == UV_ECANCELED) return errc::cancelled;
  return errc_from_errno(status);
}

// A literal address (ipv4/ipv6) into a sockaddr.
errc literal_sockaddr(const address& a, sockaddr_storage* out) {
  std::memset(out, 0, sizeof *out);
  int r = 0;
  if (a.kind == scheme::ipv4) {
    r = uv_ip4_addr(a.host.c_str(), a.port, reinterpret_cast<sockaddr_in*>(out));
  } else {
    r = uv_ip6_addr(a.host.c_str(), a.port, reinterpret_cast<sockaddr_in6*>(out));
  }
  return r == 0 ? errc::ok : errc::bad_url;
}

void add_totals(stream_connection_metrics& to, const stream_connection_metrics& m,
                bool with_queue) {
  to.packets_sent += m.packets_sent;
  to.bytes_sent += m.bytes_sent;
  to.packets_received += m.packets_received;
  to.bytes_received += m.bytes_received;
  to.write_calls += m.write_calls;
  to.packets_merged += m.packets_merged;
  to.read_calls += m.read_calls;
  to.send_refused += m.send_refused;
  to.send_failed += m.send_failed;
  to.decode_errors += m.decode_errors;
  to.io_errors += m.io_errors;
  to.partial_frame_timeouts += m.partial_frame_timeouts;
  if (with_queue) {
    to.queue_bytes += m.queue_bytes;
    to.queue_packets += m.queue_packets;
    to.queue_peak_bytes = std::max(to.queue_peak_bytes, m.queue_peak_bytes);
  }
}

}  // namespace detail

namespace {

std::atomic<uint64_t> g_next_id{1};

}  // namespace

stream_channel::impl::impl(uv_loop_t* l, const stream_config& c, const stream_callbacks& cbs)
    : loop(l), cfg(c), cb(cbs), cfg_error(validate(c)) {
  merge_cap = std::max({kMinMergeBuffer, cfg.message_limit + kFrameMaxHeader, cfg.merge_threshold});
  const size_t byte_cap = cfg.queue.max_bytes != 0 ? cfg.queue.max_bytes : cfg.queue.ring_bytes;
  low_bytes = byte_cap / 2;
  low_packets = cfg.queue.max_blocks != 0 ? cfg.queue.max_blocks / 2 : SIZE_MAX;
  uv_check_init(loop, &check);
  check.data = this;
  uv_check_start(&check, [](uv_check_t* h) { static_cast<impl*>(h->data)->flush_dirty(); });
  uv_unref(reinterpret_cast<uv_handle_t*>(&check));
  uv_idle_init(loop, &idle);
  idle.data = this;
  uv_unref(reinterpret_cast<uv_handle_t*>(&idle));
  uv_timer_init(loop, &sweep);
  sweep.data = this;
  if (cfg.partial_frame_timeout_ms != 0) {
    const uint64_t every = std::max<uint64_t>(10, cfg.partial_frame_timeout_ms / 4);
    uv_timer_start(
        &sweep, [](uv_timer_t* t) { static_cast<impl*>(t->data)->sweep_partial_frames(); }, every,
        every);
  }
  uv_unref(reinterpret_cast<uv_handle_t*>(&sweep));  // never keeps the loop alive by itself
  handles = 3;
}

// and a half-frame stalled for partial_frame_timeout_ms is closed with errc::timeout.
void stream_channel::impl::sweep_partial_frames() {
  const uint64_t now = uv_now(loop);
  for (conn_impl* c = conns; c != nullptr; c = c->next) {
    // end_conn() only marks the connection and closes its handle; it stays linked until the
    // close callback, so c->next is still valid after it.
    if (c->active() && c->decoder.buffered() != 0 &&
        now - c->last_read_ms >= cfg.partial_frame_timeout_ms) {
      ++c->m().partial_frame_timeouts;
      end_conn(c, errc::timeout);
    }
  }
}

void stream_channel::impl::link(conn_impl* c) {
  c->next = conns;
  if (conns != nullptr) conns->prev = c;
  conns = c;
  ++retired.connections_open;
}

void stream_channel::impl::link(listener_impl* l) {
  l->next = listeners;
  if (listeners != nullptr) listeners->prev = l;
  listeners = l;
  ++retired.listeners_open;
}

void stream_channel::impl::unlink(conn_impl* c) {
  if (c->prev != nullptr) c->prev->next = c->next;
  if (c->next != nullptr) c->next->prev = c->prev;
  if (conns == c) conns = c->next;
  --retired.connections_open;
}

void stream_channel::impl::unlink(listener_impl* l) {
  if (l->prev != nullptr) l->prev->next = l->next;
  if (l->next != nullptr) l->next->prev = l->prev;
  if (listeners == l) listeners = l->next;
  l->prev = l->next = nullptr;
  --retired.listeners_open;
}

void stream_channel::impl::handle_released() {
  if (--handles == 0 && owner_gone && conns == nullptr) delete this;
}

void stream_channel::impl::maybe_delete() {
  if (owner_gone && handles == 0 && conns == nullptr) delete this;
}

conn_impl* stream_channel::impl::new_conn(bool outbound, void* user) {
  auto* c = new (std::nothrow) conn_impl(this);
  if (c == nullptr) return nullptr;
  c->set_id(g_next_id.fetch_add(1, std::memory_order_relaxed));
  c->set_user(user);
  c->set_outbound(outbound);
  c->decoder = frame_decoder(cfg.message_limit);
  link(c);
  return c;
}

void stream_channel::impl::close_all(bool with_callbacks) {
  if (closed) return;
  closed = true;
  if (!with_callbacks) cb = stream_callbacks{};
  while (listeners != nullptr) (void)close_listener(listeners);
  // Reports first (callbacks see the channel closed: every call returns closed), then the
  // handles. The list cannot change meanwhile: connections are only freed from the loop.
  for (conn_impl* c = conns; c != nullptr; c = c->next) {
    if (c->state != conn_state::closing) c->reason = errc::closed;
    report_final(c);
  }
  for (conn_impl* c = conns; c != nullptr; c = c->next) end_conn(c, errc::closed);
  dirty_head = nullptr;
  for (conn_impl* c = conns; c != nullptr; c = c->next) c->dirty = false;
  if (idle_on) {
    idle_on = false;
    uv_idle_stop(&idle);
  }
  auto done = [](uv_handle_t* h) { static_cast<impl*>(h->data)->handle_released(); };
  uv_close(reinterpret_cast<uv_handle_t*>(&check), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&idle), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&sweep), done);
}

stream_channel_metrics stream_channel::impl::metrics() const {
  stream_channel_metrics m = retired;
  for (const conn_impl* c = conns; c != nullptr; c = c->next) {
    add_totals(m.totals, c->metrics(), true);
  }
  return m;
}

// ------------------------------------------------------------------------ public API --

namespace {

// libuv writes with write()/writev(), without MSG_NOSIGNAL, so a write to a peer that has gone
// raises SIGPIPE, whose default action kills the whole process: one vanished peer must cost only
// its connection (EPIPE -> connection_reset). When SIGPIPE is still at its default disposition we
// ignore it; an application that installed its own handler (or ignores it already) is left alone.
// Checked at every channel construction, not once: a forked child may have reset it.
void ignore_default_sigpipe() noexcept {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      (current.sa_flags & SA_SIGINFO) == 0) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    (void)sigaction(SIGPIPE, &ignore, nullptr);
  }
}

}  // namespace

stream_channel::stream_channel(uv_loop_t* loop, const stream_config& cfg,
                               const stream_callbacks& cbs)
    : impl_(new impl(loop, cfg, cbs)) {
  ignore_default_sigpipe();
}

stream_channel::~stream_channel() {
  impl_->close_all(false);
  impl_->owner_gone = true;
  impl_->maybe_delete();
}

errc stream_channel::validate(const stream_config& cfg) noexcept {
  if (cfg.message_limit == 0 || cfg.message_limit > (size_t{1} << 30)) {
    return errc::invalid_argument;
  }
  if (write_queue::validate(cfg.queue) != errc::ok) return errc::invalid_argument;
  const size_t biggest = frame_size(cfg.message_limit);
  if (cfg.queue.mode == queue_mode::static_ring && cfg.queue.ring_bytes < biggest + 16 + 8) {
    return errc::invalid_argument;
  }
  if (cfg.queue.max_bytes != 0 && cfg.queue.max_bytes < biggest) return errc::invalid_argument;
  if (cfg.read_buffer_size < 4096 || cfg.read_buffer_size > (size_t{1} << 30)) {
    return errc::invalid_argument;
  }
  if (cfg.backlog <= 0) return errc::invalid_argument;
  return errc::ok;
}

void stream_channel::set_callbacks(const stream_callbacks& cbs) noexcept {
  if (!impl_->closed) impl_->cb = cbs;
}

errc stream_channel::listen(std::string_view url, stream_listener** out, void* user_data) {
  return impl_->listen(url, out, user_data);
}

errc stream_channel::close_listener(stream_listener* l) {
  if (impl_->closed) return errc::closed;
  return impl_->close_listener(static_cast<listener_impl*>(l));
}

errc stream_channel::connect(std::string_view url, stream_connection** out, void* user_data) {
  return impl_->connect(url, out, user_data);
}

errc stream_channel::disconnect(stream_connection* conn, disconnect_mode mode) {
  if (conn == nullptr) return errc::invalid_argument;
  if (impl_->closed) return errc::closed;
  auto* c = static_cast<conn_impl*>(conn);
  switch (c->state) {
    case conn_state::closing:
      return errc::closed;
    case conn_state::resolving:
    case conn_state::connecting:
      impl_->end_conn(c, errc::cancelled);
      return errc::ok;
    case conn_state::draining:
      if (mode == disconnect_mode::graceful) return errc::closed;
      impl_->end_conn(c, errc::cancelled);
      return errc::ok;
    case conn_state::connected:
      if (mode == disconnect_mode::force) {
        impl_->end_conn(c, errc::cancelled);
        return errc::ok;
      }
      c->state = conn_state::draining;
      c->want_writable = false;
      // Flushed (and then shut down) from the loop, never inside this call.
      impl_->mark_dirty(c);
      return errc::ok;
  }
  return errc::ok;
}

errc stream_channel::send(stream_connection* conn, const void* data, size_t size, uint64_t tag) {
  const const_buffer b{data, size};
  return impl_->send(static_cast<conn_impl*>(conn), &b, 1, tag);
}

errc stream_channel::send(stream_connection* conn, const const_buffer* bufs, size_t n,
                          uint64_t tag) {
  return impl_->send(static_cast<conn_impl*>(conn), bufs, n, tag);
}

uint8_t* stream_channel::prepare_send(stream_connection* conn, size_t size, uint64_t tag,
                                      errc* err) {
  return impl_->prepare_send(static_cast<conn_impl*>(conn), size, tag, err);
}

void stream_channel::commit_send(stream_connection* conn) {
  impl_->commit_send(static_cast<conn_impl*>(conn));
}

void stream_channel::cancel_send(stream_connection* conn) {
  impl_->cancel_send(static_cast<conn_impl*>(conn));
}

errc stream_channel::pause_reading(stream_connection* conn) {
  if (conn == nullptr) return errc::invalid_argument;
  if (impl_->closed) return errc::closed;
  auto* c = static_cast<conn_impl*>(conn);
  if (!c->active()) return c->state == conn_state::closing ? errc::closed : errc::not_connected;
  c->paused = true;
  if (c->reading) {
    uv_read_stop(c->stream());
    c->reading = false;
  }
  return errc::ok;
}

errc stream_channel::resume_reading(stream_connection* conn) {
  if (conn == nullptr) return errc::invalid_argument;
  if (impl_->closed) return errc::closed;
  auto* c = static_cast<conn_impl*>(conn);
  if (!c->active()) return c->state == conn_state::closing ? errc::closed : errc::not_connected;
  c->paused = false;
  impl_->start_reading(c);
  return errc::ok;
}

void stream_channel::close() {
  impl_->close_all(true);
}

bool stream_channel::closed() const noexcept {
  return impl_->closed;
}

stream_channel_metrics stream_channel::metrics() const noexcept {
  return impl_->metrics();
}

const stream_config& stream_channel::config() const noexcept {
  return impl_->cfg;
}

uv_loop_t* stream_channel::loop() const noexcept {
  return impl_->loop;
}

}  // namespace uvbus
