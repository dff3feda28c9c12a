// The routing table of one node: pure data, no I/O, so every decision is unit-tested.
//
// A node knows its own id and subnets, at most one parent, and its registered direct peers
// (children, which may own subnets, and siblings). route() picks the next hop for a target id:
//
//   1. the node itself;
//   2. a registered direct peer with exactly that id (child, sibling, or the parent);
//   3. the child whose subnets hold the id (the narrowest subnet wins: a grandchild's messages go
//      down through the child that owns it);
//   4. an id inside our own subnets with no child owning it: no route (the child is not there —
//      sending it up would only bounce back down);
//   5. otherwise the parent, if any; else no route.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "uvbus/error.h"
#include "uvbus/subnet.h"

namespace uvbus::detail {

enum class peer_kind : uint8_t { parent, child, sibling, tool };
const char* to_string(peer_kind k) noexcept;
// "0x1a2b": an id as our messages name it.
std::string id_text(bus_id id);

enum class hop : uint8_t { self, direct, child, parent, none };

struct route {
  hop kind = hop::none;
  bus_id next = 0;  // the peer to hand the message to (unset for self/none)
};

// The negotiated protocol version for two ranges, or 0 if they do not overlap.
[[nodiscard]] uint8_t negotiate_version(uint8_t min_a, uint8_t max_a, uint8_t min_b,
                                        uint8_t max_b) noexcept;

// What the node's directory says of an id a sibling or tool registers as.
struct listing {
  bool listed = false;     // the directory has an entry for it ...
  bool from_tree = false;  // ... learned over a tree link (else from etcd) ...
  bus_id parent = 0;       // ... whose parent is this node
};
// Whether a sibling or tool may register as `id` (after check_peer() and an id outside our
// subnets): not as our parent's id (`parent`, 0 for none), even while its link is down; a tool
// not as any node the directory lists (a tool is never announced: an honest one is never listed);
// a sibling not as a node learned over the tree whose parent is not ours (an honest sibling in our
// tree is our parent's child; one in another tree is known from etcd). Either would take that
// node's traffic here. Otherwise duplicate_id, and *why names the id and whose it is.
[[nodiscard]] errc check_claim(peer_kind kind, bus_id id, bus_id parent, const listing& l,
                               std::string* why);

class routing_table {
 public:
  routing_table(bus_id self, std::vector<subnet> subnets);

  [[nodiscard]] bus_id self() const noexcept { return self_; }
  [[nodiscard]] const std::vector<subnet>& subnets() const noexcept { return subnets_; }
  // True if id lies in one of our own subnets (a child id).
  [[nodiscard]] bool owns(bus_id id) const noexcept;

  void set_parent(bus_id id) noexcept {
    parent_ = id;
    has_parent_ = true;
  }
  void clear_parent() noexcept { has_parent_ = false; }
  [[nodiscard]] bool has_parent() const noexcept { return has_parent_; }
  [[nodiscard]] bus_id parent() const noexcept { return parent_; }

  // Whether a peer could register as our child: its id and each of its subnets must lie inside
  // ours (out_of_subnet), and neither its id nor its subnets may collide with ourselves or a
  // registered peer (duplicate_id): a subnet may hold no other child's id, which it could then
  // send as. *why, if given, names what was wrong: the id or subnet, and the registered child
  // whose id or subnet it collides with. Returns ok when acceptable.
  [[nodiscard]] errc check_child(bus_id id, const std::vector<subnet>& subnets,
                                 std::string* why = nullptr) const;
  // Whether a peer could register as a sibling / tool: only the id must be new and not ours.
  // Otherwise duplicate_id and *why (if given) says which: "id ... is ours" or "... is already
  // registered", as check_child() does.
  [[nodiscard]] errc check_peer(bus_id id, std::string* why = nullptr) const;
  // Whether sibling `id`'s declared subnets are plausible, so that it may relay for them: each
  // must be valid and hold neither our id nor our parent's (known from its first registration on,
  // while its link is down too) nor any other registered peer's,
  // overlap neither our subnets nor another sibling's, and lie inside our parent's subnets while
  // the parent is registered. Otherwise out_of_subnet and *why names the subnet and the fault.
  [[nodiscard]] errc check_sibling(bus_id id, const std::vector<subnet>& subnets,
                                   std::string* why) const;

