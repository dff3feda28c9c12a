// The reader's engine behind shm_reader: one open region as its reader (the drain loop, the
// stuck-writer handling, the persistent consumed cursor) and its libuv glue (idle handle, async
// handle, futex helper thread). Private to src/shm/reader.cpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <uv.h>

#include "shm/region.h"
#include "uvbus/shm.h"

namespace uvbus {
// Completes a close() requested from inside the records callback (destroys the ring_reader).
void finish_close(shm_reader::impl* outer) noexcept;
}  // namespace uvbus

namespace uvbus::shm_detail {

inline constexpr size_t kMaxHolds = 64;
// The longest a sleeping loop reader's helper waits on the futex before it looks at the ring
// itself (shm_reader::start, docs/shm.md): what a writer lost between its claim of the wake-up and
// its futex_wake costs at most.
inline constexpr uint64_t kMaxSleepNs = 200'000'000;

struct ring_reader;
// Internal delivery: a batch of records to fn(user, records, count).
using deliver_fn = void (*)(void* user, const shm_record* records, size_t count);

// libuv handles live in their own block, freed by the last close callback, so the reader object
// may be destroyed as soon as close() returns.
struct loop_glue {
  uv_async_t async;
  uv_idle_t idle;
  int open_handles = 0;
  ring_reader* owner = nullptr;
};

inline void glue_closed(uv_handle_t* h) {
  auto* g = static_cast<loop_glue*>(h->data);
  if (--g->open_handles == 0) delete g;
}

// One open region as its reader: the read loop, the stuck-writer handling and the loop glue.
struct ring_reader {
  shm_reader::impl* outer = nullptr;
  bool close_requested = false;  // close() was called inside the callback: finish after drain
  shm_close_mode close_mode = shm_close_mode::remove;  // the mode of that close()
  mapping map;
  geometry g;
  shm_config cfg;
  bool owner = false;       // created or reattached the region (false for open_image)
  bool reattached = false;  // took over an existing region and resumed from its consumed cursor
  // The consumed cursor last stored in the header (consumed_pos / consumed_batch_off).
  uint64_t stored_pos = 0;
  uint64_t stored_off = 0;

  uint64_t rd = 0;         // next position to look at (delivery cursor)
  uint64_t published = 0;  // last read_pos stored
  // A skipped record's nodes stay unreleased until its writer acknowledges or reclaim passes.
  struct hold {
    uint64_t pos;
    uint64_t since_ns;
  };
  hold holds[kMaxHolds];
  size_t nholds = 0;
  // Inside a batch (kBatch) partly delivered: the batch's position and the body offset of its next
  // item (a poll or try_receive limit, or a callback batch, can stop in the middle of one).
  uint64_t sub_pos = ~uint64_t{0};
  uint64_t sub_off = 0;
  uint64_t stuck_pos = ~uint64_t{0};  // head position last seen in kWriting, and since when
  uint64_t stuck_since = 0;

  // Local counters, stored to the header after each drain (the reader is their only writer).
  uint64_t c_records = 0, c_bytes = 0, c_abandoned = 0, c_checksum = 0, c_corrupt = 0,
           c_batches = 0;
  std::vector<shm_record> batch;
  size_t size_limit = ~size_t{0};  // try_receive's buffer size
  size_t too_big = 0;              // set when drain stopped at a record above size_limit
  // try_receive's buffer: when set, a payload is copied here first and the checksum verified on
  // the copy, which is what gets delivered (the bytes verified are the bytes handed out, even if a
  // writer stalled past abandon + reclaim writes into the ring meanwhile). Holds at least
  // size_limit bytes.
  uint8_t* copy_to = nullptr;

  // Loop integration.
  uv_loop_t* loop = nullptr;
  loop_glue* glue = nullptr;
  deliver_fn cb = nullptr;
  void* user = nullptr;
  void (*after_pass)(void* user) = nullptr;  // after each loop-driven drain (skip logging)
  bool started = false;
  bool halt = false;  // stop() ran (maybe inside a callback): the current drain delivers no more
  uint64_t spin_until = 0;
  std::thread waker;
  std::atomic<uint32_t> armed{0};  // 1: the waker thread should sleep on the region's futex
  std::atomic<uint32_t> quit{0};
  std::atomic<uint64_t> wait_ns{0};    // the waker's futex timeout (0 = none)
  std::atomic<uint64_t> sleep_pos{0};  // rd when the reader went to sleep (the waker reads it)
  // 1: the head at sleep_pos was claimed when the reader went to sleep, so wait_ns covers its
  // abandon deadline; 0: a claim the waker finds there later has no deadline yet.
  std::atomic<uint32_t> sleep_timed{0};

