// Load hints (docs/bus.md "Any node of a type", least_loaded): our own (node::set_load, sent at
// most once per heartbeat interval) and those of the nodes below and above us, passed on along the
// version 6 tree links, paced (fan_load_tick).
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bus/node_impl.h"

namespace uvbus {

using detail::fanout_state;

void node::set_load(uint32_t load) {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::set_load", );
  fanout_state& f = *impl_->fan;
  if (f.my_load == load) return;
  f.my_load = load;
  f.load_dirty = true;
}

namespace {
// A load message to p. The hints a full queue refused wait in fanout_state::loads_retry for p's
// next batch (fan_load_tick), each id once: a hint is not lost because the link was busy.
void send_loads(node::impl& n, detail::peer_ep* p, const proto::directory_body& b) {
  std::vector<uint8_t> body;
  proto::encode_directory(b, &body);
  if (n.send_control(p->lk, n.make_header(proto::msg_type::directory, p->id, 0), body) == errc::ok)
    return;
  auto& again = n.fan->loads_retry[p->id];
  for (const auto& h : b.loads) again.insert(h.first);
}

// Appends (id, load) to b and sends b to p once it holds kMaxDirItems hints.
void add_load(node::impl& n, detail::peer_ep* p, proto::directory_body& b, bus_id id,
              uint32_t load) {
  b.loads.emplace_back(id, load);
  if (b.loads.size() < proto::kMaxDirItems) return;
  send_loads(n, p, b);
  b.loads.clear();
}

// The hint of node id to send to link `to`: ours, or one learned from another link (false: none,
// or its entry came by `to`).
bool hint_for(const node::impl& n, bus_id id, bus_id to, uint32_t* load) {
  if (id == n.self) {
    *load = n.fan->my_load;
    return true;
  }
  const auto d = n.dir.find(id);
  const auto l = n.fan->loads.find(id);
  if (d == n.dir.end() || d->second.via == to || l == n.fan->loads.end()) return false;
  *load = l->second;
  return true;
}
}  // namespace

void detail::fan_own_load(node::impl& n, uint64_t now) {
  fanout_state& f = *n.fan;
  if (!f.load_dirty || now - f.load_sent_ms < n.cfg.heartbeat_interval_ms) return;
  f.load_dirty = false;
  f.load_sent_ms = now;
  proto::directory_body b;
  b.op = proto::dir_op::load;
  b.loads.emplace_back(n.self, f.my_load);
  for (auto& [id, p] : n.peers) {
    if (fan_tree_v6(n, p.get())) send_loads(n, p.get(), b);
  }
}

void detail::fan_link_up(node::impl& n, peer_ep* p) {
  if (!fan_tree_v6(n, p)) return;
  n.fan->loads_retry.erase(p->id);  // everything goes now
  proto::directory_body b;
  b.op = proto::dir_op::load;
  b.loads.emplace_back(n.self, n.fan->my_load);
  // Every hint, in messages of kMaxDirItems: one left out would count as load 0 there (pick()).
  uint32_t load = 0;
  for (const auto& [id, l] : n.fan->loads) {
    if (id != n.self && hint_for(n, id, p->id, &load)) add_load(n, p, b, id, load);
  }
  if (!b.loads.empty()) send_loads(n, p, b);
}

void detail::fan_loads(node::impl& n, peer_ep* from,
                       const std::vector<std::pair<bus_id, uint32_t>>& l) {
  fanout_state& f = *n.fan;
  for (const auto& [id, load] : l) {
    const auto it = n.dir.find(id);
    // Only the link a node's entry came through speaks for it.
    if (it == n.dir.end() || it->second.via != from->id) continue;
    f.loads[id] = load;
    f.loads_out.insert(id);  // goes on with the next batch, its latest value
  }
  // Hints of nodes that left the directory go once they outnumber the directory (amortised: the
  // map stays within twice the directory's size).
  auto& loads = f.loads;
  if (loads.size() > 2 * n.dir.size() + 64) {
    for (auto it = loads.begin(); it != loads.end();) {
      it = n.dir.count(it->first) == 0 ? loads.erase(it) : std::next(it);
    }
  }
  fan_load_tick(n, n.now_ms());
}

void detail::fan_load_tick(node::impl& n, uint64_t now) {
  fanout_state& f = *n.fan;
  if (f.loads_out.empty() && f.loads_retry.empty()) return;
  if (now - f.loads_fwd_ms < n.cfg.heartbeat_interval_ms) return;
  f.loads_fwd_ms = now;
  struct hint {
    bus_id id;
    bus_id via;  // the link its entry came by
    uint32_t load;
  };
  std::vector<hint> out;
  for (const bus_id id : f.loads_out) {
    const auto d = n.dir.find(id);
    const auto l = f.loads.find(id);
    if (d != n.dir.end() && l != f.loads.end()) out.push_back({id, d->second.via, l->second});
  }
  f.loads_out.clear();
  // What full queues refused, per link: tried again now (a link gone takes its share with it).
  std::unordered_map<bus_id, std::unordered_set<bus_id>> retry;
  retry.swap(f.loads_retry);
  for (auto& [pid, p] : n.peers) {
    if (!fan_tree_v6(n, p.get())) continue;
    std::unordered_set<bus_id> again;
    if (const auto r = retry.find(pid); r != retry.end()) again.swap(r->second);
    proto::directory_body b;
    b.op = proto::dir_op::load;
    for (const hint& h : out) {
      if (h.via == pid) continue;  // not back where it came from
      again.erase(h.id);
      add_load(n, p.get(), b, h.id, h.load);
    }
    uint32_t load = 0;
    for (const bus_id id : again) {
      if (hint_for(n, id, pid, &load)) add_load(n, p.get(), b, id, load);
    }
    if (!b.loads.empty()) send_loads(n, p.get(), b);
  }
}

}  // namespace uvbus
