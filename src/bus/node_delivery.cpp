// Bus node, delivery: send_data, transmission over stream or shared memory, the pending queues
// of links that are not up yet, and the timers (heartbeats, deadlines, deferred callbacks).
#include "bus/node_impl.h"

namespace uvbus {

using proto::msg_type;

// -------------------------------------------------------------------------------- transmit --
void node::impl::strip_trace(const const_buffer* bufs, size_t n) {
  proto::header hd;
  std::memcpy(strip_head, bufs[0].data, proto::kHeaderSize);
  hd.body_len = load_le<uint32_t>(strip_head + 4) - static_cast<uint32_t>(proto::kTraceSize);
  strip_head[2] &= static_cast<uint8_t>(~proto::flag_trace);
  store_le<uint32_t>(strip_head + 4, hd.body_len);
  strip_spans.clear();
  strip_spans.push_back({strip_head, proto::kHeaderSize});
  size_t skip = proto::kHeaderSize + proto::kTraceSize;  // header and trace block: not copied
  for (size_t i = 0; i < n; ++i) {
    const auto* d = static_cast<const uint8_t*>(bufs[i].data);
    if (bufs[i].size <= skip) {
      skip -= bufs[i].size;
      continue;
    }
    strip_spans.push_back({d + skip, bufs[i].size - skip});
    skip = 0;
  }
}

errc node::impl::transmit(peer_ep* p, const const_buffer* bufs, size_t n, uint64_t tag,
                          bus_id target, bool* via_shm) {
  // Traffic in either direction keeps a sibling link from being dropped as idle.
  if (p->kind == peer_kind::sibling) p->last_data_ms = now_ms();
  // Flow messages and acknowledgements need a version-3 link (an older peer would close it); a
  // trace context a version-4 one (it is left out below that).
  if (n != 0 && bufs[0].size >= proto::kHeaderSize) {
    const auto* hb = static_cast<const uint8_t*>(bufs[0].data);
    // Our own data waits behind what a pending queue left in p's backlog (flush_queue): in order.
    if (!p->backlog.q.empty() && !p->draining_backlog && load_le<uint64_t>(hb + 8) == self &&
        (hb[1] == static_cast<uint8_t>(msg_type::data) ||
         hb[1] == static_cast<uint8_t>(msg_type::command))) {
      size_t total = 0;
      for (size_t i = 0; i < n; ++i) total += bufs[i].size;
      const errc e = enqueue(&p->backlog, bufs, n, total, tag, target);
      if (e == errc::queue_full) full_hop = p;  // on_writable once the backlog has gone out
      return e;
    }
    if (((hb[2] & proto::flag_flow) != 0 || hb[1] == static_cast<uint8_t>(msg_type::flow_ack)) &&
        version_of(p) < 3) {
      return errc::version_mismatch;
    }
    if ((hb[2] & proto::flag_call) != 0 && version_of(p) < 5) return errc::version_mismatch;
    if ((hb[2] & proto::flag_trace) != 0 && version_of(p) < 4) {
      strip_trace(bufs, n);
      bufs = strip_spans.data();
      n = strip_spans.size();
    }
  }
  if (p->shm) {
    // Sends of one loop turn go into the ring as one batch at the end of the turn (docs/shm.md,
    // "Coalescing writer"); a next-hop report needs its record in the ring now (sendv_now).
    if (!p->shm->coalescing()) (void)p->shm->coalesce(loop);
    if (p->shm_tagged) {  // the writer's tag first (access tokens; docs/security.md)
      sec->tagged.assign(1, const_buffer{p->shm_envelope, sizeof p->shm_envelope});
      sec->tagged.insert(sec->tagged.end(), bufs, bufs + n);
      bufs = sec->tagged.data();
      n = sec->tagged.size();
    }
    const bool now = tag != 0 && (tag & kTagE2e) == 0;
    errc e = now ? p->shm->sendv_now(bufs, n) : p->shm->sendv(bufs, n);
    // abandoned: we stalled mid-record (preempted past the reader's timeout) and the reader
    // skipped it, so the message was NOT delivered and sending it again cannot duplicate it.
    for (int retry = 0; e == errc::abandoned && retry < 3; ++retry) {
      ++counters.shm_abandoned_retries;
      e = now ? p->shm->sendv_now(bufs, n) : p->shm->sendv(bufs, n);
    }
    if (e == errc::ok) {
      if (via_shm != nullptr) *via_shm = true;
      if (tag != 0) channel_outcome(tag, target, errc::ok);
      return e;
    }
    if (e == errc::queue_full) full_hop = p;
    if (e != errc::not_connected) return e;
    // The peer's reader is gone (it restarted or is dying): fall back to its stream link. Logged
    // from the loop: this may run inside send_data(), where no callback may fire (an on_log that
    // sent to this peer came back here, the ring still set, for ever).
    p->shm.reset();
    log_later(log_level::info, "peer 0x%" PRIx64 ": shared memory reader gone, using the stream",
              p->id);
  }
  if (p->lk == nullptr || p->lk->state != link_state::registered) return errc::not_connected;
  // Without on_report there is nothing to pair the channel's reports with.
  const uint64_t ctag = cbs.on_report ? tag : 0;
  if (p->lk->codec != 0) compress_out(p->lk, &bufs, &n);
  uint64_t seq = 0;
  const errc e = streams->sendv(p->lk->conn, bufs, n, &seq);
  if (e == errc::ok && ctag != 0) p->lk->reports.push_back({seq, ctag, target});
  if (e == errc::queue_full) full_hop = p;  // the application's sends mark it (user_route_out)
  if (via_shm != nullptr) *via_shm = false;
  return e;
}

// A queue_full from a hop's stream link or ring owes the application on_writable(hop) only when its
// own send got it: relayed, resent and internal messages that meet a full queue tell nobody.
errc node::impl::user_route_out(bus_id target, const const_buffer* bufs, size_t n, size_t total,
                                uint64_t tag, bool* via_shm) {
  // Reset first: relayed traffic sets it too, and a full ring or pending queue leaves it alone.
  full_hop = nullptr;
  const errc e = route_out(target, bufs, n, total, tag, via_shm);
  return e == errc::queue_full && full_hop != nullptr ? blocked_by(full_hop) : e;
}

// A stream link tells when it drains (s_writable). A ring has no wake-up for room: the peer joins
// the relays' retry list, whose poll (retry_shm_overflow) owes it on_writable once the ring has
// room again. Posted tasks' sends are the node's own: nobody waits for them.
errc node::impl::blocked_by(peer_ep* p) {
  if (posting) return errc::queue_full;
  p->user_blocked = true;
  if (p->shm && std::find(shm_overflow.begin(), shm_overflow.end(), p) == shm_overflow.end()) {
    shm_overflow.push_back(p);
    arm_idle();
  }
  return errc::queue_full;
}

errc node::impl::transmit_bytes(peer_ep* p, const std::vector<uint8_t>& m, uint64_t tag,
                                bus_id target) {
  const const_buffer b{m.data(), m.size()};
  return transmit(p, &b, 1, tag, target);
}

peer_ep* node::impl::find_peer(bus_id id) {
  auto it = peers.find(id);
  return it == peers.end() ? nullptr : it->second.get();
}

peer_ep* node::impl::parent_peer() {
  if (parent_link == nullptr || parent_link->state != link_state::registered) return nullptr;
  return parent_link->peer;
}

bool node::impl::queue_allowed(const pending_queue& q, size_t bytes) const {
  return q.q.size() < cfg.pending_max_messages && q.bytes + bytes <= cfg.pending_max_bytes;
}

errc node::impl::enqueue(pending_queue* q, const const_buffer* bufs, size_t n, size_t total,
                         uint64_t tag, bus_id target) {
  if (cfg.pending_max_messages == 0) return errc::not_connected;
  if (!queue_allowed(*q, total)) return errc::queue_full;
  pending_msg m;
  m.bytes.resize(total);
  size_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    if (bufs[i].size != 0) std::memcpy(m.bytes.data() + off, bufs[i].data, bufs[i].size);
    off += bufs[i].size;
  }
  m.tag = tag;
  m.target = target;
  m.deadline_ms = now_ms() + cfg.pending_timeout_ms;
  q->bytes += total;
  q->q.push_back(std::move(m));
  ++counters.pending_now;
  return errc::ok;
}

