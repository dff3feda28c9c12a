// Any node of a type (pick, send_any; the load hints are node_load.cpp's) and broadcast (fan-out
// along the tree links, acknowledgements, the summary report): docs/bus.md "Any node of a type"
// and "Broadcast".
#include <algorithm>
#include <cstdint>

#include "bus/node_impl.h"

namespace uvbus {

using detail::fanout_state;
using detail::pending_broadcast;

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool labels_match(const std::vector<node_label>& have, const std::vector<node_label>& want) {
  for (const auto& [k, v] : want) {
    const auto it = std::find_if(have.begin(), have.end(),
                                 [&k = k](const node_label& h) { return h.first == k; });
    if (it == have.end() || it->second != v) return false;
  }
  return true;
}

bool self_matches(const node::impl& n, const broadcast_target& to) {
  if (n.cfg.join_as_tool) return false;
  if (to.by_subnet) return to.net.contains(n.self);
  return (to.type.empty() || to.type == n.cfg.type) && labels_match(n.cfg.labels, to.labels);
}

// The tree neighbour a broadcast from `source` came through: the child towards it, or the parent
// (a sibling's broadcast, like any from outside our subnets, comes down from the parent). For a
// copy read from our shared-memory ring, which has no link: sending it back there would bounce
// it between the two nodes until its TTL ran out.
bus_id tree_hop_towards(const node::impl& n, bus_id source) {
  const detail::route r = n.table.lookup(source);
  detail::peer_kind k{};
  if (r.kind == detail::hop::child) return r.next;
  if (r.kind == detail::hop::direct && n.table.kind_of(r.next, &k) &&
      k != detail::peer_kind::sibling) {
    return r.next;
  }
  return n.table.has_parent() ? n.table.parent() : 0;
}

}  // namespace

bool detail::fan_tree_v6(const node::impl& n, const peer_ep* p, bool loads) {
  constexpr uint8_t kV6 = 6;
  return !(loads && n.cfg.join_as_tool) && p != nullptr && p->lk != nullptr &&
         (p->kind == peer_kind::parent || p->kind == peer_kind::child) &&
         node::impl::version_of(p) >= kV6;
}

// Why a type-and-labels selector cannot go on the wire whole (empty: it can). Cut silently, the
// relays would match a selector other than the one the sender counted its targets by.
std::string detail::fan_selector_fault(const broadcast_target& to) {
  if (to.by_subnet) return {};
  const auto too_long = [](const std::string& s) { return s.size() > proto::kMaxDirText; };
  if (too_long(to.type)) {
    return "the type is " + std::to_string(to.type.size()) + " bytes, at most " +
           std::to_string(proto::kMaxDirText);
  }
  if (to.labels.size() > proto::kMaxLabels) {
    return std::to_string(to.labels.size()) + " labels, at most " +
           std::to_string(proto::kMaxLabels);
  }
  for (const auto& [key, value] : to.labels) {
    if (too_long(key) || too_long(value)) {
      return "label \"" + key.substr(0, 32) + "\" is longer than " +
             std::to_string(proto::kMaxDirText) + " bytes (key or value)";
    }
  }
  return {};
}

// Offers one copy of the broadcast [bufs] to every next hop except `except` of a directory entry
// it matches (bufs null: sends nothing), and records each hop with its outcome in f.hops: sent
// (ok), refused (transmit()'s error), version_mismatch (no copy: a tree link below version 6) or
// unknown_route (no copy: not a tree link, or none at all). One pass over the directory, then one
// per hop. Returns the copies sent (bufs null: that would be).
size_t detail::fan_out(node::impl& n, bus_id except, const broadcast_target& to,
                       const const_buffer* bufs, size_t count) {
  auto& hops = n.fan->hops;
  hops.clear();
  bus_id last = except;  // entries of one subtree lie together: most skip the search
  for (const auto& [eid, item] : n.dir) {
    if (item.via == except || item.via == last) continue;
    const auto known = [v = item.via](const std::pair<bus_id, errc>& h) { return h.first == v; };
    if (std::find_if(hops.begin(), hops.end(), known) != hops.end()) {
      last = item.via;
    } else if (to.matches(item.e)) {
      hops.emplace_back(item.via, errc::ok);
      last = item.via;
    }
  }
  size_t sent = 0;
  for (auto& [id, e] : hops) {
    detail::peer_ep* p = n.find_peer(id);
    if (!detail::fan_tree_v6(n, p, false)) {
      const bool tree =
          p != nullptr && p->lk != nullptr &&
          (p->kind == detail::peer_kind::parent || p->kind == detail::peer_kind::child);
      e = tree ? errc::version_mismatch : errc::unknown_route;
      continue;
    }
    e = bufs == nullptr ? errc::ok : n.transmit(p, bufs, count, 0, 0);
    if (e == errc::ok) ++sent;
  }
  return sent;
}

