// The routing table: next hop for a target id, source checks and the peer sets it keeps.
#include "bus/routing.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>

namespace uvbus::detail {

const char* to_string(peer_kind k) noexcept {
  switch (k) {
    case peer_kind::parent:
      return "parent";
    case peer_kind::child:
      return "child";
    case peer_kind::sibling:
      return "sibling";
    case peer_kind::tool:
      return "tool";
  }
  return "unknown";
}

uint8_t negotiate_version(uint8_t min_a, uint8_t max_a, uint8_t min_b, uint8_t max_b) noexcept {
  const uint8_t lo = std::max(min_a, min_b);
  const uint8_t hi = std::min(max_a, max_b);
  return lo <= hi && lo > 0 ? hi : 0;
}

routing_table::routing_table(bus_id self, std::vector<subnet> subnets)
    : self_(self), subnets_(std::move(subnets)) {}

bool routing_table::owns(bus_id id) const noexcept {
  for (const subnet& s : subnets_) {
    if (s.contains(id)) return true;
  }
  return false;
}

std::string id_text(bus_id id) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%" PRIx64, id);
  return b;
}

errc routing_table::check_child(bus_id id, const std::vector<subnet>& subnets,
                                std::string* why) const {
  // Each refusal names what was wrong (the id or subnet, and the child that holds it).
  const auto refuse = [why](errc e, std::string text) {
    if (why != nullptr) *why = std::move(text);
    return e;
  };
  if (!owns(id))
    return refuse(errc::out_of_subnet, "id " + id_text(id) + " is outside our subnets");
  for (const subnet& s : subnets) {
    const std::string name = "child subnet " + s.to_string();
    if (!s.valid()) return refuse(errc::out_of_subnet, name + " is not a valid subnet");
    bool inside = false;
    for (const subnet& mine : subnets_) inside = inside || mine.contains(s);
    if (!inside) return refuse(errc::out_of_subnet, name + " is outside our subnets");
    // A child's subnet that covers us (the parent) would route our own id downwards.
    if (s.contains(self_)) return refuse(errc::out_of_subnet, name + " holds our own id");
  }
  if (id == self_) return refuse(errc::duplicate_id, "id " + id_text(id) + " is ours");
  if (peers_.count(id) != 0) {
    return refuse(errc::duplicate_id, "id " + id_text(id) + " is already registered");
  }
  subnet theirs;
  if (const bus_id* owner = child_owner(id, &theirs)) {
    return refuse(errc::duplicate_id, "id " + id_text(id) + " lies in subnet " +
                                          theirs.to_string() + " of registered child " +
                                          id_text(*owner));
  }
  for (const subnet& s : subnets) {
    if (const bus_id* owner = child_overlap(s.canonical(), &theirs)) {
      return refuse(errc::duplicate_id, "child subnet " + s.to_string() + " overlaps subnet " +
                                            theirs.to_string() + " of registered child " +
                                            id_text(*owner));
    }
    // A registered child's own id inside s: the new child could send as it.
    auto held = child_ids_.lower_bound(s.first());
    if (held != child_ids_.end() && *held <= s.last()) {
      return refuse(errc::duplicate_id,
                    "child subnet " + s.to_string() + " holds registered child " + id_text(*held));
    }
  }
  return errc::ok;
}

errc routing_table::check_peer(bus_id id, std::string* why) const {
  if (id != self_ && peers_.count(id) == 0) return errc::ok;
  if (why != nullptr)
    *why = "id " + id_text(id) + (id == self_ ? " is ours" : " is already registered");
  return errc::duplicate_id;
}

errc check_claim(peer_kind kind, bus_id id, bus_id parent, const listing& l, std::string* why) {
  const std::string name = "id " + id_text(id);
  if (parent != 0 && id == parent) {
    *why = name + " is our parent's";
    return errc::duplicate_id;
  }
  if (!l.listed || (kind == peer_kind::sibling && (!l.from_tree || l.parent == parent))) {
    return errc::ok;
  }
  *why = name + " is registered elsewhere (our directory lists it " +
         (l.parent != 0 ? "under " + id_text(l.parent) : std::string("as a root")) +
         (kind == peer_kind::sibling ? ", not under our parent)" : ")");
  return errc::duplicate_id;
}

const char* routing_table::sibling_fault(bus_id id, const subnet& s) const {
  if (!s.valid()) return "is not a valid subnet";
  if (s.contains(self_)) return "holds our own id";
  for (const subnet& mine : subnets_) {
    if (mine.overlaps(s)) return "overlaps our subnets";
  }
  // Known since the first registration and kept while its link is down: a sibling holding it
  // could send as the parent (acks, command replies) for as long as its own link stays up.
  if (parent_ != 0 && s.contains(parent_)) return "holds our parent's id";
  // A sibling is our parent's child: its subnets came out of the parent's.
  auto par = peers_.find(parent_);
  if (has_parent_ && par != peers_.end() && !par->second.subnets.empty() &&
      std::none_of(par->second.subnets.begin(), par->second.subnets.end(),
                   [&s](const subnet& p) { return p.contains(s); })) {
    return "is outside our parent's subnets";
  }
  for (const auto& [other, p] : peers_) {
    if (other == id || p.kind == peer_kind::child) continue;  // children are inside our subnets
    if (s.contains(other)) return "holds a registered peer's id";
    if (p.kind != peer_kind::sibling) continue;
    for (const subnet& o : p.subnets) {
      if (o.overlaps(s)) return "overlaps another sibling's subnets";
    }
  }
  return nullptr;
}