void node::impl::fail_queue(pending_queue* q, errc why) {
  while (!q->q.empty()) {
    pending_msg& m = q->q.front();
    channel_outcome(m.tag, m.target, why);
    q->bytes -= m.bytes.size();
    q->q.pop_front();
    --counters.pending_now;
  }
}

void node::impl::flush_queue(pending_queue* q, peer_ep* p) {
  while (!q->q.empty()) {
    pending_msg& m = q->q.front();
    q->bytes -= m.bytes.size();
    // A require_response message reported while it waited (its response timeout passed) is
    // withdrawn: its one report said it was not delivered.
    if (still_owed(m.tag)) {
      // What the link's queue does not take waits in p's backlog, all after it too (in order),
      // and goes as the link drains (drain_backlog), still counted as pending.
      const errc e =
          p->backlog.q.empty() ? transmit_bytes(p, m.bytes, m.tag, m.target) : errc::queue_full;
      if (e == errc::queue_full) {
        p->backlog.bytes += m.bytes.size();
        p->backlog.q.push_back(std::move(m));
        q->q.pop_front();
        continue;
      }
      if (e != errc::ok) channel_outcome(m.tag, m.target, e);
    }
    q->q.pop_front();
    --counters.pending_now;
  }
  // A full ring has no wake-up: its retry poll drains the backlog too (retry_shm_overflow).
  if (!p->backlog.q.empty() && p->shm &&
      std::find(shm_overflow.begin(), shm_overflow.end(), p) == shm_overflow.end()) {
    shm_overflow.push_back(p);
    arm_idle();
  }
}

