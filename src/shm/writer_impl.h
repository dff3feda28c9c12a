// shm_detail::writer_core (shm_writer::impl): the writer's state and its inline paths (reserve,
// copy, checksum, commit, the wake-up of the reader, and the opt-in coalescing stage), included by
// writer.cpp only. Lock-free: a writer that stops anywhere (crash, preemption, SIGSTOP) never
// prevents other writers from reserving, and the reader skips its record after the abandon timeout.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <new>

#include <uv.h>

#include "shm/region.h"
#include "shm/test_hook.h"
#include "uvbus/shm.h"

namespace uvbus {
namespace shm_detail {
struct writer_core;

// A coalescing writer's libuv handles, in their own block freed by the last close callback (the
// writer may be destroyed right after close()).
struct writer_glue {
  uv_prepare_t prepare;
  uv_check_t check;
  uv_timer_t retry;  // every millisecond while a flush found the ring full
  writer_core* owner = nullptr;
  int open_handles = 0;
};
inline void writer_glue_closed(uv_handle_t* h) {
  auto* g = static_cast<writer_glue*>(h->data);
  if (--g->open_handles == 0) delete g;
}

struct writer_core {
  mapping map;
  geometry g;
  uint64_t cached_read = 0;  // last read_pos seen: free space is at least nodes - (w - cached)
  shm_metrics local;         // this writer's counters
  // Deltas not yet added to the region's shared counters (flushed every kFlushEvery sends).
  uint64_t pend_records = 0, pend_bytes = 0, pend_full = 0, pend_abandoned = 0, pend_wakeups = 0,
           pend_dropped = 0;
  uint32_t sends_since_flush = 0;
  uint32_t sends_since_liveness = 0;
  uint64_t last_liveness_ns = 0;
  bool removed = false;  // the region's name was found removed: its records can never be read
  void (*hook)(void*) = nullptr;
  void* hook_user = nullptr;
  // Coalescing (shm_writer::coalesce): the stage holds a batch body being built, items laid out
  // as in the ring ({len, payload hash} + payload padded to 8); a flush fixes each checksum up
  // with its position mix and commits the body as one kBatch record.
  std::unique_ptr<uint8_t[]> stage;
  size_t stage_cap = 0;    // 0: not coalescing
  bool closing = false;    // inside close(): a send from on_staged_dropped stages nothing
  size_t stage_used = 0;   // body bytes staged
  size_t stage_count = 0;  // messages staged
  uint64_t stage_payload = 0;
  bool stuck = false;  // the last flush failed (ring full): the stage waits for room
  // Whether a refusal counts in queue_full / not_connected: off while a flush(), a loop turn, the
  // retry timer or close() publishes the stage (no send is refused then: those counters count
  // refused sends only; what such a flush drops counts in staged_dropped).
  bool count_refusals = true;
  writer_glue* glue = nullptr;
  // shm_writer::on_staged_dropped, shared: drop_stage() holds what it calls, which the callback may
  // replace or clear while it runs.
  std::shared_ptr<const std::function<void(const uint8_t*, size_t)>> on_dropped;
  int dropping = 0;  // inside on_dropped: close() is refused (the callers still use this impl)

  static constexpr uint32_t kFlushEvery = shm_writer::kCounterFlushEvery;
  static constexpr uint32_t kLivenessEvery = 65536;  // sends between two region_removed checks

  void flush() noexcept {
    region_header* h = g.hdr;
    if (pend_records) h->records_written.fetch_add(pend_records, std::memory_order_relaxed);
    if (pend_bytes) h->bytes_written.fetch_add(pend_bytes, std::memory_order_relaxed);
    if (pend_full) h->queue_full.fetch_add(pend_full, std::memory_order_relaxed);
    if (pend_abandoned) h->writer_abandoned.fetch_add(pend_abandoned, std::memory_order_relaxed);
    if (pend_wakeups) h->wakeups.fetch_add(pend_wakeups, std::memory_order_relaxed);
    if (pend_dropped) h->staged_dropped.fetch_add(pend_dropped, std::memory_order_relaxed);
    pend_records = pend_bytes = pend_full = pend_abandoned = pend_wakeups = pend_dropped = 0;
    sends_since_flush = 0;
  }

