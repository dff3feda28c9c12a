// Any node of a type and broadcast (node_fanout.cpp, node_broadcast.cpp): the per-node state, and
// the hooks the rest of the node calls (routing, the tick, stop, the directory). Loop thread only.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bus/wire.h"
#include "core/pool_allocator.h"
#include "uvbus/buffer.h"
#include "uvbus/fanout.h"
#include "uvbus/node.h"

namespace uvbus::detail {

struct link;
struct peer_ep;

// A broadcast of ours waiting for its acknowledgements.
struct pending_broadcast {
  broadcast_fn cb;
  enum : uint8_t { waiting, acked, left };  // an expected node's state
  std::vector<bus_id> expected;             // sorted
  std::vector<uint8_t> state;               // per expected node
  std::vector<bus_id> extra;                // nodes not expected that acknowledged, sorted
  std::string detail;                       // broadcast_report::detail
  broadcast_target to;                      // the selector: a node not expected must match it
  size_t acked_count = 0;
  size_t left_count = 0;  // expected nodes that left the directory without acknowledging
  uint64_t deadline_ms = 0;
  // Every expected node acknowledged or left the directory: nothing more can come in time.
  [[nodiscard]] bool settled() const { return acked_count + left_count == expected.size(); }
};

// pick()'s state for one type and labels: round_robin's next turn, when it was last asked for,
// and the ids of the nodes that match it (sorted), taken from the directory after it changed: a
// repeated pick() or send_any() neither scans the directory nor allocates.
struct rr_cursor {
  size_t next = 0;
  uint64_t used = 0;     // fanout_state::cursor_clock at the last pick
  uint64_t gen = 0;      // fanout_state::dir_gen when `ids` were taken (0: never)
  bool started = false;  // whether this node was running then (only then it matches itself)
  std::vector<bus_id> ids;
};

struct fanout_state {
  static constexpr size_t kMaxPending = 4096;  // broadcasts awaiting their summary
  // pick()'s cursors kept at most (one per type and labels asked for, whatever the policy), and
  // the bytes of their keys and ids (the less recently used half goes when a new one would pass
  // either).
  static constexpr size_t kMaxCursors = 4096;
  static constexpr size_t kMaxCursorBytes = size_t{1} << 20;
  std::unordered_map<std::string, rr_cursor> cursors;
  size_t cursor_bytes = 0;  // the keys' bytes and the ids' (capacity)
  uint64_t cursor_clock = 0;
  // Bumped at every change of node::impl::dir (an entry added, changed or removed): a cursor takes
  // its ids again after one.
  uint64_t dir_gen = 1;
  // The selectors pick() was given last, with their cursor keys: a repeated one builds no key.
  struct recent_selector {
    bool set = false;
    std::string type;
    std::vector<node_label> labels;
    std::string key;
  };
  std::array<recent_selector, 4> recent;
  size_t recent_next = 0;
  uint32_t my_load = 0;
  bool load_dirty = false;
  uint64_t load_sent_ms = 0;
  std::unordered_map<bus_id, uint32_t> loads;  // learned load hints
  // An entry per send_any() or call_any() message: nodes from a pool, none allocated per message.
  using any_map = std::unordered_map<uint64_t, bus_id, std::hash<uint64_t>, std::equal_to<>,
                                     pool_allocator<std::pair<const uint64_t, bus_id>>>;
  // send_any() messages under next_hop with require_response still owed their report: message
  // id -> target (an entry goes when its acknowledgement arrives; the tick prunes the others).
  any_map any_replies;
  // call_any() calls not answered yet: call id -> target (an entry goes when its answer arrives;
  // the tick prunes calls that ended otherwise).
  any_map any_calls;
  std::map<uint64_t, pending_broadcast> pending;  // by broadcast id
  // (deadline, id) of each pending broadcast, a min-heap (std::greater): h->calls fires at the
  // earliest of these and the calls' (fan_next_deadline). Entries of broadcasts reported before
  // their deadline stay until they reach the top, or until they outnumber `pending` (rebuilt).
  std::vector<std::pair<uint64_t, uint64_t>> deadlines;
  // The next broadcast id: from a random point below 2^40 per node object, so a late
  // acknowledgement of a dead incarnation's broadcast (it names the id and our node id, nothing
  // else) never names one of this incarnation's.
  uint64_t next_broadcast_id = 0;
  size_t targets =
      0;  // expected and extra entries of `pending` (node_config::broadcast_max_targets)
  // The tree links fan_out() offered the broadcast being sent: each next hop's id, and what it did
  // with its copy (ok; transmit()'s refusal; version_mismatch: no copy, not a version 6 tree link).
  std::vector<std::pair<bus_id, errc>> hops;
  // While a shared-memory record is routed: its writer when access tokens proved it, else 0 (a
  // broadcast a sibling wrote there goes no further, as one over its stream link).
  bus_id ring_writer = 0;
  std::vector<bus_id> blocked;  // next hops whose full queue refused a copy of ours (on_writable)
  std::vector<std::pair<broadcast_fn, broadcast_report>> finished;  // reported from the loop
  std::vector<uint8_t> head;  // the header and selector of the broadcast being sent
  // Load hints learned from tree links that go on with the next batch (fan_load_tick: at most one
  // per heartbeat interval, each id once with its latest value), and when the last batch went.
  std::unordered_set<bus_id> loads_out;
  uint64_t loads_fwd_ms = 0;
  // Per version 6 tree link (its peer id): the ids whose hints its full queue refused (ours too),
  // sent again with its next batch, each with its latest value (at most one per id we know).
  std::unordered_map<bus_id, std::unordered_set<bus_id>> loads_retry;
};

// node_fanout.cpp for node::broadcast() (node_broadcast.cpp). Offers one copy of the broadcast
// [bufs] to every next hop except `except` of a directory entry it matches (bufs null: sends
// nothing), each hop and its outcome recorded in fanout_state::hops; returns the copies sent.
size_t fan_out(node::impl& n, bus_id except, const broadcast_target& to, const const_buffer* bufs,
               size_t count);
// Ends broadcast `id` (if pending): its report goes to fanout_state::finished, run from the loop.
void fan_finish(node::impl& n, uint64_t id, errc status);
// Why a type-and-labels selector cannot go on the wire whole (empty: it can).
std::string fan_selector_fault(const broadcast_target& to);

// Broadcasts, and acknowledgements for us (true: handled); copies that cannot go on count as drops.
bool fan_routed(node::impl& n, link* from, const proto::header& hd, const uint8_t* data,
                size_t size);
// Deadlines, and our load hint when it changed (fan_own_load).
void fan_tick(node::impl& n, uint64_t now);
// Our load hint (node::set_load) to the version 6 tree links, when it changed and a heartbeat
// interval has passed since the last (node_load.cpp).
void fan_own_load(node::impl& n, uint64_t now);
// A parent or child link speaking version 6 (loads: and a node that sends load hints: a tool node
// sends none, its parent would refuse a directory message from it).
bool fan_tree_v6(const node::impl& n, const peer_ep* p, bool loads = true);
// Broadcast `id` (just made pending) times out at deadline_ms: node_call.cpp's timer is armed for
// it. The earliest deadline of a pending broadcast (UINT64_MAX: none). The broadcasts whose
// deadline has come end (timeout; reported from the loop): no callback runs here.
void fan_add_deadline(node::impl& n, uint64_t id, uint64_t deadline_ms);
uint64_t fan_next_deadline(node::impl& n);
void fan_expire(node::impl& n, uint64_t now);
// stop(): every pending broadcast is reported closed from the loop (fan_run_deferred).
void fan_stop(node::impl& n);
void fan_run_deferred(node::impl& n);
// A tree link came up: every load hint we know goes to it (in messages of kMaxDirItems). A load
// message arrived from a version 6 tree peer: the hints of ids whose entries came through it are
// taken, and go on to the other version 6 tree links paced by fan_load_tick.
void fan_link_up(node::impl& n, peer_ep* p);
void fan_loads(node::impl& n, peer_ep* from, const std::vector<std::pair<bus_id, uint32_t>>& l);
// The hints taken since the last batch, and those a link's full queue refused (loads_retry), go
// on if a heartbeat interval has passed since it (the first at once): a child sending hints as
// fast as its link goes costs every other link one message per interval, and the latest value of
// each id arrives. No callbacks.
void fan_load_tick(node::impl& n, uint64_t now);
// Node `id` is gone (it left the directory, or a relay refused a send_any message to it with
// unknown_route or not_connected): every send_any() message to it still owed its report and every
// call_any() call to it not yet answered fail now with not_connected, from the loop (docs/bus.md
// "Any node of a type"). When it left the directory, each broadcast of ours still waiting for its
// acknowledgement counts it gone: one whose every expected node acknowledged or left is reported
// now (not_connected), from the loop. The only callback here is the on_writable a freed flow is
// owed, last.
void fan_departed(node::impl& n, bus_id id);
// Whether directory entry `now` is another incarnation of the node `was` described (another pid
// or start time): a restart the directory saw as a change, not a removal and an addition.
bool fan_new_incarnation(const directory_entry& was, const directory_entry& now);
// Node `id` restarted (its entry changed to a new incarnation, or its flow acknowledgement named a
// new incarnation): as fan_departed() for what was sent to the old one — never resent to the new
// one — except that the broadcasts waiting for it count it gone whether or not it is still in the
// directory. The tx flow to it forgets the old incarnation (the new one's first acknowledgement
// is no restart). The only callback is on_writable, last.
void fan_restarted(node::impl& n, bus_id id);

}  // namespace uvbus::detail