  void store_counters() noexcept {
    region_header* h = g.hdr;
    h->records_read.store(c_records, std::memory_order_relaxed);
    h->bytes_read.store(c_bytes, std::memory_order_relaxed);
    h->abandoned.store(c_abandoned, std::memory_order_relaxed);
    h->checksum_failures.store(c_checksum, std::memory_order_relaxed);
    h->corrupt.store(c_corrupt, std::memory_order_relaxed);
    h->batches.store(c_batches, std::memory_order_relaxed);
  }

  // Stores the consumed cursor, then releases nodes up to the first still-held skipped record.
  // release: every read of those nodes (checksum, the callback's reads) happens before a writer's
  // acquire load sees the new read_pos and overwrites them. consumed_pos goes first so that
  // read_pos <= consumed_pos holds at every instant (the new read_pos is at most rd, the new
  // consumed_pos): a reader killed between the two stores leaves a state whose only oddity is
  // read_pos trailing, as it does behind held records. Writers read only read_pos, so storing
  // consumed_pos first lets no writer reuse a node sooner.
  void publish(uint64_t now) noexcept {
    while (nholds > 0) {
      const hold& hd = holds[0];
      const uint64_t c = g.head(hd.pos)->load(std::memory_order_acquire);
      const bool acked = ctl_is(c, hd.pos) && ctl_state(c) == kAbandonedAck;
      if (!acked) {
        if (now == 0) now = mono_ns();
        if (now - hd.since_ns < uint64_t{cfg.reclaim_timeout_us} * 1000) break;
      }
      std::memmove(&holds[0], &holds[1], (nholds - 1) * sizeof(hold));
      --nholds;
    }
    store_consumed();
    const uint64_t pos = nholds > 0 ? holds[0].pos : rd;
    if (pos != published) {
      published = pos;
      g.hdr->read_pos.store(pos, std::memory_order_release);
    }
  }

  // Stores the consumed cursor (rd, and the offset reached inside a partly delivered batch at rd)
  // after a callback returned. Called only after the records up to it were handed out. The order
  // of the stores makes an interrupted update redeliver, never skip: consumed_pos first, then the
  // offset, and last consumed_batch_pos, which makes the offset count.
  void store_consumed() noexcept {
    region_header* h = g.hdr;
    const uint64_t off = sub_pos == rd ? sub_off : 0;
    if (rd == stored_pos && off == stored_off) return;
    if (rd != stored_pos) h->consumed_pos.store(rd, std::memory_order_relaxed);
    if (off != 0) {
      h->consumed_batch_off.store(off, std::memory_order_relaxed);
      h->consumed_batch_pos.store(rd, std::memory_order_relaxed);
    }
    stored_pos = rd;
    stored_off = off;
  }

