// Stream connections, the read path: the per-thread read buffer, frame decoding and delivery.
//
// libuv reads into one large per-thread buffer (alloc_cb), and the per-connection
// frame_decoder yields payloads straight from it; only the bytes of a frame cut by the end of a
// read are copied into the connection's decoder. The decoder verifies the whole frames of a read
// up to 16 at a time (murmur3_x86_32_batch) and yields them in order; a bad checksum still ends
// the connection after the frames before it, and nothing after it is delivered. Decode errors end
// that connection only.
#include <uv.h>

#include <new>

#include "stream/stream_impl.h"
#include "stream/test_access.h"
#include "stream/tls_session.h"

namespace uvbus {

namespace {

// The per-thread read buffer, shared by every channel and connection of the thread: libuv reads
// into it inside one callback at a time (single-threaded loop), and the bytes are decoded before
// that callback returns, so nothing refers to it afterwards.
struct read_buffer {
  std::unique_ptr<uint8_t[]> mem;
  size_t size = 0;
};
thread_local read_buffer tls_read;
thread_local bool tls_read_fails = false;  // stream_access::fail_read_buffer()

errc from_decoder(frame_status s) noexcept {
  switch (s) {
    case frame_status::bad_hash:
      return errc::bad_hash;
    case frame_status::oversize:
      return errc::oversize;
    case frame_status::bad_varint:
      return errc::bad_varint;
    case frame_status::no_memory:
      return errc::no_memory;
    default:
      return errc::protocol_error;
  }
}

}  // namespace

void stream_channel::impl::alloc_cb(uv_handle_t* h, size_t, uv_buf_t* buf) {
  auto* c = static_cast<conn_impl*>(h->data);
  const size_t want = c->ch->cfg.read_buffer_size;
  if (tls_read.size < want) {
    tls_read.mem.reset(tls_read_fails ? nullptr : new (std::nothrow) uint8_t[want]);
    tls_read_fails = false;
    tls_read.size = tls_read.mem ? want : 0;
  }
  // A zero-length buffer makes libuv report UV_ENOBUFS, which ends the connection.
  *buf = uv_buf_init(reinterpret_cast<char*>(tls_read.mem.get()),
                     static_cast<unsigned>(tls_read.size));
}

void stream_channel::impl::read_cb(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<conn_impl*>(s->data);
  c->ch->on_read(c, nread, buf);
}

void stream_channel::impl::on_read(conn_impl* c, ssize_t nread, const uv_buf_t* buf) {
  if (nread == 0) return;  // EAGAIN: a normal event, never an error
  // alloc_cb found no memory for the read buffer: our failure, not the socket's.
  if (nread == UV_ENOBUFS) {
    end_conn(c, errc::no_memory);
    return;
  }
  // TLS: a draining link's records still go through the session (their plaintext is dropped
  // there): the rest of a post-handshake message may be what our close_notify waits for, and a
  // record skipped would break the ones after it.
  if (c->state == conn_state::draining && (!c->secure || nread < 0)) {
    // A graceful disconnect delivers nothing more; what still arrives is read and dropped, so
    // that the peer's writes (and its own drain) never stall on us. Its end of stream only ends
    // the reading: the queue still drains, then the write side shuts down.
    if (nread >= 0) return;
    uv_read_stop(c->stream());
    c->reading = false;
    if (nread != UV_EOF) {
      ++c->m().io_errors;
      end_conn(c, from_uv(static_cast<int>(nread)));
    } else if (c->secure && c->secure->writes_wait()) {
      // TLS: the queue and close_notify wait for the rest of a peer's post-handshake message,
      // which can no longer come: the link ends now, its packets reported failed (nothing else
      // would end it: the sweep looks only at a link that still reads).
      end_conn(c, errc::connection_reset);
    }
    return;
  }
  if (c->secure) {
    tls_on_read(c, nread, buf);
    return;
  }
  if (nread < 0) {
    if (nread != UV_EOF) {
      ++c->m().io_errors;
      end_conn(c, from_uv(static_cast<int>(nread)));
    } else {
      // The peer closed: at a frame boundary that is a graceful end, mid-frame it is not.
      end_conn(c, c->decoder.buffered() == 0 ? errc::ok : errc::connection_reset);
    }
    return;
  }
  ++c->m().read_calls;
  c->last_read_ms = uv_now(loop);
  (void)deliver(c, reinterpret_cast<const uint8_t*>(buf->base), static_cast<size_t>(nread));
}

bool stream_channel::impl::deliver(conn_impl* c, const uint8_t* data, size_t n) {
  // Only a connected connection delivers: draining (a graceful disconnect) or closing, nothing.
  if (c->state != conn_state::connected) return false;
  auto& m = c->m();
  c->decoder.feed(data, n);
  for (;;) {
    const frame_decoder::result r = c->decoder.next();
    if (r.status == frame_status::payload) {
      ++m.packets_received;
      m.bytes_received += r.size;
      if (cb.on_received) {
        const detail::callback_scope scope(this);
        c->delivering = true;
        cb.on_received(c->id, r.data, r.size);
        c->delivering = false;
        // The callback may have disconnected the connection (a graceful one drains its queue but
        // reads no more) or closed the channel: the buffer of a cut frame just delivered goes at
        // once, not after a drain that lasts as long as the peer takes to read. A pause takes
        // effect after this chunk: its bytes live in the shared read buffer and cannot wait.
        if (c->state != conn_state::connected) {
          c->decoder.reset();
          return false;
        }
      }
      continue;
    }
    if (r.status == frame_status::need_more) {
      // A read that ends at a frame boundary: the connection keeps no receive buffer.
      c->decoder.release_buffer();
      return true;
    }
    // Out of memory for a cut frame's buffer is ours, not a malformed stream from the peer.
    if (r.status != frame_status::no_memory) ++m.decode_errors;
    end_conn(c, from_decoder(r.status));
    return false;
  }
}

void detail::stream_access::fail_read_buffer() noexcept {
  tls_read.mem.reset();
  tls_read.size = 0;
  tls_read_fails = true;
}

void stream_channel::impl::start_reading(conn_impl* c) {
  if (c->reading || c->paused || !c->active()) return;
  const int r = uv_read_start(c->stream(), alloc_cb, read_cb);
  if (r != 0) {
    end_conn(c, from_uv(r));
    return;
  }
  c->reading = true;
}

}  // namespace uvbus
