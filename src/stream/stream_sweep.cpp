// The stream channel's sweep: one timer that frees idle grown send rings and closes connections
// stalled mid-frame, looking at every connection once a period, in slices when they are many.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "stream/stream_impl.h"
#include "stream/test_access.h"
#include "stream/tls_session.h"

namespace uvbus {

// A pass over the connections, not a timer per connection: an idle connection costs nothing but
// its turn. The pass is cut into slices once the connections are many: looking at one costs a
// few cache misses (about 70 ns a connection measured with 19 000 of them), and the whole list at
// once stalled the loop for 1.3 ms every 2.5 s with 19 000 connections, which is 70 ms or more
// with a million. Beyond sweep_slice (kSweepSlice) connections a firing looks at a share of them,
// from where the last one stopped, and the next firing comes sooner (never sooner than
// kSweepMinMs), so that every connection still has its turn once per sweep_period_ms
// (plan_sweep()).
void stream_channel::impl::sweep() {
  const uint64_t now = uv_now(loop);
  const size_t n = conns.size();
  const detail::sweep_plan plan = detail::plan_sweep(n, sweep_slice, sweep_period_ms);
  if (plan.share >= n) sweep_next = nullptr;  // one firing for all of them, from the front
  conn_impl* c = sweep_next != nullptr ? sweep_next : conns.front();
  size_t looked = 0;
  // end_conn() only marks the connection and closes its handle; it stays linked until the close
  // callback (which moves sweep_next past it, unlink()), so its next pointer is still valid.
  for (; c != nullptr && looked < plan.share; ++looked) {
    conn_impl* next = detail::conn_list::next(c);
    sweep_one(c, now);
    c = next;
  }
  sweep_next = c;  // nullptr at the end: the next firing starts a new pass
  sweep_largest_slice = std::max(sweep_largest_slice, looked);
  ++sweep_firings;
  if (!closed) uv_timer_start(&sweep_timer, on_sweep, plan.delay_ms, 0);
}

// A connection's turn: its idle grown ring (and TLS buffers) freed, its stalled half-frame closed.
// Only a connection that is reading counts as stalled: one the owner paused (a bus node holding an
// upstream link back for a slow next hop) waits by the owner's choice, and its clock restarts at
// resume_reading(). A draining one delivers no more (its half frame is gone), but a TLS link's
// session still reads: part of a record or of a post-handshake message held there (its close_notify
// waits for the rest) counts as for a connected one. A send ring that grew and has been empty, with
// no write in flight and no reservation open, since a flush send_ring_idle_ms ago is freed, and so
// are a TLS link's ciphertext buffers (a batch's ciphertext each, kept while traffic flows).
void stream_channel::impl::sweep_one(conn_impl* c, uint64_t now) {
  if (cfg.send_ring_idle_ms != 0 && !c->writing && c->prepared == nullptr &&
      now - c->last_flush_ms >= cfg.send_ring_idle_ms) {
    if (c->queue) (void)c->queue->release_storage(true);
    if (c->secure) c->secure->release_buffers();  // only the empty ones
  }
  if (cfg.partial_frame_timeout_ms == 0 || now - c->last_read_ms < cfg.partial_frame_timeout_ms) {
    return;
  }
  const bool connected = c->state == conn_state::connected && !c->paused;
  const bool draining = c->state == conn_state::draining && c->reading;
  if ((connected && c->decoder.buffered() != 0) ||
      ((connected || draining) && c->secure && c->secure->holds_partial_input())) {
    ++c->m().partial_frame_timeouts;
    end_conn(c, errc::timeout);
  }
}

size_t detail::stream_access::sweep_largest_slice(const stream_channel& ch) noexcept {
  return ch.impl_->sweep_largest_slice;
}

uint64_t detail::stream_access::sweep_firings(const stream_channel& ch) noexcept {
  return ch.impl_->sweep_firings;
}

connection_id detail::stream_access::sweep_cursor(const stream_channel& ch) noexcept {
  const conn_impl* c = ch.impl_->sweep_next;
  return c == nullptr ? connection_id{} : c->id;
}

void detail::stream_access::set_sweep_slice(stream_channel& ch, size_t n) noexcept {
  ch.impl_->sweep_slice = n;
}

}  // namespace uvbus
