// Bus node, flows (end-to-end delivery): the source's retransmit buffers, resend and the
// reports they settle; the target's in-order positions, duplicate removal and cumulative
// acknowledgements. docs/bus.md "Flows" states the guarantees; docs/protocol.md the bytes.
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "bus/node_impl.h"

namespace uvbus {

using detail::rx_flow;
using detail::tx_entry;
using detail::tx_flow;
using proto::ack_kind;
using proto::msg_type;

namespace {

constexpr uint32_t kMaxRtoFactor = 8;
// A target asks for a resend of one flow at most this often (the source resends everything
// unacknowledged at once, so asking again before it could have arrived only duplicates).
constexpr uint64_t kNackIntervalMs = 10;
// A source honours a target's resend request at most this often per flow.
constexpr uint64_t kResendIntervalMs = 5;
// Messages the resend timer sends again (flow_probe).
constexpr uint64_t kProbeWindow = 64;

// Relay refusals that settle a message: the target is gone or the message can never pass.
bool final_refusal(errc why, bool target_known) {
  switch (why) {
    case errc::ttl_expired:
    case errc::message_too_large:
    case errc::version_mismatch:
    case errc::access_denied:
      return true;
    case errc::unknown_route:
      // A target that acknowledged us before may be restarting: retry until the deadline.
      return !target_known;
    default:
      return false;
  }
}

// detail::drained_to_half() with this node's limits.
bool drained_to_half(const node_config& cfg, const tx_flow& f) {
  return detail::drained_to_half(f, cfg.retransmit_max_messages, cfg.retransmit_max_bytes);
}

}  // namespace

// ------------------------------------------------------------------------------- source side --
// (tx_flow_for, flow_alloc and a message's first send: node_flow_send.cpp)
void node::impl::flow_pump(tx_flow& f) {
  while (!f.entries.empty() && f.next_unsent < f.next_seq && flows_may_send()) {
    const uint64_t front = f.entries.front().seq;
    if (f.next_unsent < front) f.next_unsent = front;
    if (f.next_unsent >= f.next_seq) break;
    tx_entry& e = f.entries[f.next_unsent - front];
    if (e.settled) {
      f.need_sync = true;  // the target must not wait for it
      ++f.next_unsent;
      continue;
    }
    uint8_t* m = f.store.buf.get() + e.offset;
    const bool sync = f.need_sync && e.seq == front;  // see tx_flow::need_sync
    if (sync) m[2] |= proto::flag_sync;
    const const_buffer b{m, e.size};
    const errc err = route_out(f.target, &b, 1, e.size, 0, nullptr);
    m[2] &= static_cast<uint8_t>(~proto::flag_sync);
    if (err != errc::ok) {
      // A full queue or ring: retry soon. Anything else (no route yet, link down): the resend
      // timer, a link coming up or an acknowledgement retries; the deadline settles it.
      if (err == errc::queue_full) flow_block(f);
      return;
    }
    if (sync) f.need_sync = false;
    if (e.seq <= f.high_sent) ++counters.flow_resent;
    if (e.seq > f.high_sent) f.high_sent = e.seq;
    ++f.next_unsent;
  }
}

void node::impl::flow_block(tx_flow& f) {
  if (f.blocked) return;
  f.blocked = true;
  flow_blocked.push_back(f.target);
  if (h != nullptr && !uv_is_active(reinterpret_cast<uv_handle_t*>(&h->flow))) {
    uv_timer_start(&h->flow, &impl::on_flow_timer, 1, 0);
  }
}

void node::impl::on_flow_timer(uv_timer_t* t) {
  auto* n = static_cast<impl*>(t->data);
  if (n->dead) return;  // destroyed in this loop turn (timers run before its on_idle)
  n->pump_blocked();
}

void node::impl::pump_blocked() {
  std::vector<bus_id> ids;
  ids.swap(flow_blocked);
  for (bus_id id : ids) {
    auto it = tx_flows.find(id);
    if (it == tx_flows.end()) continue;
    it->second.blocked = false;
    flow_pump(it->second);
  }
}

// The resend timer's answer to silence: send the first kProbeWindow unacknowledged messages again
// (the first flagged sync), not all of them. A path that is only slow gets a few duplicates, not a
// second copy of its whole queue (which would make it slower still); a real loss is then repaired
// by the target's gap request, a relay's drop notice or a lost link, which resend everything.
void node::impl::flow_probe(tx_flow& f) {
  f.resend_ms = now_ms();
  if (f.entries.empty()) return;
  const uint64_t front = f.entries.front().seq;
  const uint64_t end = std::min<uint64_t>(f.next_unsent, front + kProbeWindow);
  bool sync = true;
  for (uint64_t s = front; s < end && flows_may_send(); ++s) {
    tx_entry& e = f.entries[s - front];
    if (e.settled) continue;
    uint8_t* m = f.store.buf.get() + e.offset;
    if (sync) m[2] |= proto::flag_sync;
    const const_buffer b{m, e.size};
    const errc err = route_out(f.target, &b, 1, e.size, 0, nullptr);
    m[2] &= static_cast<uint8_t>(~proto::flag_sync);
    if (err != errc::ok) return;
    if (sync) f.need_sync = false;  // the front went out flagged: the target may skip to it
    sync = false;
    ++counters.flow_resent;
  }
}

void node::impl::flow_resend(tx_flow& f) {
  if (f.entries.empty()) return;
  f.next_unsent = f.entries.front().seq;
  f.need_sync = true;
  f.resend_ms = now_ms();
  flow_pump(f);
}

void node::impl::flow_settle_front(tx_flow& f, uint64_t through, errc status) {
  if (status == errc::ok && !cbs.on_report && call_by_message.empty() && !cfg.latency_histograms &&
      !f.entries.empty() && f.entries.front().seq <= through) {
    // Nothing to hand out per message (no on_report, no call waiting for its message's report, no
    // latency sample): what defer_report() would do for each is one count, so the delivered run
    // is counted and dropped in one pass (seqs are contiguous from the front).
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(through - f.entries.front().seq + 1, f.entries.size()));
    size_t bytes = 0;
    uint64_t ok = 0;
    for (size_t i = 0; i < n; ++i) {
      const tx_entry& e = f.entries[i];
      bytes += e.size;
      ok += static_cast<uint64_t>(!e.settled && e.message_id != 0);
    }
    counters.reports_ok += ok;
    f.bytes -= bytes;
    counters.flow_unacked_now -= n;
    counters.flow_unacked_bytes -= bytes;
    f.entries.pop_front_n(n);
  }
  while (!f.entries.empty() && f.entries.front().seq <= through) {
    tx_entry& e = f.entries.front();
    if (!e.settled) defer_report(e.message_id, f.target, status, true);
    if (e.sent_ns != 0 && !e.settled && status == errc::ok) record_latency(f, e);
    f.bytes -= e.size;
    --counters.flow_unacked_now;
    counters.flow_unacked_bytes -= e.size;
    f.entries.pop_front();
  }
  // Settled (failed) entries reaching the front leave too.
  while (!f.entries.empty() && f.entries.front().settled) {
    f.bytes -= f.entries.front().size;
    --counters.flow_unacked_now;
    counters.flow_unacked_bytes -= f.entries.front().size;
    f.entries.pop_front();
  }
  if (f.entries.empty()) f.store.tail = 0;
}

