// The bus directory of a static tree: every node's entry flooded along parent/child links
// (version 5, msg_type::directory), snapshots when a tree link comes up, removals when one is
// lost, events to on_directory, and the lookups of node::directory()/lookup()/find().
#include <unistd.h>

#include <chrono>

#include "bus/node_impl.h"

namespace uvbus {

namespace {
// A directory body is flushed once it passes this size (an entry is at most ~7 KiB).
constexpr size_t kDirChunkBytes = size_t{24} * 1024;
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

void node::impl::dir_send(peer_ep* p, const proto::directory_body& b) {
  proto::directory_body chunk;
  chunk.op = b.op;
  std::vector<uint8_t> body;
  const auto flush = [&] {
    body.clear();
    proto::encode_directory(chunk, &body);
    (void)send_control(p->lk, make_header(msg_type::directory, p->id, 0), body);
    chunk.entries.clear();
    chunk.ids.clear();
  };
  if (b.op == proto::dir_op::remove) {
    for (const bus_id id : b.ids) {
      chunk.ids.push_back(id);
      if (chunk.ids.size() == proto::kMaxDirItems) flush();
    }
    if (!chunk.ids.empty()) flush();
    return;
  }
  size_t bytes = 0;
  for (const directory_entry& e : b.entries) {
    chunk.entries.push_back(e);
    bytes += 64 + e.name.size() + e.type.size() + e.host_id.size() + e.hostname.size();
    for (const auto& [k, v] : e.labels) bytes += 2 + k.size() + v.size();
    for (const auto& u : e.listen) bytes += 2 + u.size();
    if (bytes >= kDirChunkBytes) {
      flush();
      bytes = 0;
    }
  }
  if (!chunk.entries.empty()) flush();
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

namespace {
// What a tree peer gets of our directory: our own entry, then everything not learned through it
// (etcd's entries stay out: every node with discovery reads etcd itself).
proto::directory_body snapshot_for(const node::impl& n, const detail::peer_ep* p) {
  proto::directory_body b;
  b.entries.push_back(n.self_entry());
  for (const auto& [id, item] : n.dir) {
    if (item.via != p->id && item.via != node::impl::kViaDiscovery) b.entries.push_back(item.e);
  }
  return b;
}
}  // namespace

// A tree link came up: the peer gets everything we know (its own part of the tree included, which
// it ignores); a new parent also changes our own entry for the nodes below us.
void node::impl::dir_link_up(peer_ep* p) {
  if (start_unix_ms == 0) return;  // not started (cannot happen for a registered peer)
  if (!dir_sends_to(p)) return;
  proto::directory_body b = snapshot_for(*this, p);
  if (p->kind == peer_kind::parent) b.entries.front().parent = p->id;
  dir_send(p, b);
  if (p->kind == peer_kind::parent) {
    proto::directory_body me;
    me.entries.push_back(b.entries.front());
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
    fire(cbs.on_directory, directory_event::removed, e);
    if (dead) return;
  }
  dir_broadcast(peer, b);
}

bool node::impl::dir_has_room(bus_id id) {
  if (dir.size() < cfg.directory_max_entries) return true;
  // The first one and then every 1024th: a flood of announcements is one line in a thousand.
  if (counters.directory_skipped++ % 1024 == 0) {
    log(log_level::warn,
        "directory: directory_max_entries (%zu) reached: 0x%" PRIx64 " left out (%" PRIu64
        " so far)",
        cfg.directory_max_entries, id, counters.directory_skipped);
  }
  return false;
}

void node::impl::dir_upsert(peer_ep* from, std::vector<directory_entry>& entries) {
  // A callback below may close links: only the peer's id is used after the first one.
  const bus_id from_id = from->id;
  const bool from_child = from->kind == peer_kind::child;
  proto::directory_body fwd;
  for (directory_entry& e : entries) {
    if (e.id == self) continue;
    // A child speaks only for its own part of the tree.
    if (from_child && !table.source_allowed(from_id, e.id)) {
      log(log_level::warn,
          "directory: child 0x%" PRIx64 " announced 0x%" PRIx64 " outside its subnets: ignored",
          from_id, e.id);
      continue;
    }
    auto it = dir.find(e.id);
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
      it->second.e = e;
      ev = directory_event::changed;
    }
    fwd.entries.push_back(e);
    fire(cbs.on_directory, ev, it->second.e);
    if (dead) return;
  }
  dir_broadcast(from_id, fwd);
}

void node::impl::dir_remove(peer_ep* from, const std::vector<bus_id>& ids) {
  const bus_id from_id = from->id;
  proto::directory_body fwd;
  fwd.op = proto::dir_op::remove;
  for (bus_id id : ids) {
    auto it = dir.find(id);
    // Only the link an entry came through may take it away (it may have moved since).
    if (it == dir.end() || it->second.via != from_id) continue;
    fwd.ids.push_back(id);
    if (disc_keep(it->second)) {
      if (dead) return;
      continue;
    }
    const directory_entry e = std::move(it->second.e);
    dir.erase(it);
    fire(cbs.on_directory, directory_event::removed, e);
    if (dead) return;
  }
  dir_broadcast(from_id, fwd);
}

void node::impl::on_directory_msg(link* lk, const proto::header& hd, const uint8_t* body) {
  peer_ep* p = lk->peer;
  proto::directory_body b;
  if (!dir_peer(p)) {
    protocol_violation(lk,
                       "directory message from a peer that is not a parent or child");  // a tool
    return;
  }
  if (proto::parse_directory(body, hd.body_len, &b) != errc::ok) {
    protocol_violation(lk, "bad directory message");
    return;
  }
  if (b.op == proto::dir_op::load) {
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
  const size_t cap = cfg.directory_max_entries;
  const size_t room = dir.size() < cap ? cap - dir.size() : 0;
  const auto fits = [&](size_t skipped) {
    return skipped != 0 && room >= std::min(skipped, std::max<size_t>(cap / 16, 1));
  };
  if (disc != nullptr && fits(disc_skipped)) {
    disc_skipped = 0;
    for (const directory_entry& e : disc->directory()) {
      if (dir.count(e.id) == 0) disc_event(directory_event::added, e);
      if (dead) return;
    }
  }
  for (auto& [id, p] : peers) {
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
      dir_send(p.get(), snapshot_for(*this, p.get()));
    }
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
  std::vector<directory_entry> out;
  for (directory_entry& e : directory()) {
    if ((type.empty() || e.type == type) && e.has_labels(labels)) out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(),
            [](const directory_entry& a, const directory_entry& b) { return a.id < b.id; });
  return out;
}

}  // namespace uvbus
