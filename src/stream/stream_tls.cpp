// Stream connections over TLS: the glue between a connection (socket, queue, decoder) and its
// tls_session — handshake and its deadline, encrypting the merged batches, decrypting reads.
//
// Write path. flush_queue() merges small frames exactly as in clear text and hands the batch to
// tls_write() instead of the socket: one SSL_write per buffer of the batch (TLS cuts it into 16 KiB
// records), so a flush of a thousand small messages costs a few records, not a thousand; a large
// frame is encrypted straight from its queue block. The ciphertext goes to the socket at once; what
// the socket does not take waits in the session's flight buffer for one uv_write, and the next
// batch is encrypted only when it is gone (c->writing), so at most one batch of ciphertext is held
// per connection. Nothing is allocated per message: the ciphertext buffers keep their memory.
//
// Read path. Ciphertext is read into the per-thread read buffer, handed to the session as its
// input, and decrypted record by record into a per-thread plaintext buffer that the frame decoder
// reads like a socket read in clear text.
#include <unistd.h>
#include <uv.h>

#include <memory>
#include <new>

#include "stream/stream_impl.h"
#include "stream/test_access.h"
#include "stream/tls_context.h"
#include "stream/tls_session.h"

namespace uvbus {

namespace detail {
void tls_session_deleter::operator()(tls_session* s) const noexcept {
  delete s;
}

bool stream_access::break_tls_writes(stream_channel& ch, connection_id conn) noexcept {
  conn_impl* c = ch.impl_->find(conn);
  if (c == nullptr || !c->secure) return false;
  c->secure->break_writes();
  return true;
}

bool stream_access::break_tls_writes_at_renewal(stream_channel& ch, connection_id conn) noexcept {
  conn_impl* c = ch.impl_->find(conn);
  if (c == nullptr || !c->secure) return false;
  c->secure->break_writes_at_renewal();
  return true;
}
}  // namespace detail

namespace {

constexpr size_t kPlainBuffer = size_t{64} * 1024;

// Decrypted bytes, per thread: decoded at once, never referenced after the read callback returns.
uint8_t* plain_buffer() {
  thread_local std::unique_ptr<uint8_t[]> buf;
  if (!buf) buf.reset(new (std::nothrow) uint8_t[kPlainBuffer]);
  return buf.get();
}

}  // namespace

errc stream_channel::impl::tls_context_for(const tls_config* per_call,
                                           std::shared_ptr<const detail::tls_context>* out) {
  out->reset();
  const tls_config& t = per_call != nullptr ? *per_call : cfg.tls;
  if (t.mode == tls_mode::off) return errc::ok;
  // The default context is built again when its files changed on disk (a renewed certificate);
  // the connections made with the old one keep it.
  if (per_call == nullptr && default_tls && !default_tls->files_changed()) {
    *out = default_tls;
    return errc::ok;
  }
  if (closed) return fail(errc::closed, "the channel is closed");
  std::string why;
  const errc e = detail::tls_context::create(t, out, &why);
  if (e != errc::ok) return fail(e, why);
  if (per_call == nullptr) default_tls = *out;
  return errc::ok;
}

void stream_channel::impl::refresh_listener_tls(listener_impl* l) {
  if (!l->tls_ctx->files_changed()) return;
  std::shared_ptr<const detail::tls_context> fresh;
  std::string why;
  if (detail::tls_context::create(l->tls_ctx->config(), &fresh, &why) != errc::ok) {
    log_later(detail::kLogTls, log_level::warn,
              l->url + ": the certificate files changed but could not be read again (" + why +
                  "): the connections accepted meanwhile get the certificate in use");
    return;
  }
  if (default_tls == l->tls_ctx) default_tls = fresh;  // the channel's default, renewed too
  l->tls_ctx = std::move(fresh);
}

errc stream_channel::impl::listen_tls(std::string_view url, const tls_config* tls, listener_id* out,
                                      void* user) {
  std::shared_ptr<const detail::tls_context> ctx;
  errc e = tls_context_for(tls, &ctx);
  if (e != errc::ok) return e;
  listener_id id;
  e = listen(url, &id, user);
  if (e != errc::ok) return e;
  find(id)->tls_ctx = std::move(ctx);
  if (out != nullptr) *out = id;
  return errc::ok;
}

errc stream_channel::impl::listen_fd_tls(std::string_view url, int fd, const tls_config* tls,
                                         listener_id* out, void* user) {
  std::shared_ptr<const detail::tls_context> ctx;
  errc e = tls_context_for(tls, &ctx);
  if (e != errc::ok) {
    ::close(fd);
    return e;
  }
  listener_id id;
  e = listen_fd(url, fd, &id, user);
  if (e != errc::ok) return e;
  find(id)->tls_ctx = std::move(ctx);
  if (out != nullptr) *out = id;
  return errc::ok;
}

errc stream_channel::impl::connect_tls(std::string_view url, const tls_config* tls,
                                       connection_id* out, void* user) {
  std::shared_ptr<const detail::tls_context> ctx;
  errc e = tls_context_for(tls, &ctx);
  if (e != errc::ok) return e;
  connection_id id;
  e = connect(url, &id, user);
  if (e != errc::ok) return e;
  find(id)->tls_ctx = std::move(ctx);
  if (out != nullptr) *out = id;
  return errc::ok;
}

void stream_channel::impl::tls_start(conn_impl* c) {
  std::unique_ptr<detail::tls_session> s;
  std::string why;
  const errc e = detail::tls_session::create(c->tls_ctx, !c->outbound, &s, &why);
  if (e != errc::ok) {
    tls_fail(c, e, why);
    return;
  }
  c->secure.reset(s.release());
  const uint32_t limit = c->tls_ctx->config().handshake_timeout_ms;
  auto* t = new (std::nothrow) uv_timer_t;
  if (t == nullptr) {
    tls_fail(c, errc::no_memory, "tls: no memory for the handshake timer");
    return;
  }
  uv_timer_init(loop, t);
  t->data = c;
  c->timer = t;
  ++c->pending;
  uv_timer_start(
      t,
      [](uv_timer_t* tt) {
        auto* cc = static_cast<conn_impl*>(tt->data);
        cc->ch->tls_fail(cc, errc::timeout,
                         "tls: handshake not finished within " +
                             std::to_string(cc->tls_ctx->config().handshake_timeout_ms) + " ms");
      },
      limit, 0);
  const int r = uv_read_start(c->stream(), alloc_cb, read_cb);
  if (r != 0) {
    end_conn(c, from_uv(r));
    return;
  }
  c->reading = true;
  c->secure->set_now(uv_now(loop));
  tls_handshake(c);  // the client's first flight
}

void stream_channel::impl::tls_handshake(conn_impl* c) {
  detail::tls_session& s = *c->secure;
  std::string why;
  const errc e = s.handshake(&why);
  if (e != errc::ok) {
    tls_fail(c, e, why);
    return;
  }
  const int r = tls_send(c);
  if (r < 0) {
    tls_socket_error(c, r, "sending");
    return;
  }
  if (!s.done()) return;
  // Authenticated both ways: the connection is announced now (the deadline timer goes).
  if (c->outbound) {
    on_connected(c);
  } else {
    close_timer(c);
    accepted(c);
  }
}

void stream_channel::impl::tls_on_read(conn_impl* c, ssize_t nread, const uv_buf_t* buf) {
  detail::tls_session& s = *c->secure;
  if (nread < 0) {
    if (nread != UV_EOF) {
      tls_socket_error(c, static_cast<int>(nread), "reading");
    } else if (!c->connected_once) {
      tls_fail(c, errc::connection_reset,
               "tls: the peer closed the connection during the handshake");
    } else {
      // An end without close_notify may be a truncation: never graceful, unless we were the ones
      // ending (our close_notify went first and the peer just closed).
      end_conn(c, c->shutting_down ? errc::ok : errc::connection_reset);
    }
    return;
  }
  ++c->m().read_calls;
  c->last_read_ms = uv_now(loop);
  s.set_now(c->last_read_ms);
  s.set_input(reinterpret_cast<const uint8_t*>(buf->base), static_cast<size_t>(nread));
  // The input points into the per-thread read buffer: forgotten at every exit of this call (no
  // stale pointer for a later write or close_notify; the session lives as long as c).
  struct input_reset {
    detail::tls_session* session;
    ~input_reset() { session->set_input(nullptr, 0); }
  } const forget{&s};
  if (!s.done()) {
    tls_handshake(c);
    // on_accepted / on_connected may have disconnected it. Draining, the rest of this read still
    // goes through the session (its plaintext dropped below): the next read continues it.
    if (!s.done() || c->state == conn_state::closing) return;
  }
  uint8_t* plain = plain_buffer();
  if (plain == nullptr) {
    end_conn(c, errc::no_memory);
    return;
  }
  for (;;) {
    size_t n = 0;
    std::string why;
    const errc e = s.read(plain, kPlainBuffer, &n, &why);
    if (e == errc::closed) {                   // close_notify: graceful at a frame boundary
      if (c->state == conn_state::draining) {  // as an end of stream while draining: reading ends,
        uv_read_stop(c->stream());             // the queue still drains
        c->reading = false;
        // The same read may have completed the post-handshake message our close_notify (and
        // the queue) waited for: flushed below, as no later read will.
        break;
      }
      end_conn(c, c->decoder.buffered() == 0 ? errc::ok : errc::connection_reset);
      return;
    }
    if (e != errc::ok) {
      tls_fail(c, e, why);
      return;
    }
    if (n == 0) break;
    // Draining (a graceful disconnect, maybe from on_received just now): nothing more is
    // delivered, but the records are still read, so that the session stays whole.
    if (c->state != conn_state::draining && !deliver(c, plain, n) &&
        c->state != conn_state::draining) {
      return;
    }
  }
  // What reading produced (KeyUpdate replies, an alert) waits in out() behind a write in flight.
  // A peer that stops reading but keeps asking for replies would grow it without a bound: past
  // the send queue's own bound, the connection goes (checked once per read, not per record).
  const size_t waiting = s.out().size();
  if (c->writing && waiting > tls_reply_limit()) {
    tls_fail(c, errc::protocol_error,
             "tls: " + std::to_string(waiting) +
                 " bytes of TLS replies (KeyUpdate) wait behind a write the peer is not reading, "
                 "more than the send queue's " +
                 std::to_string(tls_reply_limit()) + " bytes");
    return;
  }
  const int r = tls_send(c);
  if (r < 0) {
    tls_socket_error(c, r, "sending");
    return;
  }
  if (s.input_freed_writes()) mark_dirty(c);  // the writes that waited for this input
}

size_t stream_channel::impl::tls_reply_limit() const noexcept {
  return cfg.queue.mode == queue_mode::dynamic ? cfg.queue.max_bytes : cfg.queue.ring_bytes;
}

int stream_channel::impl::tls_write(conn_impl* c, const uv_buf_t* bufs, unsigned nbufs) {
  detail::tls_session& s = *c->secure;
  // Part of a peer's post-handshake message is in: nothing is written until its rest arrives
  // (tls_on_read flushes again), or partial_frame_timeout_ms closes the link.
  if (s.writes_wait()) return 0;
  s.set_now(uv_now(loop));
  const size_t before = s.out().size();
  size_t total = 0;
  for (unsigned i = 0; i < nbufs; ++i) {
    std::string why;
    const errc e = s.write(reinterpret_cast<const uint8_t*>(bufs[i].base), bufs[i].len, &why);
    if (e != errc::ok) {
      // The whole batch is reported failed: none of its ciphertext may reach the peer, not even
      // with tls_fail()'s best-effort alert (which the peer could not decrypt without the records
      // before it anyway).
      s.out().keep(before);
      tls_fail(c, e, why);  // a TLS failure: tls_failed, not io_errors
      return UV_EPROTO;
    }
    total += bufs[i].len;
  }
  const int r = tls_send(c);
  if (r < 0) {
    tls_socket_error(c, r, "sending");
    return r;
  }
  return static_cast<int>(total);
}

int stream_channel::impl::tls_send(conn_impl* c) {
  detail::tls_session& s = *c->secure;
  if (c->writing || !c->handle_open) return 0;  // after the write in flight
  detail::byte_buf& o = s.out();
  if (o.empty()) return 0;
  uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(const_cast<uint8_t*>(o.data())),
                           static_cast<unsigned>(o.size()));
  ++c->m().write_calls;
  int w = uv_try_write(c->stream(), &b, 1);
  if (w == UV_EAGAIN) {
    w = 0;
  } else if (w < 0) {
    return w;
  }
  o.consume(static_cast<size_t>(w));
  if (o.empty()) return 0;
  // The socket is full: the rest goes with one uv_write from the flight buffer, and new
  // ciphertext (a reply produced while reading) collects in out() meanwhile.
  s.swap_out();
  detail::byte_buf& f = s.flight();
  b = uv_buf_init(reinterpret_cast<char*>(const_cast<uint8_t*>(f.data())),
                  static_cast<unsigned>(f.size()));
  ++c->m().write_calls;
  c->wreq.data = c;
  const int r = uv_write(&c->wreq, c->stream(), &b, 1, [](uv_write_t* req, int status) {
    auto* cc = static_cast<conn_impl*>(req->data);
    cc->ch->on_write_done(cc, status);
  });
  if (r != 0) return r;
  c->writing = true;
  return 0;
}