void node::impl::on_flow_ack(const proto::header& hd, const proto::flow_ack_body& a) {
  ++counters.flow_acks_received;
  auto it = tx_flows.find(hd.source);
  if (it == tx_flows.end() || a.epoch != incarnation) return;  // an older incarnation's flow
  tx_flow& f = it->second;
  const bool restarted = f.peer_incarnation != 0 && a.incarnation != f.peer_incarnation;
  f.peer_incarnation = a.incarnation;
  if (a.through > f.acked && a.through < f.next_seq) {
    f.acked = a.through;
    f.last_progress_ms = now_ms();
    flow_sample_rtt(f, a.through);
    f.rto_ms = flow_base_rto(f);
    flow_settle_front(f, a.through, errc::ok);
    if (stop_flush_until != 0 && counters.flow_unacked_now == 0) {
      close_links_for_stop();
      return;
    }
    if (drained_to_half(cfg, f)) {
      f.user_blocked = false;
      fire(cbs.on_writable, f.target);
      if (dead) return;  // destroyed there: nothing is resent
    }
  }
  if (restarted) {
    // What was sent to the old incarnation as "any node" is not resent to this one: it fails
    // (fan_restarted), the rest is resent below. Also when the directory has not seen it yet.
    detail::fan_restarted(*this, f.target);
    if (dead) return;
    f.peer_incarnation = a.incarnation;
  }
  if (a.kind == ack_kind::ack && !restarted) return;
  // A gap, a target without state for us, or a restarted target: resend what is unacknowledged,
  // once per kResendIntervalMs whatever asks (a burst of requests, or a target acking resyncs or
  // alternating incarnations without end, would otherwise fill the next hop with duplicates).
  if (now_ms() - f.resend_ms < kResendIntervalMs) return;
  flow_resend(f);
}

