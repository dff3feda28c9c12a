// The bus node: a process's presence on a uvbus message bus.
//
// A node has a 64-bit id and may own subnets of child ids (subnet.h). It registers to one parent
// (one of parent_urls, tried in order), accepts children whose ids lie in its subnets, and connects
// to siblings (other children of its parent) on demand. send_data(target, type, bytes) reaches any
// node of the tree: directly when a link to the target exists, down through the child whose subnet
// holds the target, or up through the parent; every relay decrements a TTL so a misconfiguration
// cannot loop.
//
// Links: every peer link starts as a stream connection (TCP, or a unix socket when the peer offers
// one on the same host) carrying a registration handshake (docs/protocol.md): version range, id,
// subnets, listen URLs, host identity and pid, and an HMAC-SHA256 proof over a nonce chosen by the
// accepting side. When a registered peer runs on the same host and lists a shm:// URL, data for it
// goes into that shared-memory ring instead; the stream connection still carries control traffic.
// The choice is invisible to send_data().
//
// Threading: a node belongs to one uv_loop_t and to the thread that constructs it, which must be
// the thread that runs the loop; every callback runs there, from inside uv_run(). Timers
// (heartbeats, reconnects, timeouts) run inside the loop; the user calls nothing periodically.
// Every member function checks the calling thread first: a call from another thread is a caller
// bug — debug builds (NDEBUG unset) abort with a message naming the function, release builds
// return errc::wrong_thread (false / empty for functions that do not return errc; id() and
// config(), which never change, still return their value) and do nothing. The one entry point any
// thread may call is node::post().
//
// Errors are values. Contract shared with libuv, word for word: when a function which takes a
// callback returns an error, the callback will never be called. For send_data() that means: a
// send that returns an error produces no delivery report; one that returns ok produces exactly one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "uvbus/buffer.h"
#include "uvbus/call.h"
#include "uvbus/directory.h"
#include "uvbus/discovery.h"
#include "uvbus/error.h"
#include "uvbus/fanout.h"
#include "uvbus/histogram.h"
#include "uvbus/log.h"
#include "uvbus/protocol.h"
#include "uvbus/subnet.h"
#include "uvbus/tls.h"
#include "uvbus/trace.h"

typedef struct uv_loop_s uv_loop_t;  // NOLINT(modernize-use-using): matches libuv's declaration

namespace uvbus {

// What an ok delivery report means (node_config::delivery).
enum class delivery_mode : uint8_t {
  // The target's on_data was called (it returned, or is running). Messages travel in flows
  // (docs/bus.md "Flows"): per source and target a sequence number, cumulative acknowledgements
  // from the target, a bounded retransmit buffer at the source, resend after a link, a relay or
  // the target restarted, duplicates dropped by the target. A message fails only when its
  // delivery deadline passes, the route refuses it for good, or the node stops.
  end_to_end,
  // The next hop's channel took the message (the kernel socket buffer or the shared-memory
  // ring); a relay that drops it later tells on_dropped. Cheaper, and nothing is sent again.
  next_hop,
};

// A stream link's compression codec (node_config::compression).
enum class compression_codec : uint8_t { none = 0, lz4 = 1, zstd = 2 };
const char* to_string(compression_codec c) noexcept;

// A listening socket handed from one process of a node to the next (node::detach_listeners(),
// node_config::inherit_listeners, uvbus/handover.h): its bound URL (port 0 resolved), the socket.
struct inherited_listener {
  std::string url;
  int fd = -1;
};

struct node_config {
  // URLs to accept peers on: ipv4://, ipv6://, dns://, unix:// (port 0 picks a free port; read the
  // real URLs back with node::listen_urls()) and at most one shm:// (the ring this node reads its
  // data from; peers on the same host write into it).
  std::vector<std::string> listen;
  // The parent to register to (stream URLs), in order of preference; empty for a root node. The
  // node connects to the first; when a connect or registration attempt fails or the registered
  // parent's link is lost, it moves on to the next (wrapping around), so a gateway replica can
  // take over. Attempts within one round over the list wait reconnect_min_ms; each further round
  // doubles the wait up to reconnect_max_ms. All the parents must accept this node's id.
  std::vector<std::string> parent_urls;
  // Child ids this node accepts. A child must have its id and all its subnets inside these.
  std::vector<subnet> subnets;
  // Register to the parent as a tool (an operator's process such as the `uvbus` command-line
  // tool) instead of as a child: the id must lie *outside* the parent's subnets (and be unused),
  // so a tool never takes an id a real node could need, and the parent does not announce it to
  // the rest of the bus. The tool reaches every node through the parent; replies reach it from the
  // parent and from the nodes below the parent. Needs parent_urls and no subnets.
  bool join_as_tool = false;

  // Largest user payload of send_data() (message_too_large above it); the stream frame limit is
  // this plus 85 bytes (bus header 32, flow prefix 12, trace block 25,
  // shared-memory writer tag 16). Every node of a bus should agree.
  size_t message_limit = size_t{64} * 1024;
  // Per-connection stream send queue, bytes and packets (back-pressure: queue_full above them).
  size_t link_queue_bytes = size_t{2} << 20;
  size_t link_queue_packets = 65536;