void detail::fan_finish(node::impl& n, uint64_t id, errc status) {
  fanout_state& f = *n.fan;
  auto it = f.pending.find(id);
  if (it == f.pending.end()) return;
  pending_broadcast pb = std::move(it->second);
  f.pending.erase(it);
  f.targets -= pb.expected.size() + pb.extra.size();
  broadcast_report r;
  r.broadcast_id = id;
  r.expected = pb.expected.size();
  r.detail = std::move(pb.detail);
  r.reached = std::move(pb.extra);
  for (size_t i = 0; i < pb.expected.size(); ++i) {
    (pb.state[i] == pending_broadcast::acked ? r.reached : r.failed).push_back(pb.expected[i]);
  }
  std::sort(r.reached.begin(), r.reached.end());
  r.status = r.failed.empty() ? errc::ok : status;
  f.finished.emplace_back(std::move(pb.cb), std::move(r));
  n.arm_idle();
}

namespace {

// The cursor key of a type and labels: the labels sorted and each once, so one selector written
// in another order takes the same turns, and a key is never longer than the directory entry it
// matched.
std::string cursor_key(const std::string& type, std::vector<node_label> labels) {
  std::sort(labels.begin(), labels.end());
  labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
  std::string key = type;
  for (const auto& [k, v] : labels) {
    key.push_back('\0');
    key.append(k).append(1, '=').append(v);
  }
  return key;
}

// What a cursor counts in fanout_state::cursor_bytes: its key and its ids.
size_t cursor_cost(const std::string& key, const detail::rr_cursor& c) {
  return key.size() + c.ids.capacity() * sizeof(bus_id);
}

// Forgets the less recently used half of the cursors (each starts again at the lowest id when
// asked for); a key in steady use keeps its place (its last use is recent). With one cursor left,
// nothing.
void forget_older_half(fanout_state& f) {
  std::vector<uint64_t> used;
  used.reserve(f.cursors.size());
  for (const auto& [k, c] : f.cursors) used.push_back(c.used);
  const auto mid = used.begin() + static_cast<std::ptrdiff_t>(used.size() / 2);
  std::nth_element(used.begin(), mid, used.end());
  const uint64_t keep_from = *mid;  // every `used` differs: exactly half goes
  for (auto c = f.cursors.begin(); c != f.cursors.end();) {
    if (c->second.used < keep_from) {
      f.cursor_bytes -= cursor_cost(c->first, c->second);
      c = f.cursors.erase(c);
    } else {
      ++c;
    }
  }
}

// Forgets the less recently used halves until `extra` more bytes and one more cursor fit (or one
// cursor is left: a selector matching more nodes than the bound holds stays alone).
void make_room(fanout_state& f, size_t extra) {
  while (f.cursors.size() > 1 && (f.cursors.size() >= fanout_state::kMaxCursors ||
                                  f.cursor_bytes + extra > fanout_state::kMaxCursorBytes)) {
    forget_older_half(f);
  }
}

// The cursor of `key`, created at the first turn. At most kMaxCursors are kept, with at most
// kMaxCursorBytes of keys and ids, so a caller asking with ever-new label sets costs bounded
// memory.
detail::rr_cursor& cursor_for(fanout_state& f, const std::string& key) {
  auto it = f.cursors.find(key);
  if (it == f.cursors.end()) {
    make_room(f, key.size());
    f.cursor_bytes += key.size();
    it = f.cursors.emplace(key, detail::rr_cursor{}).first;
  }
  it->second.used = ++f.cursor_clock;
  return it->second;
}

// The cursor of a selector nothing matches any more goes (it starts afresh if nodes come).
void forget_cursor(fanout_state& f, const std::string& key) {
  const auto it = f.cursors.find(key);
  if (it == f.cursors.end()) return;
  f.cursor_bytes -= cursor_cost(it->first, it->second);
  f.cursors.erase(it);
}

// The cursor key of a selector given lately (compared as given: no key is built), or nullptr.
const std::string* recent_key(const fanout_state& f, const std::string& type,
                              const std::vector<node_label>& labels) {
  for (const auto& r : f.recent) {
    if (r.set && r.type == type && r.labels == labels) return &r.key;
  }
  return nullptr;
}

// Remembers a selector (replacing the oldest of the recent ones) and returns its cursor key.
const std::string& remember_selector(fanout_state& f, const std::string& type,
                                     const std::vector<node_label>& labels) {
  auto& r = f.recent[f.recent_next++ % f.recent.size()];
  r.set = true;
  r.type = type;
  r.labels = labels;
  r.key = cursor_key(type, labels);
  return r.key;
}

// Takes c's ids from the directory again (it changed, or this node started since).
void take_matches(node::impl& n, detail::rr_cursor& c, const std::string& type,
                  const std::vector<node_label>& labels, bool started) {
  fanout_state& f = *n.fan;
  const broadcast_target want = broadcast_target::of_type(type, labels);
  f.cursor_bytes -= c.ids.capacity() * sizeof(bus_id);
  c.ids.clear();
  if (started && self_matches(n, want)) c.ids.push_back(n.self);
  for (const auto& [id, item] : n.dir) {
    if (want.matches(item.e)) c.ids.push_back(id);
  }
  std::sort(c.ids.begin(), c.ids.end());  // dir is ordered; self goes to its place
  f.cursor_bytes += c.ids.capacity() * sizeof(bus_id);
  c.gen = f.dir_gen;
  c.started = started;
  make_room(f, 0);  // c was used last: it stays
}

constexpr size_t kNotExpected = SIZE_MAX;

// The place of `id` among pb's expected nodes (kNotExpected: none).
size_t expected_at(const pending_broadcast& pb, bus_id id) {
  const auto it = std::lower_bound(pb.expected.begin(), pb.expected.end(), id);
  if (it == pb.expected.end() || *it != id) return kNotExpected;
  return static_cast<size_t>(it - pb.expected.begin());
}

void on_ack(node::impl& n, const proto::header& hd) {
  auto it = n.fan->pending.find(hd.sequence);
  if (it == n.fan->pending.end()) return;  // late: already reported
  pending_broadcast& pb = it->second;
  if (n.now_ms() >= pb.deadline_ms) {  // after timeout_ms: too late to count, whatever ran first
    detail::fan_finish(n, hd.sequence, errc::timeout);
    return;
  }
  const size_t at = expected_at(pb, hd.source);
  if (at == kNotExpected) {  // a node that joined since
    // Only one the directory lists as matching the selector, each once, within
    // broadcast_max_targets: acknowledgements claiming ever-new sources (a child may claim any id
    // of its subnets) or from nodes not targeted grew `extra` without bound.
    fanout_state& f = *n.fan;
    const auto x = std::lower_bound(pb.extra.begin(), pb.extra.end(), hd.source);
    const auto d = n.dir.find(hd.source);
    if ((x != pb.extra.end() && *x == hd.source) || d == n.dir.end() ||
        !pb.to.matches(d->second.e) || f.targets >= n.cfg.broadcast_max_targets) {
      return;
    }
    pb.extra.insert(x, hd.source);
    ++f.targets;
    return;
  }
  if (pb.state[at] == pending_broadcast::acked) return;
  // One that left counts as reached after all (it came back, or its acknowledgement overtook
  // its departure).
  if (pb.state[at] == pending_broadcast::left) --pb.left_count;
  pb.state[at] = pending_broadcast::acked;
  ++pb.acked_count;
  // failed is empty unless some expected node left: finish() reports ok then.
  if (pb.settled()) detail::fan_finish(n, hd.sequence, errc::not_connected);
}

// Node `id` left this node's directory: an expected target of a broadcast of ours that has not
// acknowledged it never will in time (nothing is resent). A broadcast whose every expected node
// has acknowledged or left ends now, not_connected, rather than at its timeout.
void target_left(node::impl& n, bus_id id) {
  std::vector<uint64_t> done;
  for (auto& [bid, pb] : n.fan->pending) {
    const size_t at = expected_at(pb, id);
    if (at == kNotExpected || pb.state[at] != pending_broadcast::waiting) continue;
    pb.state[at] = pending_broadcast::left;
    ++pb.left_count;
    if (pb.settled()) done.push_back(bid);
  }
  for (const uint64_t bid : done) detail::fan_finish(n, bid, errc::not_connected);
}

}  // namespace