// Karn's rule: only a message sent once gives a sample (an acknowledgement of a resent one may
// answer either copy). The sample includes the time the message queued behind others: a path
// that is slow rather than broken must not look lossy (a resend would only lengthen the queue).
void node::impl::flow_sample_rtt(tx_flow& f, uint64_t through) {
  if (f.entries.empty() || through < f.entries.front().seq) return;
  const uint64_t idx = through - f.entries.front().seq;
  if (idx >= f.entries.size()) return;
  const uint64_t sent_ms = f.entries[idx].deadline_ms - cfg.delivery_timeout_ms;
  if (f.resend_ms >= sent_ms) return;
  const uint64_t sample = now_ms() - sent_ms;
  const uint64_t s = f.srtt_ms == 0 ? sample : (uint64_t{7} * f.srtt_ms + sample) / 8;
  f.srtt_ms = static_cast<uint32_t>(std::min<uint64_t>(s, cfg.delivery_timeout_ms));
}

// validate() bounds resend_timeout_ms and delivery_timeout_ms (which bounds srtt_ms) to one day:
// twice the round trip, its 8x and the doubled backoff below stay within 32 bits.
uint32_t node::impl::flow_base_rto(const tx_flow& f) const {
  return std::max(cfg.resend_timeout_ms, 2 * f.srtt_ms);
}

void node::impl::flow_drop_notice(bus_id target, uint64_t seq, errc why) {
  auto it = tx_flows.find(target);
  if (it == tx_flows.end()) return;
  tx_flow& f = it->second;
  if (f.entries.empty() || seq < f.entries.front().seq || seq >= f.next_seq) return;
  if ((why == errc::unknown_route || why == errc::not_connected) &&
      f.entries[seq - f.entries.front().seq].any) {
    detail::fan_departed(*this, target);  // "any node": no waiting for the chosen one to return
    return;
  }
  if (!final_refusal(why, f.peer_incarnation != 0)) {
    // A transient drop (a full queue, a link down at the relay): go back to it, once per burst of
    // notices (the ones after it were dropped too, and are resent with it).
    if (seq >= f.resend_from &&
        now_ms() - f.resend_ms < std::max<uint64_t>(kResendIntervalMs, f.srtt_ms)) {
      return;
    }
    f.resend_from = seq;
    f.resend_ms = now_ms();
    if (seq < f.next_unsent) f.next_unsent = seq;
    flow_pump(f);
    return;
  }
  tx_entry& e = f.entries[seq - f.entries.front().seq];
  if (e.settled) return;
  e.settled = true;
  defer_report(e.message_id, target, why, true);
  f.need_sync = true;
  flow_settle_front(f, 0, errc::ok);
  if (drained_to_half(cfg, f)) {
    f.user_blocked = false;
    fire(cbs.on_writable, target);
  }
}

// A flow with nothing to send or settle, idle for flow_idle_ms, goes (its sequence lives on in
// flow_seq_floor). One that met a full queue stays until it has been told (on_writable), and one
// with a reservation open stays until it is committed or cancelled.
bool node::impl::forget_idle_flow(const tx_flow& f, uint64_t now) {
  if (!f.entries.empty() || f.blocked || f.user_blocked) return false;
  if (prep.open && prep.flow == &f) return false;  // a caller that let the loop run meanwhile
  if (now - f.last_progress_ms < cfg.flow_idle_ms) return false;
  flow_seq_floor = std::max(flow_seq_floor, f.next_seq);
  if (cached_flow == &f) cached_flow = nullptr;
  return true;
}

