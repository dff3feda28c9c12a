// The bus node's internal types (namespace uvbus::detail): links, peer endpoints, pending queues,
// sibling, reply and call slots, the libuv handles and the cross-thread mailbox, with the size
// constants they share. node::impl (node_impl.h) is built from them.
#pragma once

#include <uv.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>

#include "bus/auth.h"
#include "bus/flow.h"
#include "bus/node_fanout.h"
#include "bus/node_secure.h"
#include "bus/routing.h"
#include "bus/wire.h"
#include "core/log_limiter.h"
#include "core/pool_allocator.h"
#include "core/ring_fifo.h"
#include "core/thread_check.h"
#include "obs/http_endpoint.h"
#include "obs/prom_text.h"
#include "uvbus/address.h"
#include "uvbus/node.h"
#include "uvbus/shm.h"
#include "uvbus/stream.h"

namespace uvbus::detail {

constexpr size_t kBusOverhead = proto::kHeaderSize + proto::kDataPrefix;
// The most a message adds to its payload on a link or in a ring: the header, the flow prefix (user
// type, epoch), a trace block and a shared-memory writer envelope. Frame and record limits are
// message_limit plus this, so a message of message_limit bytes fits in every form.
constexpr size_t kMaxBusOverhead =
    proto::kHeaderSize + proto::kFlowPrefix + proto::kTraceSize + proto::kShmEnvelopeSize;
constexpr uint32_t kSiblingRetryMs =
    5000;  // after a failed direct attempt, use the parent this long
constexpr size_t kMaxSpans = 64;
// A sibling the parent does not know yet (not registered): ask again this often while messages
// wait for it (they expire on the pending queue's deadline).
constexpr uint32_t kSiblingWaitRetryMs = 100;
// Log lines a peer can repeat at will, rate-limited per kind (node::impl::peer_logs: 5 a second,
// then one "N more <kPeerLogSummary> (log rate-limited)" line once the second has passed; the
// kinds from bad_call on are summed up by dir_tick).
enum class peer_log : size_t { relay_drop, refused_registration, bad_call, dir_not_theirs, none };
constexpr const char* kPeerLogSummary[] = {
    "relayed messages dropped", "registrations refused",
    "call messages with a bad call block dropped",
    "directory messages with ids not the sender's to announce"};
// A report tag is the message id; this bit marks a require_response message, whose one report is
// owned by its entry in node::impl::replies (the ack, the response timeout or the first channel
// failure, whichever comes first) and never by the channel's success. Message ids stay below it.
constexpr uint64_t kTagE2e = uint64_t{1} << 63;

// Whether a listening socket inherited as inherited_url serves the listen URL listen_url: the
// same URL, or the same scheme and address (IP literals compared as addresses, however written)
// with listen_url's port 0 (any) or equal; a dns:// listen URL takes a TCP socket of its port
// (listen_fd() checks the socket itself).
bool inherited_fits(const std::string& listen_url, const std::string& inherited_url);
// Which inherited socket each listen URL adopts (its index in `inherited`, or -1: bind afresh).
// Each socket serves one URL; exact fits (the same URL, or a fixed port) are matched before the
// port-0 URLs take what is left, so a wildcard never takes a fixed-port URL's socket.
std::vector<int> match_inherited(const std::vector<std::string>& listen,
                                 const std::vector<inherited_listener>& inherited);

// The shared-memory ring config a node with a shm:// listen URL opens (node_config.cpp).
shm_config ring_config(const node_config& cfg);
// The stream_config of the node's links (its listeners and its dials; node_config.cpp), which
// node::validate checks with stream_channel::validate.
stream_config link_stream_config(const node_config& cfg);

inline uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline peer_role role_of(peer_kind k) {
  switch (k) {
    case peer_kind::parent:
      return peer_role::parent;
    case peer_kind::child:
      return peer_role::child;
    case peer_kind::sibling:
      return peer_role::sibling;
    case peer_kind::tool:
      return peer_role::tool;
  }
  return peer_role::child;
}

// A message waiting for its link (whole bus message: header + body).
struct pending_msg {
  std::vector<uint8_t> bytes;
  uint64_t tag = 0;  // message id (| kTagE2e) when a report is owed, else 0
  bus_id target = 0;
  uint64_t deadline_ms = 0;
};

struct pending_queue {
  std::deque<pending_msg> q;
  size_t bytes = 0;
};

struct link;

// A reported message on a stream link: its stream sequence number and what to report.
struct in_flight {
  uint64_t seq;
  uint64_t tag;
  bus_id target;
};

struct peer_ep {
  bus_id id = 0;
  peer_kind kind = peer_kind::child;
  proto::node_info info;
  link* lk = nullptr;  // its registered stream link
  std::unique_ptr<shm_writer> shm;
  uint64_t rtt_ns = 0;
  uint64_t last_rx_ms = 0;
  uint64_t last_ping_ms = 0;
  uint64_t last_data_ms = 0;
  // Relayed messages that met a full queue, and the links paused until they drain.
  std::deque<std::vector<uint8_t>> overflow;
  size_t overflow_bytes = 0;
  std::vector<uint64_t> paused_links;
  // When the overflow last moved (a message into an empty one, or one out): a hop whose overflow
  // has not moved for heartbeat_timeout_ms is not reading and is closed (tick).
  uint64_t overflow_moved_ms = 0;
  bool shm_reader_paused = false;  // we stopped our shm reader because of this overflow
  // Our own messages a pending queue handed over (flush_queue) that the link's queue did not take:
  // sent in order as it drains (drain_backlog); our later data for this peer waits behind them.
  pending_queue backlog;
  bool draining_backlog = false;
  bool user_blocked = false;  // a send_data() got queue_full: tell on_writable
  bool shm_tagged = false;    // shm_envelope goes before each message into its ring
  uint8_t shm_envelope[proto::kShmEnvelopeSize] = {};
  // Directory (node_directory.cpp, dir_tick): new entries from it left out for want of room since
  // we last asked it for its directory; it asked for ours; not answered again before this time.
  size_t dir_skipped = 0;
  bool dir_wanted = false;
  uint64_t dir_answer_after_ms = 0;
  // Directory messages for it that met a full link queue (dir_drain): removals in order, then a
  // pass over our directory (1: our own entry next; 2: entries from dir_cursor on), and another
  // pass after it (dir_again) if entries changed while one ran.
  std::vector<bus_id> dir_removes;
  uint8_t dir_pass = 0;
  bool dir_again = false;
  bus_id dir_cursor = 0;
  // A child's directory events (node_directory.cpp: kDirChangeBurst, kDirChangesPerSecond): the
  // tokens left, when they were last refilled, and each id's latest state over the budget (no
  // value: removed), taken in at the tick as the budget refills; how many were held so far. Ids
  // in our directory, and up to directory_max_entries others, are held (dir_hold).
  bool dir_paced = false;  // tokens set up (at its first directory message)
  size_t dir_tokens = 0;
  uint64_t dir_refill_ms = 0;
  std::map<bus_id, std::optional<directory_entry>> dir_held;
  uint64_t dir_coalesced = 0;
};

// Metrics: what each peer's link counters read at the last render, and the increments summed for
// the peers past metrics_max_peers (peer="other"): that series only grows, whoever leaves it.
struct peer_metrics_memory {
  struct seen {
    uint64_t conn = 0;          // the link the figures are of (0: none)
    const void* shm = nullptr;  // the ring writer shm_full is of
    stream_connection_metrics link;
    uint64_t shm_full = 0;
  };
  std::unordered_map<bus_id, seen> last;
  stream_connection_metrics other;  // counters only (the queue gauges are summed at each render)
  uint64_t other_shm_full = 0;
  bool other_shown = false;  // once shown, "other" stays
  // The flow latency of the targets past metrics_max_peers (target="other"): what each one's
  // histogram held when it entered "other", and its samples since. Forgetting an idle flow, or
  // one moving to a series of its own, takes nothing out of it.
  std::unique_ptr<latency_histogram> latency_other;
};

enum class link_state : uint8_t {
  connecting,
  await_challenge,  // connector
  await_register,   // acceptor
  await_reply,      // connector
  registered,
  closing,
};

struct link {
  connection_id conn;
  uint64_t conn_id = 0;  // conn.value, the key in impl::links
  link_state state = link_state::connecting;
  bool outbound = false;
  bool is_parent = false;
  proto::link_role role = proto::link_role::child;
  uint8_t version = 0;   // the negotiated protocol version, once registered
  bus_id expect_id = 0;  // connector to a sibling: whom we expect
  uint8_t nonce[proto::kNonceSize] = {};
  bool sent_nonce = false;                   // connector: my_nonce went out (version 6)
  uint8_t my_nonce[proto::kNonceSize] = {};  // connector: what the acceptor must prove over
  uint8_t codec = 0;                         // the link's compression codec (0: none)
  uint64_t deadline_ms = 0;
  peer_ep* peer = nullptr;
  errc close_reason = errc::ok;  // set when we close it for a reason of our own
  bool paused = false;    // not read for back-pressure: exempt from the heartbeat timeout meanwhile
  bool reported = false;  // parent link: on_registration already told about this attempt
  uint64_t unsent_dropped = 0;  // relayed messages its dying queue held (s_unsent), to be logged
  // Messages awaiting their next-hop report, in stream sequence order: on_written(through) pops
  // every entry with seq <= through, on_send_failed(first, last) every entry with seq <= last.
  ring_fifo<in_flight> reports;
};

// waiting: the parent said the sibling is not registered (yet); messages wait, the lookup repeats.
enum class sib_state : uint8_t { lookup, waiting, connecting, via_parent };

struct sibling_entry {
  sib_state state = sib_state::lookup;
  pending_queue pending;
  uint64_t until_ms = 0;  // via_parent: retry a direct link after this
};

struct pending_reply {
  bus_id target = 0;
  uint64_t deadline_ms = 0;
  node::command_cb cb;  // commands; empty for acks
  uint64_t report_tag = 0;
};
// By sequence (deadlines grow with it). An entry per message sent with require_response under
// next_hop delivery: its nodes come from a pool, so a steady flow of them allocates nothing.
using reply_map = std::map<uint64_t, pending_reply, std::less<>,
                           pool_allocator<std::pair<const uint64_t, pending_reply>>>;

struct self_msg {
  bus_id source;
  uint32_t type;
  std::vector<uint8_t> bytes;
  uint64_t seq;
  bool require_response;
  bool has_trace = false;
  trace_context trace;
  uint8_t call_flag = 0;  // proto::flag_call when the bytes start with a call block
};

// An outstanding node::call() (node_call.cpp). The call id is (gen << 32) | slot index.
struct call_slot {
  uint32_t gen = 0;
  bool busy = false;
  bus_id target = 0;
  uint64_t deadline_ms = 0;
  call_fn cb;
};

// libuv handles live in their own heap block so their close callbacks may run after the node is
// destroyed; the last close callback frees the block.
struct handles {
  uv_timer_t tick{};
  uv_timer_t reconnect{};
  uv_idle_t idle{};
  uv_async_t post{};   // wakes the loop for the mailbox
  uv_check_t acks{};   // flows: acknowledgements go out after each loop iteration's input
  uv_timer_t flow{};   // flows: retry transmissions that met a full queue
  uv_timer_t calls{};  // node::call() and broadcast deadlines (node_call.cpp)
  uv_timer_t ring{};   // relays: a next hop's full ring retried (no wake-up exists for its space)
  int open = 0;
};

// What one item of node::post()'s mailbox takes of post_queue_bytes: a 64-byte record (a task's
// whole cost), then a message's payload rounded up to 8 (node_post.cpp).
inline constexpr size_t kPostRecordBytes = 64;
inline constexpr size_t post_item_bytes(size_t payload) noexcept {
  return kPostRecordBytes + ((payload + 7) & ~size_t{7});
}

// node::post()'s mailbox: the one part of a node other threads touch, all of it under `mu`.
// Producers append records (node_post.cpp) to `bytes`; the loop swaps the whole buffer out.
struct mailbox {
  enum class status : uint8_t { not_started, open, stopped, gone };
  std::mutex mu;
  status st = status::not_started;
  std::vector<uint8_t> bytes;
  std::vector<std::function<void()>> tasks;
  size_t items = 0;  // records in bytes
  // What a swapped-out batch stuck on a full queue still holds: it counts against the bounds.
  size_t held_items = 0;
  size_t held_bytes = 0;
  uv_async_t* async = nullptr;
};

}  // namespace uvbus::detail
