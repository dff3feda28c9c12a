// The stream channel: construction and destruction, connection/listener bookkeeping, close(),
// metrics, and the public API forwarding to the impl (the sweep: stream_sweep.cpp).
#include <unistd.h>
#include <uv.h>
#include <csignal>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/murmur3_batch.h"
#include "stream/stream_impl.h"
#include "stream/test_access.h"
#include "stream/tls_context.h"
#include "stream/tls_session.h"

namespace uvbus {

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

namespace detail {

namespace {
// Generations of connection ids and listener ids: process-wide, so an id is never reused.
std::atomic<uint32_t> g_next_gen{1};
std::atomic<uint64_t> g_next_listener{1};
}  // namespace

void stream_access::set_next_generation(uint32_t gen) noexcept {
  g_next_gen.store(gen, std::memory_order_relaxed);
}

// A slot's generations only grow: once the process-wide counter wraps, a slot takes the one after
// its last instead, and a slot whose last generation was the highest is never used again.
connection_id conn_table::add(conn_impl* c) {
  uint32_t gen = g_next_gen.fetch_add(1, std::memory_order_relaxed);
  if (gen == 0) gen = g_next_gen.fetch_add(1, std::memory_order_relaxed);  // after wrap-around
  uint32_t idx = 0;
  if (free_head_ != UINT32_MAX) {
    idx = free_head_;
    free_head_ = slots_[idx].next_free;
    gen = std::max(gen, slots_[idx].gen + 1);  // never UINT32_MAX + 1: such a slot is retired
  } else {
    idx = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  slots_[idx].c = c;
  slots_[idx].gen = gen;
  return connection_id{uint64_t{gen} << 32 | idx};
}

void conn_table::remove(connection_id id) noexcept {
  // Already gone: close() takes a connection out once it reported it, before the loop frees it
  // (unlink() then removes it again).
  if (find(id) == nullptr) return;
  const auto idx = static_cast<uint32_t>(id.value);
  slot& s = slots_[idx];
  s.c = nullptr;  // gen stays: find() sees no connection, and the next one here takes a later gen
  if (s.gen == UINT32_MAX) return;  // retired: its next id would repeat an earlier one
  s.next_free = free_head_;
  free_head_ = idx;
}

callback_scope::callback_scope(stream_channel::impl* c) noexcept : ch(c) {
  ++ch->callback_depth;
}

callback_scope::~callback_scope() {
  if (--ch->callback_depth == 0 && ch->has_next_cb) {
    ch->has_next_cb = false;
    if (!ch->closed) ch->cb = std::move(ch->next_cb);
    ch->next_cb = stream_callbacks{};
  }
}

}  // namespace detail

stream_channel::impl::impl(uv_loop_t* l, const stream_config& c, stream_callbacks cbs)
    : loop(l), cfg(c), cb(std::move(cbs)) {
  cfg_error = validate(c, &cfg_detail);
  merge_cap = std::max({kMinMergeBuffer, cfg.message_limit + kFrameMaxHeader, cfg.merge_threshold});
  seal_min_bytes = murmur3_batch_min_mean_bytes();
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
  uv_timer_init(loop, &sweep_timer);
  sweep_timer.data = this;
  uint64_t every = UINT64_MAX;
  if (cfg.partial_frame_timeout_ms != 0) every = cfg.partial_frame_timeout_ms / 4;
  if (cfg.send_ring_idle_ms != 0) every = std::min<uint64_t>(every, cfg.send_ring_idle_ms / 2);
  if (every != UINT64_MAX) {
    sweep_period_ms = std::max<uint64_t>(detail::kSweepMinMs, every);
    uv_timer_start(&sweep_timer, on_sweep, sweep_period_ms, 0);
  }
  uv_unref(reinterpret_cast<uv_handle_t*>(&sweep_timer));  // never keeps the loop alive by itself
  uv_timer_init(loop, &accept_timer);  // active only while a listener waits to accept again
  accept_timer.data = this;
  handles = 4;
}

void stream_channel::impl::link(conn_impl* c) {
  conns.push_front(c);
  ++retired.connections_open;
}

void stream_channel::impl::link(listener_impl* l) {
  listeners.push_front(l);
  ++retired.listeners_open;
}

void stream_channel::impl::unlink(conn_impl* c) {
  if (sweep_next == c) sweep_next = detail::conn_list::next(c);
  conns.remove(c);
  table.remove(c->id);
  --retired.connections_open;
}

void stream_channel::impl::unlink(listener_impl* l) {
  listeners.remove(l);
  --retired.listeners_open;
}

void stream_channel::impl::handle_released() {
  if (--handles == 0 && owner_gone && conns.empty()) delete this;
}

void stream_channel::impl::maybe_delete() {
  if (owner_gone && handles == 0 && conns.empty()) delete this;
}

conn_impl* stream_channel::impl::new_conn(bool outbound, void* user) {
  auto* c = new (std::nothrow) conn_impl(this);
  if (c == nullptr) return nullptr;
  c->id = table.add(c);
  c->user_data = user;
  c->outbound = outbound;
  c->decoder = frame_decoder(cfg.message_limit);
  link(c);
  return c;
}

void stream_channel::impl::close_all(bool with_callbacks) {
  if (closed) return;
  if (with_callbacks) log_deferred();  // close() calls back: its lines first
  if (closed) return;
  closed = true;
  deferred_logs.clear();
  if (!with_callbacks) cb = stream_callbacks{};
  while (!listeners.empty()) (void)close_listener(listeners.front());
  if (reserve_fd >= 0) ::close(reserve_fd);
  reserve_fd = -1;
  // Reports first (callbacks see the channel closed: every call returns closed), then the
  // handles. The list cannot change meanwhile: connections are only freed from the loop. Once its
  // final callback returned, a connection's id no longer resolves (stream.h), though the loop
  // frees it later. One already reporting (close() called from its on_unsent or on_send_failed)
  // finishes in that outer report_final(), and release() takes it out after its final callback.
  for (conn_impl* c = conns.front(); c != nullptr; c = detail::conn_list::next(c)) {
    if (c->state != conn_state::closing) c->reason = errc::closed;
    const bool reporting = c->reported;
    report_final(c);
    if (!reporting) table.remove(c->id);
  }
  for (conn_impl* c = conns.front(); c != nullptr; c = detail::conn_list::next(c))
    end_conn(c, errc::closed);
  dirty_head = nullptr;
  for (conn_impl* c = conns.front(); c != nullptr; c = detail::conn_list::next(c)) c->dirty = false;
  if (idle_on) {
    idle_on = false;
    uv_idle_stop(&idle);
  }
  auto done = [](uv_handle_t* h) { static_cast<impl*>(h->data)->handle_released(); };
  uv_close(reinterpret_cast<uv_handle_t*>(&check), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&idle), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&sweep_timer), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&accept_timer), done);
}