  // Messages sent while their link is not up yet (parent reconnecting, sibling being looked up or
  // connected) wait in a bounded queue: at most this many messages and bytes per link, each at most
  // pending_timeout_ms, then they fail with errc::timeout. pending_max_messages = 0 disables
  // queueing: such sends return not_connected at once. Default: 4096 messages / 4 MiB / 10 s.
  size_t pending_max_messages = 4096;
  size_t pending_max_bytes = size_t{4} << 20;
  uint32_t pending_timeout_ms = 10000;
  // A relay that just started (a parent restart), or that just lost a child's link, holds
  // messages for that child's id (an id of its subnets with no child registered) this long,
  // waiting for the child to register (again), instead of refusing them with unknown_route.
  // Bounded like the pending queues, per child and in total: all messages held, for every child
  // id together, are at most pending_max_messages / pending_max_bytes; beyond that a message is
  // refused as if no grace applied (unknown_route). 0: refuse at once.
  uint32_t child_grace_ms = 2000;
  // Forwarding back-pressure: when a relayed message meets a full next-hop queue it waits in that
  // hop's overflow queue (this many bytes at most) and the link it came from stops being read until
  // the overflow drains; beyond it, relayed messages are dropped and counted (forward_dropped).
  // A link paused so is not timed out for silence; a next hop whose overflow has not moved for
  // heartbeat_timeout_ms is closed (queue_full) and its overflow refused (queue_full).
  size_t forward_overflow_bytes = size_t{4} << 20;

  // A connection must finish the registration handshake within this time or is closed.
  uint32_t handshake_timeout_ms = 5000;
  // Caps on accepted connections that have not finished registration (each holds a socket and a
  // little memory until handshake_timeout_ms): beyond max_unregistered of them on this node, or
  // beyond max_unregistered_per_address of them from one source address (an IP address, whatever
  // the port; every unix-socket peer counts as one address), a new connection is closed at once,
  // counted (uvbus_stream_rejected_total) and logged (warn, rate limited). Registered peers do not
  // count and are never affected; a refused connector simply retries later. 0: no cap.
  uint32_t max_unregistered = 1024;
  uint32_t max_unregistered_per_address = 64;
  // Encrypted links (uvbus/tls.h, docs/security.md): TLS 1.3 on every stream listener and every
  // link this node dials, in certificate or psk mode; peers must use the same mode. Off by default.
  tls_config tls;
  // Every registered peer is pinged this often; the pong gives the round-trip time. A peer from
  // which nothing at all arrived for heartbeat_timeout_ms is dropped (its pending messages fail).
  uint32_t heartbeat_interval_ms = 2000;
  uint32_t heartbeat_timeout_ms = 6000;
  // Parent reconnect: exponential backoff from min to max, each delay with +-jitter (a fraction).
  uint32_t reconnect_min_ms = 100;
  uint32_t reconnect_max_ms = 5000;
  double reconnect_jitter = 0.2;
  // node::post()'s mailbox (shared by every posting thread): at most this many messages and tasks
  // and this many bytes (each message: its payload rounded up to 8, plus 64; each task: 64)
  // waiting for the loop, those of a batch the loop stopped on a full link included; beyond
  // either, post() returns queue_full. It must hold one message of message_limit.
  size_t post_queue_messages = 65536;
  size_t post_queue_bytes = size_t{8} << 20;
  // What an ok report means; see delivery_mode. Every node of a bus speaks flows (protocol
  // version 3) whatever its own mode; end_to_end needs version 3 on every link of the path.
  delivery_mode delivery = delivery_mode::end_to_end;
  // end_to_end: a message the target has not acknowledged after this time fails (timeout).
  // A target keeps a silent flow's position for max(flow_idle_ms, twice its own
  // delivery_timeout_ms), and a source may resend a message until this deadline: give the nodes of
  // a bus the same value (a source whose deadline is longer than that may see a message whose
  // acknowledgement was lost delivered a second time, after a silence longer than the target keeps
  // the position).
  uint32_t delivery_timeout_ms = 10000;
  // end_to_end: a flow idle this long is forgotten: the source's state (~200 bytes and latency
  // histogram per target), the target's position (kept at least 2 x its delivery_timeout_ms). A
  // later message starts a new flow above every sequence sent before (docs/bus.md "Flows").
  uint32_t flow_idle_ms = 120000;
  // end_to_end: each flow's retransmit buffer (messages sent and not acknowledged yet, or waiting
  // to be sent again) holds at most this many messages and bytes (each message takes its payload
  // plus 44 bytes); beyond either, send_data() returns queue_full until acknowledgements drain it.
  size_t retransmit_max_messages = 65536;
  size_t retransmit_max_bytes = size_t{8} << 20;
  // end_to_end: when a flow's acknowledgements stop advancing for this long, its unacknowledged
  // messages are sent again (the wait doubles, up to 8x, while nothing advances).
  uint32_t resend_timeout_ms = 200;
  // end_to_end: stop() keeps the links open this long at most for the acknowledgements of
  // messages sent and not acknowledged yet, while a registered link is left (0: closed at once).
  uint32_t stop_flush_ms = 2000;
  // Target side: a flow is acknowledged once per loop iteration that delivered something, and
  // inside a long run of deliveries every ack_every messages.
  uint32_t ack_every = 256;
  // A require_response message without an acknowledgement after this time fails with timeout.
  uint32_t response_timeout_ms = 10000;
  // At most this many require_response messages and commands awaiting their answer; beyond it
  // send_data(require_response) and send_command() return queue_full.
  size_t max_outstanding_responses = 65536;
  // At most this many node::call()s awaiting their answer (>= 1); beyond, call() is queue_full.
  size_t max_outstanding_calls = 65536;
  // Siblings: connect directly at the first message (else everything goes through the parent);
  // drop a sibling link with no data either way for this long.
  bool sibling_direct = true;
  uint32_t sibling_idle_ms = 60000;