void stream_channel::impl::tls_write_done(conn_impl* c, int status) {
  c->writing = false;
  c->secure->flight().clear();
  if (c->queue) c->queue->release_retired();
  if (c->state == conn_state::closing) return;
  int r = status;
  if (r >= 0) r = tls_send(c);
  if (r < 0) {
    tls_socket_error(c, r, "sending");
    return;
  }
  if (!c->writing && c->active()) flush(c);
}

bool stream_channel::impl::tls_close_notify(conn_impl* c) {
  c->secure->close_notify();
  const int r = tls_send(c);
  if (r < 0) {  // counted, as clear text's drain counts the read that meets it
    tls_socket_error(c, r, "sending close_notify");
    return false;
  }
  return true;
}

void stream_channel::impl::tls_socket_error(conn_impl* c, int status, const char* what) {
  if (!c->connected_once) {  // the handshake failed: counted and logged as such, once
    tls_fail(c, from_uv(status),
             std::string("tls: ") + what + " failed during the handshake: " + uv_strerror(status));
    return;
  }
  ++c->m().io_errors;
  end_conn(c, from_uv(status));
}

void stream_channel::impl::tls_fail(conn_impl* c, errc e, const std::string& why) {
  if (c->state == conn_state::closing) return;
  ++retired.tls_failed;
  const std::string who = c->peer_url.empty() ? std::string("a peer") : c->peer_url;
  if (c->secure && !c->writing && c->handle_open) {
    // Best effort: the alert that tells the peer why.
    detail::byte_buf& o = c->secure->out();
    uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(const_cast<uint8_t*>(o.data())),
                             static_cast<unsigned>(o.size()));
    if (!o.empty()) (void)uv_try_write(c->stream(), &b, 1);
    o.clear();
  }
  // Ended before the line is logged: an on_log that disconnects it would make its reason cancelled.
  end_conn(c, e);
  log_event(detail::kLogTls, log_level::warn, who + ": " + why);
}

}  // namespace uvbus