// ------------------------------------------------------------------------------ broadcast --
bool detail::fan_routed(node::impl& n, link* from, const proto::header& hd, const uint8_t* data,
                        size_t size) {
  if (hd.type == proto::msg_type::broadcast_ack) {
    if (hd.target != n.self) return false;  // routed on like any message
    if (hd.body_len != 0) {
      n.bad_body(from, hd, "bad broadcast acknowledgement");  // its body is empty
      return true;
    }
    on_ack(n, hd);
    return true;
  }
  if (hd.type != proto::msg_type::broadcast) return false;
  proto::broadcast_body b;
  if (proto::parse_broadcast(data + proto::kHeaderSize, hd.body_len, &b) != errc::ok) {
    // Every relay parses it: a link's peer wrote it or passed it on unparsed (closed). From the
    // ring: dropped, counted and logged (rate-limited), as bad_body does for a routed message.
    if (from != nullptr) {
      n.protocol_violation(from, "bad broadcast body");
    } else {
      n.bad_body(nullptr, hd, "bad broadcast body");
    }
    return true;
  }
  const bus_id from_id = from == nullptr         ? tree_hop_towards(n, hd.source)
                         : from->peer != nullptr ? from->peer->id
                                                 : 0;
  // A copy that cannot go on towards a target (its TTL spent, or the link refused it) is dropped
  // as a relayed message is: counted, and logged at warn (last: on_log may stop or destroy us).
  proto::reason dropped = proto::reason::ok;
  // A copy over a sibling link is one a root sent to us alone (send_direct): it goes no further,
  // whatever its selector says (a wider one would reach our whole tree on a sibling's word). The
  // same for one a sibling wrote into our ring, when access tokens proved the writer.
  const detail::peer_ep* hop = from != nullptr           ? from->peer
                               : n.fan->ring_writer != 0 ? n.find_peer(n.fan->ring_writer)
                                                         : nullptr;
  const bool from_sibling = hop != nullptr && hop->kind == detail::peer_kind::sibling;
  if (from_sibling) {
    // delivered below if it matches us, acknowledged, not sent on
  } else if (hd.ttl > 0) {
    uint8_t head[proto::kHeaderSize];
    std::memcpy(head, data, proto::kHeaderSize);
    head[3] = static_cast<uint8_t>(hd.ttl - 1);
    const const_buffer bufs[2] = {{head, sizeof head},
                                  {data + proto::kHeaderSize, size - proto::kHeaderSize}};
    n.counters.broadcasts_forwarded += detail::fan_out(n, from_id, b.to, bufs, 2);
    for (const auto& [id, e] : n.fan->hops) {
      // Sent, or no link to send on; a link below version 6 is a copy that cannot go on.
      if (e == errc::ok || e == errc::unknown_route) continue;
      dropped = proto::reason_from_errc(e);
      break;
    }
  } else if (detail::fan_out(n, from_id, b.to, nullptr, 0) != 0) {
    ++n.counters.ttl_expired;
    dropped = proto::reason::ttl_expired;
  }
  if (hd.source != n.self && self_matches(n, b.to)) {
    ++n.counters.broadcasts_received;
    const proto::header ack = n.make_header(proto::msg_type::broadcast_ack, hd.source, hd.sequence);
    uint8_t m[proto::kHeaderSize];
    proto::encode_header(ack, m);
    const const_buffer cb{m, sizeof m};
    (void)n.route_reply(hd.source, &cb, sizeof m);
    n.deliver(hd.source, 0, b.user_type, b.payload, b.size);
  }
  if (dropped != proto::reason::ok && !n.dead) n.relay_drop(hd, dropped);
  return true;
}