  errc gone() noexcept {
    if (count_refusals) ++local.not_connected;
    return errc::not_connected;
  }

  // True if the ring has room for `need` nodes at position w, refreshing the cached read cursor
  // when the cached value says no. The acquire load pairs with the reader's release store of
  // read_pos: the reader's reads of the nodes it released happen before our writes into them.
  bool room(uint64_t w, uint64_t need) noexcept {
    if (w + need - cached_read <= g.nodes) return true;
    cached_read = g.hdr->read_pos.load(std::memory_order_acquire);
    return w + need - cached_read <= g.nodes;
  }

  // True once the region was closed for good or its name removed (then remembered: a removed
  // name never comes back for this mapping). A dead or detached reader is NOT gone: its ring
  // waits for the reader that reattaches.
  bool region_gone() noexcept {
    if (!removed) removed = shm_detail::region_removed(map);
    return removed;
  }

  errc full() noexcept {
    // A removed region never frees space: tell the caller rather than full forever. Checked at
    // most once a millisecond (an fstat or IPC_STAT). Counted once, as what is returned.
    const uint64_t now = mono_ns();
    if (now - last_liveness_ns >= 1000000) {
      last_liveness_ns = now;
      if (region_gone()) return gone();
    }
    if (removed) return gone();
    if (count_refusals) {
      ++local.queue_full;
      ++pend_full;
    }
    return errc::queue_full;
  }

  // Checks shared by send and send_batch before anything is reserved. ok, or the error to return.
  errc precheck(uint32_t sends = 1) noexcept {
    region_header* h = g.hdr;
    // A hint, not a guarantee (the reader may close right after): relaxed is enough. Open (live
    // or dead reader) and detached both accept records.
    if (h->reader_state.load(std::memory_order_relaxed) == kReaderClosed || removed) return gone();
    sends_since_liveness += sends;
    if (sends_since_liveness >= kLivenessEvery) {
      sends_since_liveness = 0;
      if (region_gone()) return gone();
    }
    sends_since_flush += sends;
    if (sends_since_flush >= kFlushEvery) flush();
    // Start pulling the head and first data line of the likely position into our cache (for
    // writing) now, so the cross-core transfers overlap the hashing that follows instead of
    // stalling the claim.
    const uint64_t guess = h->write_pos.load(std::memory_order_relaxed);
    __builtin_prefetch(g.head(guess), 1);
    __builtin_prefetch(g.node(guess), 1);
    return errc::ok;
  }

  // reserve(), then the test hook (which may stand for a writer dying between its reservation and
  // its commit): on ok, *wp is the record's position and *node its first node.
  errc reserve_record(uint64_t need, uint64_t* wp, uint8_t** node) noexcept {
    if (const errc e = reserve(need, wp); e != errc::ok) return e;
    if (hook != nullptr) hook(hook_user);
    *node = g.node(*wp);
    return errc::ok;
  }