  // Access tokens. Peers registering here must prove one of them (any: rotation is adding the new
  // token everywhere, then removing the old). Empty: no proof required. When connecting, the first
  // token is used. Tokens never cross the wire: only HMAC-SHA256(token, nonce || id || role).
  // Authentication is two-way (protocol version 6): a node with tokens also requires the node it
  // connects to (parent or sibling) to prove one, over a nonce of its own, and closes the link
  // (access_denied, retried with backoff) if it does not; a peer that negotiates version 5 or
  // less cannot prove itself and is refused. With tokens, every message written into this node's
  // shared-memory ring must carry its writer's tag, derived from the token and the writer's id
  // (docs/security.md): records without a valid one, or whose source id that writer may not
  // speak for, are dropped and counted (node_counters::shm_rejected).
  std::vector<std::string> access_tokens;
  // Protocol versions offered; the highest common one is used.
  uint8_t protocol_min = proto::kMinVersion;
  uint8_t protocol_max = proto::kMaxVersion;
  uint8_t default_ttl = proto::kDefaultTtl;

  // Use shared memory for data to peers on the same host that offer a shm:// URL.
  bool enable_shm = true;
  size_t shm_ring_bytes = size_t{8} << 20;
  // How long our ring's reader waits for a writer that reserved a record but has not committed it
  // before skipping the record (a crashed writer must not wedge the ring). Larger than the shm
  // channel's 4 ms default because a writer preempted on a busy host stalls that long routinely;
  // a skipped sender learns it (errc::abandoned) and the node sends the message again.
  uint32_t shm_abandon_timeout_us = 50000;
  // Planned restart (docs/bus.md "Planned restart"): stop() and destruction leave this node's
  // shm ring in place (closed with shm_close_mode::keep) instead of removing it; the next process
  // with the same id and shm:// URL reattaches it and reads what was written meanwhile.
  bool keep_shm_inbox = false;
  // Planned restart: node::flow_positions() of the previous process of this id, taken after its
  // stop(): this node starts with them, so messages its sources send again (those the previous
  // process delivered but had not acknowledged) are recognised as duplicates. Each position
  // counts as heard from at start() (then kept like any silent flow's). Empty: none.
  std::vector<uint8_t> inherit_flow_positions;
  // Planned hand-over: listening sockets of the previous process of this id (its
  // detach_listeners(), passed over with uvbus/handover.h). A stream URL of `listen` that an
  // entry's url fits (the same URL; or the same scheme and host with the listen URL's port 0 or
  // equal; a dns:// URL by its port) adopts that socket instead of binding, so peers that
  // connected meanwhile wait in its backlog instead of being refused. Each socket serves one URL;
  // exact fits (the same URL, a fixed port) are matched first, port-0 URLs take what is left, in
  // `listen` order. start() owns every fd from its call on: it is closed with its listener, or by
  // start() if it is not adopted (start() failed, or the socket did not fit: then start() fails
  // with invalid_argument naming inherit_listeners[i] and why).
  std::vector<inherited_listener> inherit_listeners;
  // Metrics endpoint: "http://HOST:PORT[/PATH]" (HOST an IPv4 literal, [IPv6] or localhost; port
  // 0 picks one; PATH default /metrics) serves node::metrics_text() in the Prometheus text format
  // from the node's loop (no thread). Empty (the default): off. docs/observability.md.
  std::string metrics_url;
  // Latency tracking (delivery_mode::end_to_end only): each message's time from send_data() to
  // its end-to-end acknowledgement (an upper bound of send-to-deliver: it adds the way back and
  // the acknowledgement's batching within one loop iteration), per target and per user type (64
  // types, the rest as "other"), in latency_histograms (~10 KiB each). Read with latency_to() /
  // latency_of_type() and in the metrics. Off by default: one clock read per message and per
  // acknowledged message (cost in docs/benchmark.md).
  bool latency_histograms = false;
  // ... measuring one message in this many (a power of two; 1: every message). Sampling keeps the
  // cost small at millions of messages a second; percentiles of a sample are as good for all but
  // the rarest outliers.
  uint32_t latency_sample_every = 16;
  // Peers shown one by one in the per-peer metric families; the rest are summed as peer="other".
  size_t metrics_max_peers = 64;
  // Host identity override (empty: boot_id + hostname, see docs/bus.md). Equal host ids are what
  // makes two nodes try shared memory.
  std::string host_id;
  // Stream TCP_NODELAY.
  bool tcp_nodelay = true;
  // Link compression (docs/compression.md "On the bus"), negotiated at registration (protocol
  // version 6): a stream link compresses only when both of its nodes ask for a codec; it then
  // uses the accepting node's codec in both directions, each side at its own level. Data messages
  // of at least compression_threshold bytes are compressed one by one and sent compressed only
  // when that saves bytes (a message never grows); the receiving node restores each one before
  // anything else sees it, bounded by the message limit. Shared memory is never compressed.
  // Levels: lz4 0 (default), -N faster, 1..12 LZ4HC; zstd 0 (default 3), negative fast, up to 22.
  compression_codec compression = compression_codec::none;
  int compression_level = 0;
  size_t compression_threshold = 512;
  // How this node describes itself in the bus directory (node::directory(), on_directory;
  // docs/bus.md "Directory"): a name, a type ("gateway", "logic", ...) and labels (region, zone,
  // version, ...). Each text at most 128 bytes, at most 16 labels with distinct non-empty keys.
  std::string name;
  std::string type;
  std::vector<node_label> labels;
  // At most this many directory entries (at least 1): a new one beyond it is left out, counted
  // (directory_skipped), logged, and asked for again once room frees (docs/bus.md "Directory").
  size_t directory_max_entries = 65536;
  // Discovery on etcd (uvbus/discovery.h, docs/cluster.md). With discovery.etcd_endpoints set,
  // start() registers this node's directory entry under discovery.prefix with a lease and merges
  // every node found there into directory(), lookup(), find() and on_directory, exactly as the
  // tree's own entries (parent = 0 for a node known only from etcd). stop() revokes the lease.
  // etcd being unreachable never stops the node: the last directory is kept. Default: off.
  discovery_config discovery;
  // With discovery on and parent_urls empty: register to the lowest-id discovered node of this
  // type ("" = none: the node is a root) carrying every label of discovery_parent_labels, at its
  // stream listen URLs; until one is found the node is not up and messages for the rest of the
  // bus wait in the parent queue (within their deadlines). A lost link is first retried at the
  // same parent's URLs, as with parent_urls; once that parent's entry has left etcd (stopped, or
  // its lease expired after a crash) the rule chooses again among the live ones. A lower-id
  // candidate that appears later takes the node over (every node applying the rule to the same
  // directory has the same parent: no split trees); the old link is closed, flows resume.
  std::string discovery_parent_type;
  std::vector<node_label> discovery_parent_labels;
};

enum class channel_kind : uint8_t { none, stream, shm };
const char* to_string(channel_kind k) noexcept;

enum class peer_role : uint8_t { parent, child, sibling, tool };
const char* to_string(peer_role r) noexcept;

// A registered peer, as callbacks and peers() report it.
struct endpoint_info {
  bus_id id = 0;
  peer_role role = peer_role::child;
  channel_kind data_channel = channel_kind::stream;  // what our data to it uses
  proto::node_info info;                             // what it told us at registration
  uint64_t rtt_ns = 0;                               // last heartbeat round trip (0: none yet)
};

struct delivery_report {
  uint64_t message_id = 0;  // what send_data() returned in *message_id
  bus_id target = 0;
  // delivery_mode::end_to_end (the default): ok = the target's on_data was called. Otherwise
  // timeout (not acknowledged within delivery_timeout_ms: the target may or may not have got it),
  // closed (the node stopped first: likewise unknown), or a relay's refusal for good:
  // unknown_route (no such node, or one that never acknowledged us), ttl_expired,
  // message_too_large, version_mismatch (a link of the path does not speak flows).
  // delivery_mode::next_hop: ok = delivered to the next hop's channel (the kernel socket buffer or
  // the shared-memory ring), or, with require_response, received by the target node. Otherwise why
  // it failed: not_connected / connection_reset (link lost), timeout (pending or response wait
  // expired), closed (node stopped), unknown_route / ttl_expired (reported back by a relay or the
  // target, require_response only), queue_full (a relay's queue overflowed), abandoned (shm).
  errc status = errc::ok;
  bool end_to_end = false;  // true when the report comes from the target's acknowledgement
};

struct node_counters {
  uint64_t data_sent = 0;         // sends accepted (send_data/any, post, call, reply)
  uint64_t data_sent_stream = 0;  // ... of which went out over a stream link
  uint64_t data_sent_shm = 0;     // ... over shared memory
  uint64_t data_received = 0;     // delivered to on_data
  uint64_t forwarded = 0;         // user messages relayed for others
  uint64_t forward_dropped = 0;   // relayed messages dropped (no route, overflow, ttl)
  uint64_t ttl_expired = 0;       // messages dropped because their TTL ran out here
  uint64_t reports_ok = 0;
  uint64_t reports_failed = 0;
  uint64_t pending_now = 0;  // messages waiting for a link right now
  uint64_t registrations_accepted = 0;
  uint64_t registrations_refused = 0;  // peers we refused
  uint64_t reconnects = 0;             // parent connection attempts after the first
  uint64_t heartbeat_timeouts = 0;
  uint64_t protocol_errors = 0;        // malformed messages (the link is closed)
  uint64_t shm_abandoned_retries = 0;  // shm sends skipped by the reader and sent again
  uint64_t drop_notices_sent = 0;      // relay: sources told that their message was dropped here
  uint64_t drop_notices_received = 0;  // source: relays' notices about our messages (on_dropped)
  uint64_t held_for_child = 0;         // relay: messages that waited for a child to (re)register
  // Flows (end_to_end delivery; docs/bus.md "Flows").
  uint64_t flow_unacked_now = 0;    // source: messages in retransmit buffers right now
  uint64_t flow_unacked_bytes = 0;  // ... and their bytes
  uint64_t flow_targets = 0;        // source: targets with a flow (idle ones go: flow_idle_ms)
  uint64_t flow_sources = 0;        // target: sources whose position is kept (idle ones go)
  uint64_t flow_buffer_bytes = 0;   // source: memory the flows' buffers hold now (idle ones shrink)
  uint64_t flow_resent = 0;         // source: messages sent again
  uint64_t flow_acks_sent = 0;      // target: acknowledgements sent
  uint64_t flow_acks_received = 0;  // source
  uint64_t flow_duplicates = 0;     // target: duplicates dropped
  uint64_t flow_out_of_order = 0;   // target: messages after a gap dropped (the source resends)
  uint64_t flow_resyncs = 0;        // target: messages of a flow it held no position for
  uint64_t flow_stale = 0;          // target: sync messages of an epoch the flow had left
  // Request/reply (node::call).
  uint64_t calls_started = 0;      // call()s accepted
  uint64_t calls_ok = 0;           // ... answered with a reply
  uint64_t calls_failed = 0;       // ... ended otherwise (remote_error, timeout, refusal, closed)
  uint64_t requests_received = 0;  // requests delivered to on_data here
  uint64_t answers_sent = 0;       // reply() / reply_error() accepted
  uint64_t answers_ignored = 0;    // answers that came late, twice, or from a node not called
  // Link compression and shared-memory writer tags (protocol version 6).
  uint64_t compressed_sent = 0;        // messages sent compressed
  uint64_t compressed_raw_bytes = 0;   // ... their bodies' size before compression
  uint64_t compressed_wire_bytes = 0;  // ... and after
  uint64_t decompressed = 0;           // compressed messages received and restored
  uint64_t shm_rejected = 0;           // ring records refused: bad writer tag, or a foreign source
  // Broadcast (node::broadcast).
  uint64_t broadcasts_sent = 0;       // broadcast() calls accepted
  uint64_t broadcasts_received = 0;   // broadcasts delivered to on_data here
  uint64_t broadcasts_forwarded = 0;  // copies relayed to a next link
  uint64_t directory_skipped = 0;     // new directory entries left out: directory_max_entries
};

// Callbacks. Each may be empty. They run on the loop thread, never from inside the node's own
// member functions (send_data, start, stop, ... never call back synchronously): everything is
// reported from the loop. They may call any node member function, including send_data(), stop()
// and set_callbacks() (the new set takes effect when the running callback returns).
// Any of them — and a send_command() callback — may destroy the node (delete it, reset its
// unique_ptr), on_down(errc::closed) included, which is the usual place after stop(): the
// destruction completes after the callback returns, the next time the loop runs, and no callback
// of this node fires after the destroying one returns (reports still owed are dropped, as for any
// destruction). The callback must not touch the node after destroying it.
struct node_callbacks {
  // A data message for this node. [data, data + size) is valid only during the call (it points into
  // a read buffer or the shared-memory ring): copy what you keep. Messages from one source arrive
  // in send order while the route between the two nodes stays the same (a route change — a sibling
  // link coming up, a parent restart — may reorder messages in flight across the change).
  std::function<void(bus_id source, uint32_t type, const uint8_t* data, size_t size)> on_data;
  // Exactly one per message accepted by send_data(), send_datav() or post() (none if the node is
  // destroyed first; stop() still reports everything, with errc::closed for what could not be
  // sent). Always after the accepting call returned. Without this callback the node does not track
  // channel-level delivery at all (cheaper).
  std::function<void(const delivery_report&)> on_report;
  // A peer finished registration (either direction) / a registered peer's link ended (reason).
  std::function<void(const endpoint_info&)> on_endpoint_added;
  std::function<void(const endpoint_info&, errc reason)> on_endpoint_removed;
  // This node is up: registered with its parent (parent id), or started as a root (its own id).
  std::function<void(bus_id parent)> on_up;
  // This node lost its parent (it reconnects by itself; reason: why the link ended, a parent that
  // stopped gracefully included: connection_reset) or stopped (errc::closed, only then).
  std::function<void(errc reason)> on_down;
  // The outcome of each registration attempt to the parent: ok, or the reason it was refused /
  // failed (access_denied, duplicate_id, out_of_subnet, version_mismatch, timeout, connection
  // errors). After access_denied, out_of_subnet or version_mismatch the node stops retrying (a
  // configuration error); after anything else it retries with backoff.
  std::function<void(errc result, const std::string& detail)> on_registration;
  // Errors that are not tied to one send: refused peers, protocol errors, listener failures.
  std::function<void(errc e, const std::string& what)> on_error;
  // Optional log hook (registration, refusals, reconnects, drops). Without it nothing is logged.
  std::function<void(log_level level, const std::string& message)> on_log;
  // A send_data() got queue_full and there is room again: retry now. `id` is the next hop whose
  // stream link drained or whose ring is at most half full again (polled every ms), or (end_to_end)
  // the target whose full flow's retransmit buffer is at most half full (acknowledged or failed).
  std::function<void(bus_id id)> on_writable;
  // A relay dropped message `message_id` (sent to `target`) after its report was already given:
  // a message sent without require_response, reported ok when it reached the next hop, that a
  // relay further on could not pass on (reason: unknown_route, not_connected, ttl_expired,
  // queue_full, ...). Never a second report: a message whose report is still outstanding gets the
  // refusal as its report instead. (A require_response message whose report, timeout, came before
  // the relay's refusal gets neither: the refusal arrives as an acknowledgement that no longer
  // matches an outstanding message and is ignored.) Sent only by relays and links speaking protocol
  // version 2; at most one per message. Runs on the loop thread like every callback.
  std::function<void(bus_id target, uint64_t message_id, errc reason)> on_dropped;
  // The bus directory changed: a node appeared, re-registered with other fields, or left,
  // anywhere in the tree (docs/bus.md "Directory"). `entry` is valid during the call.
  std::function<void(directory_event event, const directory_entry& entry)> on_directory;
};

struct send_options {
  // delivery_mode::next_hop: ask the target to acknowledge this message: the report then comes
  // from the target (end_to_end) or fails with the reason a relay or the target gave, or with
  // timeout after response_timeout_ms. Under delivery_mode::end_to_end every report already comes
  // from the target, and this flag changes nothing.
  bool require_response = false;
  uint8_t ttl = 0;  // 0: node_config::default_ttl
  // A W3C trace context to carry with the message (copied before the call returns; 25 bytes on
  // the wire, none when null). The target reads it with node::incoming_trace() inside on_data;
  // relays pass it on unchanged; a link to a peer of protocol version < 4 drops it (the message
  // itself goes through). An invalid one (zero ids) is refused with invalid_argument.
  const trace_context* trace = nullptr;
};

class node {
 public:
  // Never fails; an invalid config makes start() return invalid_argument. The loop must outlive
  // the node, and must be run after the node's destruction until its handles have closed.
  node(uv_loop_t* loop, bus_id id, node_config cfg, node_callbacks cbs = {});
  // Releases everything without calling any callback and without a goodbye to peers (they notice
  // the closed connections). For an orderly exit call stop() first and destroy the node in (or
  // after) on_down(errc::closed). May be called from inside any callback of this node (see
  // node_callbacks); must be called on the node's thread.
  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  // Replaces every callback. wrong_state if the node is running and the new set adds or removes
  // on_report (whether reports are tracked is fixed at start()).
  [[nodiscard]] errc set_callbacks(node_callbacks cbs);

