// Bus node, registered peers: adding one, moving one onto a new link (a sibling registering
// again), a sibling's queue settled once its link is up, and the backlog of our own messages that
// a pending queue handed a link its queue did not take.
#include "bus/node_impl.h"

namespace uvbus {

void node::impl::settle_sibling(bus_id id) {
  auto it = siblings.find(id);
  peer_ep* p = find_peer(id);
  if (it == siblings.end() || p == nullptr) return;
  flush_queue(&it->second.pending, p);
  siblings.erase(it);
}

void node::impl::move_peer(peer_ep* p, link* to) {
  link* old = p->lk;
  old->peer = nullptr;
  old->close_reason = errc::duplicate_id;
  to->peer = p;
  to->state = link_state::registered;
  (void)streams->mark_registered(to->conn);  // off the unregistered caps (max_unregistered)
  p->lk = to;
  p->last_rx_ms = now_ms();  // the new link just spoke: its registration
  close_link(old, errc::duplicate_id, disconnect_mode::graceful);
  // Only the old link would have said it drained (s_writable): what waits for the peer goes out
  // over the new one now, its stall clock starts again, and an application refused by the old
  // link's full queue hears on_writable.
  drain_backlog(p);
  drain_overflow(p);
  p->overflow_moved_ms = now_ms();
  if (dead) return;
  if (p->user_blocked && p->overflow.empty() && p->backlog.q.empty()) {
    p->user_blocked = false;
    fire(cbs.on_writable, p->id);
    if (dead) return;
  }
  // The old link's queue is lost with it (reported there): flow messages in it are sent again.
  flows_route_changed(true);
}

peer_ep* node::impl::add_peer(link* lk, peer_kind kind, proto::node_info info) {
  auto p = std::make_unique<peer_ep>();
  p->id = info.id;
  p->kind = kind;
  p->info = std::move(info);
  p->lk = lk;
  p->last_rx_ms = p->last_ping_ms = p->last_data_ms = now_ms();
  lk->peer = p.get();
  lk->state = link_state::registered;
  (void)streams->mark_registered(lk->conn);  // off the unregistered caps (max_unregistered)
  // Children's and siblings' subnets (checked above) are kept for source checks (a sibling
  // relays for its descendants), a tool's are not; only children's take part in routing.
  table.add(p->id, kind, p->info.subnets);
  // Same host and a ring offered: our data for it goes through shared memory.
  if (cfg.enable_shm && kind != peer_kind::tool && p->info.host_id == host_id) {
    for (const std::string& u : p->info.listen) {
      address a;
      if (parse_address(u, &a) != errc::ok || a.kind != scheme::shm) continue;
      auto w = std::make_unique<shm_writer>();
      const errc e = w->open(a);
      if (e == errc::ok) {
        w->on_staged_dropped([this](const uint8_t* d, size_t n) { shm_unstaged(d, n); });
        p->shm = std::move(w);
      } else {
        // From the loop: this runs amid the registration (a callback destroying or stopping the
        // node here left it half registered). The URL is the peer's text: escaped.
        log_later(log_level::info,
                  "peer 0x%" PRIx64 ": shared memory %s unusable (%s), using the stream", p->id,
                  detail::printable(u).c_str(), to_string(e));
      }
      break;
    }
  }
  if (p->shm) shm_tag_peer(p.get());
  peer_ep* raw = p.get();
  peers[raw->id] = std::move(p);
  cached_hop = nullptr;
  if (kind == peer_kind::child || kind == peer_kind::parent) {
    if (kind == peer_kind::child) grace.forget(raw->id);
    release_held(raw);     // a parent: what its children sent up while it was away
    if (dead) return raw;  // destroyed from a log line there: nothing more is sent
  }
  dir_link_up(raw);
  detail::fan_link_up(*this, raw);
  fire(cbs.on_endpoint_added, info_of(*raw));
  return raw;
}

// What a pending queue handed p that its link did not take (flush_queue), in order, as the link
// takes it: from s_writable, a ring's retry, or the move to a new link. No callback runs here.
void node::impl::drain_backlog(peer_ep* p) {
  p->draining_backlog = true;  // transmit() lets these through instead of queueing them again
  while (!p->backlog.q.empty()) {
    pending_msg& m = p->backlog.q.front();
    if (still_owed(m.tag)) {  // one reported while it waited (its response timeout) is withdrawn
      const errc e = transmit_bytes(p, m.bytes, m.tag, m.target);
      if (e == errc::queue_full) break;
      if (e != errc::ok) channel_outcome(m.tag, m.target, e);
    }
    p->backlog.bytes -= m.bytes.size();
    p->backlog.q.pop_front();
    --counters.pending_now;
  }
  p->draining_backlog = false;
}

}  // namespace uvbus
