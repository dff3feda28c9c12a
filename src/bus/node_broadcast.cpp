// Broadcast from this node (node::broadcast): the copies it sends, the fate of each target at the
// call (failed at once when no copy goes towards it), and its bounds: docs/bus.md "Broadcast".
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bus/node_impl.h"

namespace uvbus {

using detail::fanout_state;
using detail::pending_broadcast;

namespace {
constexpr uint8_t kV6 = 6;

std::string hex(bus_id id) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%" PRIx64, id);
  return b;
}

// A node known only from etcd lies behind no tree link: from a root (a node it does not own is
// then in no tree of ours, so no copy reaches it twice) it gets a copy of its own, with a selector
// naming it alone (so its tree does not fan it out again: its other nodes get theirs the same
// way), over the route a send to it takes (the direct link dialled from its etcd entry). A hop
// whose full queue refused it goes into f.blocked. [hd]: the broadcast's header.
errc send_direct(node::impl& n, const node::impl::dir_item& d, proto::header hd, uint32_t msg_type,
                 const void* data, size_t size) {
  const bus_id id = d.e.id;
  std::vector<uint8_t> head(proto::kHeaderSize, 0);
  proto::encode_broadcast_head(broadcast_target::in_subnet(subnet{id, 0}), msg_type, &head);
  const size_t body = head.size() - proto::kHeaderSize + size;
  hd.target = id;
  hd.body_len = static_cast<uint32_t>(body);
  proto::encode_header(hd, head.data());
  const const_buffer bufs[2] = {{head.data(), head.size()}, {data, size}};
  // A link below version 6 would take the unknown message for a protocol error.
  if (d.e.protocol_version < kV6 || n.cfg.protocol_max < kV6) return errc::version_mismatch;
  if (body > n.cfg.message_limit) return errc::message_too_large;
  n.full_hop = nullptr;
  const errc e = n.route_lookup(id, bufs, 2, head.size() + size, 0, nullptr);
  if (e == errc::queue_full && n.full_hop != nullptr) n.fan->blocked.push_back(n.full_hop->id);
  return e;
}

// Why no copy of a broadcast of ours went towards a target whose entry came through `via`, whose
// hop fan_out() recorded with outcome e (direct: send_direct()'s refusal).
std::string no_copy_why(node::impl& n, bus_id via, errc e, errc direct) {
  if (via == node::impl::kViaDiscovery) {
    if (n.has_parent()) {
      return "it is known only from etcd, and a node with a parent sends copies only along its "
             "tree";
    }
    return direct != errc::ok ? std::string("its direct copy was refused: ") + to_string(direct)
                              : "it is known only from etcd, inside this node's subnets";
  }
  if (e == errc::version_mismatch) {
    return "the link to " + hex(via) + " is below protocol version 6";
  }
  if (e != errc::unknown_route) return "the link to " + hex(via) + " refused it: " + to_string(e);
  const detail::peer_ep* p = n.find_peer(via);
  if (p == nullptr || p->lk == nullptr) return "its next hop " + hex(via) + " is not connected";
  if (node::impl::version_of(p) < kV6) {
    return "the link to " + hex(via) + " is below protocol version 6";
  }
  return "its next hop " + hex(via) + " is not a tree link";
}

// After fan_out(): each expected target behind a hop that took a copy waits for its
// acknowledgement — unless its directory entry says it speaks a version below 6 (a relay further
// on cannot pass a copy on to it); from a root, one known only from etcd gets a copy of its own
// (send_direct); every other one got no copy and never will (nothing is resent): it is failed at
// once (left), pb->detail saying how many and why the first. Returns the direct copies sent.
size_t plan_targets(node::impl& n, pending_broadcast* pb, const proto::header& hd,
                    uint32_t msg_type, const void* data, size_t size) {
  const auto& hops = n.fan->hops;
  size_t direct = 0;
  size_t unsent = 0;
  for (size_t i = 0; i < pb->expected.size(); ++i) {
    const auto d = n.dir.find(pb->expected[i]);
    if (d == n.dir.end()) continue;  // cannot be: the list was made from the directory just now
    const bus_id via = d->second.via;
    const auto h = std::find_if(hops.begin(), hops.end(),
                                [via](const std::pair<bus_id, errc>& x) { return x.first == via; });
    const errc e = h == hops.end() ? errc::unknown_route : h->second;
    const unsigned v = d->second.e.protocol_version;
    if (e == errc::ok && v >= kV6) continue;
    if (e == errc::ok) {  // its copy stops at the last v6 relay before it
      pb->state[i] = pending_broadcast::left;
      ++pb->left_count;
      if (unsent++ == 0) {
        pb->detail = hex(d->first) + ": its directory entry says protocol version " +
                     std::to_string(v) + ", below 6 (no relay passes a copy on to it)";
      }
      continue;
    }
    errc refused = errc::ok;
    if (via == node::impl::kViaDiscovery && !n.has_parent() && !n.table.owns(d->first)) {
      refused = send_direct(n, d->second, hd, msg_type, data, size);
      if (refused == errc::ok) {
        ++direct;
        continue;
      }
    }
    pb->state[i] = pending_broadcast::left;
    ++pb->left_count;
    if (unsent++ == 0) pb->detail = hex(d->first) + ": " + no_copy_why(n, via, e, refused);
  }
  if (unsent != 0) {
    pb->detail = std::to_string(unsent) + " of " + std::to_string(pb->expected.size()) +
                 " targets got no copy; the first, " + pb->detail;
  }
  return direct;
}

// What broadcast() says when no copy went out and a full queue refused one: every hop that did
// owes on_writable, as for send_data(). Empty: some copy went, or none met a full queue.
std::string refused_whole(node::impl& n) {
  fanout_state& f = *n.fan;
  for (const auto& [id, e] : f.hops) {
    if (e == errc::queue_full) f.blocked.push_back(id);
  }
  if (f.blocked.empty()) return {};
  std::string why = "node::broadcast: the queue of the next hop " + hex(f.blocked.front()) +
                    " is full: nothing was sent (retry on on_writable)";
  for (const bus_id id : f.blocked) {
    if (detail::peer_ep* p = n.find_peer(id); p != nullptr) (void)n.blocked_by(p);
  }
  return why;
}
}  // namespace