errc node::impl::route_lookup(bus_id target, const const_buffer* bufs, size_t n, size_t total,
                              uint64_t tag, bool* via_shm) {
  const detail::route r = table.lookup(target);
  if (r.kind == hop::direct || r.kind == hop::child) {
    peer_ep* p = find_peer(r.next);
    if (p == nullptr) return errc::unknown_route;
    cached_target = target;
    cached_hop = p;
    return transmit(p, bufs, n, tag, target, via_shm);
  }
  if (r.kind == hop::self) return errc::invalid_argument;
  if (r.kind == hop::none && !table.owns(target)) {
    detail::sibling_entry* s = disc_sibling(target);  // node_discovery.cpp
    if (s != nullptr && s->state != sib_state::via_parent) {
      return enqueue(&s->pending, bufs, n, total, tag, target);
    }
  }
  if (r.kind == hop::none && (table.owns(target) || !has_parent())) {
    return errc::unknown_route;
  }
  // Up through the parent, or directly to a sibling (never for a tool: node_config.h).
  const bool direct = cfg.sibling_direct && !cfg.join_as_tool;
  if (direct && target != parent_id && parent_peer() != nullptr && !table.owns(target)) {
    auto it = siblings.find(target);
    if (it == siblings.end()) {
      it = siblings.emplace(target, sibling_entry{}).first;
      if (start_lookup(target) != errc::ok) {
        it->second.state = sib_state::via_parent;
        it->second.until_ms = now_ms() + kSiblingRetryMs;
      }
    }
    sibling_entry& s = it->second;
    if (s.state == sib_state::via_parent && now_ms() >= s.until_ms) {
      s.state = sib_state::lookup;
      if (start_lookup(target) != errc::ok) {
        s.state = sib_state::via_parent;
        s.until_ms = now_ms() + kSiblingRetryMs;
      }
    }
    // Queueing off (not_connected): through the parent meanwhile, as while it is not direct.
    if (s.state != sib_state::via_parent) {
      const errc e = enqueue(&s.pending, bufs, n, total, tag, target);
      if (e != errc::not_connected) return e;
    }
  }
  peer_ep* pp = parent_peer();
  if (pp != nullptr) {
    // Only cache the parent hop when no sibling entry could claim this target later.
    if (!direct || table.owns(target) || target == parent_id) {
      cached_target = target;
      cached_hop = pp;
    }
    return transmit(pp, bufs, n, tag, target, via_shm);
  }
  if (parent_failed) return parent_refusal;  // refused for good: not retriable
  return enqueue(&parent_pending, bufs, n, total, tag, target);
}