stream_channel_metrics stream_channel::impl::metrics() const {
  stream_channel_metrics m = retired;
  for (const conn_impl* c = conns.front(); c != nullptr; c = detail::conn_list::next(c)) {
    add_totals(m.totals, live_metrics(c), true);
    m.totals.queue_memory_bytes += send_memory(c);
    m.totals.receive_memory_bytes += c->decoder.buffer_capacity();
  }
  return m;
}

size_t stream_channel::impl::send_memory(const conn_impl* c) noexcept {
  size_t n = c->queue ? c->queue->memory_bytes() : 0;
  if (c->secure) n += c->secure->buffer_bytes();
  return n;
}

errc stream_channel::impl::fail(errc e, std::string detail) {
  last_err.code = e;
  last_err.detail = std::move(detail);
  return e;
}

listener_impl* stream_channel::impl::find(listener_id id) const noexcept {
  for (listener_impl* l = listeners.front(); l != nullptr; l = detail::listener_list::next(l)) {
    if (l->id == id) return l;
  }
  return nullptr;
}

uint64_t stream_channel::impl::next_listener_id() noexcept {
  return detail::g_next_listener.fetch_add(1, std::memory_order_relaxed);
}

errc stream_channel::impl::check_url(std::string_view url, address* a) {
  const std::string u(url);
  if (closed) return fail(errc::closed, u + ": the channel is closed");
  if (cfg_error != errc::ok) return fail(cfg_error, "stream_config: " + cfg_detail);
  std::string why;
  if (const errc pe = parse_address(url, a, &why); pe != errc::ok) return fail(pe, u + ": " + why);
  if (!a->is_stream()) {
    return fail(errc::unsupported_scheme, u + ": not a stream scheme (ipv4, ipv6, dns or unix)");
  }
  return errc::ok;
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

stream_channel::stream_channel(uv_loop_t* loop, const stream_config& cfg, stream_callbacks cbs)
    : impl_(new impl(loop, cfg, std::move(cbs))) {
  ignore_default_sigpipe();
}

stream_channel::~stream_channel() {
  if (!impl_->owner.here()) detail::wrong_thread("stream_channel::~stream_channel");
  if (impl_->callback_depth != 0) {
    // Destroying the channel inside its own callback would free the state the caller returns to.
    std::fprintf(stderr, "uvbus: stream_channel destroyed inside one of its callbacks\n");
    std::abort();
  }
  impl_->close_all(false);
  impl_->owner_gone = true;
  impl_->maybe_delete();
}

errc stream_channel::validate(const stream_config& cfg, std::string* detail) noexcept {
  auto bad = [detail](const char* why) {
    if (detail != nullptr) *detail = why;
    return errc::invalid_argument;
  };
  if (cfg.message_limit == 0 || cfg.message_limit > (size_t{1} << 30)) {
    return bad("message_limit must be between 1 and 1 GiB");
  }
  if (cfg.queue.mode != queue_mode::static_ring && cfg.queue.mode != queue_mode::dynamic) {
    return bad("queue.mode must be static_ring or dynamic");
  }
  if (cfg.queue.mode == queue_mode::static_ring && cfg.queue.ring_bytes < 64) {
    return bad("queue.ring_bytes must be at least 64");
  }
  if (cfg.queue.mode == queue_mode::static_ring &&
      cfg.queue.ring_bytes > write_queue::kMaxRingBytes) {
    return bad("queue.ring_bytes must be at most SIZE_MAX / 2 (rounded up to 8 it would wrap)");
  }
  if (cfg.queue.mode == queue_mode::dynamic &&
      (cfg.queue.max_bytes == 0 || cfg.queue.max_blocks == 0)) {
    return bad("queue.max_bytes and queue.max_blocks must both be > 0 in dynamic mode");
  }
  if (write_queue::validate(cfg.queue) != errc::ok) return bad("queue: invalid write_queue_config");
  const size_t biggest = frame_size(cfg.message_limit);
  if (cfg.queue.mode == queue_mode::static_ring && cfg.queue.ring_bytes < biggest + 16 + 8) {
    return bad("queue.ring_bytes must hold one frame of message_limit (+ 24 bytes)");
  }
  if (cfg.queue.max_bytes != 0 && cfg.queue.max_bytes < biggest) {
    return bad("queue.max_bytes must hold one frame of message_limit (payload + 14 bytes)");
  }
  // The per-thread merge buffer is at least this large (merge_cap): unbounded, one request could
  // ask for SIZE_MAX bytes at the first merged write.
  if (cfg.merge_threshold > (size_t{1} << 30)) return bad("merge_threshold must be at most 1 GiB");
  if (cfg.read_buffer_size < 4096 || cfg.read_buffer_size > (size_t{1} << 30)) {
    return bad("read_buffer_size must be between 4 KiB and 1 GiB");
  }
  if (cfg.backlog <= 0) return bad("backlog must be > 0");
  // Linux takes 1 to 32767 s (TCP_KEEPIDLE); outside it the socket kept the kernel's 2 hours.
  if (cfg.tcp_keepalive && (cfg.keepalive_delay_s == 0 || cfg.keepalive_delay_s > kMaxKeepaliveS)) {
    return bad("keepalive_delay_s must be between 1 and 32767 when tcp_keepalive is set");
  }
  if (cfg.unix_socket_mode > 07777) return bad("unix_socket_mode must be at most 07777");
  if (cfg.unix_send_buffer > kMaxUnixSendBuffer)
    return bad("unix_send_buffer must be at most 1 GiB");
  if (cfg.max_unregistered != 0 && cfg.max_unregistered_per_address > cfg.max_unregistered) {
    return bad("max_unregistered_per_address must not exceed max_unregistered (or set it to 0)");
  }
  if (cfg.tls.mode != tls_mode::off) {
    std::string why;
    const errc e = detail::tls_context::check(cfg.tls, &why);
    if (e != errc::ok) {
      if (detail != nullptr) *detail = why;
      return e;
    }
  }
  return errc::ok;
}

errc stream_channel::set_callbacks(stream_callbacks cbs) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::set_callbacks");
  if (impl_->closed) return errc::closed;
  if (impl_->callback_depth != 0) {  // the running std::function must outlive its call
    impl_->next_cb = std::move(cbs);
    impl_->has_next_cb = true;
  } else {
    impl_->cb = std::move(cbs);
  }
  return errc::ok;
}