  // Checks id and cfg against every rule; on a refusal *detail (if given) names the field and the
  // rule ("node_config.heartbeat_timeout_ms (3000) must be at least twice heartbeat_interval_ms
  // (2000): ..."). Codes: bad_url / unsupported_scheme for a listen or parent URL that does not
  // parse or is of the wrong kind (a listen URL without port: bad_url); invalid_argument for the
  // rest: id 0, more than 16 subnets or 8 listen URLs, a subnet wider than 64 bits, more than one
  // shm:// listen URL, a URL over 256 bytes, an empty access token, host_id over 128 bytes, a
  // protocol range that is empty or starts at 0, message_limit 0 or above 1 GiB,
  // link_queue_bytes below one frame of message_limit, post_queue_bytes below one message
  // (message_limit rounded up to 8, plus 64), post_queue_messages, link_queue_packets,
  // max_outstanding_responses or default_ttl 0, a zero timeout or interval, heartbeat_timeout_ms
  // below twice heartbeat_interval_ms, reconnect_min_ms > reconnect_max_ms, jitter outside
  // [0, 1], max_unregistered_per_address above a non-zero max_unregistered, and with a shm://
  // listen URL: shm_ring_bytes not a power of two or too small for two records of message_limit,
  // shm_abandon_timeout_us 0.
  [[nodiscard]] static errc validate(bus_id id, const node_config& cfg,
                                     std::string* detail = nullptr);