  // A reattached region: resumes from its consumed cursor and counters, and holds again the
  // skipped records between read_pos and the cursor whose writers have not acknowledged the skip
  // (their nodes must not be reused before reclaim_timeout: a stalled writer may still copy).
  // layout_mismatch() accepted the cursors from the header alone; here, with the heads mapped,
  // write_pos is helped past a dead writer's unadvanced claim the last reader skipped, and the
  // cursors must then be read_pos <= resume position <= write_pos, one ring apart at most, the
  // resume position where a record starts (resume_point_error) and the heads from read_pos must
  // step onto it. Returns "" or why not (bad_layout).
  std::string resume() {
    region_header* h = g.hdr;
    published = h->read_pos.load(std::memory_order_acquire);
    stored_pos = h->consumed_pos.load(std::memory_order_acquire);
    // Every record before read_pos was consumed: read_pos passes a record only after the callback
    // it went to returned. (A build that stored read_pos first, killed between the two stores,
    // left consumed_pos behind it; stored_pos keeps the header's value, so it is rewritten.)
    rd = std::max(published, stored_pos);
    if (rd == stored_pos && h->consumed_batch_pos.load(std::memory_order_acquire) == rd) {
      sub_pos = rd;
      sub_off = stored_off = h->consumed_batch_off.load(std::memory_order_acquire);
    }
    const uint64_t wp = help_write_pos(g, rd);
    if (rd > wp || wp - published > g.nodes) {
      return cursors_inconsistent(published, stored_pos, wp, g.nodes);
    }
    if (const char* why = resume_point_error(wp); why != nullptr) {
      return cursors_inconsistent(published, stored_pos, wp, g.nodes) + ": " + why +
             " (resume position " + std::to_string(rd) + ", consumed_batch_off " +
             std::to_string(sub_pos == rd ? sub_off : 0) + ")";
    }
    if (!hold_skipped(mono_ns())) {
      return cursors_inconsistent(published, stored_pos, wp, g.nodes) +
             ": the records from read_pos step past the resume position " + std::to_string(rd);
    }
    c_records = h->records_read.load(std::memory_order_relaxed);
    c_bytes = h->bytes_read.load(std::memory_order_relaxed);
    c_abandoned = h->abandoned.load(std::memory_order_relaxed);
    c_checksum = h->checksum_failures.load(std::memory_order_relaxed);
    c_corrupt = h->corrupt.load(std::memory_order_relaxed);
    c_batches = h->batches.load(std::memory_order_relaxed);
    reattached = true;
    return {};
  }

  // Whether the resume position rd (write_pos wp helped up to it) is one no reader stores: null if
  // it is fine, else why. A reader stores only where a record starts, so below write_pos the head
  // at rd carries rd's stamp (claimed by a writer: writing, committed, a batch, padding,
  // abandoned; its nodes are not released, so no later lap overwrote it). A position inside a
  // record (a damaged consumed_pos or read_pos) carries none: a reader waiting there would never
  // deliver again while writers filled the ring. A partly consumed batch's offset is where one
  // of its items ends (its body's end included: a callback batch can end with its last item).
  [[nodiscard]] const char* resume_point_error(uint64_t wp) const noexcept {
    // acquire: write_pos passed rd only after rd's claim, and (a batch) the commit publishes it.
    const uint64_t c = g.head(rd)->load(std::memory_order_acquire);
    if (rd < wp && !ctl_is(c, rd)) return "no record starts at the resume position";
    if (sub_pos != rd || sub_off == 0) return nullptr;
    const uint64_t n = ctl_nodes(c);
    if (!ctl_is(c, rd) || ctl_state(c) != kBatch || n == 0 || (rd & g.mask) + n > g.nodes) {
      return "the partly consumed batch at the resume position is no batch";
    }
    record_prefix pre;
    std::memcpy(&pre, g.node(rd), sizeof pre);
    if (pre.len > g.max_record || g.nodes_for(pre.len) != n || pre.checksum == 0) {
      return "the partly consumed batch at the resume position is no batch";
    }
    const uint8_t* body = g.node(rd) + kRecordHeaderSize;
    uint64_t off = 0;  // the items' ends, as take_batch steps over them
    while (off < sub_off && pre.len - off >= sizeof pre) {
      record_prefix ip;
      std::memcpy(&ip, body + off, sizeof ip);
      const uint64_t item_bytes = batch_item_bytes(ip.len);
      if (item_bytes > pre.len - off) break;
      off += item_bytes;
    }
    if (off != sub_off) return "consumed_batch_off is not where an item of its batch ends";
    return nullptr;
  }

  // Holds again the abandoned records between read_pos and rd, stepping over the heads as the last
  // reader stepped (ctl_span); an unreadable head holds everything from it (reclaim frees it).
  // Returns false when a step passes rd: rd lies inside a record there, not a cursor a reader
  // stores.
  bool hold_skipped(uint64_t now) noexcept {
    uint64_t p = published;
    while (p < rd) {
      const uint64_t c = g.head(p)->load(std::memory_order_acquire);
      if (!ctl_is(c, p) || (ctl_nodes(c) == 0 && ctl_state(c) != kPad)) {
        if (nholds < kMaxHolds) holds[nholds++] = hold{p, now};
        return true;
      }
      if (ctl_state(c) == kAbandoned && nholds < kMaxHolds) holds[nholds++] = hold{p, now};
      p += ctl_span(c, p & g.mask, g.nodes);  // the step the last reader took here
    }
    return p == rd;
  }