void node::impl::flows_tick(uint64_t now) {
  std::vector<bus_id> writable;  // told after the walk: a send from on_writable may add a flow
  for (auto it = tx_flows.begin(); it != tx_flows.end();) {
    tx_flow& f = it->second;
    if (forget_idle_flow(f, now)) {
      it = tx_flows.erase(it);
      continue;
    }
    ++it;
    // Deadlines grow with the sequence: the expired ones are at the front.
    bool expired = false;
    for (size_t i = 0; i < f.entries.size() && f.entries[i].deadline_ms <= now; ++i) {
      tx_entry& e = f.entries[i];
      if (e.settled) continue;
      e.settled = true;
      expired = true;
      defer_report(e.message_id, f.target, errc::timeout, true);
    }
    if (expired) {
      f.need_sync = true;
      flow_settle_front(f, 0, errc::ok);
      if (drained_to_half(cfg, f)) {
        f.user_blocked = false;
        writable.push_back(f.target);
      }
    }
    if (f.entries.empty()) {
      // Quiet for a second: what a burst grew goes, unless a reservation is open in its store (a
      // caller that let the loop run with it open: its pointer must stay valid until commit).
      if (now - f.last_progress_ms > 1000 && !(prep.open && prep.flow == &f)) {
        if (f.store.cap > detail::kFlowStoreMin) f.store = {};
        if (f.entries.capacity() > detail::kFlowEntriesKept) f.entries = {};
      }
      continue;
    }
    if (now - std::max(f.last_progress_ms, f.resend_ms) >= f.rto_ms) {
      f.rto_ms = std::min(f.rto_ms * 2, flow_base_rto(f) * kMaxRtoFactor);
      flow_probe(f);
    }
  }
  if (stop_flush_until != 0 &&
      (now >= stop_flush_until || counters.flow_unacked_now == 0 || !any_registered_link())) {
    close_links_for_stop();
  }
  const uint64_t rx_idle_ms =
      std::max<uint64_t>(cfg.flow_idle_ms, uint64_t{2} * cfg.delivery_timeout_ms);
  for (auto it = rx_flows.begin(); it != rx_flows.end();) {
    if (!it->second.queued && now - it->second.last_rx_ms > rx_idle_ms) {
      if (cached_rx == &it->second) cached_rx = nullptr;
      it = rx_flows.erase(it);
    } else {
      ++it;
    }
  }
  for (const bus_id id : writable) {
    if (dead) return;
    fire(cbs.on_writable, id);
  }
}

node_counters node::impl::counters_now() const {
  node_counters c = counters;
  c.flow_targets = tx_flows.size();
  c.flow_sources = rx_flows.size();
  for (const auto& [id, f] : tx_flows) {
    c.flow_buffer_bytes += f.store.cap + f.entries.capacity() * sizeof(tx_entry);
  }
  return c;
}

void node::impl::flows_route_changed(bool lost) {
  for (auto& [id, f] : tx_flows) {
    if (f.entries.empty()) continue;
    // A lost link may have taken unacknowledged messages with it: send them again (the target
    // drops what it has). A new link: send what waits.
    if (lost) {
      flow_resend(f);
    } else {
      flow_pump(f);
    }
  }
}

void node::impl::flows_stop() {
  for (auto& [id, f] : tx_flows) {
    for (size_t i = 0; i < f.entries.size(); ++i) {
      tx_entry& e = f.entries[i];
      if (!e.settled) defer_report(e.message_id, f.target, errc::closed, true);
      e.settled = true;
    }
    flow_settle_front(f, 0, errc::ok);
  }
  flow_blocked.clear();
}

