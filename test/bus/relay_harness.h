// The relay tests' shared set-up: next-hop delivery (a relay's drops reach their source as
// notices), nodes that record their on_dropped events, and a root 0x100 with a child A 0x101 that
// sends through it.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "bus/bus_harness.h"

namespace uvbus::test {

struct dropped_event {
  bus_id target;
  uint64_t id;
  errc why;
};

// Next-hop delivery: a relay's refusal reaches a source whose report was already ok as a drop
// notice (end-to-end delivery turns the same refusals into reports).
inline node_config hop_config() {
  node_config c = fast_config();
  c.delivery = delivery_mode::next_hop;
  return c;
}

class relay_fixture : public bus_fixture {
 protected:
  // A node whose on_dropped events land in drops_ (one list per node, in the order of creation).
  bus_node* make_recording(bus_id id, node_config cfg) {
    auto& list = drops_.emplace_back();
    return make(id, std::move(cfg), true, [&list](node_callbacks* cb) {
      cb->on_dropped = [&list](bus_id t, uint64_t m, errc e) { list.push_back({t, m, e}); };
    });
  }
  // Root 0x100 owning 0x100/8 (root_tweak: its callbacks), and child A 0x101, recording its
  // drops (a_drops()) and dialling no sibling directly: everything it sends goes through the root.
  void make_root_and_sender(node_config rc, node_config ac, const tweak_fn& root_tweak = {}) {
    rc.subnets = {{0x100, 8}};
    root_ = make(0x100, std::move(rc), true, root_tweak);
    ac.parent_urls = {root_->n->listen_urls().at(0)};
    ac.sibling_direct = false;
    a_ = make_recording(0x101, std::move(ac));
    a_drops_ = &drops_.back();
    ASSERT_TRUE(wait([&] { return a_->n->up(); }));
  }
  std::vector<dropped_event>& a_drops() { return *a_drops_; }

  std::deque<std::vector<dropped_event>> drops_;  // a deque: the lists never move
  std::vector<dropped_event>* a_drops_ = nullptr;
  bus_node* root_ = nullptr;
  bus_node* a_ = nullptr;
};

}  // namespace uvbus::test