errc routing_table::check_sibling(bus_id id, const std::vector<subnet>& subnets,
                                  std::string* why) const {
  for (const subnet& s : subnets) {
    if (const char* fault = sibling_fault(id, s)) {
      *why = "sibling subnet " + s.to_string() + " " + fault;
      return errc::out_of_subnet;
    }
  }
  return errc::ok;
}

const bus_id* routing_table::child_owner(bus_id id, subnet* which) const {
  for (const width_index& w : by_width_) {  // narrowest first
    const bus_id first = id & ~subnet::low_mask(w.mask_bits);
    auto it = w.owner_by_first.find(first);
    if (it == w.owner_by_first.end()) continue;
    if (which != nullptr) *which = subnet{first, w.mask_bits};
    return &it->second;
  }
  return nullptr;
}

const bus_id* routing_table::child_overlap(const subnet& s, subnet* theirs) const {
  if (const bus_id* owner = child_owner(s.first(), theirs)) return owner;
  auto it = child_nets_.lower_bound({s.first(), 0});
  if (it == child_nets_.end() || it->first.first > s.last()) return nullptr;
  *theirs = subnet{it->first.first, it->first.second};
  return &it->second;
}

void routing_table::index_add(const subnet& s, bus_id owner) {
  auto it = std::find_if(by_width_.begin(), by_width_.end(),
                         [&](const width_index& w) { return w.mask_bits >= s.mask_bits; });
  if (it == by_width_.end() || it->mask_bits != s.mask_bits) {
    it = by_width_.insert(it, width_index{s.mask_bits, {}});
  }
  it->owner_by_first.emplace(s.first(), owner);  // an earlier claim of the same subnet stays
}

void routing_table::index_remove(const subnet& s, const bus_id* next) {
  auto it = std::find_if(by_width_.begin(), by_width_.end(),
                         [&](const width_index& w) { return w.mask_bits == s.mask_bits; });
  if (it == by_width_.end()) return;
  if (next != nullptr) {
    it->owner_by_first[s.first()] = *next;
    return;
  }
  it->owner_by_first.erase(s.first());
  if (it->owner_by_first.empty()) by_width_.erase(it);
}

void routing_table::add(bus_id id, peer_kind kind, std::vector<subnet> subnets) {
  (void)remove(id);  // a registration again: nothing of the earlier one stays
  if (kind == peer_kind::tool) subnets.clear();  // a tool relays for no one
  if (kind == peer_kind::child) {
    child_ids_.insert(id);
    for (const subnet& s : subnets) {
      const subnet c = s.canonical();
      child_nets_.emplace(std::make_pair(c.first(), c.mask_bits), id);  // after equal ones
      index_add(c, id);
    }
  }
  peers_[id] = peer{kind, std::move(subnets)};
}

bool routing_table::remove(bus_id id) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return false;
  if (it->second.kind == peer_kind::child) {
    child_ids_.erase(id);
    for (const subnet& s : it->second.subnets) {
      const subnet c = s.canonical();
      const auto range = child_nets_.equal_range({c.first(), c.mask_bits});
      auto mine =
          std::find_if(range.first, range.second, [id](const auto& e) { return e.second == id; });
      if (mine == range.second) continue;  // listed twice: the first pass took it
      if (mine != range.first) {
        child_nets_.erase(mine);  // not the routing claim: the index stays
        continue;
      }
      const auto after = child_nets_.erase(mine);
      index_remove(c, after != range.second ? &after->second : nullptr);
    }
  }
  peers_.erase(it);
  return true;
}

const std::vector<subnet>* routing_table::subnets_of(bus_id id) const {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : &it->second.subnets;
}

bool routing_table::kind_of(bus_id id, peer_kind* out) const {
  auto it = peers_.find(id);
  if (it == peers_.end()) return false;
  *out = it->second.kind;
  return true;
}

route routing_table::lookup(bus_id target) const {
  if (target == self_) return {hop::self, self_};
  if (peers_.count(target) != 0) return {hop::direct, target};
  if (const bus_id* owner = child_owner(target)) return {hop::child, *owner};
  if (owns(target)) return {hop::none, 0};
  if (has_parent_) return {hop::parent, parent_};
  return {hop::none, 0};
}

bool routing_table::source_allowed(bus_id from, bus_id source) const {
  auto it = peers_.find(from);
  if (it == peers_.end()) return false;
  if (it->second.kind == peer_kind::parent) return true;
  if (source == from) return true;
  for (const subnet& s : it->second.subnets) {
    if (s.contains(source)) return true;
  }
  return false;
}

}  // namespace uvbus::detail