  // Opens the listeners (and the shm ring), then connects to the parent if any. Errors (nothing
  // started): validate()'s, wrong_state (already started, or stopped: a node starts once), and
  // the listener's errors (address_in_use, permission_denied, busy, ...). Every refusal is
  // recorded in last_error() with the field or URL at fault and logged through on_log (error
  // level, from the loop).
  [[nodiscard]] errc start();
  // Graceful stop: pending messages fail (closed); end-to-end messages already sent get up to
  // stop_flush_ms for their acknowledgements (then the rest is reported closed); every peer gets
  // a goodbye, every stream link flushes its queue and closes, listeners and the shm ring close.
  // With discovery, the etcd lease is revoked first (within request_timeout_ms). on_down(closed)
  // fires when all of it is done (from the loop), so destroying the node there loses nothing.
  // Idempotent. The node can not be started again.
  void stop();
  [[nodiscard]] bool running() const noexcept;
  // Registered with the parent (or started as a root).
  [[nodiscard]] bool up() const noexcept;

  // Sends a message to target. Returns at once:
  //   ok                 accepted: exactly one delivery report follows (if on_report is set);
  //                      *message_id (if given) gets the id that report will carry (unique
  //                      per node; increasing for the loop thread's sends, but post()'s ids from
  //                      other threads do not fall in order between them)
  //   message_too_large  size > message_limit
  //   unknown_route      no route to target (an id in our subnets with no such child, or no
  //                      parent for an id outside them)
  //   not_connected      the route's link is down and queueing is disabled
  //   queue_full         the link's queue, the shared-memory ring or the pending queue is full,
  //                      or too many require_response messages are awaiting their answer
  //                      (retriable; on_writable tells when the link, ring or flow drained)
  //   access_denied, out_of_subnet, version_mismatch
  //                      the route goes through the parent, which refused this node for good
  //                      (not retriable: the configuration must change)
  //   wrong_state        not started
  //   closed             stopped
  // On an error, last_error() says more for the caller errors (which limit, which id).
  // A message to this node's own id is delivered through on_data from the loop, never inline.
  // The bytes are copied before send_data() returns.
  [[nodiscard]] errc send_data(bus_id target, uint32_t type, const void* data, size_t size,
                               const send_options& opt = {}, uint64_t* message_id = nullptr);
  // The gather form: sends the concatenation of bufs[0..count) (at most 64 buffers; their total
  // size is what message_limit applies to) as one message. Same results as send_data(), plus
  // invalid_argument for more than 64 buffers or a null buffer with a non-zero size.
  [[nodiscard]] errc send_datav(bus_id target, uint32_t type, const const_buffer* bufs,
                                size_t count, const send_options& opt = {},
                                uint64_t* message_id = nullptr);
  // In-place form, for a payload serialized straight into the node's buffer (saves the copy
  // send_data() makes): prepare_data() reserves room for exactly `size` payload bytes to target
  // and returns where to write them; commit_data() sends them with send_data()'s results and its
  // one report, and gives the message id. Under delivery_mode::end_to_end to another node the
  // room is in the target's retransmit buffer, so the payload is copied once less; otherwise it is
  // a buffer of the node's that commit_data() copies as send_data() would. On failure
  // prepare_data() returns nullptr and sets *err to one of send_data()'s errors (queue_full: the
  // retransmit buffer is full, retry on on_writable), or wrong_state while another reservation is
  // open, nothing sent. Between the two calls the node sends nothing else (send_data[v](), call(),
  // answers, broadcast(), send_command() return wrong_state); control must not return to the loop;
  // cancel_data() drops the reservation instead (nothing is sent or reported). stop() drops an
  // open reservation: commit_data() then returns closed. commit_data() without a reservation
  // returns wrong_state; a commit_data() that fails (queue_full from the link, ...) has dropped
  // the reservation too: nothing is sent or reported, prepare again to retry. The pointer is
  // valid until commit_data(), cancel_data() or stop().
  [[nodiscard]] uint8_t* prepare_data(bus_id target, uint32_t type, size_t size,
                                      errc* err = nullptr, const send_options& opt = {});
  [[nodiscard]] errc commit_data(uint64_t* message_id = nullptr);
  void cancel_data();

