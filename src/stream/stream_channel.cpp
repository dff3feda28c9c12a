// The stream channel: connection lifecycle, the coalescing write path and the read path.
//
// Write path (DESIGN §1). send() encodes the frame (hash computed once, over the payload already
// copied into its queue block) into the connection's write_queue and puts the connection on the
// channel's flush list; the list is flushed before the loop next blocks (uv_check right after the
// I/O phase, and an idle handle that keeps the poll from blocking while the list is non-empty). So
// every packet sent during one loop iteration leaves in as few system calls as possible.
//
// A flush takes the queue's front: when it is small (below merge_threshold) as many small frames as
// fit are copied into the thread's merge buffer and written with one uv_try_write(); a large frame
// is written straight from its queue block. uv_try_write() is synchronous, so the merge buffer is
// free again when it returns and one buffer can serve every connection of the thread. Blocks are
// popped only once all their bytes are in the kernel. When the socket takes only part of the batch
// (or nothing: EAGAIN), the rest of the block at the cut is handed to uv_write() straight from the
// queue block (its memory does not move until popped) and the connection waits for that write —
// the "one write in flight" state; the blocks after it stay queued and are merged again when it
// completes. Nothing is allocated per packet: the queue is a fixed ring (or a block per packet in
// dynamic mode, by the user's choice), the merge buffer is per thread, requests are per connection.
//
// Read path. libuv reads into one large per-thread buffer (alloc_cb), and the per-connection
// frame_decoder yields payloads straight from it; only the bytes of a frame cut by the end of a
// read are copied into the connection's decoder. Decode errors end that connection only.
//
// Endings. end_conn() stops everything and calls uv_close(); the final reports (every queued packet
// failed, then on_disconnected or on_connected(error)) fire from the close callback, so they never
// run inside a user's call to disconnect(). close() of the channel reports synchronously instead.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>
#include <csignal>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/murmur3.h"
#include "stream/stream_impl.h"
#include "uvbus/address.h"

namespace uvbus {

using detail::conn_impl;
using detail::conn_state;
using detail::listener_impl;

namespace {

constexpr size_t kMinMergeBuffer = size_t{64} * 1024;
// A flush hands the socket at most this much before giving other connections (and the loop) a
// turn; the connection stays on the flush list.
constexpr size_t kFlushBudget = size_t{1024} * 1024;
// One writev() carries at most this many queue blocks and (beyond its first block) this many bytes.
constexpr size_t kMaxGather = 16;
constexpr size_t kGatherBytes = size_t{256} * 1024;

// Per-thread buffers shared by every channel and connection of the thread. Only touched from inside
// one libuv callback at a time (single-threaded loop), and never referenced after the call that
// used them returns (reads are decoded at once; merged writes are synchronous).
struct thread_buffers {
  std::unique_ptr<uint8_t[]> read;
  size_t read_size = 0;
  std::unique_ptr<uint8_t[]> merge;
  size_t merge_size = 0;
};
thread_local thread_buffers tls;

// Connection ids are unique in the process, so handles of several channels can share one map.
std::atomic<uint64_t> g_next_id{1};

uint8_t* merge_buffer(size_t want) {
  if (tls.merge_size < want) {
    tls.merge.reset(new (std::nothrow) uint8_t[want]);
    tls.merge_size = tls.merge ? want : 0;
  }
  return tls.merge.get();
}

errc from_uv(int status) noexcept {
  if (status == UV_EOF) return errc::connection_reset;
  if (status == UV_EAI_NONAME || status == UV_EAI_AGAIN || status == UV_EAI_FAIL ||
      status == UV_EAI_NODATA || status == UV_EAI_FAMILY || status == UV_EAI_SERVICE) {
    return errc::resolve_failed;
  }
  if (status == UV_ECANCELED) return errc::cancelled;
  return errc_from_errno(status);
}

errc from_decoder(frame_status s) noexcept {
  switch (s) {
    case frame_status::bad_hash:
      return errc::bad_hash;
    case frame_status::oversize:
      return errc::oversize;
    case frame_status::bad_varint:
      return errc::bad_varint;
    default:
      return errc::protocol_error;
  }
}

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

}  // namespace

struct stream_channel::impl {
  uv_loop_t* loop;
  stream_config cfg;
  stream_callbacks cb;
  errc cfg_error;
  size_t merge_cap;
  size_t low_bytes;    // on_writable fires at or below these
  size_t low_packets;  //
  bool closed = false;
  bool owner_gone = false;
  int handles = 0;  // libuv handles/requests of the channel itself and of its listeners

