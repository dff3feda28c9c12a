// Any node of a type, and broadcast: the types node::pick(), node::send_any() and
// node::broadcast() take and report (docs/bus.md "Any node of a type" and "Broadcast").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "uvbus/directory.h"
#include "uvbus/error.h"
#include "uvbus/subnet.h"

namespace uvbus {

// How node::pick() chooses among the live nodes that match.
enum class pick_policy : uint8_t {
  // Each matching node in turn (a cursor per type and set of labels, in any order, on this
  // node; at most 4096 kept with 1 MiB of keys, the least recently used dropped first:
  // docs/bus.md "Any node of a type").
  round_robin,
  // The node with the lowest load hint (node::set_load(), carried by the directory); ties by id.
  // A node whose hint this node has not heard counts as load 0 (every node known only from etcd,
  // every node of protocol version 5, one that never called set_load()): it wins over any hinted
  // node with a higher load, and among several of them the lowest id is picked every time.
  least_loaded,
  // Rendezvous hashing on pick_options::key: the same key keeps reaching the same node while it
  // lives; when it leaves, only its keys move, each to the node that ranks next for that key,
  // and every node of the bus with the same directory picks the same one.
  consistent_hash,
};

struct pick_options {
  pick_policy policy = pick_policy::round_robin;
  uint64_t key = 0;  // consistent_hash: the key (a player id, a room id, ...)
};

// Who a broadcast is for: every node of a type carrying every label given, or every node whose id
// lies in a subnet.
struct broadcast_target {
  std::string type;                // of_type: the type ("" = any type)
  std::vector<node_label> labels;  // of_type: labels every target carries
  bool by_subnet = false;
  subnet net{0, 0};  // in_subnet
  static broadcast_target of_type(std::string t, std::vector<node_label> l = {}) {
    broadcast_target b;
    b.type = std::move(t);
    b.labels = std::move(l);
    return b;
  }
  static broadcast_target in_subnet(subnet s) {
    broadcast_target b;
    b.by_subnet = true;
    b.net = s;
    return b;
  }
  [[nodiscard]] bool matches(const directory_entry& e) const {
    if (by_subnet) return net.contains(e.id);
    return (type.empty() || e.type == type) && e.has_labels(labels);
  }
};

// The one summary of a broadcast.
struct broadcast_report {
  uint64_t broadcast_id = 0;
  // ok: every node that matched in this node's directory when broadcast() was called acknowledged
  // delivery. not_connected: every other one left this node's directory (stopped, killed, its
  // relay's link gone) or no copy went towards it from here (see `detail`) without acknowledging:
  // they are in `failed`, reported once the last one is accounted for, not at the timeout.
  // timeout: some did not acknowledge in time (in `failed`, with any that left). Each one in
  // `failed` may or may not have got it. closed: the node stopped first.
  errc status = errc::ok;
  size_t expected = 0;  // matching nodes known when broadcast() was called
  // Nodes whose on_data got it: a node that joined since is included if this node's directory
  // lists it when its acknowledgement comes (and room is left under broadcast_max_targets).
  std::vector<bus_id> reached;
  std::vector<bus_id> failed;  // expected nodes that did not acknowledge, by id
  // Why targets failed at once, inside broadcast() (empty if none did): how many got no copy, the
  // first of them, and why ("the link to 0x1100 refused it: queue_full", "below protocol version
  // 6", "known only from etcd and this node has a parent", ...).
  std::string detail;
};

// Called once per accepted broadcast, on the loop thread, as a callback of the node (it may call
// any node function and destroy the node; none fires after the node is destroyed). The report is
// valid during the call.
using broadcast_fn = std::function<void(const broadcast_report&)>;

}  // namespace uvbus