// ------------------------------------------------------------------------------- target side --
namespace {

// The refusal of a sync message of a new source beyond max_flow_sources: the source is told.
void refuse_flow_source(node::impl& n, const proto::header& hd) {
  const uint64_t refused = ++n.counters.flow_sources_refused;
  n.send_drop_notice(hd, proto::reason::access_denied);
  if ((refused & (refused - 1)) != 0) return;  // logged at the 1st, 2nd, 4th, 8th ... refusal
  n.log(log_level::warn,
        "refusing flow data from 0x%" PRIx64 ": max_flow_sources (%zu) sources kept here (%" PRIu64
        " refused so far)",
        hd.source, n.cfg.max_flow_sources, refused);
}

// The position kept for hd.source, made for a sync message. nullptr: there is none, and the
// message was answered without one. A message that is not sync is asked to resync, and no state
// is made for it (the answer is a sync message, which makes it): forged source ids cannot grow
// the table, a resync per source and epoch goes at most every kNackIntervalMs. A sync message
// while max_flow_sources positions are kept is refused: its source is told (access_denied, final:
// reported), the refusal counted and logged.
rx_flow* rx_flow_of(node::impl& n, const proto::header& hd, uint64_t epoch, bool sync) {
  if (n.cached_rx != nullptr && n.cached_rx_source == hd.source) return n.cached_rx;
  auto it = n.rx_flows.find(hd.source);
  if (it == n.rx_flows.end()) {
    if (!sync) {
      ++n.counters.flow_resyncs;
      if (n.resync_limit.allow(hd.source, epoch, n.now_ms(), kNackIntervalMs) &&
          (n.state == node::impl::run_state::running ||
           n.state == node::impl::run_state::stopping)) {
        rx_flow none;
        none.resync_epoch = epoch;
        none.kind = static_cast<uint8_t>(ack_kind::resync);
        n.send_flow_ack(hd.source, none);
      }
      return nullptr;
    }
    if (n.rx_flows.size() >= n.cfg.max_flow_sources) {
      refuse_flow_source(n, hd);
      return nullptr;
    }
    it = n.rx_flows.emplace(hd.source, rx_flow{}).first;
  }
  n.cached_rx = &it->second;  // unordered_map: stays valid until erased
  n.cached_rx_source = hd.source;
  return n.cached_rx;
}

// Whether a message of `epoch` goes on to the in-order checks (the flow now at that epoch), or was
// answered here. An epoch the flow left is stale (a dead incarnation's message, late) — unless
// the current epoch has sent nothing since an earlier sync message of a left epoch, at least
// resend_timeout_ms ago: a dead incarnation's late messages are few and come together, while a
// live source sends its first unacknowledged message flagged sync again and again until it is
// acknowledged. That epoch is live: taken back at the position it had, so nothing is delivered
// twice. So one late message cannot wedge a live flow (docs/bus.md "Flows").
bool rx_epoch(node::impl& n, rx_flow& r, const proto::header& hd, uint64_t epoch, bool sync) {
  const uint64_t now = n.now_ms();
  if (r.epoch != epoch) {
    const int i = r.left_index(epoch);
    if (i >= 0) {
      if (!sync || !r.stale_seen || now - r.stale_since_ms < n.cfg.resend_timeout_ms) {
        if (sync && !r.stale_seen) {
          r.stale_seen = true;
          r.stale_since_ms = now;
        }
        ++n.counters.flow_stale;  // not heard from: a flow only stale ones come to is forgotten
        return false;
      }
      r.switch_to(epoch, r.left[static_cast<size_t>(i)].through);
    } else if (!sync) {
      // No state for this epoch (we restarted, or forgot it): the source must resend from its
      // first unacknowledged message with flag_sync; this one is dropped (it will come again).
      ++n.counters.flow_resyncs;
      r.last_rx_ms = now;
      r.resync_epoch = epoch;
      n.queue_ack(hd.source, r, ack_kind::resync);
      return false;
    } else {
      r.switch_to(epoch, hd.sequence - 1);
    }
  }
  r.last_rx_ms = now;
  r.stale_seen = false;
  return true;
}

}  // namespace

void node::impl::on_flow_data(link* from, const proto::header& hd, const uint8_t* body) {
  proto::data_body d;
  uint64_t epoch = 0;
  if (proto::parse_flow_data(body, hd.body_len, &d, &epoch) != errc::ok) {
    bad_body(from, hd, "bad flow data body");
    return;
  }
  if (hd.sequence == 0) {
    // Sequences start at 1. Taken (a sync message's position is its sequence - 1), 0 would put
    // the flow at the last sequence there is: every later message of it a duplicate. From the
    // peer itself a protocol error; relayed, the link that brought it is not to blame.
    if (from != nullptr && from->peer != nullptr && from->peer->id == hd.source) {
      protocol_violation(from, "flow data with sequence 0");
    } else {
      ++counters.protocol_errors;
    }
    return;
  }
  const bool sync = (hd.flags & proto::flag_sync) != 0;
  rx_flow* rp = rx_flow_of(*this, hd, epoch, sync);
  if (rp == nullptr || !rx_epoch(*this, *rp, hd, epoch, sync)) return;
  rx_flow& r = *rp;
  if (hd.sequence <= r.through) {
    ++counters.flow_duplicates;
    queue_ack(hd.source, r, ack_kind::ack);  // the source may have missed the acknowledgement
    return;
  }
  if (hd.sequence != r.through + 1 && !sync) {
    ++counters.flow_out_of_order;
    queue_ack(hd.source, r, ack_kind::gap);
    return;
  }
  if (state == run_state::stopping && (hd.flags & proto::flag_call) != 0 && d.size != 0 &&
      d.payload[0] == static_cast<uint8_t>(proto::call_kind::request)) {
    // A stopping node could not answer it (its sends are refused): left to its successor, not
    // delivered or acknowledged, the position not past it (docs/bus.md "Planned restart").
    return;
  }
  r.through = hd.sequence;
  ++r.unacked;
  ++counters.data_received;
  queue_ack(hd.source, r, ack_kind::ack);
  deliver(hd.source, hd.flags, d.user_type, d.payload, d.size);
  // A long run of messages in one read: acknowledge on the way (the source's buffer drains).
  if (r.unacked >= cfg.ack_every && !dead) send_flow_ack(hd.source, r);
}