  // ------------------------------------------------------------------- from any thread --
  // post() is the node's one thread-safe entry: any thread may call it while the node object
  // exists (destroying the node while another thread may still call post() is a race the caller
  // must avoid: stop those threads first). It queues send_data(target, type, data, size, opt) in
  // a bounded mailbox that the loop thread runs in post order (one FIFO for every posting thread),
  // and returns at once:
  //   ok                 accepted: *message_id (if given) gets the message's id now, and exactly
  //                      one delivery report follows (if on_report is set), as for send_data():
  //                      a send the loop refuses (unknown_route, not_connected, a refusal for
  //                      good, ...) is reported with that code; a full link or ring is retried
  //                      when it drains, not reported. Accepted before stop() but not run yet:
  //                      reported closed, before on_down(closed). Destroyed first: no report.
  //   queue_full         the mailbox is full (post_queue_messages / post_queue_bytes; it stops
  //                      draining while the link is full): retriable
  //   message_too_large  size > message_limit
  //   invalid_argument   data is null with a non-zero size
  //   wrong_state        not started
  //   closed             stopped
  // The bytes are copied before post() returns. last_error() is not updated (it is the loop's).
  [[nodiscard]] errc post(bus_id target, uint32_t type, const void* data, size_t size,
                          const send_options& opt = {}, uint64_t* message_id = nullptr);
  // Runs task on the loop thread, in post order with the messages, as a callback of this node
  // (it may call any node function, and destroy the node). An accepted task runs even after
  // stop() (before on_down(closed)); none runs after destruction. Errors: invalid_argument
  // (empty task), queue_full, wrong_state, closed, as above.
  [[nodiscard]] errc post(std::function<void()> task);