// ------------------------------------------------------------------------------- send_data --
errc node::impl::send_data(bus_id target, uint32_t type, const const_buffer* spans, size_t count,
                           const send_options& opt, uint64_t* message_id, uint64_t seq) {
  if (state != run_state::running)
    return state == run_state::idle ? errc::wrong_state : errc::closed;
  if (prep.open || target == 0) return prep.open ? errc::wrong_state : errc::invalid_argument;
  if (count > kMaxSpans || (spans == nullptr && count != 0)) return errc::invalid_argument;
  size_t size = 0;
  for (size_t i = 0; i < count; ++i) {
    if (spans[i].data == nullptr && spans[i].size != 0) return errc::invalid_argument;
    size += spans[i].size;
  }
  if (size > cfg.message_limit) return errc::message_too_large;
  if (opt.trace != nullptr && !opt.trace->valid()) return errc::invalid_argument;
  const bool flows = cfg.delivery == delivery_mode::end_to_end;
  // A message to ourselves is reported once delivered (or closed by stop()) under end_to_end, as
  // a require_response message; across the bus end_to_end makes require_response moot.
  const bool rr = target == self ? opt.require_response || flows : opt.require_response && !flows;
  // max_outstanding_responses bounds require_response messages (node_config.h). A plain message to
  // ourselves waits as one only until the next loop turn delivers it: not refused (queue_full with
  // no on_writable to follow), bounded as under next-hop delivery by what one loop turn sends.
  if (rr && opt.require_response && replies.size() >= cfg.max_outstanding_responses)
    return errc::queue_full;
  if (seq == 0) seq = take_seq();
  const uint64_t tag = rr ? (seq | kTagE2e) : (cbs.on_report ? seq : 0);
  if (target != self && flows) {
    bool via_shm = false;
    const errc e = flow_send(target, type, spans, count, size, opt, seq, &via_shm);
    return flow_sent(e, via_shm, seq, message_id);
  }
  if (target == self) {
    self_msg m{self, type, {}, seq, rr, false, {}};
    m.call_flag = send_call_flag;
    if (opt.trace != nullptr) {
      m.has_trace = true;
      m.trace = *opt.trace;
    }
    m.bytes.reserve(size);
    for (size_t i = 0; i < count; ++i) {
      const auto* b = static_cast<const uint8_t*>(spans[i].data);
      m.bytes.insert(m.bytes.end(), b, b + spans[i].size);
    }
    deferred_self.push_back(std::move(m));
    // The reply wait run_deferred() consumes on delivery; stop() and the response timeout report
    // through it and withdraw the message.
    if (rr) replies[seq] = pending_reply{self, now_ms() + cfg.response_timeout_ms, {}, seq};
    arm_idle();
    ++counters.data_sent;
    if (message_id != nullptr) *message_id = seq;
    return errc::ok;
  }
  uint8_t head[kBusOverhead + proto::kTraceSize];
  const size_t trace = opt.trace != nullptr ? proto::kTraceSize : 0;
  proto::header hd = make_header(msg_type::data, target, seq);
  if (rr) hd.flags |= proto::flag_require_response;
  if (trace != 0) hd.flags |= proto::flag_trace;
  hd.flags |= send_call_flag;
  if (opt.ttl != 0) hd.ttl = opt.ttl;
  hd.body_len = static_cast<uint32_t>(trace + proto::kDataPrefix + size);
  proto::encode_header(hd, head);
  if (trace != 0) proto::encode_trace(*opt.trace, head + proto::kHeaderSize);
  proto::encode_data_prefix(type, head + proto::kHeaderSize + trace);
  const size_t head_size = kBusOverhead + trace;
  gather.resize(count + 1);
  gather[0] = {head, head_size};
  for (size_t i = 0; i < count; ++i) gather[i + 1] = {spans[i].data, spans[i].size};
  // Register the reply wait first: a shm send reports success synchronously.
  if (rr) replies[seq] = pending_reply{target, now_ms() + cfg.response_timeout_ms, {}, seq};
  bool via_shm = false;
  // gather may be reused by a nested call (transmit does not re-enter), so pass a copy pointer.
  const errc e =
      user_route_out(target, gather.data(), gather.size(), head_size + size, tag, &via_shm);
  if (e != errc::ok) {
    if (rr) replies.erase(seq);
    return e;
  }
  ++counters.data_sent;
  if (via_shm) {
    ++counters.data_sent_shm;
  } else {
    ++counters.data_sent_stream;
  }
  if (message_id != nullptr) *message_id = seq;
  return errc::ok;
}