void detail::fan_stop(node::impl& n) {
  std::vector<uint64_t> ids;
  for (const auto& [id, pb] : n.fan->pending) ids.push_back(id);
  for (const uint64_t id : ids) detail::fan_finish(n, id, errc::closed);
  n.fan->deadlines.clear();
}

// ------------------------------------------------------------------------------- deadlines --
// A broadcast's timeout came only with the node's tick (up to 250 ms late), and an
// acknowledgement read before that tick still counted: h->calls, the calls' exact timer, now
// fires at the earliest broadcast deadline too (node::impl::arm_call_timer).
void detail::fan_add_deadline(node::impl& n, uint64_t id, uint64_t deadline_ms) {
  fanout_state& f = *n.fan;
  if (f.deadlines.size() > 2 * f.pending.size() + 64) {  // mostly reported ones: rebuild
    f.deadlines.clear();
    for (const auto& [bid, pb] : f.pending) f.deadlines.emplace_back(pb.deadline_ms, bid);
    std::make_heap(f.deadlines.begin(), f.deadlines.end(), std::greater<>());
  } else {
    f.deadlines.emplace_back(deadline_ms, id);
    std::push_heap(f.deadlines.begin(), f.deadlines.end(), std::greater<>());
  }
  n.arm_call_timer();
}