void node::impl::queue_ack(bus_id source, rx_flow& r, ack_kind k) {
  if (k != ack_kind::ack) {
    // Ask for a resend at most every kNackIntervalMs per flow; plain acknowledgements meanwhile.
    if (now_ms() - r.last_nack_ms < kNackIntervalMs) {
      k = ack_kind::ack;
    } else {
      r.last_nack_ms = now_ms();
    }
  }
  if (static_cast<uint8_t>(k) > r.kind) r.kind = static_cast<uint8_t>(k);
  if (r.queued) return;
  r.queued = true;
  ack_queue.push_back(source);
  if (h != nullptr && ack_queue.size() == 1) {
    uv_check_start(&h->acks, &impl::on_ack_check);
  }
}

void node::impl::send_flow_ack(bus_id to, rx_flow& r) {
  uint8_t m[proto::kHeaderSize + proto::kFlowAckSize];
  proto::header hd = make_header(msg_type::flow_ack, to, 0);
  hd.body_len = proto::kFlowAckSize;
  proto::encode_header(hd, m);
  // A resync answers the epoch of the message that asked for it, with no position in it.
  const bool resync = r.kind == static_cast<uint8_t>(ack_kind::resync);
  proto::encode_flow_ack({resync ? r.resync_epoch : r.epoch, incarnation, resync ? 0 : r.through,
                          static_cast<ack_kind>(r.kind)},
                         m + proto::kHeaderSize);
  r.unacked = 0;
  r.kind = 0;
  const const_buffer b{m, sizeof m};
  // Best effort: a lost acknowledgement is repaired by the source's resend (and our duplicate
  // acknowledgement of it).
  if (route_reply(to, &b, sizeof m) == errc::ok) ++counters.flow_acks_sent;
}

void node::impl::on_ack_check(uv_check_t* c) {
  auto* n = static_cast<impl*>(c->data);
  if (!n->dead) n->flush_acks();
}

void node::impl::flush_acks() {
  std::vector<bus_id> ids;
  ids.swap(ack_queue);
  for (bus_id id : ids) {
    auto it = rx_flows.find(id);
    if (it == rx_flows.end()) continue;
    it->second.queued = false;
    if (state == run_state::running || state == run_state::stopping) {
      send_flow_ack(id, it->second);
    }
  }
  if (ack_queue.empty() && h != nullptr) uv_check_stop(&h->acks);
  if (ack_queue.empty()) {
    ids.clear();
    ack_queue.swap(ids);  // keep the capacity: no allocation per batch
  }
}

// ------------------------------------------------------------------------------- handover --
namespace {

// "UVF2", then the id of the node the positions are of: a blob handed to another id would make it
// drop its sources' first messages as duplicates (each flow's sequence starts at 1 per target).
// Each entry: source, epoch, through, then the two left epochs with their positions (without
// them, a late message of a dead incarnation would take the flow from the live one).
constexpr uint8_t kPositionsMagic[4] = {'U', 'V', 'F', '2'};
constexpr size_t kPositionsHead = 16;  // magic, u64 node id, u32 count
constexpr size_t kPositionsEntry = 56;
// The previous release's blob: "UVFP", the node id, u32 count, entries without the left epochs.
constexpr uint8_t kPositionsMagicV1[4] = {'U', 'V', 'F', 'P'};
constexpr size_t kPositionsEntryV1 = 24;

std::string id_hex(bus_id id) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, id);
  return buf;
}

}  // namespace

