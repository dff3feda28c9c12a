// Stream connections: the coalescing write path and connection endings (the read path:
// stream_read.cpp).
//
// Write path. send() copies the payload into a frame in the connection's write_queue, writes its
// length and puts the connection on the channel's flush list. Checksums are written in batches
// (seal_frames: murmur3_x86_32_batch) once 16 frames wait, while they are still in the cache, and
// for the rest before a flush reads the queue; a frame under the active kernel's batch threshold
// (256 B scalar, 24 B AVX2) sent when none waits is hashed at once. The list is flushed before the
// loop next blocks (uv_check right after the I/O phase, and an idle handle that keeps the poll from
// blocking while the list is non-empty), so every packet sent during one loop iteration leaves in
// as few system calls as possible.
//
// A flush takes the queue's front: when it is small (below merge_threshold) as many small frames as
// fit are copied into the thread's merge buffer and written with one uv_try_write(); a large frame
// is written straight from its queue block. uv_try_write() is synchronous, so the merge buffer is
// free again when it returns and one buffer can serve every connection of the thread. Blocks are
// popped only once all their bytes are in the kernel. When the socket takes only part of the batch
// (or nothing: EAGAIN), the rest of the block at the cut is handed to uv_write() straight from the
// queue block (a ring that grows meanwhile keeps the old memory until the write completes) and
// the connection waits for that write —
// the "one write in flight" state; the blocks after it stay queued and are merged again when it
// completes. Nothing is allocated per packet: the queue is a ring that starts small and doubles up
// to its configured size (a few times per connection, on its first sends, not per packet), or a
// block per packet in dynamic mode, by the user's choice; the merge buffer is per thread, requests
// are per connection.
//
// Endings. end_conn() stops everything and calls uv_close(); the final reports (every queued packet
// failed, then on_disconnected or on_connected(error)) fire from the close callback, so they never
// run inside a user's call to disconnect(). close() of the channel reports synchronously instead.
#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

#include "core/endian.h"
#include "core/murmur3.h"
#include "core/murmur3_batch.h"
#include "stream/stream_impl.h"
#include "stream/tls_session.h"