uint64_t detail::fan_next_deadline(node::impl& n) {
  fanout_state& f = *n.fan;
  while (!f.deadlines.empty() && f.pending.count(f.deadlines.front().second) == 0) {
    std::pop_heap(f.deadlines.begin(), f.deadlines.end(), std::greater<>());
    f.deadlines.pop_back();
  }
  return f.deadlines.empty() ? UINT64_MAX : f.deadlines.front().first;
}

void detail::fan_expire(node::impl& n, uint64_t now) {
  fanout_state& f = *n.fan;
  while (!f.deadlines.empty() && f.deadlines.front().first <= now) {
    const uint64_t id = f.deadlines.front().second;
    std::pop_heap(f.deadlines.begin(), f.deadlines.end(), std::greater<>());
    f.deadlines.pop_back();
    detail::fan_finish(n, id, errc::timeout);  // nothing if it was reported already
  }
}

void detail::fan_run_deferred(node::impl& n) {
  if (n.dead || n.fan->finished.empty()) return;
  auto done = std::move(n.fan->finished);
  n.fan->finished.clear();
  for (auto& [cb, r] : done) {
    n.fire(cb, r);
    if (n.dead) return;
  }
}

// ------------------------------------------------------------------- any node of a type --
errc node::pick(const std::string& type, const std::vector<node_label>& labels,
                const pick_options& how, bus_id* out) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::pick");
  impl& n = *impl_;
  if (out == nullptr) return n.fail(errc::invalid_argument, "node::pick: out is null");
  if (how.policy > pick_policy::consistent_hash) {
    return n.fail(errc::invalid_argument,
                  "node::pick: policy " + std::to_string(static_cast<unsigned>(how.policy)) +
                      " is none of round_robin, least_loaded, consistent_hash");
  }
  fanout_state& f = *n.fan;
  const std::string* key = recent_key(f, type, labels);
  if (key == nullptr) {
    // No directory entry holds a longer type or label, or more labels: say so instead of keeping
    // a cursor for a key no entry could have.
    const broadcast_target want = broadcast_target::of_type(type, labels);
    if (const std::string why = detail::fan_selector_fault(want); !why.empty()) {
      return n.fail(errc::invalid_argument, "node::pick: " + why);
    }
    key = &remember_selector(f, type, labels);
  }
  detail::rr_cursor& c = cursor_for(f, *key);
  const bool started = n.start_unix_ms != 0;
  if (c.gen != f.dir_gen || c.started != started) take_matches(n, c, type, labels, started);
  const std::vector<bus_id>& ids = c.ids;  // sorted
  if (ids.empty()) {
    // Nothing to take turns among: its cursor goes; it starts afresh if nodes come.
    forget_cursor(f, *key);
    return n.fail(errc::unknown_route, "node::pick: no node of type \"" + type + "\"" +
                                           (labels.empty() ? "" : " with those labels") +
                                           " in the directory");
  }
  bus_id best = ids.front();
  if (how.policy == pick_policy::round_robin) {
    best = ids[c.next++ % ids.size()];
  } else if (how.policy == pick_policy::least_loaded) {
    uint32_t least = UINT32_MAX;
    for (const bus_id id : ids) {
      const auto it = f.loads.find(id);
      const uint32_t l = id == n.self ? f.my_load : it == f.loads.end() ? 0 : it->second;
      if (l < least) {
        least = l;
        best = id;
      }
    }
  } else {
    uint64_t top = 0;
    for (const bus_id id : ids) {
      const uint64_t score = mix(how.key ^ mix(id));
      if (score >= top) {
        top = score;
        best = id;
      }
    }
  }
  *out = best;
  return errc::ok;
}