  uv_check_t check{};
  uv_idle_t idle{};
  bool idle_on = false;
  uv_timer_t sweep{};  // closes connections stalled mid-frame (partial_frame_timeout_ms)

  conn_impl* conns = nullptr;
  listener_impl* listeners = nullptr;
  conn_impl* dirty_head = nullptr;

  stream_channel_metrics retired;  // totals of connections already released, and event counts

  impl(uv_loop_t* l, const stream_config& c, const stream_callbacks& cbs)
      : loop(l), cfg(c), cb(cbs), cfg_error(validate(c)) {
    merge_cap =
        std::max({kMinMergeBuffer, cfg.message_limit + kFrameMaxHeader, cfg.merge_threshold});
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

  // One pass over the connections, not a timer per connection: an idle connection costs nothing,
  // and a half-frame stalled for partial_frame_timeout_ms is closed with errc::timeout.
  void sweep_partial_frames() {
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

  // ------------------------------------------------------------------ bookkeeping --
  void link(conn_impl* c) {
    c->next = conns;
    if (conns != nullptr) conns->prev = c;
    conns = c;
    ++retired.connections_open;
  }
  void unlink(conn_impl* c) {
    if (c->prev != nullptr) c->prev->next = c->next;
    if (c->next != nullptr) c->next->prev = c->prev;
    if (conns == c) conns = c->next;
    --retired.connections_open;
  }
  void link(listener_impl* l) {
    l->next = listeners;
    if (listeners != nullptr) listeners->prev = l;
    listeners = l;
    ++retired.listeners_open;
  }
  void unlink(listener_impl* l) {
    if (l->prev != nullptr) l->prev->next = l->next;
    if (l->next != nullptr) l->next->prev = l->prev;
    if (listeners == l) listeners = l->next;
    l->prev = l->next = nullptr;
    --retired.listeners_open;
  }

  void handle_released() {
    if (--handles == 0 && owner_gone && conns == nullptr) delete this;
  }
  void maybe_delete() {
    if (owner_gone && handles == 0 && conns == nullptr) delete this;
  }

  conn_impl* new_conn(bool outbound, void* user) {
    auto* c = new (std::nothrow) conn_impl(this);
    if (c == nullptr) return nullptr;
    c->set_id(g_next_id.fetch_add(1, std::memory_order_relaxed));
    c->set_user(user);
    c->set_outbound(outbound);
    c->decoder = frame_decoder(cfg.message_limit);
    link(c);
    return c;
  }

  // ------------------------------------------------------------------ flush list --
  void mark_dirty(conn_impl* c) {
    if (c->dirty) return;
    c->dirty = true;
    c->dirty_next = dirty_head;
    dirty_head = c;
    if (!idle_on) {
      idle_on = true;
      // An active idle handle makes the loop poll without blocking, so a send() made anywhere
      // (a timer, another check callback, outside uv_run) is flushed before the loop sleeps.
      uv_idle_start(&idle, [](uv_idle_t* h) { static_cast<impl*>(h->data)->flush_dirty(); });
    }
  }

  void flush_dirty() {
    // Connections re-marked during this pass (budget exhausted, or sent to from a callback) go on
    // a fresh list and are handled on the next pass.
    conn_impl* c = dirty_head;
    dirty_head = nullptr;
    while (c != nullptr) {
      conn_impl* next = c->dirty_next;
      c->dirty = false;
      c->dirty_next = nullptr;
      flush(c);
      c = next;
    }
    if (dirty_head == nullptr && idle_on) {
      idle_on = false;
      uv_idle_stop(&idle);
    }
  }

  // ------------------------------------------------------------------ write path --
  // Called with the block still queued (in dynamic mode popping frees it).
  void count_sent(conn_impl* c, const write_queue::block& b) {
    auto& m = c->m();
    ++m.packets_sent;
    m.bytes_sent += b.size - frame_header_size_of(b);
  }

  // Payload size of a queued frame: its header holds the varint length after the 4-byte hash.
  static size_t frame_header_size_of(const write_queue::block& b) {
    // Fast paths for payloads below 128 and 16384 bytes (one or two varint bytes).
    if (b.data[kFrameHashBytes] < 0x80) return kFrameHashBytes + 1;
    if (b.data[kFrameHashBytes + 1] < 0x80) return kFrameHashBytes + 2;
    uint64_t len = 0;
    size_t vn = 0;
    (void)varint_decode(b.data + kFrameHashBytes, b.size - kFrameHashBytes, &len, &vn);
    return kFrameHashBytes + vn;
  }

  void sync_queue_metrics(conn_impl* c) {
    auto& m = c->m();
    m.queue_bytes = c->queue->bytes();
    m.queue_packets = c->queue->size();
  }

  // Pops the blocks wholly covered by `written` bytes (reporting each delivered) and returns the
  // bytes of the next block already written.
  size_t consume(conn_impl* c, size_t written) {
    write_queue& q = *c->queue;
    while (!q.empty()) {
      const write_queue::block b = q.front();
      if (written < b.size) break;
      written -= b.size;
      count_sent(c, b);
      const uint64_t tag = b.tag;
      q.pop_front();
      if (cfg.report_written && cb.on_written != nullptr) {
        cb.on_written(cb.ctx, c, tag, errc::ok);
        if (!c->active()) return 0;  // the callback ended the connection
      }
    }
    sync_queue_metrics(c);
    return written;
  }

  void pop_merged(conn_impl* c, const uint8_t* frames, size_t len, size_t count) {
    write_queue& q = *c->queue;
    for (size_t i = 0; i < count; ++i) q.pop_front();
    size_t header_bytes = 0;
    for (size_t pos = 0; pos < len;) {
      uint64_t plen = 0;
      size_t vn = 0;
      const uint8_t* v = frames + pos + kFrameHashBytes;
      if (v[0] < 0x80) {
        plen = v[0];
        vn = 1;
      } else if (v[1] < 0x80) {
        plen = (uint64_t{v[0]} & 0x7f) << 7 | v[1];
        vn = 2;
      } else {
        (void)varint_decode(v, len - pos - kFrameHashBytes, &plen, &vn);
      }
      header_bytes += kFrameHashBytes + vn;
      pos += kFrameHashBytes + vn + static_cast<size_t>(plen);
    }
    auto& m = c->m();
    m.packets_sent += count;
    m.packets_merged += count;
    m.bytes_sent += len - header_bytes;
    sync_queue_metrics(c);
  }

  void maybe_writable(conn_impl* c) {
    if (!c->want_writable || c->queue->bytes() > low_bytes || c->queue->size() > low_packets) {
      return;
    }
    c->want_writable = false;
    if (cb.on_writable != nullptr) cb.on_writable(cb.ctx, c);
  }

  void flush(conn_impl* c) {
    if (!c->active() || c->writing || c->shutting_down || !c->queue || c->prepared != nullptr) {
      if (c->active() && !c->writing && c->state == conn_state::draining) maybe_shutdown(c);
      return;
    }
    write_queue& q = *c->queue;
    size_t budget = kFlushBudget;
    while (!q.empty()) {
      if (budget == 0) {
        mark_dirty(c);
        return;
      }
      const write_queue::block front = q.front();
      uv_buf_t bufs[kMaxGather];
      unsigned nbufs = 1;
      size_t merged = 0;
      if (cfg.merge_threshold == 0 || q.size() == 1) {
        bufs[0] =
            uv_buf_init(reinterpret_cast<char*>(front.data), static_cast<unsigned>(front.size));
      } else {
        uint8_t* mb = merge_buffer(merge_cap);
        if (mb == nullptr) {
          end_conn(c, errc::no_memory);
          return;
        }
        if (front.size < cfg.merge_threshold) {
          const size_t n = q.merge_front(mb, merge_cap, cfg.merge_threshold, &merged);
          bufs[0] = uv_buf_init(reinterpret_cast<char*>(mb), static_cast<unsigned>(n));
        } else {
          nbufs = gather(q, mb, bufs, &merged);
        }
      }
      size_t len = 0;
      for (unsigned i = 0; i < nbufs; ++i) len += bufs[i].len;
      ++c->m().write_calls;
      int w = uv_try_write(c->stream(), bufs, nbufs);
      if (w == UV_EAGAIN) {
        w = 0;
      } else if (w < 0) {
        ++c->m().io_errors;
        end_conn(c, from_uv(w));
        return;
      }
      budget -= std::min(budget, static_cast<size_t>(w));
      if (nbufs == 1 && merged > 1 && static_cast<size_t>(w) == len &&
          !(cfg.report_written && cb.on_written != nullptr)) {
        // The whole merged batch went out and nobody wants per-packet reports: pop the blocks
        // without looking at them again; the payload bytes come from the frames just written.
        pop_merged(c, reinterpret_cast<const uint8_t*>(bufs[0].base), len, merged);
        maybe_writable(c);
        if (!c->active()) return;
        continue;
      }
      if (merged > 1 && static_cast<size_t>(w) == len) c->m().packets_merged += merged;
      const size_t rest = consume(c, static_cast<size_t>(w));
      if (!c->active()) return;
      if (static_cast<size_t>(w) < len) {
        // The socket is full: send the rest of the front block from the queue and wait.
        start_write(c, rest);
        return;
      }
      maybe_writable(c);
      if (!c->active()) return;
    }
    if (c->state == conn_state::draining) maybe_shutdown(c);
  }

  // A large frame at the front: it and the frames behind it go out in one writev(), large ones
  // straight from their queue blocks, small ones copied into the merge buffer (fewer system calls
  // than one write per large frame, and still no second copy of a large frame).
  size_t gather(const write_queue& q, uint8_t* mb, uv_buf_t* bufs, size_t* merged) {
    write_queue::block blocks[kMaxGather];
    size_t n = 0;
    q.for_each_front(std::min(q.size(), kMaxGather),
                     [&](const write_queue::block& b) { blocks[n++] = b; });
    size_t nb = 0, used = 0, total = 0, small = 0;
    bool last_merged = false;
    for (size_t i = 0; i < n; ++i) {
      const write_queue::block& b = blocks[i];
      if (i > 0 && total + b.size > kGatherBytes) break;
      if (b.size < cfg.merge_threshold) {
        if (used + b.size > merge_cap) break;
        std::memcpy(mb + used, b.data, b.size);
        if (last_merged) {
          bufs[nb - 1].len += static_cast<unsigned>(b.size);
        } else {
          bufs[nb++] =
              uv_buf_init(reinterpret_cast<char*>(mb + used), static_cast<unsigned>(b.size));
        }
        used += b.size;
        ++small;
        last_merged = true;
      } else {
        bufs[nb++] = uv_buf_init(reinterpret_cast<char*>(b.data), static_cast<unsigned>(b.size));
        last_merged = false;
      }
      total += b.size;
    }
    *merged = small;
    return nb;
  }

  void start_write(conn_impl* c, size_t offset) {
    const write_queue::block front = c->queue->front();
    uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(front.data + offset),
                               static_cast<unsigned>(front.size - offset));
    ++c->m().write_calls;
    c->wreq.data = c;
    const int r = uv_write(&c->wreq, c->stream(), &buf, 1, [](uv_write_t* req, int status) {
      auto* cc = static_cast<conn_impl*>(req->data);
      cc->ch->on_write_done(cc, status);
    });
    if (r != 0) {
      ++c->m().io_errors;
      end_conn(c, from_uv(r));
      return;
    }
    c->writing = true;
  }

  void on_write_done(conn_impl* c, int status) {
    c->writing = false;
    // A closing connection's queued packets (this one included) are reported by its close path.
    if (!c->active()) return;
    if (status < 0) {
      ++c->m().io_errors;
      end_conn(c, from_uv(status));
      return;
    }
    const write_queue::block front = c->queue->front();
    (void)consume(c, front.size);
    if (!c->active()) return;
    maybe_writable(c);
    if (!c->active()) return;
    flush(c);
  }

  void maybe_shutdown(conn_impl* c) {
    if (c->shutting_down || c->writing || (c->queue && !c->queue->empty())) return;
    c->shutting_down = true;
    c->sreq.data = c;
    const int r = uv_shutdown(&c->sreq, c->stream(), [](uv_shutdown_t* req, int status) {
      auto* cc = static_cast<conn_impl*>(req->data);
      if (cc->state == conn_state::closing) return;
      cc->ch->end_conn(cc, status == 0 ? errc::ok : from_uv(status));
    });
    if (r != 0) end_conn(c, from_uv(r));
  }

  // Checks a send of `total` payload bytes and reserves its frame in c's queue.
  uint8_t* reserve_frame(conn_impl* c, size_t total, uint64_t tag, errc* err) {
    if (closed) {
      *err = errc::closed;
      return nullptr;
    }
    if (c->state != conn_state::connected) {
      *err = c->state == conn_state::resolving || c->state == conn_state::connecting
                 ? errc::not_connected
                 : errc::closed;
      return nullptr;
    }
    if (c->prepared != nullptr) {
      *err = errc::invalid_argument;
      return nullptr;
    }
    if (total > cfg.message_limit) {
      *err = errc::message_too_large;
      return nullptr;
    }
    if (!c->queue) {
      c->queue.reset(new (std::nothrow) write_queue(cfg.queue));
      if (!c->queue) {
        *err = errc::no_memory;
        return nullptr;
      }
    }
    uint8_t* p = c->queue->reserve(frame_header_size(total) + total, tag, err);
    if (p == nullptr && *err == errc::queue_full) {
      ++c->m().send_refused;
      c->want_writable = true;
    }
    return p;
  }

  // The payload is in place after the header room: hash it once, write the header, schedule.
  void complete_frame(conn_impl* c, uint8_t* frame, size_t total) {
    const size_t hdr = frame_header_size(total);
    frame_write_header(murmur3_x86_32(frame + hdr, total, 0), total, frame);
    auto& m = c->m();
    m.queue_bytes = c->queue->bytes();
    m.queue_packets = c->queue->size();
    if (m.queue_bytes > m.queue_peak_bytes) m.queue_peak_bytes = m.queue_bytes;
    if (!c->writing) mark_dirty(c);
  }

  errc send(conn_impl* c, const const_buffer* bufs, size_t n, uint64_t tag) {
    if (c == nullptr || (n != 0 && bufs == nullptr)) return errc::invalid_argument;
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (bufs[i].data == nullptr && bufs[i].size != 0) return errc::invalid_argument;
      total += bufs[i].size;
    }
    errc err = errc::ok;
    uint8_t* p = reserve_frame(c, total, tag, &err);
    if (p == nullptr) return err;
    uint8_t* payload = p + frame_header_size(total);
    for (size_t i = 0; i < n; ++i) {
      if (bufs[i].size != 0) std::memcpy(payload, bufs[i].data, bufs[i].size);
      payload += bufs[i].size;
    }
    complete_frame(c, p, total);
    return errc::ok;
  }