errc node::broadcast(const broadcast_target& to, uint32_t msg_type, const void* data, size_t size,
                     uint32_t timeout_ms, broadcast_fn cb, const send_options& opt,
                     uint64_t* broadcast_id) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::broadcast");
  impl& n = *impl_;
  if (!cb || timeout_ms == 0 || (data == nullptr && size != 0) || to.net.mask_bits > 64) {
    return n.fail(errc::invalid_argument, !cb ? "node::broadcast: the callback is empty"
                                          : timeout_ms == 0 ? "node::broadcast: timeout_ms is 0"
                                          : to.net.mask_bits > 64
                                              ? "node::broadcast: a subnet wider than 64 bits"
                                              : "node::broadcast: null data, non-zero size");
  }
  if (opt.trace != nullptr) {  // the broadcast frame has no room for one (a receiver refuses it)
    return n.fail(errc::invalid_argument,
                  "node::broadcast: send_options::trace is not carried by a broadcast");
  }
  if (const std::string why = detail::fan_selector_fault(to); !why.empty()) {
    return n.fail(errc::invalid_argument, "node::broadcast: " + why);
  }
  if (n.state != impl::run_state::running) {
    return n.fail(n.state == impl::run_state::idle ? errc::wrong_state : errc::closed,
                  "node::broadcast: the node is not running");
  }
  if (n.prep.open) {
    return n.fail(errc::wrong_state,
                  "node::broadcast: a prepare_data() reservation is open: commit_data() or "
                  "cancel_data() first");
  }
  fanout_state& f = *n.fan;
  f.head.assign(proto::kHeaderSize, 0);
  proto::encode_broadcast_head(to, msg_type, &f.head);
  const size_t selector = f.head.size() - proto::kHeaderSize;
  if (size + selector > n.cfg.message_limit) {
    return n.fail(errc::message_too_large, "node::broadcast: " + std::to_string(size) +
                                               " bytes + " + std::to_string(selector) +
                                               " of selector, above message_limit (" +
                                               std::to_string(n.cfg.message_limit) + ")");
  }
  if (f.pending.size() >= fanout_state::kMaxPending) {
    return n.fail(errc::queue_full, "node::broadcast: 4096 broadcasts await their summary");
  }
  size_t count = 0;
  for (const auto& [id, item] : n.dir) count += to.matches(item.e) ? 1 : 0;
  if (count == 0) {
    return n.fail(errc::unknown_route, "node::broadcast: no node of the directory matches");
  }
  if (count > n.cfg.broadcast_max_targets - f.targets) {  // f.targets <= the cap
    return n.fail(errc::queue_full, "node::broadcast: broadcast_max_targets (" +
                                        std::to_string(n.cfg.broadcast_max_targets) +
                                        ") reached: " + std::to_string(f.targets) +
                                        " targets of pending broadcasts, and this one has " +
                                        std::to_string(count));
  }
  pending_broadcast pb;
  pb.expected.reserve(count);  // exactly: 9 bytes a target while it waits
  for (const auto& [id, item] : n.dir) {
    if (to.matches(item.e)) pb.expected.push_back(id);
  }
  pb.state.assign(pb.expected.size(), pending_broadcast::waiting);
  // Not take_seq() (it starts at 1 in every process): a late acknowledgement of a dead
  // incarnation's broadcast must not name one of ours (fanout_state::next_broadcast_id).
  if (f.next_broadcast_id == 0) f.next_broadcast_id = 1 + (n.incarnation >> 24);  // < 2^40
  proto::header hd = n.make_header(proto::msg_type::broadcast, 0, f.next_broadcast_id++);
  hd.ttl = opt.ttl != 0 ? opt.ttl : n.cfg.default_ttl;
  hd.body_len = static_cast<uint32_t>(selector + size);
  proto::encode_header(hd, f.head.data());
  const const_buffer bufs[2] = {{f.head.data(), f.head.size()}, {data, size}};
  f.blocked.clear();
  size_t sent = detail::fan_out(n, 0, to, bufs, 2);  // first: plan_targets() reads its hops
  sent += plan_targets(n, &pb, hd, msg_type, data, size);
  if (sent == 0) {  // nothing accepted when a full queue refused every copy: retry on on_writable
    if (std::string why = refused_whole(n); !why.empty()) {
      return n.fail(errc::queue_full, std::move(why));
    }
  }
  pb.to = to;
  pb.cb = std::move(cb);
  pb.deadline_ms = n.now_ms() + timeout_ms;
  const uint64_t deadline = pb.deadline_ms;
  const bool none_left = pb.settled();  // no target got a copy: reported from the loop
  f.targets += pb.expected.size();
  f.pending.emplace(hd.sequence, std::move(pb));
  if (none_left) {
    detail::fan_finish(n, hd.sequence, errc::not_connected);
  } else {
    detail::fan_add_deadline(n, hd.sequence, deadline);
  }
  ++n.counters.broadcasts_sent;
  if (broadcast_id != nullptr) *broadcast_id = hd.sequence;
  return errc::ok;
}

}  // namespace uvbus