void stream_channel::impl::log_event(size_t kind, log_level lv, const std::string& text) {
  if (!cb.on_log) return;
  uint64_t suppressed = 0;
  if (!log_limit.allow(kind, uv_now(loop), &suppressed)) return;
  const detail::callback_scope scope(this);
  if (suppressed == 0) {
    cb.on_log(lv, text);
  } else {
    cb.on_log(lv, text + " (" + std::to_string(suppressed) + " more like it not logged)");
  }
}

void stream_channel::impl::log_later(size_t kind, log_level lv, std::string text) {
  if (!cb.on_log || closed) return;
  deferred_logs.push_back({kind, lv, std::move(text)});
  start_idle();
}

// Taken out first: an on_log that calls listen() may defer another line meanwhile.
void stream_channel::impl::log_deferred() {
  std::vector<deferred_line> lines;
  lines.swap(deferred_logs);
  for (const deferred_line& d : lines) {
    if (closed) return;
    log_event(d.kind, d.level, d.text);
  }
}

void stream_channel::impl::log_end(const conn_impl* c, errc reason) {
  size_t kind = 0;
  switch (reason) {
    case errc::bad_hash:
      kind = kLogBadHash;
      break;
    case errc::bad_varint:
      kind = kLogBadVarint;
      break;
    case errc::oversize:
      kind = kLogOversize;
      break;
    case errc::timeout:
      // Only a stalled half-frame: a dial's connect_timeout_ms is an ordinary end, and a TLS
      // handshake's deadline is logged by tls_fail.
      if (c->metrics.partial_frame_timeouts == 0) return;
      kind = kLogStalled;
      break;
    default:
      return;  // ordinary ends are the owner's to log (on_disconnected tells it)
  }
  const std::string who = c->peer_url.empty() ? std::string("a peer") : c->peer_url;
  log_event(kind, log_level::warn,
            "connection " + std::to_string(c->id.value) + " (" + who + ") closed: " +
                to_string(reason) + (reason == errc::timeout ? "" : ": corrupt stream"));
}