  uint8_t* prepare_send(conn_impl* c, size_t size, uint64_t tag, errc* err) {
    errc e = errc::ok;
    uint8_t* p = c == nullptr ? nullptr : reserve_frame(c, size, tag, &e);
    if (c == nullptr) e = errc::invalid_argument;
    if (err != nullptr) *err = e;
    if (p == nullptr) return nullptr;
    c->prepared = p;
    c->prepared_size = size;
    return p + frame_header_size(size);
  }

  void commit_send(conn_impl* c) {
    if (c == nullptr || c->prepared == nullptr) return;
    uint8_t* p = c->prepared;
    c->prepared = nullptr;
    if (!c->active()) return;  // ended meanwhile: the close path reports the queued frame
    complete_frame(c, p, c->prepared_size);
  }

  void cancel_send(conn_impl* c) {
    if (c == nullptr || c->prepared == nullptr) return;
    c->prepared = nullptr;
    if (c->queue) {
      c->queue->unreserve_back();
      sync_queue_metrics(c);
    }
  }

  // ------------------------------------------------------------------- read path --
  static void alloc_cb(uv_handle_t* h, size_t, uv_buf_t* buf) {
    auto* c = static_cast<conn_impl*>(h->data);
    const size_t want = c->ch->cfg.read_buffer_size;
    if (tls.read_size < want) {
      tls.read.reset(new (std::nothrow) uint8_t[want]);
      tls.read_size = tls.read ? want : 0;
    }
    // A zero-length buffer makes libuv report UV_ENOBUFS, which ends the connection.
    *buf =
        uv_buf_init(reinterpret_cast<char*>(tls.read.get()), static_cast<unsigned>(tls.read_size));
  }