  // Reserves `need` consecutive nodes: on ok, *wp is their position and their head holds
  // kWriting with our stamp. Otherwise queue_full or not_connected (nothing reserved).
  errc reserve(uint64_t need, uint64_t* wp) noexcept {
    region_header* h = g.hdr;
    uint64_t w = h->write_pos.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t idx = w & g.mask;
      head_word* head = g.head(w);
      // acquire: a claim we see (another writer's) must come with its node count.
      uint64_t c = head->load(std::memory_order_acquire);
      if (ctl_is(c, w)) {
        // Position w is claimed but write_pos not yet advanced (its writer is between its two
        // CASes, or died there): help it along, so no writer ever waits for another. By
        // ctl_span, exactly the nodes the reader steps over at w: the head may also be one no
        // writer claimed in this stamp period (see ctl_span), which the reader steps over alike.
        const uint64_t n = ctl_span(c, idx, g.nodes);
        // A real claim was made with room for it, so this never refuses one; it keeps such an
        // old head from taking write_pos more than a ring past read_pos (unless the reader has
        // already stepped over it: read_pos past w).
        if (!room(w, n) && cached_read <= w) return full();
        if (h->write_pos.compare_exchange_strong(w, w + n, std::memory_order_acq_rel,
                                                 std::memory_order_acquire)) {
          w += n;
        }
        continue;
      }
      // w must still be the current write position: a writer preempted for a whole lap could
      // otherwise claim a node that is now in the middle of a newer record. While write_pos == w,
      // nobody has claimed position w, so the CAS below fails if anything touched the node after
      // we loaded c (no ABA: the head would have to come back to exactly c, which takes a record
      // starting at this node 2^40 positions later, while this writer sits here).
      const uint64_t now_w = h->write_pos.load(std::memory_order_acquire);
      if (now_w != w) {
        w = now_w;
        continue;
      }
      if (idx + need > g.nodes) {
        // The record would cross the end of the ring: claim the rest of the lap as padding first
        // (only if the record fits after it, so a pad never takes space for nothing).
        const uint64_t pad = g.nodes - idx;
        if (!room(w, pad + need)) return full();
        if (head->compare_exchange_strong(c, make_ctl(w, 0, kPad), std::memory_order_acq_rel,
                                          std::memory_order_acquire)) {
          if (h->write_pos.compare_exchange_strong(w, w + pad, std::memory_order_acq_rel,
                                                   std::memory_order_acquire)) {
            w += pad;
          }
        } else {
          w = h->write_pos.load(std::memory_order_acquire);
        }
        continue;
      }
      if (!room(w, need)) return full();
      // The claim: the stale header of an earlier lap becomes ours. A CAS (not a store) because
      // another writer may be claiming the same position; release publishes nothing yet but
      // acquire on failure gives us the winner's node count for helping.
      if (head->compare_exchange_strong(c, make_ctl(w, need, kWriting), std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        uint64_t expect = w;
        h->write_pos.compare_exchange_strong(expect, w + need, std::memory_order_acq_rel,
                                             std::memory_order_relaxed);
        *wp = w;
        return errc::ok;
      }
      w = h->write_pos.load(std::memory_order_acquire);
    }
  }

  // Wakes the reader if it announced it sleeps (true). The locked exchange only after a plain load.
  bool wake_reader() noexcept {
    std::atomic<uint32_t>& s = g.hdr->reader_sleeping;
    constexpr auto sc = std::memory_order_seq_cst;
    if (s.load(sc) == 0 || s.exchange(0, sc) == 0) return false;
    futex_wake(&s, 1);
    ++local.wakeups;
    ++pend_wakeups;
    return true;
  }

  // Commits the reservation at w (kWriting -> `state`) and wakes a sleeping reader; counts
  // `records` messages of `bytes` payload bytes. ok or abandoned.
  errc commit(uint64_t w, uint64_t need, uint32_t state, uint64_t records,
              uint64_t bytes) noexcept {
    head_word* head = g.head(w);
    // Commit: a CAS, not a store. If the reader gave up on us (kAbandoned) the record is lost and
    // we must say so. seq_cst pairs with the reader's seq_cst store of reader_sleeping and its
    // seq_cst re-check of the head: either the reader sees this commit before sleeping, or we see
    // reader_sleeping == 1 below and wake it (no lost wake-up). On x86 both are plain locked ops.
    uint64_t expect = make_ctl(w, need, kWriting);
    if (!head->compare_exchange_strong(expect, make_ctl(w, need, state), std::memory_order_seq_cst,
                                       std::memory_order_acquire)) {
      // Done with the nodes: ack (seq_cst: a reader re-checks it before sleeping) and wake it.
      if (ctl_is(expect, w) && ctl_state(expect) == kAbandoned &&
          head->compare_exchange_strong(expect, make_ctl(w, need, kAbandonedAck),
                                        std::memory_order_seq_cst, std::memory_order_relaxed)) {
        wake_reader();
      }
      ++local.writer_abandoned;
      ++pend_abandoned;
      return errc::abandoned;
    }
    local.records_written += records;
    local.bytes_written += bytes;
    pend_records += records;
    pend_bytes += bytes;
    if (wake_reader()) {
      // The reader was idle, so traffic is light and the syscall above dwarfs a flush: publishing
      // the counters here keeps the region's totals (uvbus_shm_inspect) from lagging for long.
      flush();
    }
    return errc::ok;
  }