errc stream_channel::listen(std::string_view url, listener_id* out, void* user_data) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::listen");
  return impl_->listen_tls(url, nullptr, out, user_data);
}

errc stream_channel::listen(std::string_view url, const tls_config& tls, listener_id* out,
                            void* user_data) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::listen");
  return impl_->listen_tls(url, &tls, out, user_data);
}

errc stream_channel::listen_fd(std::string_view url, int fd, listener_id* out, void* user_data) {
  if (!impl_->owner.here()) {  // the channel owns fd from the call on, even this one
    ::close(fd);
    detail::wrong_thread("stream_channel::listen_fd");  // (debug builds abort here)
    return errc::wrong_thread;
  }
  if (impl_->closed) {
    ::close(fd);
    return errc::closed;
  }
  return impl_->listen_fd_tls(url, fd, nullptr, out, user_data);
}

errc stream_channel::detach_listener(listener_id l, int* fd) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::detach_listener");
  if (impl_->closed || fd == nullptr) return errc::closed;
  return impl_->detach_listener(impl_->find(l), fd);
}

errc stream_channel::close_listener(listener_id l) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::close_listener");
  if (impl_->closed) return errc::closed;
  return impl_->close_listener(impl_->find(l));
}

std::string stream_channel::listener_url(listener_id l) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::listener_url", {});
  const listener_impl* li = impl_->find(l);
  return li != nullptr ? li->url : std::string();
}