errc node::impl::send_command(bus_id target, proto::command_id cmd, const void* args, size_t size,
                              command_cb cb) {
  if (state != run_state::running)
    return state == run_state::idle ? errc::wrong_state : errc::closed;
  if (!cb || target == 0) return errc::invalid_argument;  // id 0: reserved
  if (size > cfg.message_limit) return errc::message_too_large;
  if (replies.size() >= cfg.max_outstanding_responses) return errc::queue_full;
  const uint64_t seq = take_seq();
  std::vector<uint8_t> body;
  proto::encode_command(static_cast<uint32_t>(cmd), args, size, &body);
  if (target == self) {
    std::string out =
        run_command(static_cast<uint32_t>(cmd), static_cast<const uint8_t*>(args), size);
    // Deliver from the loop, through the same reply path.
    replies[seq] = pending_reply{self, now_ms() + cfg.response_timeout_ms, std::move(cb), 0};
    std::vector<uint8_t> rb;
    proto::encode_command_reply(static_cast<uint32_t>(cmd), proto::reason::ok, out.data(),
                                out.size(), &rb);
    self_replies.emplace_back(seq, std::move(rb));
    arm_idle();
    return errc::ok;
  }
  const std::vector<uint8_t> m = proto::build(make_header(msg_type::command, target, seq), body);
  replies[seq] = pending_reply{target, now_ms() + cfg.response_timeout_ms, std::move(cb), 0};
  const const_buffer b{m.data(), m.size()};
  const errc e = user_route_out(target, &b, 1, m.size(), 0, nullptr);
  if (e != errc::ok) replies.erase(seq);
  return e;
}

// ---------------------------------------------------------------------------------- timers --
namespace {

// True for a closing link. A graceful close flushes the queue first; a peer that does not read
// would hold it (and stop()) for ever: after heartbeat_timeout_ms (its deadline_ms once closing)
// it is closed at once.
bool force_overdue_close(stream_channel* streams, detail::link* lk, uint64_t now) {
  if (lk->state != detail::link_state::closing) return false;
  if (now >= lk->deadline_ms) {
    lk->deadline_ms = UINT64_MAX;
    (void)streams->disconnect(lk->conn, disconnect_mode::force);
  }
  return true;
}

}  // namespace