  static void read_cb(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
    auto* c = static_cast<conn_impl*>(s->data);
    c->ch->on_read(c, nread, buf);
  }

  void on_read(conn_impl* c, ssize_t nread, const uv_buf_t* buf) {
    if (nread == 0) return;  // EAGAIN: a normal event, never an error
    if (nread < 0) {
      if (nread != UV_EOF) ++c->m().io_errors;
      end_conn(c, from_uv(static_cast<int>(nread)));
      return;
    }
    auto& m = c->m();
    ++m.read_calls;
    c->last_read_ms = uv_now(loop);
    c->decoder.feed(buf->base, static_cast<size_t>(nread));
    for (;;) {
      const frame_decoder::result r = c->decoder.next();
      if (r.status == frame_status::payload) {
        ++m.packets_received;
        m.bytes_received += r.size;
        if (cb.on_received != nullptr) {
          cb.on_received(cb.ctx, c, r.data, r.size);
          // The callback may have ended the connection or closed the channel. A pause takes effect
          // after this chunk: its bytes live in the shared read buffer and cannot wait.
          if (!c->active()) return;
        }
        continue;
      }
      if (r.status == frame_status::need_more) return;
      ++m.decode_errors;
      end_conn(c, from_decoder(r.status));
      return;
    }
  }