uint16_t stream_channel::listener_port(listener_id l) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::listener_port", 0);
  const listener_impl* li = impl_->find(l);
  return li != nullptr ? li->port : 0;
}

void* stream_channel::listener_user_data(listener_id l) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::listener_user_data", nullptr);
  const listener_impl* li = impl_->find(l);
  return li != nullptr ? li->user_data : nullptr;
}

errc stream_channel::connect(std::string_view url, connection_id* out, void* user_data) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::connect");
  return impl_->connect_tls(url, nullptr, out, user_data);
}

errc stream_channel::connect(std::string_view url, const tls_config& tls, connection_id* out,
                             void* user_data) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::connect");
  return impl_->connect_tls(url, &tls, out, user_data);
}

errc stream_channel::impl::disconnect(conn_impl* c, disconnect_mode mode) {
  if (c == nullptr || closed) return errc::closed;
  switch (c->state) {
    case conn_state::closing:
      return errc::closed;
    case conn_state::resolving:
    case conn_state::connecting:
      end_conn(c, errc::cancelled);
      return errc::ok;
    case conn_state::draining:
      if (mode == disconnect_mode::graceful) return errc::closed;
      end_conn(c, errc::cancelled);
      return errc::ok;
    case conn_state::connected:
      if (mode == disconnect_mode::force) {
        end_conn(c, errc::cancelled);
        return errc::ok;
      }
      c->state = conn_state::draining;
      c->want_writable = false;
      // Nothing more is delivered: a cut frame's buffer goes now, not when the drain ends (from
      // its own on_received, data may point into it: deliver() resets it after the callback).
      if (!c->delivering) c->decoder.reset();
      // Nothing more of it is delivered (stream.h, on_received), but it goes on reading, and
      // discards (on_read): a peer whose writes stalled on us would never finish its own drain.
      c->paused = false;
      start_reading(c);
      // Flushed (and then shut down) from the loop, never inside this call.
      mark_dirty(c);
      return errc::ok;
  }
  return errc::ok;
}

errc stream_channel::disconnect(connection_id conn, disconnect_mode mode) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::disconnect");
  return impl_->disconnect(impl_->find(conn), mode);
}

errc stream_channel::send(connection_id conn, const void* data, size_t size, uint64_t* seq) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::send");
  const const_buffer b{data, size};
  return impl_->send(impl_->find(conn), &b, 1, seq);
}

errc stream_channel::sendv(connection_id conn, const const_buffer* bufs, size_t count,
                           uint64_t* seq) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::sendv");
  return impl_->send(impl_->find(conn), bufs, count, seq);
}