  // Asks node `target` (any node with a route) for a command's result: routes (text, one line per
  // route), counters (text, name=value lines) or echo (returns args). cb fires exactly once, from
  // the loop: (ok, result) or (error, empty): timeout after response_timeout_ms, unknown_route,
  // closed. Errors at once (cb never called): as send_data. cb runs as a callback of this node
  // (node_callbacks' rules: it may destroy the node); none runs after the node is destroyed.
  using command_cb = std::function<void(errc status, const uint8_t* result, size_t size)>;
  [[nodiscard]] errc send_command(bus_id target, proto::command_id command, const void* args,
                                  size_t size, command_cb cb);

  // ---------------------------------------------------------------------- request/reply --
  // Sends [data, data + size) to `target` as a request of user type `type` and calls cb exactly
  // once with the reply or the reason there is none (call_result; uvbus/call.h): the handler's
  // reply, its reply_error (remote_error + its code), timeout after timeout_ms, a refusal on the
  // way (unknown_route, ...), closed at stop(). The request travels like send_data (same routes,
  // same flow and resend under end_to_end; opt.trace and opt.ttl apply) but has no delivery report
  // of its own: cb is its one outcome. The reply comes back over the bus to this node's id.
  // *call_id (if given) identifies the call (reply_handle::call_id on the other side). On the
  // node's thread. Errors at once (cb never called): as send_data, plus invalid_argument (empty cb,
  // timeout_ms 0), message_too_large (size above message_limit - 13: the call block takes 13 bytes)
  // and queue_full (max_outstanding_calls).
  [[nodiscard]] errc call(bus_id target, uint32_t type, const void* data, size_t size,
                          uint32_t timeout_ms, call_fn cb, const send_options& opt = {},
                          uint64_t* call_id = nullptr);
  // Inside on_data: the request being delivered (a call() from another node), or nullptr for a
  // plain message. Valid until on_data returns: copy the handle to answer later.
  [[nodiscard]] const reply_handle* incoming_request() const noexcept;
  // Answers a request once: the reply bytes (at most message_limit - 13), or an error code with a
  // detail text. The answer travels like a message to h.caller (no delivery report: the caller's
  // callback is the outcome, a lost answer makes it time out). Clears h (h.call_id = 0) when
  // accepted. Errors: invalid_argument (h not valid: not a request, or answered already),
  // message_too_large, and send_data's (closed, queue_full, not_connected, ...; h stays valid).
  // On the node's thread; callable from inside on_data.
  [[nodiscard]] errc reply(reply_handle& h, const void* data, size_t size);
  [[nodiscard]] errc reply_error(reply_handle& h, uint32_t code, const void* detail, size_t size);