std::vector<uint8_t> node::impl::flow_positions_export() const {
  std::vector<uint8_t> out(kPositionsHead + rx_flows.size() * kPositionsEntry);
  std::memcpy(out.data(), kPositionsMagic, 4);
  store_le<uint64_t>(out.data() + 4, self);
  store_le<uint32_t>(out.data() + 12, static_cast<uint32_t>(rx_flows.size()));
  uint8_t* e = out.data() + kPositionsHead;
  for (const auto& [source, r] : rx_flows) {
    const uint64_t v[7] = {source,           r.epoch,           r.through,
                           r.left[0].epoch,  r.left[0].through, r.left[1].epoch,
                           r.left[1].through};
    for (const uint64_t x : v) {
      store_le<uint64_t>(e, x);
      e += 8;
    }
  }
  return out;
}

errc detail::parse_flow_positions(uint64_t self, const uint8_t* p, size_t n,
                                  std::vector<flow_position>* out, std::string* why) {
  // This release's blob names its node and carries the left epochs; the previous releases' (one
  // naming its node, and before it u32 count and the entries) are still taken, so a rolling
  // upgrade hands its positions over.
  constexpr size_t head = 4;
  size_t entry = kPositionsEntryV1;
  const size_t total = n;
  // "UVF" and a letter: a blob naming its node ("UVF2", "UVFP"), or a later release's. (An oldest
  // form's count starting so would announce millions of positions.)
  if (p != nullptr && n >= 4 && std::memcmp(p, kPositionsMagic, 3) == 0) {
    const std::string magic(p, p + 4);
    if (p[3] != kPositionsMagic[3] && p[3] != kPositionsMagicV1[3]) {
      *why = "is a later release's flow positions (magic " + magic +
             "): this one takes UVF2 and earlier";
      return errc::protocol_error;
    }
    if (n < kPositionsHead) {
      *why = "is cut short: " + std::to_string(n) + " bytes, less than a \"" + magic +
             "\" blob's head (" + std::to_string(kPositionsHead) + ")";
      return errc::protocol_error;
    }
    const auto of = load_le<uint64_t>(p + 4);
    if (of != self) {
      *why = "are node " + id_hex(of) + "'s flow positions, not this node's (" + id_hex(self) + ")";
      return errc::invalid_argument;
    }
    if (p[3] == kPositionsMagic[3]) entry = kPositionsEntry;
    p += 12;
    n -= 12;
  }
  if (p == nullptr || n < head || n != head + size_t{load_le<uint32_t>(p)} * entry) {
    *why = "is not a node::flow_positions() blob";
    if (p != nullptr && n >= head) {
      const uint64_t want = (total - n) + head + uint64_t{load_le<uint32_t>(p)} * entry;
      *why += " (" + std::to_string(load_le<uint32_t>(p)) +
              " positions announced: " + std::to_string(want) + " bytes, not " +
              std::to_string(total) + "; cut short or garbled)";
    }
    return errc::protocol_error;
  }
  const auto count = load_le<uint32_t>(p);
  out->clear();
  out->reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t* e = p + head + size_t{i} * entry;
    flow_position& f = out->emplace_back();
    f.source = load_le<uint64_t>(e);
    f.epoch = load_le<uint64_t>(e + 8);
    f.through = load_le<uint64_t>(e + 16);
    if (entry == kPositionsEntry) {
      for (size_t k = 0; k < f.left.size(); ++k) {
        f.left[k] = {load_le<uint64_t>(e + 24 + 16 * k), load_le<uint64_t>(e + 32 + 16 * k)};
      }
    }
  }
  return errc::ok;
}

void node::impl::flow_positions_import() {
  const std::vector<uint8_t>& blob = cfg.inherit_flow_positions;
  std::vector<detail::flow_position> got;
  std::string why;
  if (blob.empty() ||
      detail::parse_flow_positions(self, blob.data(), blob.size(), &got, &why) != errc::ok) {
    return;  // none (a blob it would refuse, validate() refused first)
  }
  // start() updated the loop's clock first: the positions count as heard from now, however long
  // the new process blocked before it (in handover_receive()).
  for (const detail::flow_position& f : got) {
    rx_flow& r = rx_flows[f.source];
    r.epoch = f.epoch;
    r.through = f.through;
    r.left = f.left;
    r.last_rx_ms = now_ms();
  }
  cached_rx = nullptr;
}

}  // namespace uvbus