  void start_reading(conn_impl* c) {
    if (c->reading || c->paused || !c->active()) return;
    const int r = uv_read_start(c->stream(), alloc_cb, read_cb);
    if (r != 0) {
      end_conn(c, from_uv(r));
      return;
    }
    c->reading = true;
  }

  // --------------------------------------------------------------------- endings --
  void end_conn(conn_impl* c, errc reason) {
    if (c->state == conn_state::closing) return;
    c->state = conn_state::closing;
    c->reason = reason;
    if (c->reading) {
      uv_read_stop(c->stream());
      c->reading = false;
    }
    if (c->gai != nullptr) uv_cancel(reinterpret_cast<uv_req_t*>(c->gai));
    close_timer(c);
    if (c->handle_open) {
      c->handle_open = false;
      uv_close(c->handle(), [](uv_handle_t* h) {
        auto* cc = static_cast<conn_impl*>(h->data);
        cc->ch->release(cc);
      });
    } else {
      // Nothing is open right now (resolving, or between two dns addresses): the pending request
      // or handle close finishes the job; otherwise finish from the loop, not inside this call.
      if (c->pending == 0) {
        ++c->pending;
        auto* t = new (std::nothrow) uv_timer_t;
        if (t != nullptr) {
          uv_timer_init(loop, t);
          t->data = c;
          uv_timer_start(
              t,
              [](uv_timer_t* tt) {
                uv_close(reinterpret_cast<uv_handle_t*>(tt), [](uv_handle_t* h) {
                  auto* cc = static_cast<conn_impl*>(h->data);
                  delete reinterpret_cast<uv_timer_t*>(h);
                  cc->ch->release(cc);
                });
              },
              0, 0);
        } else {
          release(c);
        }
      }
    }
  }