errc node::send_any(const std::string& type, const std::vector<node_label>& labels,
                    uint32_t msg_type, const void* data, size_t size, const pick_options& how,
                    const send_options& opt, bus_id* chosen, uint64_t* message_id) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::send_any");
  bus_id target = 0;
  errc e = pick(type, labels, how, &target);
  if (e != errc::ok) return e;
  if (chosen != nullptr) *chosen = target;
  uint64_t id = 0;
  e = send_data(target, msg_type, data, size, opt, &id);
  if (e != errc::ok) return e;
  if (message_id != nullptr) *message_id = id;
  // Marked as sent to "any node": it fails at once if that node leaves before its report
  // (fan_departed). Here, not in send_data: a message to a known target pays nothing for it.
  impl& n = *impl_;
  if (target == n.self) return e;
  if (const auto f = n.tx_flows.find(target); f != n.tx_flows.end() && !f->second.entries.empty() &&
                                              f->second.entries.back().message_id == id) {
    f->second.entries.back().any = true;  // end to end: the entry flow_commit() just added
  } else if (n.replies.count(id) != 0) {
    n.fan->any_replies.emplace(id, target);  // next hop, require_response
  }
  return e;
}

namespace {

// fan_departed(): the call_any() calls to `id` still open end with not_connected, from the loop
// (the ones whose request was still in a flow already ended with its settled report).
void fail_any_calls(node::impl& n, bus_id id) {
  auto& calls = n.fan->any_calls;
  for (auto it = calls.begin(); it != calls.end();) {
    if (it->second != id) {
      ++it;
      continue;
    }
    if (n.find_call(it->first) != nullptr) {
      n.deferred_call_fail.emplace_back(n.take_call(it->first, errc::not_connected),
                                        errc::not_connected);
      n.arm_idle();
    }
    it = calls.erase(it);
  }
}

}  // namespace

