// node_config::discovery inside a node: registers the node's own directory entry in etcd
// (etcd_discovery), merges the entries found there into the node's directory and on_directory
// (kept apart from the tree's flooding), revokes on stop(), and optionally picks the parent by a
// rule (discovery_parent_type / discovery_parent_labels) when parent_urls is empty.
#include "bus/node_impl.h"

namespace uvbus {

void node::impl::disc_start() {
  if (cfg.discovery.etcd_endpoints.empty()) return;
  discovery_callbacks cb;
  cb.on_directory = [this](directory_event ev, const directory_entry& e) { disc_event(ev, e); };
  cb.on_log = [this](log_level lv, const std::string& m) { log(lv, "%s", m.c_str()); };
  disc = std::make_unique<etcd_discovery>(loop, cfg.discovery, std::move(cb));
  disc_parent_wanted = cfg.parent_urls.empty() && !cfg.discovery_parent_type.empty();
  directory_entry me = self_entry();
  me.parent = 0;
  // node::validate checked cfg.discovery, so this cannot fail; if it did, the node runs without.
  if (disc->start(me) != errc::ok) {
    log(log_level::error, "discovery: %s", disc->last_error().detail.c_str());
    disc.reset();
    disc_parent_wanted = false;
  }
}

void node::impl::disc_stop() {
  if (disc) (void)disc->stop(nullptr);  // revokes the lease; best effort if destroyed first
  disc_parent_wanted = false;
}

// An etcd entry: added or changed unless the tree knows the node (the tree's entry, with its
// parent, wins); removed only if it came from etcd.
void node::impl::disc_event(directory_event ev, const directory_entry& e) {
  if (dead || e.id == self || state != run_state::running) return;
  auto it = dir.find(e.id);
  if (ev == directory_event::removed) {
    if (it == dir.end() || it->second.via != kViaDiscovery) return;
    const directory_entry gone = std::move(it->second.e);
    dir.erase(it);
    fire(cbs.on_directory, directory_event::removed, gone);
    return;
  }
  if (it == dir.end()) {
    it = dir.emplace(e.id, dir_item{e, kViaDiscovery}).first;
    fire(cbs.on_directory, directory_event::added, it->second.e);
  } else if (it->second.via == kViaDiscovery && it->second.e != e) {
    it->second.e = e;
    fire(cbs.on_directory, directory_event::changed, it->second.e);
  }
  if (!dead && disc_parent_wanted) disc_pick_parent();
}

// The lowest-id node of discovery_parent_type with every discovery_parent_label and a stream
// listen URL becomes the parent: its stream URLs are parent_urls from then on.
void node::impl::disc_pick_parent() {
  for (const directory_entry& c : disc->directory()) {
    if (c.id == self || c.type != cfg.discovery_parent_type ||
        !c.has_labels(cfg.discovery_parent_labels)) {
      continue;
    }
    std::vector<std::string> urls;
    for (const std::string& u : c.listen) {
      if (u.rfind("shm://", 0) != 0 && urls.size() < proto::kMaxListen) urls.push_back(u);
    }
    if (urls.empty()) continue;
    disc_parent_wanted = false;
    cfg.parent_urls = std::move(urls);
    log(log_level::info, "discovery: parent 0x%" PRIx64 " (%s, type %s) chosen at %s", c.id,
        c.name.c_str(), c.type.c_str(), cfg.parent_urls.front().c_str());
    connect_parent();
    return;
  }
}

}  // namespace uvbus