  errc send(const const_buffer* parts, size_t count) noexcept {
    if (g.hdr == nullptr) return errc::not_connected;
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) {
      total += parts[i].size;
      if (total > g.max_record || parts[i].size > g.max_record) return errc::message_too_large;
    }
    if (const errc e = precheck(); e != errc::ok) return e;
    // A single part is hashed before reserving (see payload_hash): the reserve-to-commit window
    // is then just the copy.
    const uint32_t pre_hash = count == 1 ? payload_hash(g.version, parts[0].data, total) : 0;
    const uint64_t need = g.nodes_for(total);
    uint64_t w = 0;
    uint8_t* node = nullptr;
    if (const errc e = reserve_record(need, &w, &node); e != errc::ok) return e;
    // The nodes are ours alone until the commit: plain stores.
    uint8_t* dst = node + kRecordHeaderSize;
    size_t off = 0;
    for (size_t i = 0; i < count; ++i) {
      if (parts[i].size != 0) std::memcpy(dst + off, parts[i].data, parts[i].size);
      off += parts[i].size;
    }
    const uint32_t hash = count == 1 ? pre_hash : payload_hash(g.version, dst, total);
    const record_prefix pre{static_cast<uint32_t>(total), hash ^ position_mix(w)};
    std::memcpy(node, &pre, sizeof pre);
    return commit(w, need, kCommitted, 1, total);
  }

  errc send_batch(const const_buffer* msgs, size_t count) noexcept {
    if (g.hdr == nullptr) return errc::not_connected;
    if (count == 0) return errc::ok;
    if (count > shm_writer::kMaxBatch) return errc::invalid_argument;
    if (count == 1) return send(msgs, 1);  // the plain record format is smaller
    uint64_t body = 0, bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      if (msgs[i].size > g.max_record) return errc::message_too_large;
      body += batch_item_bytes(msgs[i].size);
      bytes += msgs[i].size;
      if (body > g.max_record) return errc::message_too_large;
    }
    if (const errc e = precheck(); e != errc::ok) return e;
    // Every payload is hashed before reserving, as in send(): the window stays the copies.
    uint32_t hashes[shm_writer::kMaxBatch];
    for (size_t i = 0; i < count; ++i)
      hashes[i] = payload_hash(g.version, msgs[i].data, msgs[i].size);
    const uint64_t need = g.nodes_for(body);
    uint64_t w = 0;
    uint8_t* node = nullptr;
    if (const errc e = reserve_record(need, &w, &node); e != errc::ok) return e;
    uint8_t* dst = node + kRecordHeaderSize;
    uint64_t off = 0;
    for (size_t i = 0; i < count; ++i) {
      const size_t len = msgs[i].size;
      const record_prefix ip{static_cast<uint32_t>(len), hashes[i] ^ item_mix(w, off)};
      std::memcpy(dst + off, &ip, sizeof ip);
      if (len != 0) std::memcpy(dst + off + kRecordHeaderSize, msgs[i].data, len);
      off += batch_item_bytes(len);
    }
    const record_prefix pre{static_cast<uint32_t>(body), static_cast<uint32_t>(count)};
    std::memcpy(node, &pre, sizeof pre);
    return commit(w, need, kBatch, count, bytes);
  }

  // ---- coalescing ---------------------------------------------------------------------------