errc node::call_any(const std::string& type, const std::vector<node_label>& labels,
                    uint32_t msg_type, const void* data, size_t size, uint32_t timeout_ms,
                    call_fn cb, const pick_options& how, const send_options& opt, bus_id* chosen,
                    uint64_t* call_id) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::call_any");
  bus_id target = 0;
  errc e = pick(type, labels, how, &target);
  if (e != errc::ok) return e;
  if (chosen != nullptr) *chosen = target;
  uint64_t id = 0;
  e = call(target, msg_type, data, size, timeout_ms, std::move(cb), opt, &id);
  if (e != errc::ok) return e;
  if (call_id != nullptr) *call_id = id;
  impl& n = *impl_;
  if (target == n.self) return e;
  // End to end, the request's flow entry (the one call() just added) is settled, not resent, when
  // the node leaves (fan_departed): the call then ends with its report.
  if (const auto f = n.tx_flows.find(target); f != n.tx_flows.end() && !f->second.entries.empty()) {
    detail::tx_entry& last = f->second.entries.back();
    const uint64_t* m = n.call_by_message.find(last.message_id);
    if (m != nullptr && *m == id) last.any = true;
  }
  n.fan->any_calls.emplace(id, target);
  return e;
}

namespace {

// fan_departed() and fan_restarted(): what was sent to node `id` as "any node" fails now.
void settle_any(node::impl& n, bus_id id) {
  bool writable = false;  // settled messages freed a full flow: on_writable(id), as acks do
  if (const auto it = n.tx_flows.find(id); it != n.tx_flows.end()) {
    detail::tx_flow& f = it->second;
    bool failed = false;
    for (size_t i = 0; i < f.entries.size(); ++i) {
      detail::tx_entry& e = f.entries[i];
      if (!e.any || e.settled) continue;
      // Handed to a link or not, it is not resent to the node's next incarnation nor to
      // another node (it may have been delivered: at most once).
      e.settled = true;
      failed = true;
      n.defer_report(e.message_id, id, errc::not_connected, true);
    }
    if (failed) {
      f.need_sync = true;  // the target must not wait for what was settled
      n.flow_settle_front(f, 0, errc::ok);
      writable = drained_to_half(f, n.cfg.retransmit_max_messages, n.cfg.retransmit_max_bytes);
      if (writable) f.user_blocked = false;
    }
  }
  auto& owed = n.fan->any_replies;
  for (auto it = owed.begin(); it != owed.end();) {
    if (it->second != id) {
      ++it;
      continue;
    }
    if (const auto r = n.replies.find(it->first); r != n.replies.end() && !r->second.cb) {
      n.replies.erase(r);
      n.defer_report(it->first, id, errc::not_connected, true);  // require_response's
    }
    it = owed.erase(it);
  }
  fail_any_calls(n, id);
  if (writable) n.fire(n.cbs.on_writable, id);  // last: it may send, or destroy the node
}

}  // namespace

void detail::fan_departed(node::impl& n, bus_id id) {
  // A relay's refusal of a send_any message leaves the directory as it is: only a departure counts.
  if (!n.fan->pending.empty() && n.dir.count(id) == 0) target_left(n, id);
  settle_any(n, id);
}

bool detail::fan_new_incarnation(const directory_entry& was, const directory_entry& now) {
  // 0: not known (an entry of an older version may carry none).
  return was.start_time_ms != 0 && now.start_time_ms != 0 &&
         (was.pid != now.pid || was.start_time_ms != now.start_time_ms);
}

void detail::fan_restarted(node::impl& n, bus_id id) {
  if (!n.fan->pending.empty()) target_left(n, id);
  if (const auto it = n.tx_flows.find(id); it != n.tx_flows.end()) {
    it->second.peer_incarnation = 0;  // the old one's: the new one's first ack is no restart
  }
  settle_any(n, id);
}

void detail::fan_tick(node::impl& n, uint64_t now) {
  fanout_state& f = *n.fan;
  detail::fan_expire(n, now);  // h->calls does this at each deadline; the tick is a backstop
  for (auto it = f.any_replies.begin(); it != f.any_replies.end();) {
    it = n.replies.count(it->first) == 0 ? f.any_replies.erase(it) : std::next(it);
  }
  for (auto it = f.any_calls.begin(); it != f.any_calls.end();) {
    it = n.find_call(it->first) == nullptr ? f.any_calls.erase(it) : std::next(it);
  }
  fan_own_load(n, now);
}

}  // namespace uvbus