  void close_timer(conn_impl* c) {
    if (c->timer == nullptr) return;
    uv_close(reinterpret_cast<uv_handle_t*>(c->timer), [](uv_handle_t* h) {
      auto* cc = static_cast<conn_impl*>(h->data);
      delete reinterpret_cast<uv_timer_t*>(h);
      cc->ch->release(cc);
    });
    c->timer = nullptr;
  }

  // One libuv object referring to c is gone; the last one finishes the connection.
  void release(conn_impl* c) {
    if (--c->pending > 0) return;
    report_final(c);
    if (c->ai_list != nullptr) uv_freeaddrinfo(c->ai_list);
    c->ai_list = c->ai_next = nullptr;
    add_totals(retired.totals, c->metrics(), false);
    if (c->dirty) remove_dirty(c);
    unlink(c);
    delete c;
    maybe_delete();
  }

  void remove_dirty(conn_impl* c) {
    conn_impl** pp = &dirty_head;
    while (*pp != nullptr && *pp != c) pp = &(*pp)->dirty_next;
    if (*pp == c) *pp = c->dirty_next;
    c->dirty = false;
  }

  // Every queued packet failed, then the final callback. Runs once per connection.
  void report_final(conn_impl* c) {
    if (c->reported) return;
    c->reported = true;
    const errc reason = c->reason;
    if (c->queue) {
      write_queue& q = *c->queue;
      while (!q.empty()) {
        const write_queue::block b = q.front();
        q.pop_front();
        ++c->m().send_failed;
        if (cb.on_written != nullptr) cb.on_written(cb.ctx, c, b.tag, reason);
      }
      sync_queue_metrics(c);
    }
    c->want_writable = false;
    if (c->connected_once) {
      ++retired.connections_closed;
      if (cb.on_disconnected != nullptr) cb.on_disconnected(cb.ctx, c, reason);
    } else if (c->outbound()) {
      ++retired.connect_failed;
      if (cb.on_connected != nullptr) cb.on_connected(cb.ctx, c, reason);
    }
  }

  // ------------------------------------------------------------------- connecting --
  void on_connected(conn_impl* c) {
    close_timer(c);
    if (c->ai_list != nullptr) {
      uv_freeaddrinfo(c->ai_list);
      c->ai_list = c->ai_next = nullptr;
    }
    if (!c->is_unix) apply_tcp_options(c);
    c->state = conn_state::connected;
    c->connected_once = true;
    ++retired.connections_connected;
    start_reading(c);
    if (cb.on_connected != nullptr && c->active()) cb.on_connected(cb.ctx, c, errc::ok);
  }

  void apply_tcp_options(conn_impl* c) {
    uv_tcp_nodelay(&c->h.tcp, cfg.tcp_nodelay ? 1 : 0);
    if (cfg.tcp_keepalive) uv_tcp_keepalive(&c->h.tcp, 1, cfg.keepalive_delay_s);
  }

  static void connect_cb(uv_connect_t* req, int status) {
    auto* c = static_cast<conn_impl*>(req->data);
    impl* self = c->ch;
    if (c->state == conn_state::closing) return;  // cancelled: the close path reports
    if (status == 0) {
      self->on_connected(c);
      return;
    }
    const errc e = from_uv(status);
    if (c->ai_next != nullptr) {
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
      return;
    }
    self->end_conn(c, e);
  }