  // The records gathered for the next callback call, and what one drain has delivered so far.
  struct sink {
    deliver_fn fn;
    void* user;
    size_t max_records;
    size_t nb = 0;
    size_t delivered = 0;
    [[nodiscard]] bool full() const noexcept { return delivered + nb >= max_records; }
  };
  enum class step { go_on, stop };

  void flush(sink& s) noexcept {
    if (s.nb == 0) return;
    s.fn(s.user, batch.data(), s.nb);
    s.delivered += s.nb;
    c_records += s.nb;
    ++c_batches;
    s.nb = 0;
  }
  // Adds one verified record; a full batch goes to the callback and its nodes are released.
  void push(sink& s, const uint8_t* payload, uint32_t len) noexcept {
    batch[s.nb++] = shm_record{payload, len};
    c_bytes += len;
    if (s.nb == batch.size()) {
      flush(s);
      publish(0);
    }
  }

  // Delivers up to max_records records in batches; returns how many were delivered. The read loop
  // only: a head still being written is unblock()'s business.
  // Bounded work: every iteration either stops, or advances rd by at least one node, or retries a
  // CAS that lost to a commit (at most once per record), and the total is capped, so a hostile
  // region cannot keep the reader here.
  size_t drain(deliver_fn fn, void* u, size_t max_records) noexcept {
    sink s{fn, u, max_records};
    halt = false;
    uint64_t now = 0;
    size_t budget = max_records > (~size_t{0} - 64) / 4 ? ~size_t{0} : max_records * 4 + 64;
    while (!s.full() && !halt && budget-- > 0) {
      // acquire: pairs with the writer's commit CAS; the payload, len and checksum it wrote
      // before are visible once we see kCommitted.
      const uint64_t c = g.head(rd)->load(std::memory_order_acquire);
      if (!ctl_is(c, rd)) break;  // nothing claimed at rd yet
      if (read_head(c, s, &now) == step::stop) break;
    }
    flush(s);
    publish(now);
    store_counters();
    return s.delivered;
  }

  // Acts on the head word c of the record at rd (its stamp matches).
  step read_head(uint64_t c, sink& s, uint64_t* now) noexcept {
    const uint64_t idx = rd & g.mask;
    const uint32_t st = ctl_state(c);
    if (st == kPad) {
      rd += g.nodes - idx;
      return step::go_on;
    }
    const uint64_t n = ctl_nodes(c);
    if (n == 0 || idx + n > g.nodes) {  // impossible for a real writer: never trust it
      // ... except the formatted head, which matches positions k * 2^40 - 1 at node N - 1 when
      // no record started there since the region was formatted: not damage. Writers help
      // write_pos over exactly these nodes too (ctl_span).
      if (c != kHeadFormatted) ++c_corrupt;
      rd += ctl_span(c, idx, g.nodes);
      return step::go_on;
    }
    switch (st) {
      case kCommitted:
        return take_record(n, s);
      case kBatch:
        return take_batch(n, s);
      case kWriting:
        return unblock(c, n, now);
      case kAbandoned:  // skipped by an earlier reader instance that died before storing past it
        return pass_abandoned(n, now);
      case kAbandonedAck:  // its writer no longer touches the nodes
        rd += n;
        return step::go_on;
      default:
        ++c_corrupt;
        rd += n;
        return step::go_on;
    }
  }

  // The bytes to verify and deliver: the ring's, or (try_receive) a copy in copy_to. len was
  // checked against size_limit.
  const uint8_t* take_payload(const uint8_t* ring, uint32_t len) const noexcept {
    if (copy_to == nullptr) return ring;
    if (len != 0) std::memcpy(copy_to, ring, len);
    return copy_to;
  }

  // A committed single record of n nodes at rd.
  step take_record(uint64_t n, sink& s) noexcept {
    const uint8_t* node = g.node(rd);
    record_prefix pre;
    std::memcpy(&pre, node, sizeof pre);
    if (pre.len > size_limit && pre.len <= g.max_record) {  // try_receive: leave it at the head
      too_big = pre.len;
      return step::stop;
    }
    rd += n;
    if (pre.len > g.max_record || g.nodes_for(pre.len) != n) {
      ++c_corrupt;
      return step::go_on;
    }
    const uint8_t* payload = take_payload(node + kRecordHeaderSize, pre.len);
    if (record_checksum(g.version, payload, pre.len, rd - n) != pre.checksum) {
      ++c_checksum;
      return step::go_on;
    }
    push(s, payload, pre.len);
    return step::go_on;
  }

