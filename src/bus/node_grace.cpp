// Bus node, a relay's grace for its children: a message for an id of our subnets whose child is
// not registered — because we just started (a parent restart) or its link was just lost (a child
// restart: its own id, and the ids of the subnets it owned, its descendants') — waits for that
// child for child_grace_ms instead of being refused with unknown_route. All held messages
// together, whatever their target, are bounded by pending_max_messages and pending_max_bytes
// (grace.held_count, grace.held_bytes): beyond that a message is refused as if no grace applied,
// however many distinct ids the messages name. A relay that stops tells the sources of what it
// still holds, here or in a next hop's overflow (drop_relayed_for_stop). A relayed message for an
// id outside our subnets while our parent reconnects is held the same way, within the same bound,
// for pending_timeout_ms (hold_for_parent; released when the parent registers, told unknown_route
// when it refuses us for good: drop_held_for_parent).

#include "bus/node_impl.h"

namespace uvbus {

using proto::msg_type;

namespace {

// relay_drop() without its log line (the callers log once, after telling them all): counted, and
// the source told.
void tell_source(node::impl& n, const std::vector<uint8_t>& m, proto::reason why) {
  proto::header hd;
  if (proto::parse_header(m.data(), m.size(), &hd) == errc::ok) {
    n.relay_drop(hd, why, false);
  } else {
    ++n.counters.forward_dropped;
  }
}

// The grace `target` is in, and since when: our start's or its child's loss, whichever came later
// (a child lost during our start-up window is waited for child_grace_ms after its loss).
bool grace_since(const node::impl& n, bus_id target, uint64_t now, uint64_t* since) {
  const uint64_t g = n.cfg.child_grace_ms;
  bool in = now - n.started_ms < g;
  if (in) *since = n.started_ms;
  uint64_t lost = 0;
  if (n.grace.lost_since(target, &lost) && now - lost < g && (!in || lost > *since)) {
    *since = lost;
    in = true;
  }
  return in;
}

// Holds a relayed message in grace.held until `deadline` (ms). True when it is held, or refused
// here (a relay that is going holds nothing more: not_connected, try again); false when the hold
// is full (pending_max_messages / _bytes for all of it): the caller refuses.
bool hold(node::impl& n, const proto::header& hd, const uint8_t* data, size_t size,
          uint64_t deadline) {
  if (n.state != node::impl::run_state::running) {
    n.relay_drop(hd, proto::reason::not_connected);
    return true;
  }
  detail::grace_state& g = n.grace;
  if (g.held_count >= n.cfg.pending_max_messages || g.held_bytes + size > n.cfg.pending_max_bytes)
    return false;
  pending_queue& q = g.held[hd.target];
  uint8_t head[proto::kHeaderSize];
  n.forward_header(hd, data, head);
  const const_buffer bufs[2] = {{head, sizeof head},
                                {data + proto::kHeaderSize, size - proto::kHeaderSize}};
  if (n.enqueue(&q, bufs, 2, size, 0, hd.target) != errc::ok) {
    if (q.q.empty()) g.held.erase(hd.target);
    return false;
  }
  q.q.back().deadline_ms = deadline;
  ++g.held_count;
  g.held_bytes += size;
  ++n.counters.held_for_child;
  return true;
}

// A relayed message for an id outside our subnets while our configured parent reconnects: held
// with the messages held for children (grace.held, the same bound), for pending_timeout_ms, and
// sent on when the parent registers (release_held), in order and through its overflow as forward()
// sends; expired, its source is told not_connected (the relay's parent is away, not the target:
// a flow retries). Notices and broadcast acknowledgements are not held (a parent of an older
// version would take them as a protocol error: forward() checks). No parent, one that refused us
// for good, or the hold full: the caller refuses (unknown_route).
bool hold_for_parent(node::impl& n, const proto::header& hd, const uint8_t* data, size_t size) {
  if (!n.has_parent() || n.parent_failed || n.parent_peer() != nullptr) return false;
  if (hd.type == msg_type::dropped || hd.type == msg_type::broadcast_ack) return false;
  return hold(n, hd, data, size, n.now_ms() + n.cfg.pending_timeout_ms);
}

}  // namespace

bool node::impl::hold_for_child(const proto::header& hd, const uint8_t* data, size_t size) {
  if (!table.owns(hd.target)) return hold_for_parent(*this, hd, data, size);
  if (cfg.child_grace_ms == 0 || hd.target == self) return false;
  uint64_t since = 0;
  if (!grace_since(*this, hd.target, now_ms(), &since)) return false;
  return hold(*this, hd, data, size, since + cfg.child_grace_ms);
}

void node::impl::release_held(peer_ep* child) {
  // Everything held for an id that routes to this child now: its own, and its descendants' (ids
  // of its subnets), which were held under their own ids; or, for our parent, what our children
  // sent up while it was away (hold_for_parent).
  std::vector<bus_id> ids;
  for (const auto& [id, q] : grace.held) {
    const detail::route r = table.lookup(id);
    // A parent registering (add_peer) is not the table's parent yet: ids outside our subnets
    // with no route of their own go to it.
    // with no route of their own go to it. Every id outside our subnets was held for the parent
    // (the parent's own, a sibling's that registered meanwhile): all go to it.
    const bool via = child->kind == peer_kind::parent
                         ? !table.owns(id)
                         : (r.kind == hop::direct || r.kind == hop::child) && r.next == child->id;
    if (via) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());  // the same order however the map lies
  for (const bus_id id : ids) {
    if (dead || state != run_state::running) return;  // a refusal's log line stopped us
    auto it = grace.held.find(id);
    if (it == grace.held.end()) continue;
    pending_queue q = std::move(it->second);
    grace.held.erase(it);
    release_queue(child, &q);
  }
}

// Sends one target's held messages to the child that now routes to it.
void node::impl::release_queue(peer_ep* child, pending_queue* held_q) {
  pending_queue& q = *held_q;
  grace.held_count -= q.q.size();
  grace.held_bytes -= q.bytes;
  counters.pending_now -= q.q.size();
  // As forward() sends them: what the child's queue does not take waits in its overflow (they
  // were lost there unseen), beyond that bound it is refused to its source. No callback runs
  // during the walk: every source is told first, then one line (on_log may stop() the node, whose
  // links then take no notice, or destroy it).
  size_t refused = 0;
  errc why = errc::ok;
  for (pending_msg& m : q.q) {
    // forward()'s checks: a peer below version 2 does not know drop notices, one below 6
    // broadcast acknowledgements (it would close the link); only user messages count as forwarded.
    const auto type = static_cast<msg_type>(m.bytes[1]);
    if ((type == msg_type::dropped && version_of(child) < 2) ||
        (type == msg_type::broadcast_ack && version_of(child) < 6)) {
      ++counters.forward_dropped;
      continue;
    }
    errc e = errc::queue_full;
    if (child->overflow.empty()) e = transmit_bytes(child, m.bytes, 0, m.target);
    if (e == errc::ok) {
      if (type == msg_type::data || type == msg_type::forward) ++counters.forwarded;
      continue;
    }
    if (e == errc::queue_full && overflow_keep(child, &m.bytes)) continue;
    tell_source(*this, m.bytes, proto::reason_from_errc(e));
    ++refused;
    why = e;
  }
  if (refused == 0) return;
  log(log_level::warn,
      "%zu relayed messages held for 0x%" PRIx64
      " refused when it registered, their sources told (last: %s)",
      refused, child->id, to_string(why));
}

void node::impl::grace_tick(uint64_t now) {
  // Allocates only when something expires. A message held for our parent (an id outside our
  // subnets) is told not_connected (the target may be there: its flow retries), one held for a
  // child unknown_route (no child came back).
  std::vector<std::pair<std::vector<uint8_t>, bool>> expired;  // the message, held for the parent
  for (auto it = grace.held.begin(); it != grace.held.end();) {
    pending_queue& q = it->second;
    const bool up = !table.owns(it->first);
    while (!q.q.empty() && now >= q.q.front().deadline_ms) {
      std::vector<uint8_t>& m = q.q.front().bytes;
      q.bytes -= m.size();
      grace.held_bytes -= m.size();
      --grace.held_count;
      --counters.pending_now;
      expired.emplace_back(std::move(m), up);
      q.q.pop_front();
    }
    it = q.q.empty() ? grace.held.erase(it) : std::next(it);
  }
  grace.expire(now, cfg.child_grace_ms);
  if (expired.empty()) return;
  // Every source told first, then one line: on_log may stop() (its links close, `held` empties)
  // or destroy the node.
  size_t up = 0;
  for (const auto& [m, for_parent] : expired) {
    tell_source(*this, m, for_parent ? proto::reason::not_connected : proto::reason::unknown_route);
    up += for_parent ? 1 : 0;
  }
  if (up < expired.size()) {
    log(log_level::warn,
        "%zu relayed messages held for children refused (unknown_route): no child came back "
        "within child_grace_ms (%" PRIu64 " ms)",
        expired.size() - up, static_cast<uint64_t>(cfg.child_grace_ms));
  }
  if (up == 0 || dead || state != run_state::running) return;  // on_log may have stopped us
  log(log_level::warn,
      "%zu relayed messages held for the parent refused (not_connected): it was not back within "
      "pending_timeout_ms (%" PRIu64 " ms)",
      up, static_cast<uint64_t>(cfg.pending_timeout_ms));
}

// stop(), before the goodbyes: what is held for children and what waits in a next hop's overflow
// can go nowhere now. Each source is told while its link still takes a notice (not_connected: try
// again, it is the relay that goes, not the target) and one line is logged, from the loop (this
// runs inside stop()).
void node::impl::drop_relayed_for_stop() {
  std::vector<std::vector<uint8_t>> gone;
  for (auto& [id, q] : grace.held) {
    counters.pending_now -= q.q.size();
    for (auto& e : q.q) gone.push_back(std::move(e.bytes));
  }
  grace.held.clear();
  grace.held_count = 0;
  grace.held_bytes = 0;
  for (auto& [id, p] : peers) {
    for (auto& m : p->overflow) gone.push_back(std::move(m));
    p->overflow.clear();
    p->overflow_bytes = 0;
    resume_paused(p.get());
  }
  shm_overflow.clear();
  if (gone.empty()) return;
  for (const std::vector<uint8_t>& m : gone) tell_source(*this, m, proto::reason::not_connected);
  deferred_logs.emplace_back(log_level::warn,
                             "stopping: " + std::to_string(gone.size()) +
                                 " relayed messages held for children or waiting for a next hop "
                                 "dropped, their sources told (not_connected)");
}

void detail::drop_held_for_parent(node::impl& n) {
  std::vector<std::vector<uint8_t>> gone;
  for (auto it = n.grace.held.begin(); it != n.grace.held.end();) {
    if (n.table.owns(it->first)) {
      ++it;
      continue;
    }
    pending_queue& q = it->second;
    n.grace.held_count -= q.q.size();
    n.grace.held_bytes -= q.bytes;
    n.counters.pending_now -= q.q.size();
    for (pending_msg& m : q.q) gone.push_back(std::move(m.bytes));
    it = n.grace.held.erase(it);
  }
  if (gone.empty()) return;
  for (const std::vector<uint8_t>& m : gone) tell_source(n, m, proto::reason::unknown_route);
  n.log_later(log_level::warn,
              "%zu relayed messages held for the parent refused (unknown_route): it refused us",
              gone.size());
}

}  // namespace uvbus