  errc start_tcp_connect(conn_impl* c, const sockaddr* sa) {
    int r = uv_tcp_init(loop, &c->h.tcp);
    if (r != 0) return from_uv(r);
    c->h.handle.data = c;
    c->handle_open = true;
    ++c->pending;
    c->creq.data = c;
    r = uv_tcp_connect(&c->creq, &c->h.tcp, sa, connect_cb);
    return r == 0 ? errc::ok : from_uv(r);
  }

  void try_next_address(conn_impl* c) {
    while (c->ai_next != nullptr) {
      addrinfo* ai = c->ai_next;
      c->ai_next = ai->ai_next;
      if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
      const errc e = start_tcp_connect(c, ai->ai_addr);
      if (e == errc::ok) {
        c->state = conn_state::connecting;
        return;
      }
      c->reason = e;
      if (c->handle_open) {
        // Failed synchronously on this handle: close it and go on from its close callback.
        connect_cb(&c->creq, e == errc::connection_refused ? UV_ECONNREFUSED : UV_EINVAL);
        return;
      }
    }
    end_conn(c, c->reason == errc::ok ? errc::resolve_failed : c->reason);
  }

  static void resolved_cb(uv_getaddrinfo_t* req, int status, addrinfo* res) {
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
    c->ai_list = c->ai_next = res;
    c->reason = errc::resolve_failed;
    self->try_next_address(c);
  }

  void start_connect_timer(conn_impl* c) {
    if (cfg.connect_timeout_ms == 0) return;
    auto* t = new (std::nothrow) uv_timer_t;
    if (t == nullptr) return;  // no timeout then: the kernel's applies
    uv_timer_init(loop, t);
    t->data = c;
    c->timer = t;
    ++c->pending;
    uv_timer_start(
        t,
        [](uv_timer_t* tt) {
          auto* cc = static_cast<conn_impl*>(tt->data);
          cc->ch->end_conn(cc, errc::timeout);
        },
        cfg.connect_timeout_ms, 0);
  }

  errc connect(std::string_view url, stream_connection** out, void* user) {
    if (closed) return errc::closed;
    if (cfg_error != errc::ok) return cfg_error;
    address a;
    const errc pe = parse_address(url, &a);
    if (pe != errc::ok) return pe;
    if (!a.is_stream()) return errc::unsupported_scheme;
    if (a.kind != scheme::unix_socket && a.port == 0) return errc::bad_url;
    conn_impl* c = new_conn(true, user);
    if (c == nullptr) return errc::no_memory;
    c->set_peer_url(std::string(url));
    errc e = errc::ok;
    if (a.kind == scheme::unix_socket) {
      c->is_unix = true;
      c->state = conn_state::connecting;
      int r = uv_pipe_init(loop, &c->h.pipe, 0);
      if (r != 0) {
        e = from_uv(r);
      } else {
        c->h.handle.data = c;
        c->handle_open = true;
        ++c->pending;
        c->creq.data = c;
        uv_pipe_connect(&c->creq, &c->h.pipe, a.host.c_str(), connect_cb);
      }
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
          e = from_uv(r);
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
        e = start_tcp_connect(c, reinterpret_cast<sockaddr*>(&ss));
      }
    }
    if (e != errc::ok) {
      // No callback for this connection: drop it silently once libuv lets go of it.
      c->reported = true;
      end_conn(c, e);
      return e;
    }
    start_connect_timer(c);
    if (out != nullptr) *out = c;
    return errc::ok;
  }

  // -------------------------------------------------------------------- listening --
  static void connection_cb(uv_stream_t* server, int status) {
    auto* l = static_cast<listener_impl*>(server->data);
    l->ch->on_incoming(l, status);
  }

  void on_incoming(listener_impl* l, int status) {
    if (status < 0 || closed) return;  // e.g. EMFILE: the next accept may succeed
    conn_impl* c = new_conn(false, nullptr);
    if (c == nullptr) return;
    c->is_unix = l->is_unix;
    c->set_listener(l);
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
      c->set_peer_url(l->url());
    } else {
      apply_tcp_options(c);
      sockaddr_storage ss{};
      int len = sizeof ss;
      if (uv_tcp_getpeername(&c->h.tcp, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        c->set_peer_url(sockaddr_url(reinterpret_cast<sockaddr*>(&ss)));
      }
    }
    if (cfg.max_connections != 0 && retired.connections_open > cfg.max_connections) {
      // Accepted only to take it off the backlog: over the cap, it is closed unannounced.
      ++retired.connections_rejected;
      c->reported = true;
      end_conn(c, errc::busy);
      return;
    }
    c->state = conn_state::connected;
    c->connected_once = true;
    c->last_read_ms = uv_now(loop);
    ++retired.connections_accepted;
    start_reading(c);
    if (cb.on_accepted != nullptr && c->active()) cb.on_accepted(cb.ctx, c);
  }

