// node_config::discovery inside a node: registers the node's own directory entry in etcd
// (etcd_discovery), merges the entries found there into the node's directory and on_directory
// (kept apart from the tree's flooding), dials the nodes no tree of ours knows directly, revokes
// on stop(), and optionally picks the parent by a rule (discovery_parent_type / _labels) when
// parent_urls is empty, choosing again when the chosen parent leaves etcd or a lower id appears.
#include "bus/node_discovery.h"

#include <atomic>

#include "bus/auth.h"  // detail::printable: the words of etcd entries in log lines
#include "bus/node_impl.h"

namespace uvbus {

namespace detail {
namespace {
std::atomic<uint64_t> entries_copied{0};
}  // namespace

std::vector<directory_entry> disc_directory(const etcd_discovery& d) {
  std::vector<directory_entry> all = d.directory();
  entries_copied.fetch_add(all.size(), std::memory_order_relaxed);
  return all;
}

uint64_t disc_entries_copied() noexcept {
  return entries_copied.load(std::memory_order_relaxed);
}
}  // namespace detail

namespace {

// c's stream listen URLs (at most kMaxListen) into *urls; false if it has none.
bool stream_urls(const directory_entry& c, std::vector<std::string>* urls) {
  urls->clear();
  for (const std::string& u : c.listen) {
    if (u.rfind("shm://", 0) != 0 && urls->size() < proto::kMaxListen) urls->push_back(u);
  }
  return !urls->empty();
}

// Whether c may be the parent by cfg's rule: of discovery_parent_type, with every
// discovery_parent_label and a stream listen URL (its stream URLs are then in *urls).
bool parent_candidate(const node_config& cfg, bus_id self, const directory_entry& c,
                      std::vector<std::string>* urls) {
  if (c.id == self || c.type != cfg.discovery_parent_type ||
      !c.has_labels(cfg.discovery_parent_labels)) {
    return false;
  }
  return stream_urls(c, urls);
}

// Whether an etcd event for e may change what disc_pick_parent chooses, mirroring it: e is the
// parent, or a candidate below it, or any candidate while the parent no longer matches (or none
// is chosen). Any other event changes nothing, and the choice (a copy of the whole directory)
// is not made again: it was made for each event, N copies of up to N entries for a range of N.
bool may_choose_anew(const node_config& cfg, bus_id self, bus_id parent, const etcd_discovery& d,
                     const directory_entry& e) {
  std::vector<std::string> urls;
  if (e.id == parent) return true;
  if (!parent_candidate(cfg, self, e, &urls)) return false;
  if (parent == 0 || e.id < parent) return true;
  directory_entry cur;
  return d.lookup(parent, &cur) && !parent_candidate(cfg, self, cur, &urls);
}

}  // namespace

// Refuses (nothing left started) when etcd_discovery does not start: without it the node would
// run without its entry in etcd, and with discovery_parent_type come up as a lone root.
errc node::impl::disc_start() {
  if (cfg.discovery.etcd_endpoints.empty()) return errc::ok;
  discovery_callbacks cb;
  cb.on_directory = [this](directory_event ev, const directory_entry& e) { disc_event(ev, e); };
  // Deferred to the loop: etcd_discovery's on_log may call only its const members, and the user's
  // on_log may call stop() (which stops the etcd_discovery) or destroy the node.
  cb.on_log = [this](log_level lv, const std::string& m) { log_later(lv, "%s", m.c_str()); };
  disc = std::make_unique<etcd_discovery>(loop, cfg.discovery, std::move(cb));
  directory_entry me = self_entry();
  me.parent = 0;
  // node::validate checked cfg.discovery itself; the entry (its size against max_entry_bytes)
  // is only known now.
  if (const errc e = disc->start(me); e != errc::ok) {
    const std::string why = disc->last_error().detail;
    disc.reset();
    return refuse_call(e, "node::start: node_config.discovery: " + why);
  }
  disc_parent_wanted = cfg.parent_urls.empty() && !cfg.discovery_parent_type.empty();
  disc_rule = disc_parent_wanted;
  return errc::ok;
}

void node::impl::disc_stop() {
  // Revokes the lease. The node's stop completes (on_down(closed)) only after the revoke's answer
  // (bounded by request_timeout_ms, twice that when a token must be got first): destroying the
  // node in on_down would otherwise cancel it.
  if (disc) {
    disc_stopping = disc->stop([this] {
      disc_stopping = false;
      maybe_finish_stop();
    }) == errc::ok;
  }
  if (disc_rule) cfg.parent_urls.clear();  // a later start() applies the rule again
  disc_parent_wanted = false;
  disc_rule = false;
  disc_parent = 0;
}

// An etcd entry: added or changed unless the tree knows the node (the tree's entry, with its
// parent, wins); removed only if it came from etcd. The chosen parent leaving may re-choose.
void node::impl::disc_event(directory_event ev, const directory_entry& e) {
  if (dead || e.id == self || state != run_state::running) return;
  auto it = dir.find(e.id);
  if (ev == directory_event::removed) {
    if (it != dir.end() && it->second.via == kViaDiscovery) {
      const directory_entry gone = std::move(it->second.e);
      dir.erase(it);
      ++fan->dir_gen;
      detail::fan_departed(*this, gone.id);  // its send_any messages fail now
      fire(cbs.on_directory, directory_event::removed, gone);
    }
    if (!dead && e.id == disc_parent) (void)disc_parent_left();
    return;
  }
  if (it == dir.end() && !dir_has_room(e.id)) {
    ++disc_skipped;  // etcd's watch will not bring it again: dir_tick offers it once room frees
    return;
  }
  if (it == dir.end()) {
    it = dir.emplace(e.id, dir_item{e, kViaDiscovery}).first;
    ++fan->dir_gen;
    fire(cbs.on_directory, directory_event::added, it->second.e);
  } else if (it->second.via == kViaDiscovery && it->second.e != e) {
    if (detail::fan_new_incarnation(it->second.e, e)) {
      detail::fan_restarted(*this, e.id);  // a restart within the lease: as node_directory.cpp
      if (dead) return;
      it = dir.find(e.id);
      if (it == dir.end()) return;
    }
    it->second.e = e;
    ++fan->dir_gen;
    fire(cbs.on_directory, directory_event::changed, it->second.e);
  }
  if (dead || !disc_rule || !may_choose_anew(cfg, self, disc_parent, *disc, e)) return;
  disc_pick_parent();
  std::vector<std::string> urls;
  if (!dead && e.id == disc_parent && !parent_candidate(cfg, self, e, &urls)) {
    log(log_level::info,
        "discovery: parent 0x%" PRIx64 " no longer matches the rule, and no other node does: kept",
        e.id);
  }
}

bool node::impl::disc_keep(dir_item& item) {
  directory_entry e;
  if (disc == nullptr || state != run_state::running || !disc->lookup(item.e.id, &e)) return false;
  item.via = kViaDiscovery;
  if (item.e != e) {
    if (detail::fan_new_incarnation(item.e, e)) {
      detail::fan_restarted(*this, e.id);  // etcd has its next incarnation already
      if (dead) return true;
    }
    item.e = std::move(e);
    ++fan->dir_gen;  // pick()'s cached matches
    fire(cbs.on_directory, directory_event::changed, item.e);
  }
  return true;
}

// The lowest-id node of discovery_parent_type with every discovery_parent_label and a stream
// listen URL is the parent: its stream URLs are parent_urls from then on. Every node applying the
// rule to the same directory chooses the same parent, so a lower-id candidate appearing later
// (a gateway that started late, or came back) takes the children over: otherwise nodes that chose
// while the directory was still filling would split the bus into two trees. A parent whose entry
// no longer matches the rule (it came back with other labels or another type) gives way to the
// lowest-id candidate that does, if any. The current parent link is closed (its flows resume
// through the new parent; nothing is lost).
void node::impl::disc_pick_parent() {
  std::vector<std::string> urls;
  directory_entry cur;
  const bool found = disc_parent != 0 && disc->lookup(disc_parent, &cur);
  const bool stale = found && !parent_candidate(cfg, self, cur, &urls);
  // It came back at other URLs: dialled there (also when kept although it no longer matches, as
  // no other node does: else it would be dialled at its old URLs for ever).
  const auto follow = [this](std::vector<std::string>* at) {
    if (*at == cfg.parent_urls) return;
    cfg.parent_urls = std::move(*at);
    parent_index = 0;
    log(log_level::info, "discovery: parent 0x%" PRIx64 " now listens at %s", disc_parent,
        detail::printable(cfg.parent_urls.front()).c_str());
  };
  if (found && !stale) follow(&urls);
  for (const directory_entry& c : detail::disc_directory(*disc)) {
    if (disc_parent != 0 && !stale && c.id >= disc_parent) return;  // still the best
    if (c.id == disc_parent || !parent_candidate(cfg, self, c, &urls)) continue;
    const bus_id before = disc_parent;
    disc_parent_wanted = false;
    disc_parent = c.id;
    cfg.parent_urls = std::move(urls);
    parent_index = 0;
    reconnect_attempt = 0;
    // A refusal for good was the previous parent's (its subnets, version, tokens): the new one is
    // dialled, and refuses for good in turn if it must.
    parent_failed = false;
    parent_refusal = errc::ok;
    const char* why = before == 0 ? ""
                      : stale     ? " (the current parent no longer matches the rule)"
                                  : " (a lower id than the current parent)";
    // The entry's words are whatever its writer put in etcd: escaped, as every peer's text.
    log(log_level::info, "discovery: parent 0x%" PRIx64 " (%s, type %s) chosen at %s%s", c.id,
        detail::printable(c.name).c_str(), detail::printable(c.type).c_str(),
        detail::printable(cfg.parent_urls.front()).c_str(), why);
    if (reconnect_armed) {
      uv_timer_stop(&h->reconnect);
      reconnect_armed = false;
    }
    if (parent_link != nullptr) {
      close_link(parent_link, errc::connection_reset);  // reconnects to the new URLs
    } else {
      connect_parent();
    }
    return;
  }
  if (stale && stream_urls(cur, &urls)) follow(&urls);  // kept: no other node matches
}

// A registered parent stays whatever etcd says (a working link wins). Without one, a parent
// whose entry left etcd (revoked, or its lease expired after a crash) is given up: the queued
// messages wait for the next parent the rule finds (now, or when one appears), within their
// deadlines.
bool node::impl::disc_parent_left() {
  if (disc == nullptr || disc_parent == 0 || state != run_state::running) return false;
  if (parent_link != nullptr && parent_link->peer != nullptr) return false;
  directory_entry e;
  if (disc->lookup(disc_parent, &e)) return false;
  log(log_level::info, "discovery: parent 0x%" PRIx64 " left the directory; choosing again",
      disc_parent);
  if (reconnect_armed) {
    uv_timer_stop(&h->reconnect);
    reconnect_armed = false;
  }
  cfg.parent_urls.clear();
  parent_index = 0;
  reconnect_attempt = 0;
  disc_parent = 0;
  disc_parent_wanted = true;
  disc_pick_parent();
  return true;
}

// A node in another tree, or in none (both roots), is reached over a direct link registered as a
// sibling, dialled at the listen URLs of its etcd entry (a unix socket on the same host first).
// After a failed dial the entry waits kSiblingRetryMs (via_parent) before the next one: its
// messages go to the parent meanwhile; without one they fail (unknown_route), queued ones too.
detail::sibling_entry* node::impl::disc_sibling(bus_id target) {
  if (disc == nullptr || !cfg.sibling_direct) return nullptr;
  auto d = dir.find(target);
  if (d == dir.end() || d->second.via != kViaDiscovery) return nullptr;
  auto [it, fresh] = siblings.emplace(target, detail::sibling_entry{});
  detail::sibling_entry& s = it->second;
  if (fresh || (s.state == sib_state::via_parent && now_ms() >= s.until_ms)) {
    s.state = sib_state::connecting;
    // Logged from the loop: this runs inside send_data().
    log_later(log_level::info, "discovery: 0x%" PRIx64 " is in no tree of ours: direct link",
              target);
    dial_sibling(target, sibling_url(d->second.e.listen, d->second.e.host_id));
  }
  return &s;
}

}  // namespace uvbus