// A next hop whose overflow has not moved for heartbeat_timeout_ms does not read: the links paused
// for it would otherwise stay paused for ever. What waits in its overflow is refused (queue_full:
// a drop notice, or a failed report, to each source), then the hop is closed, which resumes them.
void node::impl::close_stalled_hop(link* lk, uint64_t now) {
  peer_ep* p = lk->peer;
  log(log_level::warn,
      "%s 0x%" PRIx64 " has not read for %" PRIu64 " ms (%zu relayed messages waiting): dropping",
      detail::to_string(p->kind), p->id, now - p->overflow_moved_ms, p->overflow.size());
  // Each message leaves the overflow before it is refused: the refusal logs, and an on_log that
  // calls stop() empties the overflow (drop_relayed_for_stop).
  while (!p->overflow.empty()) {
    const std::vector<uint8_t> m = std::move(p->overflow.front());
    p->overflow_bytes -= m.size();
    p->overflow.pop_front();
    proto::header hd;
    if (proto::parse_header(m.data(), m.size(), &hd) == errc::ok) {
      relay_drop(hd, proto::reason::queue_full);
    } else {
      ++counters.forward_dropped;
    }
  }
  close_link(lk, errc::queue_full);
}

// Sibling entries: expired messages fail, idle entries go, and a sibling waited for is looked up
// again (after the walk: a lookup that fails logs, and on_log may send, adding an entry).
void node::impl::sibling_tick(uint64_t now) {
  std::vector<bus_id> ask;
  for (auto it = siblings.begin(); it != siblings.end();) {
    expire_queue(&it->second.pending, now);
    sibling_entry& s = it->second;
    // Waiting for a sibling to register with the parent: ask again, while anything waits for it.
    if (s.state == sib_state::waiting && !s.pending.q.empty() && now >= s.until_ms) {
      s.state = sib_state::lookup;
      ask.push_back(it->first);
    }
    const bool idle = s.state == sib_state::waiting || s.state == sib_state::via_parent;
    if (idle && now >= s.until_ms && s.pending.q.empty()) {
      it = siblings.erase(it);
    } else {
      ++it;
    }
  }
  for (bus_id id : ask) {
    if (dead) return;
    if (start_lookup(id) != errc::ok) sibling_via_parent(id, "lookup failed");
  }
}