  static uv_stream_t* server_of(listener_impl* l) { return &l->h.stream; }

  errc listen_unix(listener_impl* l, const std::string& path) {
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) return errc::invalid_argument;
    struct stat st {};
    if (lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) return errc::already_exists;
      // A socket file: replace it only if nobody listens on it any more.
      const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return errc_from_errno(-errno);
      sockaddr_un sun{};
      sun.sun_family = AF_UNIX;
      std::memcpy(sun.sun_path, path.c_str(), path.size() + 1);
      const int r = ::connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof sun);
      const int err = r == 0 ? 0 : errno;
      ::close(fd);
      if (r == 0 || err == EAGAIN || err == EINPROGRESS) return errc::address_in_use;
      if (err != ECONNREFUSED) return errc_from_errno(-err);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errc_from_errno(-errno);
    }
    int r = uv_pipe_init(loop, &l->h.pipe, 0);
    if (r != 0) return from_uv(r);
    l->h.handle.data = l;
    ++handles;
    l->is_unix = true;
    r = uv_pipe_bind(&l->h.pipe, path.c_str());
    if (r != 0) return from_uv(r);
    l->unix_path = path;
    if (stat(path.c_str(), &st) == 0) {
      l->unix_dev = st.st_dev;
      l->unix_ino = st.st_ino;
    }
    // Before listen(): nobody can connect yet, so there is no window with the default mode.
    if (chmod(path.c_str(), static_cast<mode_t>(cfg.unix_socket_mode)) != 0) {
      return errc_from_errno(-errno);
    }
    r = uv_listen(&l->h.stream, cfg.backlog, connection_cb);
    if (r != 0) return from_uv(r);
    l->set_url("unix://" + path, 0);
    return errc::ok;
  }

  errc listen_tcp(listener_impl* l, const sockaddr* sa) {
    int r = uv_tcp_init(loop, &l->h.tcp);
    if (r != 0) return from_uv(r);
    l->h.handle.data = l;
    ++handles;
    r = uv_tcp_bind(&l->h.tcp, sa, sa->sa_family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
    if (r != 0) return from_uv(r);
    r = uv_listen(&l->h.stream, cfg.backlog, connection_cb);
    if (r != 0) return from_uv(r);
    sockaddr_storage ss{};
    int len = sizeof ss;
    r = uv_tcp_getsockname(&l->h.tcp, reinterpret_cast<sockaddr*>(&ss), &len);
    if (r != 0) return from_uv(r);
    l->set_url(sockaddr_url(reinterpret_cast<sockaddr*>(&ss)),
               sockaddr_port(reinterpret_cast<sockaddr*>(&ss)));
    return errc::ok;
  }

  errc listen(std::string_view url, stream_listener** out, void* user) {
    if (closed) return errc::closed;
    if (cfg_error != errc::ok) return cfg_error;
    address a;
    const errc pe = parse_address(url, &a);
    if (pe != errc::ok) return pe;
    if (!a.is_stream()) return errc::unsupported_scheme;
    auto* l = new (std::nothrow) listener_impl(this);
    if (l == nullptr) return errc::no_memory;
    l->set_user(user);
    const int handles_before = handles;
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
      return e;
    }
    link(l);
    if (out != nullptr) *out = l;
    return errc::ok;
  }

  // Removes the socket file only if it is still the one this listener created (another process
  // may have replaced a file it thought stale).
  static void remove_socket_file(listener_impl* l) {
    struct stat st {};
    if (lstat(l->unix_path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == l->unix_dev &&
        static_cast<uint64_t>(st.st_ino) == l->unix_ino) {
      ::unlink(l->unix_path.c_str());
    }
    l->unix_path.clear();
  }

  errc close_listener(listener_impl* l) {
    if (l == nullptr) return errc::invalid_argument;
    if (l->closing) return errc::closed;
    l->closing = true;
    if (l->is_unix) remove_socket_file(l);
    unlink(l);
    uv_close(&l->h.handle, [](uv_handle_t* h) {
      auto* ll = static_cast<listener_impl*>(h->data);
      impl* self = ll->ch;
      delete ll;
      self->handle_released();
    });
    return errc::ok;
  }

  // ------------------------------------------------------------------------ close --
  void close_all(bool with_callbacks) {
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

  [[nodiscard]] stream_channel_metrics metrics() const {
    stream_channel_metrics m = retired;
    for (const conn_impl* c = conns; c != nullptr; c = c->next) {
      add_totals(m.totals, c->metrics(), true);
    }
    return m;
  }
};

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