uint8_t* stream_channel::prepare_send(connection_id conn, size_t size, errc* err) {
  if (!impl_->owner.here()) {
    detail::wrong_thread("stream_channel::prepare_send");
    if (err != nullptr) *err = errc::wrong_thread;
    return nullptr;
  }
  return impl_->prepare_send(impl_->find(conn), size, err);
}

errc stream_channel::commit_send(connection_id conn, uint64_t* seq) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::commit_send");
  return impl_->commit_send(impl_->find(conn), seq);
}

void stream_channel::cancel_send(connection_id conn) {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::cancel_send", );
  impl_->cancel_send(impl_->find(conn));
}

errc stream_channel::mark_registered(connection_id conn) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::mark_registered");
  conn_impl* c = impl_->find(conn);
  if (c == nullptr || impl_->closed) return errc::closed;
  impl_->forget_unregistered(c);
  return errc::ok;
}

errc stream_channel::pause_reading(connection_id conn) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::pause_reading");
  conn_impl* c = impl_->find(conn);
  if (c == nullptr || impl_->closed) return errc::closed;
  if (!c->active()) return c->state == conn_state::closing ? errc::closed : errc::not_connected;
  c->paused = true;
  if (c->reading) {
    uv_read_stop(c->stream());
    c->reading = false;
  }
  return errc::ok;
}

errc stream_channel::resume_reading(connection_id conn) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::resume_reading");
  conn_impl* c = impl_->find(conn);
  if (c == nullptr || impl_->closed) return errc::closed;
  if (!c->active()) return c->state == conn_state::closing ? errc::closed : errc::not_connected;
  if (c->paused) {
    c->paused = false;
    c->last_read_ms = uv_now(impl_->loop);  // the stall clock starts again (sweep)
  }
  impl_->start_reading(c);
  return errc::ok;
}

bool stream_channel::is_open(connection_id conn) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::is_open", false);
  return impl_->find(conn) != nullptr;
}

bool stream_channel::set_user_data(connection_id conn, void* p) {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::set_user_data", false);
  conn_impl* c = impl_->find(conn);
  if (c == nullptr) return false;
  c->user_data = p;
  return true;
}

void* stream_channel::user_data(connection_id conn) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::user_data", nullptr);
  const conn_impl* c = impl_->find(conn);
  return c != nullptr ? c->user_data : nullptr;
}

bool stream_channel::outbound(connection_id conn) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::outbound", false);
  const conn_impl* c = impl_->find(conn);
  return c != nullptr && c->outbound;
}

listener_id stream_channel::listener(connection_id conn) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::listener", {});
  const conn_impl* c = impl_->find(conn);
  return c != nullptr ? c->listener : listener_id{};
}

std::string stream_channel::peer_url(connection_id conn) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::peer_url", {});
  const conn_impl* c = impl_->find(conn);
  return c != nullptr ? c->peer_url : std::string();
}

errc stream_channel::connection_metrics(connection_id conn, stream_connection_metrics* out) const {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "stream_channel::connection_metrics");
  const conn_impl* c = impl_->find(conn);
  if (c == nullptr) return errc::closed;
  if (out != nullptr) {
    *out = impl::live_metrics(c);
    out->queue_memory_bytes = impl::send_memory(c);
    out->receive_memory_bytes = c->decoder.buffer_capacity();
  }
  return errc::ok;
}

void stream_channel::close() {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::close", );
  impl_->close_all(true);
}

bool stream_channel::closed() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::closed", true);
  return impl_->closed;
}

const error_info& stream_channel::last_error() const {
  static const error_info wrong{errc::wrong_thread, "stream_channel::last_error: wrong thread"};
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::last_error", wrong);
  return impl_->last_err;
}

stream_channel_metrics stream_channel::metrics() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "stream_channel::metrics", {});
  return impl_->metrics();
}

const stream_config& stream_channel::config() const {
  return impl_->cfg;  // immutable after construction: safe from any thread
}

uv_loop_t* stream_channel::loop() const {
  return impl_->loop;  // immutable after construction: safe from any thread
}

}  // namespace uvbus