void node::impl::tick() {
  const uint64_t now = now_ms();
  detail::fan_tick(*this, now);
  if (post_blocked) drain_posts();  // a full ring or pending queue has no wake-up of its own
  // A walk over a copy: a log line below runs on_log, which may send, and a send may dial a
  // sibling (a link added to `links`). Links leave `links` only from the channel's callbacks.
  // The copy's vector is kept between ticks (taken here, given back at the end of the walk), so
  // a tick allocates nothing once it has held every link.
  std::vector<link*> all = std::move(tick_links);
  all.clear();
  for (auto& [id, lk] : links) all.push_back(lk.get());
  std::vector<link*> expired;
  for (link* lk : all) {
    if (dead) return;
    if (force_overdue_close(streams.get(), lk, now)) continue;
    if (lk->state != link_state::registered) {
      if (now >= lk->deadline_ms) expired.push_back(lk);
      continue;
    }
    peer_ep* p = lk->peer;
    if (!p->backlog.q.empty()) expire_queue(&p->backlog, now);
    if (!p->overflow.empty() && now - p->overflow_moved_ms > cfg.heartbeat_timeout_ms) {
      close_stalled_hop(lk, now);
      continue;
    }
    // A link we stopped reading for back-pressure is not silent: we do not read its pings.
    if (!lk->paused && now - p->last_rx_ms > cfg.heartbeat_timeout_ms) {
      ++counters.heartbeat_timeouts;
      log(log_level::warn, "%s 0x%" PRIx64 " silent for %" PRIu64 " ms: dropping",
          detail::to_string(p->kind), p->id, now - p->last_rx_ms);
      close_link(lk, errc::timeout);
      continue;
    }
    if (p->kind == peer_kind::sibling && now - p->last_data_ms > cfg.sibling_idle_ms) {
      std::vector<uint8_t> b;
      proto::encode_bye({proto::reason::closing}, &b);
      (void)send_control(lk, make_header(msg_type::bye, p->id, 0), b);
      close_link(lk, errc::closed, disconnect_mode::graceful);
      continue;
    }
    if (now - p->last_ping_ms >= cfg.heartbeat_interval_ms) {
      p->last_ping_ms = now;
      uint8_t b[proto::kPingSize];
      proto::encode_ping({mono_ns()}, b);
      (void)send_control(lk, make_header(msg_type::ping, p->id, take_seq()), b, sizeof b);
    }
  }
  tick_links = std::move(all);
  for (link* lk : expired) {
    if (dead) return;
    log(log_level::warn, "connection %s: handshake timed out", streams->peer_url(lk->conn).c_str());
    close_link(lk, errc::timeout);
  }
  expire_queue(&parent_pending, now);
  flush_logs(now);
  flows_tick(now);  // may run on_writable
  if (dead) return;
  call_by_message.trim(now);
  grace_tick(now);
  dir_tick(now);
  if (dead) return;
  sibling_tick(now);
  // Replies: deadlines grow with the sequence only per kind, so scan everything (bounded by the
  // messages in flight with require_response, which the pending limits keep small).
  std::vector<std::pair<uint64_t, pending_reply>> late;
  for (auto it = replies.begin(); it != replies.end();) {
    if (now >= it->second.deadline_ms) {
      late.emplace_back(it->first, std::move(it->second));
      it = replies.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [seq, r] : late) {
    if (r.cb) {
      fire(r.cb, errc::timeout, nullptr, size_t{0});
    } else {
      defer_report(r.report_tag, r.target, errc::timeout, true);
    }
  }
}

void node::impl::expire_queue(pending_queue* q, uint64_t now) {
  while (!q->q.empty() && now >= q->q.front().deadline_ms) {
    pending_msg& m = q->q.front();
    channel_outcome(m.tag, m.target, errc::timeout);
    q->bytes -= m.bytes.size();
    q->q.pop_front();
    --counters.pending_now;
  }
}

namespace {

// Whether the application, refused by p's full ring, may send again: nothing left in the writer's
// stage and the ring at most half full (so that on_writable is not followed by the next refusal at
// once). A ring that was replaced by the stream link (its reader gone) has room too.
bool ring_has_room(const detail::peer_ep& p) {
  if (!p.shm) return true;
  if (p.shm->staged() != 0) return false;
  const shm_metrics m = p.shm->metrics();
  return m.fill_bytes <= m.capacity_bytes / 2;
}

// Retries relays blocked on a full ring (no wake-up exists for ring space), and tells the
// application whose sends a full ring refused when it has room: from the next loop turn while
// they move, else from a 1 ms timer (the idle handle ran the loop flat out).
void retry_shm_overflow(node::impl& n) {
  std::vector<detail::peer_ep*> ps = n.shm_overflow;
  std::vector<bus_id> writable;  // told after the walk: a send from on_writable may block again
  bool moved = false;
  for (detail::peer_ep* p : ps) {
    const size_t before = p->overflow.size() + p->backlog.q.size();
    n.drain_backlog(p);
    n.drain_overflow(p);
    moved = moved || p->overflow.size() + p->backlog.q.size() != before;
    const bool empty = p->overflow.empty() && p->backlog.q.empty();
    if (empty && p->user_blocked && ring_has_room(*p)) {
      p->user_blocked = false;
      writable.push_back(p->id);
    }
    if (empty && !p->user_blocked) {
      n.shm_overflow.erase(std::remove(n.shm_overflow.begin(), n.shm_overflow.end(), p),
                           n.shm_overflow.end());
    }
  }
  n.restart_shm_reader();
  if (!moved && writable.empty() && !n.shm_overflow.empty() && n.h != nullptr) {
    uv_timer_start(
        &n.h->ring, [](uv_timer_t* t) { static_cast<node::impl*>(t->data)->arm_idle(); }, 1, 0);
  }
  for (const bus_id id : writable) n.fire(n.cbs.on_writable, id);  // fire(): nothing once dead
}

// Tells the sources of the relayed messages rings' stages dropped (shm_unstaged), then one line.
void tell_unstaged(node::impl& n) {
  const std::vector<proto::header> hs = std::move(n.unstaged);
  n.unstaged.clear();
  for (const proto::header& hd : hs) n.relay_drop(hd, proto::reason::not_connected, false);
  n.log_later(log_level::warn,
              "%zu relayed messages staged for a shared-memory ring were dropped (its reader "
              "closed, or the ring stayed full): their sources were told",
              hs.size());
}

}  // namespace

void node::impl::run_deferred() {
  if (!shm_overflow.empty()) retry_shm_overflow(*this);
  if (dead) return;  // destroyed in on_writable (retry_shm_overflow): on_idle releases it
  if (!unstaged.empty()) tell_unstaged(*this);
  // Posts accepted before stop() are reported (closed), their tasks run, before on_down(closed).
  if (state == run_state::stopping) drain_posts_for_stop();
  if (!deferred_logs.empty()) {
    auto lines = std::move(deferred_logs);
    deferred_logs.clear();
    for (auto& [lv, text] : lines) fire(cbs.on_log, lv, text);
  }
  if (deferred_up) {
    deferred_up = false;
    fire(cbs.on_up, self);
  }
  if (!deferred_self.empty()) {
    std::vector<self_msg> msgs;
    msgs.swap(deferred_self);
    for (self_msg& m : msgs) {
      // A require_response message to ourselves already reported (timeout, stop) is withdrawn.
      if (m.require_response && replies.erase(m.seq) == 0) continue;
      ++counters.data_received;
      incoming = m.has_trace ? &m.trace : nullptr;
      deliver(m.source, m.call_flag, m.type, m.bytes.data(), m.bytes.size());
      incoming = nullptr;
      if (m.require_response || cbs.on_report) {
        defer_report(m.seq, self, errc::ok,
                     m.require_response || cfg.delivery == delivery_mode::end_to_end);
      }
    }
  }
  run_deferred_calls();
  detail::fan_run_deferred(*this);
  if (!self_replies.empty()) {
    auto rs = std::move(self_replies);
    self_replies.clear();
    for (auto& [seq, body] : rs) {
      auto it = replies.find(seq);
      if (it == replies.end()) continue;
      command_cb cb = std::move(it->second.cb);
      replies.erase(it);
      proto::command_reply_body r;
      if (proto::parse_command_reply(body.data(), body.size(), &r) == errc::ok && cb) {
        fire(cb, errc::ok, r.result, r.result_size);
      }
    }
  }
  if (!deferred_reports.empty()) {
    std::vector<delivery_report> rs;
    rs.swap(deferred_reports);
    for (const delivery_report& r : rs) {
      fire(cbs.on_report, r);
    }
    if (deferred_reports.empty()) {
      rs.clear();
      deferred_reports.swap(rs);  // keep the capacity: no allocation per message
    }
  }
  // on_down(closed) comes after everything owed: what a callback above deferred (stop() from
  // on_report fails the open calls and broadcasts) first gets another round.
  if (stop_done_pending && !dead && stop_settled()) {
    stop_done_pending = false;
    finish_stop();
  }
  if (deferred_reports.empty() && deferred_self.empty() && self_replies.empty() &&
      deferred_call_fail.empty() && fan->finished.empty() && deferred_logs.empty() &&
      !deferred_up && !stop_done_pending && h != nullptr &&
      (shm_overflow.empty() || uv_is_active(reinterpret_cast<uv_handle_t*>(&h->ring)))) {
    uv_idle_stop(&h->idle);
  }
}

bool node::impl::stop_settled() {
  return deferred_reports.empty() && deferred_self.empty() && self_replies.empty() &&
         deferred_call_fail.empty() && fan->finished.empty() && posts_drained();
}

}  // namespace uvbus
