// The bus directory of a static tree: every node's entry flooded along parent/child links
// (version 5, msg_type::directory), snapshots when a tree link comes up, removals when one is
// lost, events to on_directory, and the lookups of node::directory()/lookup()/find().
#include <unistd.h>

#include <chrono>

#include "bus/node_discovery.h"
#include "bus/node_impl.h"

namespace uvbus {

namespace {
// A directory body is flushed once it passes this size (an entry is at most ~7 KiB).
constexpr size_t kDirChunkBytes = size_t{24} * 1024;

// A child's directory events (added, changed, removed: each one an on_directory event here and a
// message on every other tree link): kDirChangesPerSecond, in bursts of up to kDirChangeBurst,
// plus directory_max_entries once for the snapshot of its subtree it sends at registration. Past
// that each id's latest state waits in peer_ep::dir_held and is taken in (one event, forwarded
// once) at the tick as the budget refills: a child re-announcing its ids over and over costs the
// bus that rate at most, and an honest child's changes still arrive, late and coalesced.
constexpr size_t kDirChangeBurst = 1024;
constexpr uint64_t kDirChangesPerSecond = 1024;

void dir_refill(peer_ep* p, uint64_t now, size_t snapshot) {
  if (!p->dir_paced) {
    p->dir_paced = true;
    p->dir_tokens = kDirChangeBurst + snapshot;
    p->dir_refill_ms = now;
    return;
  }
  const uint64_t add = (now - p->dir_refill_ms) * kDirChangesPerSecond / 1000;
  if (add == 0) return;
  p->dir_refill_ms = now;
  if (p->dir_tokens < kDirChangeBurst) {
    p->dir_tokens = static_cast<size_t>(std::min<uint64_t>(kDirChangeBurst, p->dir_tokens + add));
  }
}

// A new entry `id` left out for want of room: counted, and logged the first time and then every
// 1024th (a flood of announcements is one line in a thousand; on_log may destroy the node).
void dir_left_out(node::impl& n, bus_id id) {
  if (n.counters.directory_skipped++ % 1024 == 0) {
    n.log(log_level::warn,
          "directory: directory_max_entries (%zu) reached: 0x%" PRIx64 " left out (%" PRIu64
          " so far)",
          n.cfg.directory_max_entries, id, n.counters.directory_skipped);
  }
}

// Whether a child's event for `id` waits (e: its new entry; nullptr: its removal): it does while
// an earlier one for the id waits (this one replaces it) or the child's budget is spent. What
// waits is bounded: an id in our directory, or while fewer than directory_max_entries wait; a new
// id past that is left out as for a full directory (true, nothing kept; dir_tick asks again). The
// first one held is logged, then every 1024th (the log callback may destroy the node: n.dead).
bool dir_hold(node::impl& n, peer_ep* p, bus_id id, const directory_entry* e) {
  dir_refill(p, n.now_ms(), n.cfg.directory_max_entries);
  auto it = p->dir_held.find(id);
  if (it == p->dir_held.end() && p->dir_tokens > 0) {
    --p->dir_tokens;
    return false;
  }
  if (it == p->dir_held.end() && p->dir_held.size() >= n.cfg.directory_max_entries &&
      n.dir.count(id) == 0) {
    ++p->dir_skipped;
    dir_left_out(n, id);
    return true;
  }
  p->dir_held[id] = e != nullptr ? std::optional<directory_entry>(*e) : std::nullopt;
  if (p->dir_coalesced++ % 1024 == 0) {
    n.log(log_level::warn,
          "directory: child 0x%" PRIx64 " changes its entries faster than %" PRIu64
          " a second: the latest state of each is taken in as the budget refills (%" PRIu64
          " held so far)",
          p->id, kDirChangesPerSecond, p->dir_coalesced);
  }
  return true;
}

// Takes in what child `child` has waiting (dir_hold), as far as its budget refilled: removals,
// then entries, each as the child's own message would have been.
void dir_release(node::impl& n, bus_id child) {
  peer_ep* p = n.find_peer(child);
  if (p == nullptr || p->dir_held.empty()) return;
  dir_refill(p, n.now_ms(), 0);
  std::vector<directory_entry> up;
  std::vector<bus_id> gone;
  while (p->dir_tokens > 0 && !p->dir_held.empty()) {
    auto it = p->dir_held.begin();
    if (it->second.has_value()) {
      up.push_back(std::move(*it->second));
    } else {
      gone.push_back(it->first);
    }
    p->dir_held.erase(it);
    --p->dir_tokens;
  }
  if (!gone.empty()) n.dir_remove(p, gone, false);
  if (n.dead || up.empty()) return;
  p = n.find_peer(child);
  if (p != nullptr) n.dir_upsert(p, up, false);
}

}  // namespace

const char* to_string(directory_event e) noexcept {
  switch (e) {
    case directory_event::added:
      return "added";
    case directory_event::changed:
      return "changed";
    case directory_event::removed:
      return "removed";
  }
  return "unknown";
}

directory_entry node::impl::self_entry() const {
  directory_entry e;
  e.id = self;
  e.parent = is_up && parent_link != nullptr && parent_link->peer != nullptr ? parent_id : 0;
  e.name = cfg.name;
  e.type = cfg.type;
  e.labels = cfg.labels;
  e.listen = listen_urls;
  e.host_id = host_id;
  e.hostname = hostname;
  e.pid = static_cast<uint32_t>(getpid());
  e.start_time_ms = start_unix_ms;
  e.protocol_version = std::min(cfg.protocol_max, proto::kMaxVersion);
  return e;
}

bool node::impl::dir_peer(const peer_ep* p) const {
  return p != nullptr && (p->kind == peer_kind::parent || p->kind == peer_kind::child) &&
         p->lk != nullptr && version_of(p) >= 5;
}

bool node::impl::dir_sends_to(const peer_ep* p) const {
  if (p == nullptr || cfg.join_as_tool) return false;  // a tool only listens
  if (p->kind == peer_kind::tool) return p->lk != nullptr && version_of(p) >= 5;
  return dir_peer(p);
}

namespace {

// An entry's share of a body, roughly (for chunking only).
size_t entry_bytes(const directory_entry& e) {
  size_t n = 64 + e.name.size() + e.type.size() + e.host_id.size() + e.hostname.size();
  for (const auto& [k, v] : e.labels) n += 2 + k.size() + v.size();
  for (const auto& u : e.listen) n += 2 + u.size();
  return n;
}

}  // namespace

errc node::impl::dir_out(peer_ep* p, const proto::directory_body& chunk) {
  std::vector<uint8_t> body;
  proto::encode_directory(chunk, &body);
  return send_control(p->lk, make_header(msg_type::directory, p->id, 0), body);
}

// Directory messages to p go out at once, unless they meet a full link queue: then what is left
// waits in p (removals in order; for changes and snapshots, a pass over the whole directory) and
// everything after it waits behind it, so that the peer sees them in order (dir_drain).
void node::impl::dir_send(peer_ep* p, const proto::directory_body& b) {
  const bool behind = p->dir_pass != 0 || !p->dir_removes.empty();
  proto::directory_body chunk;
  chunk.op = b.op;
  if (b.op == proto::dir_op::remove) {
    for (size_t i = 0; i < b.ids.size(); i += proto::kMaxDirItems) {
      const auto from = b.ids.begin() + static_cast<std::ptrdiff_t>(i);
      const auto to = b.ids.begin() +
                      static_cast<std::ptrdiff_t>(std::min(b.ids.size(), i + proto::kMaxDirItems));
      chunk.ids.assign(from, to);
      const errc e = behind ? errc::queue_full : dir_out(p, chunk);
      if (e == errc::queue_full) {
        dir_owe_removes(p, from, b.ids.end());
        return;
      }
      if (e != errc::ok) return;  // the link is going: its peer forgets what came through it
    }
    return;
  }
  if (behind) {
    dir_owe_pass(p);
    return;
  }
  size_t bytes = 0;
  for (size_t i = 0; i < b.entries.size(); ++i) {
    chunk.entries.push_back(b.entries[i]);
    bytes += entry_bytes(b.entries[i]);
    if (bytes < kDirChunkBytes && i + 1 < b.entries.size()) continue;
    const errc e = dir_out(p, chunk);
    if (e == errc::queue_full) dir_owe_pass(p);
    if (e != errc::ok) return;
    chunk.entries.clear();
    bytes = 0;
  }
}

void node::impl::dir_owe_pass(peer_ep* p) {
  if (p->dir_pass == 0) {
    p->dir_pass = 1;
  } else if (p->dir_pass == 2) {
    p->dir_again = true;  // entries the pass has already sent may have changed
  }
}

void node::impl::dir_owe_removes(peer_ep* p, std::vector<bus_id>::const_iterator from,
                                 std::vector<bus_id>::const_iterator to) {
  p->dir_removes.insert(p->dir_removes.end(), from, to);
  if (p->dir_removes.size() <= cfg.directory_max_entries) return;
  // It has not read a directory's worth of removals: rather than hold more, let it go; it gets a
  // fresh snapshot when it registers again (and forgets what came through this link).
  log(log_level::warn, "directory: %s 0x%" PRIx64 " is %zu removals behind: closing its link",
      detail::to_string(p->kind), p->id, p->dir_removes.size());
  p->dir_removes.clear();
  p->dir_pass = 0;
  if (p->lk != nullptr) close_link(p->lk, errc::queue_full);
}

// Sends what waits for p while its queue takes it: removals first, then the pass (our own entry,
// then every entry not learned through p nor from etcd, in id order from dir_cursor), then
// another pass if entries changed while one ran. Called at on_writable and every tick.
void node::impl::dir_drain(peer_ep* p) {
  if (p->dir_pass == 0 && p->dir_removes.empty()) return;
  proto::directory_body chunk;
  chunk.op = proto::dir_op::remove;
  size_t sent = 0;
  errc e = errc::ok;
  while (sent < p->dir_removes.size() && e == errc::ok) {
    const size_t n = std::min(p->dir_removes.size() - sent, proto::kMaxDirItems);
    chunk.ids.assign(p->dir_removes.begin() + static_cast<std::ptrdiff_t>(sent),
                     p->dir_removes.begin() + static_cast<std::ptrdiff_t>(sent + n));
    e = dir_out(p, chunk);
    if (e == errc::ok) sent += n;
  }
  p->dir_removes.erase(p->dir_removes.begin(),
                       p->dir_removes.begin() + static_cast<std::ptrdiff_t>(sent));
  chunk.op = proto::dir_op::upsert;
  while (e == errc::ok && p->dir_pass != 0) {
    chunk.entries.clear();
    size_t bytes = 0;
    if (p->dir_pass == 1) {  // a pass starts with our own entry
      chunk.entries.push_back(self_entry());
      if (p->kind == peer_kind::parent) chunk.entries.front().parent = p->id;
      p->dir_cursor = 0;
    }
    auto it = dir.lower_bound(p->dir_cursor);
    for (; it != dir.end() && bytes < kDirChunkBytes; ++it) {
      if (it->second.via == p->id || it->second.via == kViaDiscovery) continue;
      chunk.entries.push_back(it->second.e);
      bytes += entry_bytes(it->second.e);
    }
    if (!chunk.entries.empty()) e = dir_out(p, chunk);
    if (e != errc::ok) break;
    p->dir_pass = 2;
    if (it == dir.end()) {
      p->dir_pass = p->dir_again ? 1 : 0;  // another pass from the start, at once
      p->dir_again = false;
      continue;
    }
    p->dir_cursor = it->first;  // the first entry not sent
  }
  if (e != errc::ok && e != errc::queue_full) {  // the link is going
    p->dir_removes.clear();
    p->dir_pass = 0;
  }
}

void node::impl::dir_broadcast(bus_id except, const proto::directory_body& b) {
  if ((b.op == proto::dir_op::upsert && b.entries.empty()) ||
      (b.op == proto::dir_op::remove && b.ids.empty())) {
    return;
  }
  for (auto& [id, p] : peers) {
    if (id != except && dir_sends_to(p.get())) dir_send(p.get(), b);
  }
}

// A tree link came up: the peer gets everything we know but what came through it and etcd's
// entries (every node with discovery reads etcd itself), as a pass (dir_drain: as much as its
// queue takes now, the rest as it drains); a new parent also changes our own entry for the nodes
// below us.
void node::impl::dir_link_up(peer_ep* p) {
  if (start_unix_ms == 0) return;  // not started (cannot happen for a registered peer)
  if (!dir_sends_to(p)) return;
  dir_owe_pass(p);
  dir_drain(p);
  if (p->kind == peer_kind::parent) {
    proto::directory_body me;
    me.entries.push_back(self_entry());
    me.entries.front().parent = p->id;
    dir_broadcast(p->id, me);
  }
}

// A peer's link is gone: everything learned through it leaves the directory (here and, through
// the other tree links, everywhere).
void node::impl::dir_link_gone(bus_id peer) {
  proto::directory_body b;
  b.op = proto::dir_op::remove;
  for (auto it = dir.begin(); it != dir.end();) {
    if (it->second.via != peer) {
      ++it;
      continue;
    }
    b.ids.push_back(it->first);
    if (disc_keep(it->second)) {  // still in etcd: stays, as etcd's entry
      if (dead) return;
      ++it;
      continue;
    }
    const directory_entry e = std::move(it->second.e);
    it = dir.erase(it);
    ++fan->dir_gen;
    detail::fan_departed(*this, e.id);  // its send_any messages fail now
    fire(cbs.on_directory, directory_event::removed, e);
    if (dead) return;
  }
  dir_broadcast(peer, b);
}

bool node::impl::dir_has_room(bus_id id) {
  if (dir.size() < cfg.directory_max_entries) return true;
  dir_left_out(*this, id);
  return false;
}

void node::impl::dir_upsert(peer_ep* from, std::vector<directory_entry>& entries, bool paced) {
  // A callback below may close links: only the peer's id is used after the first one.
  const bus_id from_id = from->id;
  const bool from_child = from->kind == peer_kind::child;
  proto::directory_body fwd;
  size_t outside = 0;  // ids outside a child's subnets: one line for the message, not one each
  bus_id first_outside = 0;
  for (directory_entry& e : entries) {
    if (e.id == self) continue;
    // A child speaks only for its own part of the tree, a parent for all but ours (what lies in
    // our subnets is told us by our children: a parent's word would outlast the node).
    if (from_child ? !table.source_allowed(from_id, e.id) : table.owns(e.id)) {
      if (outside++ == 0) first_outside = e.id;
      continue;
    }
    auto it = dir.find(e.id);
    // A child's event over its budget waits (dir_hold); an entry that changes nothing is free.
    if (paced && from_child) {
      peer_ep* p = find_peer(from_id);
      const bool same = it != dir.end() && it->second.e == e;
      if (p != nullptr && (!same || p->dir_held.count(e.id) != 0) && dir_hold(*this, p, e.id, &e)) {
        if (dead) return;
        continue;
      }
    }
    directory_event ev = directory_event::added;
    if (it == dir.end() && !dir_has_room(e.id)) {
      if (peer_ep* p = find_peer(from_id); p != nullptr) ++p->dir_skipped;  // dir_tick asks again
      continue;
    }
    if (it == dir.end()) {
      it = dir.emplace(e.id, dir_item{e, from_id}).first;
    } else {
      const bool same = it->second.e == e;
      it->second.via = from_id;
      if (same) continue;
      if (detail::fan_new_incarnation(it->second.e, e)) {
        // A restart seen as a change (a removal and re-add coalesced, or a quick restart): what
        // went to the old incarnation as "any node" fails before anyone can pick the new one.
        detail::fan_restarted(*this, e.id);
        if (dead) return;
        it = dir.find(e.id);
        if (it == dir.end()) continue;
      }
      it->second.e = e;
      ev = directory_event::changed;
    }
    ++fan->dir_gen;
    fwd.entries.push_back(e);
    fire(cbs.on_directory, ev, it->second.e);
    if (dead) return;
  }
  // Any peer can send these at will: rate-limited (dir_tick logs how many were left out).
  if (outside != 0 && log_allowed(detail::peer_log::dir_not_theirs)) {
    log(log_level::warn,
        "directory: %s 0x%" PRIx64 " announced %zu ids %s subnets (the first 0x%" PRIx64
        "): ignored",
        from_child ? "child" : "parent", from_id, outside,
        from_child ? "outside its" : "inside our", first_outside);
  }
  // A log line above may have destroyed the node: it forwards nothing then.
  if (dead) return;
  dir_broadcast(from_id, fwd);
}

void node::impl::dir_remove(peer_ep* from, const std::vector<bus_id>& ids, bool paced) {
  const bus_id from_id = from->id;
  const bool from_child = from->kind == peer_kind::child;
  proto::directory_body fwd;
  fwd.op = proto::dir_op::remove;
  for (bus_id id : ids) {
    auto it = dir.find(id);
    if (paced && from_child) {  // as in dir_upsert: a removal of an entry of its own is an event
      peer_ep* p = find_peer(from_id);
      const bool mine = it != dir.end() && it->second.via == from_id;
      if (p != nullptr && (mine || p->dir_held.count(id) != 0) && dir_hold(*this, p, id, nullptr)) {
        if (dead) return;
        continue;
      }
    }
    // Only the link an entry came through may take it away (it may have moved since).
    if (it == dir.end() || it->second.via != from_id) continue;
    fwd.ids.push_back(id);
    if (disc_keep(it->second)) {
      if (dead) return;
      continue;
    }
    const directory_entry e = std::move(it->second.e);
    dir.erase(it);
    ++fan->dir_gen;
    detail::fan_departed(*this, id);  // its send_any messages fail now
    fire(cbs.on_directory, directory_event::removed, e);
    if (dead) return;
  }
  dir_broadcast(from_id, fwd);
}

void node::impl::on_directory_msg(link* lk, const proto::header& hd, const uint8_t* body) {
  peer_ep* p = lk->peer;
  proto::directory_body b;
  if (!dir_peer(p)) {
    const bool tree = p != nullptr && (p->kind == peer_kind::parent || p->kind == peer_kind::child);
    protocol_violation(lk, tree ? "directory message over a link below protocol version 5"
                                : "directory message from a peer that is not a parent or child");
    return;
  }
  if (proto::parse_directory(body, hd.body_len, &b) != errc::ok) {
    protocol_violation(lk, "bad directory message");
    return;
  }
  if (b.op == proto::dir_op::load && version_of(p) < 6) {
    protocol_violation(lk, "load hints over a link below protocol version 6");  // never sent there
  } else if (b.op == proto::dir_op::load) {
    detail::fan_loads(*this, p, b.loads);
  } else if (b.op == proto::dir_op::upsert && b.entries.empty()) {
    p->dir_wanted = true;  // a request for our directory: dir_tick answers it
  } else if (b.op == proto::dir_op::upsert) {
    dir_upsert(p, b.entries);
  } else {
    dir_remove(p, b.ids);
  }
}

// Entries left out for want of room are not announced again by their nodes: once there is room
// for them, we ask each tree link that brought some for its directory again (an upsert with no
// entries; a peer without this ignores it), and what we already know comes in unchanged (no
// event, not forwarded); etcd's entries are taken again from etcd_discovery's copy. Only once the
// room reaches what was left out or a sixteenth of directory_max_entries, whichever is less: a
// bus larger than the bound is not asked over and over for a slot or two. A request is answered
// at most once per heartbeat interval per link (a whole directory can be large).
void node::impl::dir_tick(uint64_t now) {
  detail::fan_load_tick(*this, now);  // the load hints (dir_op::load) held back
  const size_t cap = cfg.directory_max_entries;
  const size_t room = dir.size() < cap ? cap - dir.size() : 0;
  const auto fits = [&](size_t skipped) {
    return skipped != 0 && room >= std::min(skipped, std::max<size_t>(cap / 16, 1));
  };
  if (disc != nullptr && fits(disc_skipped)) {
    disc_skipped = 0;
    for (const directory_entry& e : detail::disc_directory(*disc)) {
      if (dir.count(e.id) == 0) disc_event(directory_event::added, e);
      if (dead) return;
    }
  }
  for (auto& [id, p] : peers) {
    dir_drain(p.get());  // what met a full queue (on_writable drains it too)
    if (!dir_peer(p.get())) continue;
    if (fits(p->dir_skipped) && !cfg.join_as_tool) {
      std::vector<uint8_t> body;
      proto::encode_directory(proto::directory_body{}, &body);
      // A full link queue: asked at a later tick.
      if (send_control(p->lk, make_header(msg_type::directory, p->id, 0), body) == errc::ok) {
        p->dir_skipped = 0;
      }
    }
    if (p->dir_wanted && now >= p->dir_answer_after_ms && dir_sends_to(p.get())) {
      p->dir_wanted = false;
      p->dir_answer_after_ms = now + cfg.heartbeat_interval_ms;
      dir_owe_pass(p.get());
      dir_drain(p.get());
    }
  }
  // Children's events held over their budget, as much as it refilled (by id: callbacks run).
  std::vector<bus_id> holding;
  for (auto& [id, p] : peers) {
    if (!p->dir_held.empty()) holding.push_back(id);
  }
  for (bus_id id : holding) {
    dir_release(*this, id);
    if (dead) return;
  }
}

// ------------------------------------------------------------------------- public wrappers --
std::vector<directory_entry> node::directory() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::directory", {});
  std::vector<directory_entry> out;
  if (impl_->start_unix_ms == 0) return out;
  out.reserve(impl_->dir.size() + 1);
  out.push_back(impl_->self_entry());
  for (const auto& [id, item] : impl_->dir) out.push_back(item.e);
  return out;
}

bool node::lookup(bus_id id, directory_entry* out) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::lookup", false);
  if (impl_->start_unix_ms == 0 || out == nullptr) return false;
  if (id == impl_->self) {
    *out = impl_->self_entry();
    return true;
  }
  auto it = impl_->dir.find(id);
  if (it == impl_->dir.end()) return false;
  *out = it->second.e;
  return true;
}

bool node::lookup_name(const std::string& name, directory_entry* out) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::lookup_name", false);
  for (directory_entry& e : directory()) {
    if (e.name == name) {
      if (out != nullptr) *out = std::move(e);
      return true;
    }
  }
  return false;
}

std::vector<directory_entry> node::find(const std::string& type,
                                        const std::vector<node_label>& labels) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::find", {});
  std::vector<directory_entry> out;
  for (directory_entry& e : directory()) {
    if ((type.empty() || e.type == type) && e.has_labels(labels)) out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(),
            [](const directory_entry& a, const directory_entry& b) { return a.id < b.id; });
  return out;
}

}  // namespace uvbus