  // Copies the stage into the ring as one reservation: a plain record for a single message, a
  // batch otherwise. The ring protocol is send_batch's: the reserve-to-commit window is the copy.
  errc publish_stage() noexcept {
    if (const errc e = precheck(static_cast<uint32_t>(stage_count)); e != errc::ok) return e;
    const uint8_t* src = stage.get();
    record_prefix sp;
    std::memcpy(&sp, src, sizeof sp);
    const bool single = stage_count == 1;
    const uint64_t need = g.nodes_for(single ? sp.len : stage_used);
    uint64_t w = 0;
    uint8_t* node = nullptr;
    if (const errc e = reserve_record(need, &w, &node); e != errc::ok) return e;
    uint8_t* dst = node + kRecordHeaderSize;
    if (single) {
      if (sp.len != 0) std::memcpy(dst, src + kRecordHeaderSize, sp.len);
      const record_prefix pre{sp.len, sp.checksum ^ position_mix(w)};
      std::memcpy(node, &pre, sizeof pre);
      return commit(w, need, kCommitted, 1, sp.len);
    }
    std::memcpy(dst, src, stage_used);
    // The item prefixes carry the payload hash: mix in the position (lengths from the stage,
    // our private memory, never from the ring).
    for (uint64_t off = 0; off < stage_used;) {
      record_prefix ip;
      std::memcpy(&ip, src + off, sizeof ip);
      ip.checksum ^= item_mix(w, off);
      std::memcpy(dst + off, &ip, sizeof ip);
      off += batch_item_bytes(ip.len);
    }
    const record_prefix pre{static_cast<uint32_t>(stage_used), static_cast<uint32_t>(stage_count)};
    std::memcpy(node, &pre, sizeof pre);
    return commit(w, need, kBatch, stage_count, stage_payload);
  }

  // Drops the staged messages (counted here and, at the next flush(), in the region). Returns how
  // many.
  size_t drop_stage() noexcept {
    const size_t n = stage_count;
    local.staged_dropped += n;
    pend_dropped += n;
    const size_t used = stage_used;
    // Handed back from a stage of their own: a send the callback makes stages afresh.
    std::unique_ptr<uint8_t[]> gone;
    const auto cb = on_dropped;  // the callback may replace it: this one hands back this stage
    if (cb && n != 0) {
      gone.reset(new (std::nothrow) uint8_t[stage_cap]);
      if (gone) gone.swap(stage);
    }
    clear_stage();
    // The callback's own sends are sends like any other, counted when refused even inside a flush
    // that no send asked for (flush_uncounted).
    const bool counted = count_refusals;
    count_refusals = true;
    for (uint64_t off = 0; gone && off < used;) {
      record_prefix ip;
      std::memcpy(&ip, gone.get() + off, sizeof ip);
      ++dropping;
      (*cb)(gone.get() + off + kRecordHeaderSize, ip.len);
      --dropping;
      off += batch_item_bytes(ip.len);
    }
    count_refusals = counted;
    return n;
  }

  void clear_stage() noexcept {
    stage_used = stage_count = 0;
    stage_payload = 0;
    stuck = false;
    if (glue != nullptr) uv_timer_stop(&glue->retry);
  }

  // Publishes the stage (retrying an abandoned copy, which was not delivered, up to 3 times).
  // ok: empty now. not_connected: the region is gone, the stage is dropped. queue_full or
  // abandoned: kept, and retried by the next send/flush/loop turn or the retry timer.
  errc flush_stage() noexcept {
    if (stage_count == 0) return errc::ok;
    errc e = publish_stage();
    for (int retry = 0; e == errc::abandoned && retry < 3; ++retry) e = publish_stage();
    if (e == errc::ok) {
      ++local.coalesced_flushes;
      clear_stage();
      return e;
    }
    if (e == errc::not_connected) {
      drop_stage();
      return e;
    }
    if (!stuck && glue != nullptr) uv_timer_start(&glue->retry, on_retry, 1, 1);
    stuck = true;
    return e;
  }