  // A committed batch of n nodes at rd, resumed at sub_off when an earlier drain paused in it.
  // Its nodes stay unreleased (rd stays on it) until its last item is delivered: publish()
  // releases only up to rd.
  step take_batch(uint64_t n, sink& s) noexcept {
    const uint8_t* node = g.node(rd);
    record_prefix pre;
    std::memcpy(&pre, node, sizeof pre);
    const uint64_t blen = pre.len;
    if (blen > g.max_record || g.nodes_for(blen) != n || pre.checksum == 0) {
      ++c_corrupt;
      rd += n;
      return step::go_on;
    }
    const uint8_t* body = node + kRecordHeaderSize;
    uint64_t off = sub_pos == rd ? sub_off : 0;
    while (off < blen) {
      if (s.full() || halt) return pause_batch(off);
      record_prefix ip;
      if (blen - off < sizeof ip) {
        ++c_corrupt;
        break;
      }
      std::memcpy(&ip, body + off, sizeof ip);
      const uint64_t item_bytes = batch_item_bytes(ip.len);
      if (item_bytes > blen - off) {  // a length that runs past the body: nothing after it is sure
        ++c_corrupt;
        break;
      }
      if (ip.len > size_limit) {  // try_receive: leave it at the head
        too_big = ip.len;
        return pause_batch(off);
      }
      const uint8_t* payload = take_payload(body + off + kRecordHeaderSize, ip.len);
      const bool ok = batch_item_checksum(g.version, payload, ip.len, rd, off) == ip.checksum;
      off += item_bytes;
      if (!ok) {
        ++c_checksum;
        continue;
      }
      sub_pos = rd;  // where to resume if the callback below is the last of this drain
      sub_off = off;
      push(s, payload, ip.len);
    }
    sub_pos = ~uint64_t{0};
    rd += n;
    return step::go_on;
  }
  step pause_batch(uint64_t off) noexcept {
    sub_pos = rd;
    sub_off = off;
    return step::stop;
  }

  // A record an earlier instance abandoned and, dead before storing its cursor past it, left for
  // us: its writer may still be copying into its nodes, so they are held as unblock() holds the
  // ones it abandons itself (resume() holds only those before the stored cursor).
  step pass_abandoned(uint64_t n, uint64_t* now) noexcept {
    if (nholds == kMaxHolds) return step::stop;
    if (*now == 0) *now = mono_ns();
    holds[nholds++] = hold{rd, *now};
    rd += n;
    return step::go_on;
  }

