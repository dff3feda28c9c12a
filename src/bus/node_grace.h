// A relay's grace for its children (node_grace.cpp): the children lost lately, the subnets each
// of them owned, and the relayed messages held for them and their descendants. Loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bus/node_types.h"
#include "uvbus/subnet.h"

namespace uvbus::detail {

// Our parent refused us for good: what our children sent up meanwhile (held for it, an id outside
// our subnets) is refused to its sources, unknown_route, and one line logged from the loop.
// node_grace.cpp.
void drop_held_for_parent(node::impl& n);

struct grace_state {
  // A child whose link was lost within child_grace_ms: when, and the subnets it owned (its
  // descendants' ids: messages for them wait for it too).
  struct lost_child {
    uint64_t ms = 0;
    std::vector<subnet> subnets;
  };
  // Lost children remembered with their subnets at most (a message with no route scans them):
  // beyond it a lost child's own id is held for, not its subnets.
  static constexpr size_t kMaxLostRelays = 256;
  std::unordered_map<bus_id, lost_child> lost;  // by child id
  size_t lost_relays = 0;  // entries of `lost` with subnets (none: no subnet scan per message)
  std::unordered_map<bus_id, pending_queue> held;  // by target id (a child's or below)
  size_t held_count = 0, held_bytes = 0;  // all of `held` (caps: pending_max_messages, _bytes)

  void child_lost(bus_id id, uint64_t now, const std::vector<subnet>& subnets) {
    forget(id);
    const bool keep = !subnets.empty() && lost_relays < kMaxLostRelays;
    lost.emplace(id, lost_child{now, keep ? subnets : std::vector<subnet>{}});
    lost_relays += keep ? 1 : 0;
  }
  void forget(bus_id id) {
    auto it = lost.find(id);
    if (it == lost.end()) return;
    lost_relays -= it->second.subnets.empty() ? 0 : 1;
    lost.erase(it);
  }
  // Whether the child that `target` is, or lies below (in its subnets), was lost, and when
  // (*since). Of two (a subnet another child claimed, lost too), the later loss.
  [[nodiscard]] bool lost_since(bus_id target, uint64_t* since) const {
    if (auto it = lost.find(target); it != lost.end()) {
      *since = it->second.ms;
      return true;
    }
    bool found = false;
    if (lost_relays == 0) return found;
    for (const auto& [id, c] : lost) {
      for (const subnet& s : c.subnets) {
        if (!s.contains(target) || (found && c.ms <= *since)) continue;
        *since = c.ms;
        found = true;
      }
    }
    return found;
  }
  // Forgets the children lost grace_ms ago or longer.
  void expire(uint64_t now, uint64_t grace_ms) {
    for (auto it = lost.begin(); it != lost.end();) {
      if (now - it->second.ms < grace_ms) {
        ++it;
        continue;
      }
      lost_relays -= it->second.subnets.empty() ? 0 : 1;
      it = lost.erase(it);
    }
  }
};

}  // namespace uvbus::detail