  // send()/sendv() on a coalescing writer: appends the message to the stage.
  errc stage_send(const const_buffer* parts, size_t count) noexcept {
    if (g.hdr == nullptr) return errc::not_connected;
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) {
      total += parts[i].size;
      if (total > g.max_record || parts[i].size > g.max_record) return errc::message_too_large;
    }
    // A region closed for good: what is staged can never be read either (a relaxed hint, as in
    // precheck; a removed name is found by the flush's periodic check).
    if (g.hdr->reader_state.load(std::memory_order_relaxed) == kReaderClosed || removed) {
      drop_stage();
      return gone();
    }
    const uint64_t item = batch_item_bytes(total);
    if (stuck || stage_used + item > stage_cap || stage_count == shm_writer::kMaxBatch) {
      if (const errc e = flush_stage(); e != errc::ok) return e;
    }
    if (item > stage_cap) return send(parts, count);  // too big to stage: alone, after the stage
    uint8_t* d = stage.get() + stage_used;
    size_t off = kRecordHeaderSize;
    for (size_t i = 0; i < count; ++i) {
      if (parts[i].size != 0) std::memcpy(d + off, parts[i].data, parts[i].size);
      off += parts[i].size;
    }
    const record_prefix ip{static_cast<uint32_t>(total),
                           payload_hash(g.version, d + kRecordHeaderSize, total)};
    std::memcpy(d, &ip, sizeof ip);
    stage_used += item;
    ++stage_count;
    stage_payload += total;
    return errc::ok;
  }

  // A flush that no send asked for: it refuses no send, so queue_full and not_connected stay as
  // they are.
  errc flush_uncounted() noexcept {
    count_refusals = false;
    const errc e = flush_stage();
    count_refusals = true;
    return e;
  }

  static void on_turn(writer_core* self) noexcept {
    if (self != nullptr && self->stage_count != 0) (void)self->flush_uncounted();
  }
  static void on_prepare(uv_prepare_t* h) { on_turn(static_cast<writer_glue*>(h->data)->owner); }
  static void on_check(uv_check_t* h) { on_turn(static_cast<writer_glue*>(h->data)->owner); }
  static void on_retry(uv_timer_t* h) { on_turn(static_cast<writer_glue*>(h->data)->owner); }

  errc start_glue(uv_loop_t* loop) noexcept {
    auto* gl = new (std::nothrow) writer_glue();
    if (gl == nullptr) return errc::no_memory;
    gl->owner = this;
    gl->prepare.data = gl->check.data = gl->retry.data = gl;
    uv_prepare_init(loop, &gl->prepare);
    uv_check_init(loop, &gl->check);
    uv_timer_init(loop, &gl->retry);
    gl->open_handles = 3;
    uv_prepare_start(&gl->prepare, on_prepare);
    uv_check_start(&gl->check, on_check);
    // Never keep the loop alive: they only serve sends, which come from something that does.
    uv_unref(reinterpret_cast<uv_handle_t*>(&gl->prepare));
    uv_unref(reinterpret_cast<uv_handle_t*>(&gl->check));
    uv_unref(reinterpret_cast<uv_handle_t*>(&gl->retry));
    glue = gl;
    return errc::ok;
  }

  // close(): a last flush; what can not be published is dropped and counted (the caller then
  // flushes the counters into the region). Returns how many were dropped.
  size_t stop_coalescing() noexcept {
    if (stage_cap == 0) return 0;
    closing = true;  // what on_dropped sends now could only be staged and cleared unseen below
    const size_t before = local.staged_dropped;
    if (flush_uncounted() != errc::ok) drop_stage();
    clear_stage();
    const auto dropped = static_cast<size_t>(local.staged_dropped - before);
    if (glue != nullptr) {
      glue->owner = nullptr;
      uv_close(reinterpret_cast<uv_handle_t*>(&glue->prepare), writer_glue_closed);
      uv_close(reinterpret_cast<uv_handle_t*>(&glue->check), writer_glue_closed);
      uv_close(reinterpret_cast<uv_handle_t*>(&glue->retry), writer_glue_closed);
      glue = nullptr;
    }
    stage_cap = 0;
    return dropped;
  }
};

}  // namespace shm_detail
}  // namespace uvbus