  // The stuck-writer handling: the record at rd (head c, n nodes) is still being written. Waits
  // abandon_timeout from when it was first seen so; then marks it abandoned so the records behind
  // it flow, and holds its nodes until the writer acknowledges or reclaim_timeout passes.
  step unblock(uint64_t c, uint64_t n, uint64_t* now) noexcept {
    if (*now == 0) *now = mono_ns();
    if (stuck_pos != rd) {
      // The clock now, not the drain's: a callback earlier in this drain may have run for longer
      // than abandon_timeout, and this writer only began meanwhile.
      stuck_pos = rd;
      stuck_since = mono_ns();
      return step::stop;
    }
    const uint64_t waited = *now > stuck_since ? *now - stuck_since : 0;  // *now may be older
    if (waited < uint64_t{cfg.abandon_timeout_us} * 1000 || nholds == kMaxHolds) {
      return step::stop;
    }
    uint64_t expect = c;
    // acq_rel: on success the writer's later commit CAS fails and it reports abandoned; on
    // failure the writer committed first and we deliver it on the next iteration.
    if (!g.head(rd)->compare_exchange_strong(expect, make_ctl(rd, n, kAbandoned),
                                             std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
      return step::go_on;
    }
    ++c_abandoned;
    holds[nholds++] = hold{rd, *now};
    rd += n;
    return step::go_on;
  }

  // Whether the head holds something to act on now (a record, padding, a skip). kWriting is not:
  // the futex timeout covers its abandon deadline.
  [[nodiscard]] bool head_ready() const noexcept { return ready_at(rd); }
  [[nodiscard]] bool ready_at(uint64_t pos) const noexcept {
    const uint64_t c = g.head(pos)->load(std::memory_order_seq_cst);
    return ctl_is(c, pos) && ctl_state(c) != kWriting;
  }

  // Whether the writer of the first held (abandoned) record has acknowledged it since: the next
  // drain releases its nodes. seq_cst: pairs with the writer's acknowledging CAS (go_to_sleep).
  [[nodiscard]] bool first_hold_acked() const noexcept {
    if (nholds == 0) return false;
    const uint64_t c = g.head(holds[0].pos)->load(std::memory_order_seq_cst);
    return ctl_is(c, holds[0].pos) && ctl_state(c) == kAbandonedAck;
  }

  // ---- loop integration -------------------------------------------------------------------

  static void on_idle(uv_idle_t* h) {
    auto* gl = static_cast<loop_glue*>(h->data);
    ring_reader* self = gl->owner;
    if (self == nullptr || !self->started) return;
    const size_t n = self->drain(self->cb, self->user, self->cfg.batch_max);
    if (self->after_pass != nullptr && !self->close_requested) self->after_pass(self->user);
    if (self->close_requested) {
      finish_close(self->outer);  // self is gone now
      return;
    }
    if (!self->started) return;  // the callback called stop()
    if (n > 0) {  // the spin window starts when the ring first runs dry: no clock read here
      self->spin_until = 0;
      return;
    }
    const uint64_t now = mono_ns();
    if (self->spin_until == 0) {
      self->spin_until = now + uint64_t{self->cfg.spin_us} * 1000;
      return;
    }
    if (now < self->spin_until) return;
    self->go_to_sleep(now);
  }

  void go_to_sleep(uint64_t now) {
    region_header* h = g.hdr;
    // Dekker with the writers' commit: store 1 (seq_cst), then re-check the head (seq_cst). A
    // writer commits (seq_cst CAS) and then loads reader_sleeping (seq_cst): one of us sees the
    // other, so a record never waits for the next writer to wake us.
    h->reader_sleeping.store(1, std::memory_order_seq_cst);
    if (head_ready() || first_hold_acked()) {
      h->reader_sleeping.store(0, std::memory_order_relaxed);
      return;
    }
    uint64_t timeout = 0;
    const uint64_t c = g.head(rd)->load(std::memory_order_acquire);
    const bool claimed = ctl_is(c, rd);
    if (claimed) {  // in flight: wake up in time to skip it if it is abandoned
      const uint64_t lim = uint64_t{cfg.abandon_timeout_us} * 1000;
      const uint64_t since = stuck_pos == rd ? stuck_since : now;
      timeout = since + lim > now ? since + lim - now : 1000;
      if (stuck_pos != rd) {
        stuck_pos = rd;
        stuck_since = now;
      }
    }
    if (nholds > 0) {  // held nodes: come back to release them after reclaim_timeout
      const uint64_t lim = uint64_t{cfg.reclaim_timeout_us} * 1000;
      const uint64_t t = holds[0].since_ns + lim > now ? holds[0].since_ns + lim - now : 1000;
      if (timeout == 0 || t < timeout) timeout = t;
    }
    uv_idle_stop(&glue->idle);
    wait_ns.store(timeout, std::memory_order_relaxed);
    sleep_pos.store(rd, std::memory_order_relaxed);
    sleep_timed.store(claimed ? 1 : 0, std::memory_order_relaxed);
    armed.store(1, std::memory_order_release);
    futex_wake(&armed, 1);
  }

  static void on_async(uv_async_t* h) {
    auto* gl = static_cast<loop_glue*>(h->data);
    ring_reader* self = gl->owner;
    if (self == nullptr || !self->started) return;
    self->g.hdr->reader_sleeping.store(0, std::memory_order_relaxed);
    self->spin_until = mono_ns() + uint64_t{self->cfg.spin_us} * 1000;
    uv_idle_start(&gl->idle, on_idle);
  }

  // The waker's sleep on the region's futex word until a writer wakes it or the reader's own
  // timeout (wait_ns) passes; false on quit. Each wait lasts at most kMaxSleepNs: a writer stopped
  // or killed between swapping reader_sleeping to 0 and its futex_wake (or between its commit and
  // that check) would otherwise leave the reader asleep for ever, since later writers see 0 (or
  // nobody checks). After each capped wait it looks: the word cleared, or a record at the head,
  // or (no deadline armed for it) the head claimed since the reader slept: a writer that died
  // mid-write there would otherwise hide the records committed behind it until some later writer's
  // wake-up, since nothing arms its abandon timeout but the loop's drain.
  bool sleep() noexcept {
    std::atomic<uint32_t>& word = g.hdr->reader_sleeping;
    const uint64_t want = wait_ns.load(std::memory_order_relaxed);
    const uint64_t pos = sleep_pos.load(std::memory_order_relaxed);
    const bool timed = sleep_timed.load(std::memory_order_relaxed) != 0;
    const uint64_t start = mono_ns();
    for (;;) {
      const uint64_t spent = mono_ns() - start;
      if (want != 0 && spent >= want) return true;
      futex_wait(&word, 1, want == 0 ? kMaxSleepNs : std::min(want - spent, kMaxSleepNs));
      if (quit.load(std::memory_order_acquire) != 0) return false;
      if (word.load(std::memory_order_seq_cst) != 1 || ready_at(pos)) return true;
      if (!timed && ctl_is(g.head(pos)->load(std::memory_order_acquire), pos)) return true;
    }
  }

  void waker_main() {
    for (;;) {
      while (armed.load(std::memory_order_acquire) == 0) {
        if (quit.load(std::memory_order_acquire) != 0) return;
        futex_wait(&armed, 0, 0);
      }
      if (quit.load(std::memory_order_acquire) != 0) return;
      if (!sleep()) return;
      armed.store(0, std::memory_order_release);
      uv_async_send(&glue->async);
    }
  }

  errc start(uv_loop_t* lp, deliver_fn fn, void* u) {
    if (started) return errc::wrong_state;
    if (lp == nullptr || fn == nullptr) return errc::invalid_argument;
    auto* gl = new (std::nothrow) loop_glue();
    if (gl == nullptr) return errc::no_memory;
    gl->owner = this;
    if (uv_async_init(lp, &gl->async, on_async) != 0) {
      delete gl;
      return errc::io_error;
    }
    gl->async.data = gl;
    uv_idle_init(lp, &gl->idle);
    gl->idle.data = gl;
    gl->open_handles = 2;
    loop = lp;
    glue = gl;
    cb = fn;
    user = u;
    armed.store(0);
    quit.store(0);
    try {
      waker = std::thread([this] { waker_main(); });
    } catch (...) {
      close_glue();
      return errc::io_error;
    }
    started = true;
    spin_until = mono_ns() + uint64_t{cfg.spin_us} * 1000;
    uv_idle_start(&gl->idle, on_idle);
    return errc::ok;
  }

  void close_glue() {
    if (glue == nullptr) return;
    glue->owner = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(&glue->async), glue_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&glue->idle), glue_closed);
    glue = nullptr;
    loop = nullptr;
  }