  // -------------------------------------------------------------------------- directory --
  // Every node of the bus this node knows of, itself first, then by id (docs/bus.md
  // "Directory": what a node knows and when). Empty before start().
  [[nodiscard]] std::vector<directory_entry> directory() const;
  // The entry of node `id`; false if it is not known.
  [[nodiscard]] bool lookup(bus_id id, directory_entry* out) const;
  // The node called `name` (this node first, then by id); false if none.
  [[nodiscard]] bool lookup_name(const std::string& name, directory_entry* out) const;
  // The nodes of type `type` ("" = any type) that carry every label of `labels`, by id.
  [[nodiscard]] std::vector<directory_entry> find(const std::string& type,
                                                  const std::vector<node_label>& labels = {}) const;

  // ------------------------------------------------------ any node of a type, broadcast --
  // One live node of type `type` ("" = any) with every label of `labels` from the directory (this
  // node too, tool nodes never, nor one that left it), chosen by `how` (uvbus/fanout.h).
  // unknown_route (*out unchanged) if none; invalid_argument: null out, >16 labels, >128-byte text.
  [[nodiscard]] errc pick(const std::string& type, const std::vector<node_label>& labels,
                          const pick_options& how, bus_id* out);
  // pick() then send_data() to the node picked (*chosen, if given): one message, one report. If
  // that node leaves the directory first, the report is not_connected at once (delivered or not:
  // never resent, nor to another node); unknown_route when no node matches (docs/bus.md).
  [[nodiscard]] errc send_any(const std::string& type, const std::vector<node_label>& labels,
                              uint32_t msg_type, const void* data, size_t size,
                              const pick_options& how = {}, const send_options& opt = {},
                              bus_id* chosen = nullptr, uint64_t* message_id = nullptr);
  // This node's load hint for least_loaded (lower: less loaded), sent at most once a heartbeat.
  void set_load(uint32_t load);
  // One send delivered to every node of `to` (uvbus/fanout.h) except this one: the message goes
  // once over each tree link (parent, children) behind which the directory knows a target, and
  // each relay fans it out the same way (one copy per link, not per target). Every target's
  // on_data gets it (source: this node, type msg_type) and acknowledges it; cb gets one summary
  // when every node that matched here has acknowledged, or after timeout_ms with the rest as
  // failed, or closed at stop(). Not resent (a failed target may be sent to with send_data).
  // Links below protocol version 6 are skipped. Errors at once (cb never called): unknown_route
  // (no node matches), invalid_argument (empty cb, timeout_ms 0, a subnet wider than 64 bits, a
  // type, label key or value over 128 bytes or more than 16 labels: the wire carries no more),
  // message_too_large (size plus the selector's bytes above message_limit), wrong_state, closed.
  // *broadcast_id (if given) is the report's id.
  [[nodiscard]] errc broadcast(const broadcast_target& to, uint32_t msg_type, const void* data,
                               size_t size, uint32_t timeout_ms, broadcast_fn cb,
                               const send_options& opt = {}, uint64_t* broadcast_id = nullptr);

  [[nodiscard]] bus_id id() const noexcept;
  // The URLs actually listened on (port 0 resolved), in config order.
  [[nodiscard]] std::vector<std::string> listen_urls() const;
  [[nodiscard]] std::vector<endpoint_info> peers() const;
  // The registered direct peer with this id; false if none.
  [[nodiscard]] bool peer(bus_id id, endpoint_info* out) const;
  [[nodiscard]] node_counters counters() const noexcept;
  // The same text the routes command returns.
  [[nodiscard]] std::string routes_text() const;
  [[nodiscard]] const node_config& config() const noexcept;
  // The last error a call of this node returned, with the detail naming the field, URL or rule
  // (empty detail: nothing more to say than the code). A call that returns ok leaves it unchanged.
  [[nodiscard]] error_info last_error() const;
  // Where each source's flow stands here: for each source, the epoch and the highest sequence
  // delivered in order (an opaque blob; docs/protocol.md "Flow positions"). Pass it to the next
  // process of this id as node_config::inherit_flow_positions (after stop(), nothing changes).
  [[nodiscard]] std::vector<uint8_t> flow_positions() const;
  // The metrics of this node in the Prometheus text exposition format (what metrics_url serves;
  // names and units in docs/observability.md). Usable without the endpoint.
  [[nodiscard]] std::string metrics_text() const;
  // The metrics endpoint's bound URL (port 0 resolved); empty when metrics_url is empty.
  [[nodiscard]] std::string metrics_url() const;
  // latency_histograms: p50/p90/p99/p99.9/max of the send-to-acknowledgement time of messages to
  // target, or of user type `type`; false if none was measured.
  [[nodiscard]] bool latency_to(bus_id target, latency_percentiles* out) const;
  [[nodiscard]] bool latency_of_type(uint32_t type, latency_percentiles* out) const;
  // Inside on_data: the trace context the message being delivered carried (send_options::trace),
  // or nullptr if it carried none. nullptr outside on_data; the pointer is valid until on_data
  // returns.
  [[nodiscard]] const trace_context* incoming_trace() const noexcept;
  // Planned hand-over, first step: stops accepting on every stream listener and appends each one's
  // listening socket (with its bound URL) to *out, in `listen` order; they stay bound and
  // listening, so peers connecting from now on wait in the backlog for the next process (which gets
  // them as node_config::inherit_listeners) instead of being refused. The caller owns the fds. Then
  // stop() as usual; existing links are not touched. Errors: wrong_state (not running),
  // invalid_argument (out null), and the duplicate's system error (that listener and the ones after
  // it stay; those before it are in *out).
  [[nodiscard]] errc detach_listeners(std::vector<inherited_listener>* out);

  struct impl;  // src/bus/node.cpp

 private:
  impl* impl_;
};

}  // namespace uvbus