  // Adds a registered direct peer (replacing an earlier registration of the same id). A child's
  // or sibling's subnets count for source_allowed() (check them first: check_child(),
  // check_sibling()), a tool's are dropped (a tool speaks only as itself); only a child's are used
  // for routing (a sibling's claim is not the parent's allocation, so traffic for a sibling's
  // descendants still goes through the parent). check_child(), add() and remove() take
  // O(log children) per subnet plus one hash lookup per subnet width in use: no scan of the
  // other children.
  void add(bus_id id, peer_kind kind, std::vector<subnet> subnets = {});
  // Removes a peer; returns whether it was there.
  bool remove(bus_id id);
  [[nodiscard]] bool has(bus_id id) const { return peers_.count(id) != 0; }
  [[nodiscard]] const std::vector<subnet>* subnets_of(bus_id id) const;
  [[nodiscard]] bool kind_of(bus_id id, peer_kind* out) const;

  [[nodiscard]] route lookup(bus_id target) const;

  // Whether a message that arrived from peer `from` may claim `source`: a parent's are not checked
  // (a parent relays for the whole bus); a child or sibling may only send as itself or as an id
  // inside its subnets (its descendants), a tool only as itself.
  [[nodiscard]] bool source_allowed(bus_id from, bus_id source) const;

  template <class F>
  void for_each(F&& f) const {
    for (const auto& [id, p] : peers_) f(id, p.kind, p.subnets);
  }
  [[nodiscard]] size_t size() const noexcept { return peers_.size(); }

 private:
  struct peer {
    peer_kind kind;
    std::vector<subnet> subnets;
  };
  bus_id self_;
  std::vector<subnet> subnets_;
  bool has_parent_ = false;
  bus_id parent_ = 0;
  std::unordered_map<bus_id, peer> peers_;
  // Every child subnet (canonical), ordered by its first id, then width; equal subnets of two
  // children in registration order. check_child() finds a subnet that a new one would contain by
  // one ordered lookup, and remove() finds a child's entries without a scan of everyone's.
  std::multimap<std::pair<bus_id, uint8_t>, bus_id> child_nets_;
  // Every registered child's id: check_child() finds one inside a new subnet by one lookup.
  std::set<bus_id> child_ids_;
  // Step 3's index over child_nets_: per mask width in use, narrowest first, the owner of each
  // subnet by its first id (the first registered one when two children claim the same subnet).
  // One hash lookup per width in use instead of a scan of every child's subnets per message.
  struct width_index {
    uint8_t mask_bits = 0;
    std::unordered_map<bus_id, bus_id> owner_by_first;
  };
  std::vector<width_index> by_width_;
  // The child owning the narrowest child subnet that holds id, if any (*which: that subnet).
  [[nodiscard]] const bus_id* child_owner(bus_id id, subnet* which = nullptr) const;
  // The child whose subnet (*theirs) s overlaps, if any: one of them holds s's first id, or starts
  // inside s (two aligned subnets either nest or are disjoint).
  [[nodiscard]] const bus_id* child_overlap(const subnet& s, subnet* theirs) const;
  // Why sibling `id` may not relay for s (see check_sibling()), or nullptr.
  [[nodiscard]] const char* sibling_fault(bus_id id, const subnet& s) const;
  void index_add(const subnet& s, bus_id owner);
  // Drops s from the index, or hands it to `next` (the next child that claims the same subnet).
  void index_remove(const subnet& s, const bus_id* next);
};

}  // namespace uvbus::detail