  void stop() {
    halt = true;
    if (!started) return;
    started = false;
    quit.store(1, std::memory_order_release);
    // Wake the helper wherever it sleeps: on `armed` or on the region's futex word.
    armed.store(1, std::memory_order_release);
    futex_wake(&armed, 1);
    g.hdr->reader_sleeping.store(0, std::memory_order_seq_cst);
    futex_wake(&g.hdr->reader_sleeping, 1);
    if (waker.joinable()) waker.join();
    close_glue();
  }

  errc init_common(const shm_config& c) {
    cfg = c;
    if (cfg.batch_max == 0) cfg.batch_max = 1;
    try {
      batch.resize(cfg.batch_max);
    } catch (...) {
      return errc::no_memory;
    }
    return errc::ok;
  }

  // Stops and, for the region's owner, marks it closed and removes it (remove), or marks it
  // detached and leaves it to the next reader (keep).
  void shut(shm_close_mode mode) noexcept {
    stop();
    if (owner) {
      store_counters();
      store_consumed();
      const bool keep = mode == shm_close_mode::keep;
      // release: a writer that sees "closed" needs nothing else from us and stops sending; a
      // reader that reattaches after "detached" (acquire) sees the cursor and counters above.
      if (keep) {
        detach_region(g.hdr);
      } else {
        g.hdr->reader_state.store(kReaderClosed, std::memory_order_release);
      }
      release_region(&map, !keep);
    }
  }
};

}  // namespace uvbus::shm_detail
