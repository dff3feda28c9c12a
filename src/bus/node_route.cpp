// Bus node, routing: routed messages from links and the shared-memory ring, forwarding with
// back-pressure, and sibling lookups.

#include "bus/node_impl.h"

namespace uvbus {

using proto::msg_type;

namespace {

// Buffers of relayed messages that left an overflow, kept for the next ones: a relay whose next
// hop reads slower than its sources send overflows in steady state, and would otherwise allocate
// and free one buffer a message. Per thread (a node runs on its loop's thread), at most
// kSpareBuffers of at most kSpareBytes each (the small messages a game server relays).
constexpr size_t kSpareBuffers = 1024;
constexpr size_t kSpareBytes = 1024;
thread_local std::vector<std::vector<uint8_t>> t_spare;

std::vector<uint8_t> take_buffer(size_t size) {
  std::vector<uint8_t> m;
  if (!t_spare.empty() && size <= kSpareBytes) {
    m = std::move(t_spare.back());
    t_spare.pop_back();
  }
  m.resize(size);
  return m;
}

void give_buffer(std::vector<uint8_t>* m) {
  if (m->capacity() > kSpareBytes || t_spare.size() >= kSpareBuffers) return;
  m->clear();
  t_spare.push_back(std::move(*m));
}

}  // namespace

// -------------------------------------------------------------------------------- siblings --
errc node::impl::start_lookup(bus_id target) {
  peer_ep* pp = parent_peer();
  if (pp == nullptr) return errc::not_connected;
  uint8_t arg[8];
  for (int i = 0; i < 8; ++i) arg[i] = static_cast<uint8_t>(target >> (8 * i));
  const uint64_t seq = take_seq();
  std::vector<uint8_t> body;
  proto::encode_command(static_cast<uint32_t>(proto::command_id::lookup), arg, 8, &body);
  const std::vector<uint8_t> m = proto::build(make_header(msg_type::command, pp->id, seq), body);
  replies[seq] = pending_reply{
      pp->id, now_ms() + cfg.handshake_timeout_ms,
      [this, target](errc st, const uint8_t* p, size_t n) { on_lookup(target, st, p, n); }, 0};
  const errc e = transmit_bytes(pp, m, 0, pp->id);
  if (e != errc::ok) replies.erase(seq);
  return e;
}

void node::impl::sibling_via_parent(bus_id target, const char* why) {
  auto it = siblings.find(target);
  if (it == siblings.end()) return;
  it->second.state = sib_state::via_parent;
  it->second.until_ms = now_ms() + kSiblingRetryMs;
  peer_ep* pp = parent_peer();
  if (pp != nullptr) {
    flush_queue(&it->second.pending, pp);
  } else if (!has_parent()) {
    fail_queue(&it->second.pending, errc::unknown_route);  // a root's direct dial failed
  } else {
    // Keep order: the parent queue takes them (they still expire on their own deadlines).
    for (auto& m : it->second.pending.q) {
      parent_pending.bytes += m.bytes.size();
      parent_pending.q.push_back(std::move(m));
    }
    it->second.pending.q.clear();
    it->second.pending.bytes = 0;
  }
  // From the loop: this runs inside send_data() too (a dial that fails at once), where no
  // callback may fire (an on_log that sent to the target came back to this entry).
  log_later(log_level::info, "sibling 0x%" PRIx64 ": %s, routing through the parent", target, why);
}

void node::impl::on_lookup(bus_id target, errc st, const uint8_t* p, size_t n) {
  auto it = siblings.find(target);
  if (it == siblings.end() || it->second.state != sib_state::lookup) return;
  proto::node_info info;
  // A version-2 parent answers unknown_route only for an id of its own subnets that no child has
  // registered (yet): the messages wait for it (bounded by the pending queue's limits and
  // deadline) instead of going to a parent that would drop them. A version-1 parent gives the
  // same answer for an id it routes elsewhere, so with it they go through the parent as before.
  if (st == errc::unknown_route && version_of(parent_peer()) >= 2) {
    it->second.state = sib_state::waiting;
    it->second.until_ms = now_ms() + detail::kSiblingWaitRetryMs;
    return;
  }
  if (st != errc::ok || proto::parse_node_info(p, n, &info) != errc::ok || info.id != target) {
    sibling_via_parent(target, "not a direct child of the parent");
    return;
  }
  if (state != run_state::running) return;
  dial_sibling(target, sibling_url(info.listen, info.host_id));
}

// Prefer a unix socket on the same host, else the first TCP address; "" if there is none.
std::string node::impl::sibling_url(const std::vector<std::string>& listen,
                                    const std::string& host) const {
  std::string url;
  for (const std::string& u : listen) {
    address a;
    if (parse_address(u, &a) != errc::ok) continue;
    if (a.kind == scheme::unix_socket && host == host_id) return u;
    if (url.empty() && a.is_stream() && a.kind != scheme::unix_socket) url = u;
  }
  return url;
}

void node::impl::dial_sibling(bus_id target, const std::string& url) {
  auto it = siblings.find(target);
  if (it == siblings.end()) return;
  if (url.empty()) {
    sibling_via_parent(target, "no stream address");
    return;
  }
  connection_id c;
  if (streams->connect(url, &c) != errc::ok) {
    sibling_via_parent(target, ("connect failed: " + streams->last_error().detail).c_str());
    return;
  }
  it->second.state = sib_state::connecting;
  link* lk = add_link(c, true);
  lk->role = proto::link_role::sibling;
  lk->expect_id = target;
}

// ------------------------------------------------------------------------- routed messages --
// A data message to us (its trace block, if any, already taken off).
void node::impl::on_local_data(link* from, const proto::header& hd, const uint8_t* body) {
  if ((hd.flags & proto::flag_flow) != 0) {
    on_flow_data(from, hd, body);
    return;
  }
  proto::data_body d;
  if (proto::parse_data(body, hd.body_len, &d) != errc::ok) {
    bad_body(from, hd, "bad data body");
    return;
  }
  ++counters.data_received;
  if ((hd.flags & proto::flag_require_response) == 0) {
    deliver(hd.source, hd.flags, d.user_type, d.payload, d.size);
    return;
  }
  // Acknowledged once on_data returns; stop() from on_data sends it before the links close
  // (close_links_for_stop() takes owed_ack), else the source would report timeout.
  const proto::header* outer = std::exchange(owed_ack, &hd);
  deliver(hd.source, hd.flags, d.user_type, d.payload, d.size);
  if (owed_ack != nullptr) send_ack(hd.source, hd.sequence, proto::reason::ok);
  owed_ack = outer;
}

// A data message to us with a trace block: delivered like any other with incoming_trace() set.
// A block with an all-zero id (never sent by a node) counts as none: incoming_trace() is null,
// else an application passing it on would have its own send refused for the peer's fault.
void node::impl::on_traced_data(link* from, const proto::header& hd, const uint8_t* body) {
  trace_context t;
  proto::parse_trace(body, &t);
  proto::header inner = hd;
  inner.flags &= static_cast<uint8_t>(~proto::flag_trace);
  inner.body_len -= static_cast<uint32_t>(proto::kTraceSize);
  const trace_context* outer = incoming;
  incoming = t.valid() ? &t : nullptr;
  on_local_data(from, inner, body + proto::kTraceSize);
  incoming = outer;
}

void node::impl::on_routed(link* from, const proto::header& hd, const uint8_t* data, size_t size) {
  if (plain_flow_data(hd)) {
    on_flow_data(from, hd, data + proto::kHeaderSize);
    return;
  }
  if ((hd.type == msg_type::broadcast || hd.type == msg_type::broadcast_ack) &&
      detail::fan_routed(*this, from, hd, data, size)) {
    return;
  }
  // Checked before relaying too: stripping a short block for an older hop would corrupt it.
  if ((hd.flags & proto::flag_trace) != 0 &&
      (hd.body_len < proto::kTraceSize ||
       (hd.type != msg_type::data && hd.type != msg_type::forward))) {
    bad_body(from, hd, "trace flag on a message that cannot carry one");
    return;
  }
  if (hd.target != self) {
    forward(from, hd, data, size);
    return;
  }
  const uint8_t* body = data + proto::kHeaderSize;
  switch (hd.type) {
    case msg_type::data:
    case msg_type::forward: {
      if ((hd.flags & proto::flag_trace) != 0) {
        on_traced_data(from, hd, body);
      } else {
        on_local_data(from, hd, body);
      }
      return;
    }
    case msg_type::ack: {
      proto::ack_body a;
      if (proto::parse_ack(body, hd.body_len, &a) != errc::ok) {
        bad_body(from, hd, "bad ack");
        return;
      }
      auto it = replies.find(a.acked_sequence);
      if (it == replies.end() || it->second.cb) return;  // late (already timed out)
      // Only the target says it received it (a relay on the way only refuses): an ok from any
      // other node is a guess at the sequence.
      if (a.status == proto::reason::ok && hd.source != it->second.target) return;
      const bus_id target = it->second.target;
      replies.erase(it);
      if (!fan->any_replies.empty()) fan->any_replies.erase(a.acked_sequence);  // send_any's
      defer_report(a.acked_sequence, target,
                   proto::errc_from_reason(static_cast<uint16_t>(a.status)), true);
      return;
    }
    case msg_type::dropped:
    case msg_type::flow_ack:
      on_notice(from, hd, body);
      return;
    case msg_type::command:
      on_command(from, hd, body);
      return;
    case msg_type::command_reply: {
      proto::command_reply_body r;
      if (proto::parse_command_reply(body, hd.body_len, &r) != errc::ok) {
        bad_body(from, hd, "bad command reply");
        return;
      }
      auto it = replies.find(hd.sequence);
      // Only the commanded node answers (no relay does): a reply from any other is ignored.
      if (it == replies.end() || !it->second.cb || hd.source != it->second.target) return;
      command_cb cb = std::move(it->second.cb);
      replies.erase(it);
      fire(cb, proto::errc_from_reason(static_cast<uint16_t>(r.status)), r.result, r.result_size);
      return;
    }
    default:
      if (from != nullptr) protocol_violation(from, "unexpected message type");
      return;
  }
}

// A drop notice or a flow acknowledgement addressed to us.
void node::impl::on_notice(link* from, const proto::header& hd, const uint8_t* body) {
  if (hd.type == msg_type::flow_ack) {
    proto::flow_ack_body a;
    if (proto::parse_flow_ack(body, hd.body_len, &a) != errc::ok) {
      bad_body(from, hd, "bad flow acknowledgement");
      return;
    }
    on_flow_ack(hd, a);
    return;
  }
  proto::dropped_body d;
  if (proto::parse_dropped(body, hd.body_len, &d) != errc::ok) {
    bad_body(from, hd, "bad drop notice");
    return;
  }
  const errc why = proto::errc_from_reason(static_cast<uint16_t>(d.why));
  if ((hd.flags & proto::flag_flow) != 0) {
    ++counters.drop_notices_received;
    flow_drop_notice(d.original_target, d.message_id, why);
  } else {
    on_drop_notice(d.message_id, d.original_target, why);
  }
}

// Replies and acks go back along the normal route but never wait in a sibling queue.
errc node::impl::route_reply(bus_id target, const const_buffer* bufs, size_t total) {
  const detail::route r = table.lookup(target);
  peer_ep* p = nullptr;
  if (r.kind == hop::direct || r.kind == hop::child || r.kind == hop::parent) {
    p = find_peer(r.next);
  }
  if (p == nullptr) {
    if (r.kind == hop::none && has_parent() && !table.owns(target) && !parent_failed) {
      return enqueue(&parent_pending, bufs, 1, total, 0, target);
    }
    return errc::unknown_route;
  }
  // A broadcast acknowledgement only to a link that knows it (see forward()).
  const auto* head = static_cast<const uint8_t*>(bufs[0].data);
  if (head[1] == static_cast<uint8_t>(msg_type::broadcast_ack) && version_of(p) < 6) {
    ++counters.forward_dropped;
    return errc::version_mismatch;
  }
  return transmit(p, bufs, 1, 0, target);
}

// Built on the stack: under next_hop delivery with require_response every message gets one.
void node::impl::send_ack(bus_id to, uint64_t seq, proto::reason st) {
  uint8_t m[proto::kHeaderSize + proto::kAckSize];
  proto::header h = make_header(msg_type::ack, to, take_seq());
  h.body_len = proto::kAckSize;
  proto::encode_header(h, m);
  proto::encode_ack({seq, st}, m + proto::kHeaderSize);
  const const_buffer cb{m, sizeof m};
  (void)route_reply(to, &cb, sizeof m);
}

// Inlined into on_routed, its one caller (node_impl.h): when on_routed grew, LTO stopped inlining
// it and a relay spent about 19 more instructions a message (benchmark/instr.sh,
// docs/benchmark.md).
void node::impl::forward(link* from, const proto::header& hd, const uint8_t* data, size_t size) {
  if (hd.ttl == 0) {
    ++counters.ttl_expired;
    relay_drop(hd, proto::reason::ttl_expired);
    return;
  }
  peer_ep* p = nullptr;
  if (cached_hop != nullptr && cached_target == hd.target) {
    p = cached_hop;
  } else {
    const detail::route r = table.lookup(hd.target);
    if (r.kind == hop::direct || r.kind == hop::child || r.kind == hop::parent) {
      p = find_peer(r.next);
      // Relayed traffic never takes a sibling shortcut, so any hop found here may be cached.
      if (p != nullptr) {
        cached_target = hd.target;
        cached_hop = p;
      }
    }
  }
  // Never send a message back where it came from (the parent does not know the target either).
  if (p == nullptr && hold_for_child(hd, data, size)) return;
  if (p == nullptr || (from != nullptr && from->peer == p)) {
    relay_drop(hd, proto::reason::unknown_route);
    return;
  }
  // A peer below version 2 does not know drop notices, one below 6 broadcast acknowledgements (it
  // would close the link as a protocol error).
  if ((hd.type == msg_type::dropped && version_of(p) < 2) ||
      (hd.type == msg_type::broadcast_ack && version_of(p) < 6)) {
    ++counters.forward_dropped;
    return;
  }
  uint8_t head[proto::kHeaderSize];
  forward_header(hd, data, head);
  const const_buffer bufs[2] = {{head, sizeof head},
                                {data + proto::kHeaderSize, size - proto::kHeaderSize}};
  errc e = errc::queue_full;
  if (p->overflow.empty()) e = forward_out(p, hd, data, size, bufs);
  if (e == errc::ok) {
    if (hd.type == msg_type::data || hd.type == msg_type::forward) ++counters.forwarded;
    return;
  }
  if (e == errc::queue_full) {
    if (!overflow_push(p, from, bufs, size)) relay_drop(hd, proto::reason::queue_full);
    return;
  }
  relay_drop(hd, proto::reason_from_errc(e));
}

// forward()'s send: straight into a plain stream link's reserved frame (the new header written
// there) or a plain ring, else transmit(). bufs: the new header and the body.
errc node::impl::forward_out(peer_ep* p, const proto::header& hd, const uint8_t* data, size_t size,
                             const const_buffer* bufs) {
  if (link* lk = plain_stream(p); lk != nullptr) {
    errc e = errc::ok;
    uint8_t* d = streams->prepare_send(lk->conn, size, &e);
    if (d != nullptr) {
      forward_header(hd, data, d);
      std::memcpy(d + proto::kHeaderSize, data + proto::kHeaderSize, size - proto::kHeaderSize);
      e = streams->commit_send(lk->conn);
    }
    return e;  // queue_full: overflow_push(); on_writable is owed only to the application's sends
  }
  if (p->shm && plain_ring(p)) {
    if (!p->shm->coalescing()) (void)p->shm->coalesce(loop);
    const errc e = p->shm->sendv(bufs, 2);
    if (e != errc::abandoned && e != errc::not_connected) return e;
  }
  return transmit(p, bufs, 2, 0, hd.target);
}

uint8_t node::impl::version_of(const peer_ep* p) {
  return p == nullptr || p->lk == nullptr ? 0 : p->lk->version;
}

void node::impl::relay_drop(const proto::header& hd, proto::reason why, bool log_line) {
  ++counters.forward_dropped;
  // The source is told first: the log line runs on_log, which may stop() the node (links close).
  if (hd.type == msg_type::data || hd.type == msg_type::forward) {  // no notice on notices
    if ((hd.flags & proto::flag_require_response) != 0) {
      send_ack(hd.source, hd.sequence, why);  // its report (every version knows acks)
    } else {
      send_drop_notice(hd, why);
    }
  }
  if (!log_line || !log_allowed(detail::peer_log::relay_drop))
    return;  // the caller logs once for many
  log(log_level::warn, "dropping %s message %" PRIu64 " 0x%" PRIx64 " -> 0x%" PRIx64 ": %s",
      proto::to_string(hd.type), hd.sequence, hd.source, hd.target,
      to_string(proto::errc_from_reason(static_cast<uint16_t>(why))));
}

// Cold and never inlined: kept out of on_routed, whose size decides whether forward() inlines.
void node::impl::bad_body(link* from, const proto::header& hd, const char* what) {
  // The peer wrote it: its link is closed. Relayed (or read from the ring), it says nothing
  // about the link it came by: closing that would cut an honest relay off for its source's fault.
  if (from != nullptr && from->peer != nullptr && from->peer->id == hd.source) {
    protocol_violation(from, what);
    return;
  }
  ++counters.protocol_errors;
  if (!log_allowed(detail::peer_log::relay_drop)) return;
  log(log_level::warn, "dropping %s message %" PRIu64 " 0x%" PRIx64 " -> 0x%" PRIx64 ": %s",
      proto::to_string(hd.type), hd.sequence, hd.source, hd.target, what);
}

bool node::impl::log_allowed(detail::peer_log kind) {
  const uint64_t now = now_ms();
  flush_logs(now);  // the last window's count first, in its own line
  uint64_t suppressed = 0;
  return peer_logs.allow(static_cast<size_t>(kind), now, &suppressed);
}

void node::impl::flush_logs(uint64_t now) {
  for (size_t i = 0; i < static_cast<size_t>(detail::peer_log::none); ++i) {
    const uint64_t left_out = peer_logs.take_expired(i, now);
    // on_log may stop the node: the count was taken first.
    if (left_out != 0) {
      log(log_level::warn, "%" PRIu64 " more %s (log rate-limited)", left_out,
          detail::kPeerLogSummary[i]);
    }
  }
}

void node::impl::send_drop_notice(const proto::header& hd, proto::reason why) {
  // Only over a link that negotiated version 2, and never queued: a notice is best effort.
  const detail::route r = table.lookup(hd.source);
  peer_ep* p = nullptr;
  if (r.kind == hop::direct || r.kind == hop::child || r.kind == hop::parent) p = find_peer(r.next);
  if (p == nullptr || version_of(p) < 2) return;
  std::vector<uint8_t> b;
  proto::encode_dropped({hd.sequence, hd.target, why}, &b);
  proto::header nh = make_header(msg_type::dropped, hd.source, take_seq());
  nh.flags = hd.flags & proto::flag_flow;  // message_id is a flow sequence
  const std::vector<uint8_t> m = proto::build(nh, b);
  if (transmit_bytes(p, m, 0, hd.source) == errc::ok) ++counters.drop_notices_sent;
}

void node::impl::on_drop_notice(uint64_t message_id, bus_id target, errc why) {
  ++counters.drop_notices_received;
  auto it = replies.find(message_id);
  if (it != replies.end() && !it->second.cb && it->second.target == target) {
    replies.erase(it);                            // its report was still outstanding: this is it
    defer_report(message_id, target, why, true);  // a require_response message's
    return;
  }
  fire(cbs.on_dropped, target, message_id, why);
}

bool node::impl::overflow_keep(peer_ep* p, std::vector<uint8_t>* m) {
  if (p->overflow_bytes + m->size() > cfg.forward_overflow_bytes) return false;
  if (p->overflow.empty()) p->overflow_moved_ms = now_ms();
  p->overflow_bytes += m->size();
  p->overflow.push_back(std::move(*m));
  if (p->shm && std::find(shm_overflow.begin(), shm_overflow.end(), p) == shm_overflow.end()) {
    shm_overflow.push_back(p);
    arm_idle();
  }
  return true;
}

bool node::impl::overflow_push(peer_ep* p, link* from, const const_buffer* bufs, size_t size) {
  if (p->overflow_bytes + size > cfg.forward_overflow_bytes) return false;
  std::vector<uint8_t> m = take_buffer(size);
  std::memcpy(m.data(), bufs[0].data, bufs[0].size);
  std::memcpy(m.data() + bufs[0].size, bufs[1].data, bufs[1].size);
  (void)overflow_keep(p, &m);
  // Back-pressure: stop reading the link (or the ring) that feeds this hop until it drains.
  if (from != nullptr) {
    if (!from->paused && streams->pause_reading(from->conn) == errc::ok) {
      from->paused = true;
      p->paused_links.push_back(from->conn_id);
    }
  } else if (!shm_paused && reader) {
    reader->stop();
    shm_paused = true;
    p->shm_reader_paused = true;
  }
  return true;
}

void node::impl::drain_overflow(peer_ep* p) {
  // A refusal's log line may destroy the node (`dead`): a destroyed node sends nothing more.
  while (!dead && !p->overflow.empty()) {
    const std::vector<uint8_t>& m = p->overflow.front();
    const errc e = transmit_bytes(p, m, 0, 0);
    if (e == errc::queue_full) return;
    proto::header hd;
    const bool refuse = e != errc::ok && proto::parse_header(m.data(), m.size(), &hd) == errc::ok;
    if (e == errc::ok) {
      const auto t = static_cast<msg_type>(m[1]);
      if (t == msg_type::data || t == msg_type::forward) ++counters.forwarded;
    } else if (!refuse) {
      ++counters.forward_dropped;
    }
    p->overflow_bytes -= m.size();
    give_buffer(&p->overflow.front());  // m is empty from here
    p->overflow.pop_front();
    p->overflow_moved_ms = now_ms();
    // After it left: the refusal logs, and an on_log that calls stop() empties the overflow.
    if (refuse) relay_drop(hd, proto::reason_from_errc(e));
  }
  if (!dead) resume_paused(p);
}

void node::impl::resume_paused(peer_ep* p) {
  for (uint64_t id : p->paused_links) {
    auto it = links.find(id);
    if (it != links.end() && it->second->paused) {
      it->second->paused = false;
      (void)streams->resume_reading(it->second->conn);
      // Its pings were not read meanwhile: its silence clock starts again now.
      if (it->second->peer != nullptr) it->second->peer->last_rx_ms = now_ms();
    }
  }
  p->paused_links.clear();
  if (p->shm_reader_paused) {
    p->shm_reader_paused = false;
    restart_shm_reader();
  }
}

void node::impl::restart_shm_reader() {
  if (!shm_paused || !reader || state != run_state::running) return;
  for (peer_ep* q : shm_overflow) {
    if (q->shm_reader_paused) return;
  }
  shm_paused = false;
  (void)reader->start(loop);
}

void node::impl::on_shm_records(void* user, const shm_record* recs, size_t count) {
  impl* n = static_cast<impl*>(user);
  // Liveness is refreshed once per run of records from one source, not per record.
  bus_id last_source = n->self;
  // Records are taken while the node runs, and while stop() waits for acknowledgements (which
  // come through the ring from same-host peers). A callback that destroys the node, or a stop()
  // without that wait, ends the batch: nothing more of it is delivered.
  for (size_t i = 0;
       i < count && !n->dead && (n->state == run_state::running || n->stop_flush_until != 0); ++i) {
    const uint8_t* data = recs[i].data;
    size_t size = recs[i].size;
    bus_id writer = 0;
    if (!n->shm_accept(&data, &size, &writer)) continue;
    proto::header hd;
    // Shared memory is never compressed (the flag is link-local): relayed on with the flag set, a
    // record would get the next hop's link closed; delivered here, its body would be wrong.
    if (proto::parse_header(data, size, &hd) != errc::ok ||
        (hd.flags & proto::flag_compressed) != 0) {
      ++n->counters.protocol_errors;
      continue;
    }
    // With access tokens the tag proved the writer: it may speak for itself, or relay for the
    // nodes its registration allows (as on its stream link).
    if (!n->cfg.access_tokens.empty() && hd.source != writer &&
        (n->find_peer(writer) == nullptr || !n->table.source_allowed(writer, hd.source))) {
      ++n->counters.shm_rejected;
      continue;
    }
    switch (hd.type) {
      case msg_type::data:
      case msg_type::forward:
      case msg_type::ack:
      case msg_type::command:
      case msg_type::command_reply:
      case msg_type::dropped:
      case msg_type::flow_ack:
      case msg_type::broadcast:
      case msg_type::broadcast_ack:
        if (hd.source != last_source) {
          last_source = hd.source;
          if (peer_ep* p = n->find_peer(hd.source); p != nullptr) {
            p->last_rx_ms = n->now_ms();
            p->last_data_ms = p->last_rx_ms;
          }
        }
        n->fan->ring_writer = n->cfg.access_tokens.empty() ? 0 : writer;  // proved, or unknown
        n->on_routed(nullptr, hd, data, size);
        n->fan->ring_writer = 0;
        break;
      default:
        ++n->counters.protocol_errors;
        break;
    }
  }
}

}  // namespace uvbus