namespace uvbus {

namespace {

// The per-thread merge buffer, shared by every channel and connection of the thread. Only touched
// from inside one libuv callback at a time (single-threaded loop), and never referenced after the
// call that used it returns (merged writes are synchronous).
struct thread_buffers {
  std::unique_ptr<uint8_t[]> merge;
  size_t merge_size = 0;
};
thread_local thread_buffers tls;

uint8_t* merge_buffer(size_t want) {
  if (tls.merge_size < want) {
    tls.merge.reset(new (std::nothrow) uint8_t[want]);
    tls.merge_size = tls.merge ? want : 0;
  }
  return tls.merge.get();
}

}  // namespace

void stream_channel::impl::mark_dirty(conn_impl* c) {
  if (c->dirty) return;
  c->dirty = true;
  c->dirty_next = dirty_head;
  dirty_head = c;
  start_idle();
}

void stream_channel::impl::start_idle() {
  if (idle_on) return;
  idle_on = true;
  // An active idle handle makes the loop poll without blocking, so a send() made anywhere
  // (a timer, another check callback, outside uv_run) is flushed before the loop sleeps.
  uv_idle_start(&idle, [](uv_idle_t* h) { static_cast<impl*>(h->data)->flush_dirty(); });
}

void stream_channel::impl::flush_dirty() {
  if (!deferred_logs.empty()) {
    log_deferred();
    if (closed) return;
  }
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
  if (dirty_head == nullptr && deferred_logs.empty() && idle_on) {
    idle_on = false;
    uv_idle_stop(&idle);
  }
}

// Called with the block still queued (in dynamic mode popping frees it).
void stream_channel::impl::count_sent(conn_impl* c, const write_queue::block& b) {
  auto& m = c->m();
  ++m.packets_sent;
  m.bytes_sent += b.tag;  // the payload size (reserve_frame)
}

// Before the queue shrinks: it only grows in between, so its peak is seen here or when read.
void stream_channel::impl::note_queue_peak(conn_impl* c) {
  auto& m = c->m();
  m.queue_peak_bytes = std::max(m.queue_peak_bytes, c->queue->bytes());
}

// The stored metrics hold no queue gauges (only the peak, from note_queue_peak): they are read from
// the queue here.
stream_connection_metrics stream_channel::impl::live_metrics(const conn_impl* c) {
  stream_connection_metrics m = c->metrics;
  if (c->queue) {
    m.queue_bytes = c->queue->bytes();
    m.queue_packets = c->queue->size();
    m.queue_peak_bytes = std::max(m.queue_peak_bytes, m.queue_bytes);
  }
  return m;
}

// Pops the blocks wholly covered by `written` bytes (advancing written_seq) and returns the bytes
// of the next block already written.
size_t stream_channel::impl::consume(conn_impl* c, size_t written) {
  write_queue& q = *c->queue;
  note_queue_peak(c);
  while (!q.empty()) {
    const write_queue::block b = q.front();
    if (written < b.size) break;
    written -= b.size;
    count_sent(c, b);
    q.pop_front();
    ++c->written_seq;
  }
  return written;
}

void stream_channel::impl::report_written(conn_impl* c) {
  if (c->written_seq == c->reported_seq || c->reported || !cb.on_written) return;
  c->reported_seq = c->written_seq;
  const detail::callback_scope scope(this);
  cb.on_written(c->id, c->reported_seq);
}

void stream_channel::impl::pop_merged(conn_impl* c, size_t len, size_t count, size_t span,
                                      uint64_t payload) {
  note_queue_peak(c);
  c->queue->pop_front_n(count, len, span);
  c->written_seq += count;
  auto& m = c->m();
  m.packets_sent += count;
  m.packets_merged += count;
  m.bytes_sent += payload;
}

void stream_channel::impl::maybe_writable(conn_impl* c) {
  if (!c->want_writable || c->queue->bytes() > low_bytes || c->queue->size() > low_packets) {
    return;
  }
  c->want_writable = false;
  if (cb.on_writable) {
    const detail::callback_scope scope(this);
    cb.on_writable(c->id);
  }
}

// Writes what the queue holds, then tells on_written (once for the whole batch).
void stream_channel::impl::flush(conn_impl* c) {
  flush_queue(c);
  report_written(c);
  c->last_flush_ms = uv_now(loop);
  // A drained queue hands its small ring back to the thread's pool (write_queue::release_storage):
  // a quiet connection keeps no send buffer.
  if (c->queue && !c->writing && c->prepared == nullptr) (void)c->queue->release_storage();
}

void stream_channel::impl::seal_frames(write_queue& q) {
  write_queue::block b[kSealBatch];
  const uint8_t* data[kSealBatch];
  size_t len[kSealBatch];
  uint32_t hash[kSealBatch];
  while (q.unsealed() != 0) {
    const size_t n = q.take_unsealed(b, kSealBatch);
    for (size_t i = 0; i < n; ++i) {  // the payload ends the frame; the tag is its size
      len[i] = static_cast<size_t>(b[i].tag);
      data[i] = b[i].data + b[i].size - len[i];
    }
    murmur3_x86_32_batch(data, len, n, 0, hash);
    for (size_t i = 0; i < n; ++i) store_le<uint32_t>(b[i].data, hash[i]);
  }
}

void stream_channel::impl::flush_queue(conn_impl* c) {
  if (!c->active() || c->writing || c->shutting_down || !c->queue || c->prepared != nullptr) {
    if (c->active() && !c->writing && c->state == conn_state::draining) maybe_shutdown(c);
    return;
  }
  write_queue& q = *c->queue;
  size_t budget = kFlushBudget;
  while (!q.empty()) {
    // TLS: the last batch's ciphertext is still going out. Or on_writable, called below, opened a
    // reservation: its frame is not complete, and commit_send() / cancel_send() flush again.
    if (c->writing || c->prepared != nullptr) return;
    // Every pass: on_writable, called below, may have queued more frames.
    seal_frames(q);
    if (budget == 0) {
      mark_dirty(c);
      return;
    }
    const write_queue::block front = q.front();
    uv_buf_t bufs[kMaxGather];
    unsigned nbufs = 1;
    size_t merged = 0;
    size_t span = 0;       // the merged blocks' room in the queue (write_queue::pop_front_n)
    uint64_t payload = 0;  // ... and their payload bytes
    if (cfg.merge_threshold == 0 || q.size() == 1) {
      bufs[0] = uv_buf_init(reinterpret_cast<char*>(front.data), static_cast<unsigned>(front.size));
    } else {
      uint8_t* mb = merge_buffer(merge_cap);
      if (mb == nullptr) {
        end_conn(c, errc::no_memory);
        return;
      }
      if (front.size < cfg.merge_threshold) {
        // Never below one frame that qualifies for merging (merge_threshold may be set large).
        const size_t window =
            c->merge_window != 0 ? std::max(c->merge_window, cfg.merge_threshold) : merge_cap;
        const size_t n = q.merge_front(mb, window, cfg.merge_threshold, &merged, &span, &payload);
        bufs[0] = uv_buf_init(reinterpret_cast<char*>(mb), static_cast<unsigned>(n));
      } else {
        nbufs = gather(q, mb, bufs, &merged);
      }
    }
    size_t len = 0;
    for (unsigned i = 0; i < nbufs; ++i) len += bufs[i].len;
    if (!c->secure) ++c->m().write_calls;  // TLS counts its socket writes in tls_send()
    int w = c->secure ? tls_write(c, bufs, nbufs) : uv_try_write(c->stream(), bufs, nbufs);
    if (c->secure && w == 0) return;  // TLS writes all or nothing: these wait for input
    if (w == UV_EAGAIN) {
      w = 0;
    } else if (w < 0) {
      // tls_write() has counted its error (a socket error in io_errors, a TLS one in tls_failed,
      // never both) and ended the connection.
      if (!c->secure) {
        ++c->m().io_errors;
        end_conn(c, from_uv(w));
      }
      return;
    }
    budget -= std::min(budget, static_cast<size_t>(w));
    if (merged > 1 && nbufs == 1) {
      c->merge_window = next_merge_window(c->merge_window, static_cast<size_t>(w), len, merge_cap);
    }
    if (nbufs == 1 && merged > 1 && static_cast<size_t>(w) == len) {
      // The whole merged batch went out: pop the blocks without looking at them again.
      pop_merged(c, len, merged, span, payload);
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
size_t stream_channel::impl::gather(const write_queue& q, uint8_t* mb, uv_buf_t* bufs,
                                    size_t* merged) {
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
        bufs[nb++] = uv_buf_init(reinterpret_cast<char*>(mb + used), static_cast<unsigned>(b.size));
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

void stream_channel::impl::start_write(conn_impl* c, size_t offset) {
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

void stream_channel::impl::on_write_done(conn_impl* c, int status) {
  if (c->secure) {
    tls_write_done(c, status);
    return;
  }
  c->writing = false;
  c->queue->release_retired();  // the write may have read a ring the queue has outgrown
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

void stream_channel::impl::maybe_shutdown(conn_impl* c) {
  if (c->shutting_down || c->writing || (c->queue && !c->queue->empty())) return;
  // TLS: close_notify waits, as writes do, for the rest of a peer's post-handshake message
  // (OpenSSL refuses SSL_shutdown until then); the read that brings it flushes again.
  if (c->secure && c->secure->writes_wait()) return;
  c->shutting_down = true;
  if (c->secure && !tls_close_notify(c)) return;  // uv_shutdown() waits for its write
  c->sreq.data = c;
  const int r = uv_shutdown(&c->sreq, c->stream(), [](uv_shutdown_t* req, int status) {
    auto* cc = static_cast<conn_impl*>(req->data);
    if (cc->state == conn_state::closing) return;
    cc->ch->end_conn(cc, status == 0 ? errc::ok : from_uv(status));
  });
  if (r != 0) end_conn(c, from_uv(r));
}

// Checks a send of `total` payload bytes and reserves its frame in c's queue. The common case (a
// connected connection with a queue, a size within the limit) stays short; the rest is
// reserve_unusual().
uint8_t* stream_channel::impl::reserve_frame(conn_impl* c, size_t total, size_t* hdr, errc* err) {
  if (closed || c->state != conn_state::connected || c->prepared != nullptr ||
      total > cfg.message_limit || !c->queue) {
    return reserve_unusual(c, total, hdr, err);
  }
  // The block's tag is the payload size: the byte counts and the batch hash read it there.
  *hdr = frame_header_size(total);
  write_queue& q = *c->queue;
  uint8_t* p = q.reserve(*hdr + total, total, err);
  // A growing ring keeps the old one for the write in flight; without one it can go now.
  if (q.has_retired() && !c->writing) q.release_retired();
  if (p == nullptr) refused(c, *err);
  return p;
}

// reserve_frame() on a closed channel or connection, during prepare_send(), beyond the size limit
// or before the connection's first send (the queue is created here).
uint8_t* stream_channel::impl::reserve_unusual(conn_impl* c, size_t total, size_t* hdr, errc* err) {
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
  if (!c->queue) c->queue.reset(new (std::nothrow) write_queue(cfg.queue));
  if (!c->queue) {
    *err = errc::no_memory;
    return nullptr;
  }
  return reserve_frame(c, total, hdr, err);
}

// queue_full asks for on_writable; no_memory (the queue's storage could not be allocated) is
// counted, but nothing follows it: a drain need not make memory available (stream.h, send()).
void stream_channel::impl::refused(conn_impl* c, errc err) {
  if (err != errc::queue_full && err != errc::no_memory) return;
  ++c->m().send_refused;
  if (err == errc::queue_full) c->want_writable = true;
}

// The payload is in place after the header room: write the header and schedule. Below
// seal_min_bytes (under 256 B with the scalar kernel, under 24 B with AVX2) a frame with no other
// frame waiting for its checksum is hashed at once; otherwise the checksum follows in a batch
// (seal_frames, called last so that the common path needs no stack frame of its own).
void stream_channel::impl::complete_frame(conn_impl* c, uint8_t* frame, size_t hdr, size_t total) {
  ++c->accepted_seq;
  write_queue& q = *c->queue;
  if (total < seal_min_bytes && q.unsealed() == 1) {
    seal_one(q, frame, hdr, total);
  } else {
    (void)frame_write_header(0, total, frame);
  }
  // The queue gauges are not touched here: a frame's read of the queue's two counters, just
  // written by the reservation, stalled every send (live_metrics reads them when asked).
  if (!c->writing && !c->dirty) mark_dirty(c);
  if (q.unsealed() >= kSealBatch) seal_frames(q);
}

void stream_channel::impl::seal_one(write_queue& q, uint8_t* frame, size_t hdr, size_t total) {
  (void)frame_write_header(murmur3_x86_32(frame + hdr, total, 0), total, frame);
  q.seal_newest();
}

errc stream_channel::impl::send(conn_impl* c, const const_buffer* bufs, size_t n, uint64_t* seq) {
  if (c == nullptr) return errc::closed;
  if (n != 0 && bufs == nullptr) return errc::invalid_argument;
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (bufs[i].data == nullptr && bufs[i].size != 0) return errc::invalid_argument;
    // A sum that wraps would pass the limit as a small message and copy the parts past it.
    if (bufs[i].size > SIZE_MAX - total) return errc::message_too_large;
    total += bufs[i].size;
  }
  errc err = errc::ok;
  size_t hdr = 0;
  uint8_t* p = reserve_frame(c, total, &hdr, &err);
  if (p == nullptr) return err;
  uint8_t* payload = p + hdr;
  for (size_t i = 0; i < n; ++i) {
    if (bufs[i].size != 0) std::memcpy(payload, bufs[i].data, bufs[i].size);
    payload += bufs[i].size;
  }
  complete_frame(c, p, hdr, total);
  if (seq != nullptr) *seq = c->accepted_seq;
  return errc::ok;
}

uint8_t* stream_channel::impl::prepare_send(conn_impl* c, size_t size, errc* err) {
  errc e = errc::ok;
  size_t hdr = 0;
  uint8_t* p = c == nullptr ? nullptr : reserve_frame(c, size, &hdr, &e);
  if (c == nullptr) e = errc::closed;
  if (err != nullptr) *err = e;
  if (p == nullptr) return nullptr;
  c->prepared = p;
  c->prepared_size = size;
  c->prepared_hdr = hdr;
  return p + hdr;
}

errc stream_channel::impl::commit_send(conn_impl* c, uint64_t* seq) {
  // No reservation: never made, cancelled, or dropped because the connection ended meanwhile.
  if (c == nullptr || c->prepared == nullptr) return errc::closed;
  if (c->state != conn_state::connected) {  // disconnected meanwhile: not a packet, not reported
    cancel_send(c);
    return errc::closed;
  }
  uint8_t* p = c->prepared;
  c->prepared = nullptr;
  complete_frame(c, p, c->prepared_hdr, c->prepared_size);
  if (seq != nullptr) *seq = c->accepted_seq;
  return errc::ok;
}

void stream_channel::impl::cancel_send(conn_impl* c) {
  if (c == nullptr || c->prepared == nullptr) return;
  c->prepared = nullptr;
  if (c->queue) c->queue->unreserve_back();
  // The frames queued before the reservation waited for it (flush_queue), as does a drain.
  if (c->active()) mark_dirty(c);
}

void stream_channel::impl::end_conn(conn_impl* c, errc reason) {
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

void stream_channel::impl::close_timer(conn_impl* c) {
  if (c->timer == nullptr) return;
  uv_close(reinterpret_cast<uv_handle_t*>(c->timer), [](uv_handle_t* h) {
    auto* cc = static_cast<conn_impl*>(h->data);
    delete reinterpret_cast<uv_timer_t*>(h);
    cc->ch->release(cc);
  });
  c->timer = nullptr;
}

// One libuv object referring to c is gone; the last one finishes the connection.
void stream_channel::impl::release(conn_impl* c) {
  if (--c->pending > 0) return;
  report_final(c);
  add_totals(retired.totals, c->metrics, false);
  forget_unregistered(c);
  if (c->dirty) remove_dirty(c);
  unlink(c);
  delete c;
  maybe_delete();
}

void stream_channel::impl::remove_dirty(conn_impl* c) {
  conn_impl** pp = &dirty_head;
  while (*pp != nullptr && *pp != c) pp = &(*pp)->dirty_next;
  if (*pp == c) *pp = c->dirty_next;
  c->dirty = false;
}

// on_unsent for every packet still queued, oldest first: a block's tag is its payload size, the
// payload ends the block. Sends on c fail meanwhile (it is closing or the channel closed), so the
// queue does not change under the walk.
void stream_channel::impl::hand_back_unsent(conn_impl* c) {
  const detail::callback_scope scope(this);
  const connection_id id = c->id;
  c->queue->for_each_front(c->queue->size(), [&](const write_queue::block& b) {
    const auto n = static_cast<size_t>(b.tag);
    if (cb.on_unsent) cb.on_unsent(id, b.data + (b.size - n), n);
  });
}

// Pending on_written, then every queued packet failed (one range), then the final callback. Runs
// once per connection.
void stream_channel::impl::report_final(conn_impl* c) {
  if (c->reported) return;
  report_written(c);
  // on_written may have called close(), which reported this connection in full (close_all).
  if (c->reported) return;
  c->reported = true;
  const errc reason = c->reason;
  log_end(c, reason);
  if (c->queue) {
    write_queue& q = *c->queue;
    if (c->prepared != nullptr) {  // a reservation is not a packet: drop it unreported
      q.unreserve_back();
      c->prepared = nullptr;
    }
    const uint64_t failed = q.size();
    if (failed != 0 && cb.on_unsent) hand_back_unsent(c);
    note_queue_peak(c);
    while (!q.empty()) q.pop_front();
    if (failed != 0) {
      c->m().send_failed += failed;
      const uint64_t first = c->written_seq + 1;
      c->written_seq = c->accepted_seq;
      if (cb.on_send_failed) {
        const detail::callback_scope scope(this);
        cb.on_send_failed(c->id, first, c->accepted_seq,
                          reason == errc::ok ? errc::closed : reason);
      }
    }
  }
  c->want_writable = false;
  const detail::callback_scope scope(this);
  if (c->connected_once) {
    ++retired.connections_closed;
    if (cb.on_disconnected) cb.on_disconnected(c->id, reason);
  } else if (c->outbound) {
    ++retired.connect_failed;
    if (cb.on_connected) cb.on_connected(c->id, reason);
  }
}

}  // namespace uvbus
