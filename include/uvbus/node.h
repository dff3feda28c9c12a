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
// config() still return their value) and do nothing. The one entry point any thread may call is
// node::post(). The id never changes; the config's fields neither, but for two the loop thread
// rewrites: parent_urls (when discovery_parent_type picks or follows a parent) and
// inherit_listeners[i].fd (-1 once start() took the socket): read those on the loop thread.
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
#include "uvbus/node_config.h"
#include "uvbus/protocol.h"
#include "uvbus/subnet.h"
#include "uvbus/tls.h"
#include "uvbus/trace.h"

typedef struct uv_loop_s uv_loop_t;  // NOLINT(modernize-use-using): matches libuv's declaration

namespace uvbus {

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
  // message_too_large, version_mismatch (a link of the path does not speak flows), access_denied
  // (the target keeps max_flow_sources flows and refused ours), not_connected (a send_any()
  // message whose node left the directory before its report: not resent), or the parent's
  // refusal of this node for good (access_denied, out_of_subnet, version_mismatch: a message that
  // waited for it is reported so when it refuses).
  // delivery_mode::next_hop: ok = delivered to the next hop's channel (the kernel socket buffer or
  // the shared-memory ring), or, with require_response, received by the target node. Otherwise why
  // it failed: not_connected / connection_reset (link lost), timeout (pending or response wait
  // expired), closed (node stopped), unknown_route / ttl_expired (reported back by a relay or the
  // target, require_response only), queue_full (a relay's queue overflowed), abandoned (shm). A
  // message still queued on a link the node closes gets the link's reason, the one
  // on_endpoint_removed hears: timeout (the peer went silent), queue_full (the next hop stopped
  // reading), protocol_error (it broke the protocol), closed (stop(), or a link closed cleanly: the
  // peer's goodbye, an idle sibling link dropped), no_memory / io_error (it failed here);
  // connection_reset when the peer ended the link, not_connected when it registered again over a
  // new one.
  errc status = errc::ok;
  // true for every report of a message sent under delivery_mode::end_to_end, and under next_hop
  // for a message sent with require_response (the report stands for the target's acknowledgement
  // or its absence: ok, a relay's or the target's refusal, timeout, closed, a failed link); false
  // for the other next-hop reports (ok = the next hop's channel took it). It says how the message
  // was sent, not whether the target got it.
  bool end_to_end = false;
};

struct node_counters {
  uint64_t data_sent = 0;         // sends accepted (send_data/any, post, call, reply)
  uint64_t data_sent_stream = 0;  // ... of which went out over a stream link
  uint64_t data_sent_shm = 0;     // ... over shared memory
  uint64_t data_received = 0;     // delivered to on_data
  uint64_t forwarded = 0;         // user messages relayed for others
  uint64_t forward_dropped = 0;   // relayed messages dropped (no route, overflow, ttl), and
                                  // command answers this node could not send
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
  uint64_t held_for_child = 0;  // relay: messages held for a child (or its parent) to (re)register
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
  uint64_t flow_stale = 0;          // target: messages of an epoch the flow had left
  uint64_t flow_sources_refused = 0;  // target: sync messages of a new source beyond
                                      // max_flow_sources (the source is told: access_denied)
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
  // Called for every one, also when its log line is rate-limited (refused registrations).
  std::function<void(errc e, const std::string& what)> on_error;
  // Optional log hook (registration, refusals, reconnects, drops). Without it nothing is logged.
  // Lines a peer can repeat at will (relayed drops, refused registrations) are rate-limited: the
  // first 5 a second of each kind, then one "N more ..." line.
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
  // Never fails. A null loop makes start() return invalid_argument (nothing opened: destroying
  // such a node needs no loop run); an invalid config makes it return validate()'s code, the
  // refusal logged through the loop. The loop must outlive the node, and must be run after the
  // node's destruction until its handles have closed (a node refused for its config included).
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
  // (2000): ..."). Codes: bad_url / unsupported_scheme for a listen, parent or metrics URL that
  // does not parse or is of the wrong kind (a listen URL without port: bad_url), or a parent URL
  // no dial can reach (port 0; a dns host with a space or control byte): bad_url; invalid_argument
  // for the rest: id 0, more than 16 subnets or 8 listen / parent URLs, a subnet wider than 64
  // bits, more than one shm:// listen URL, a URL over 256 bytes, an inherited listener with a
  // negative fd, no listen URL to serve or the URL or fd of another, latency_sample_every not a
  // power of two, join_as_tool without parent_urls or with subnets, an empty access token, host_id
  // over 128 bytes, name / type / a label key or value over 128 bytes, more than 16 labels, an
  // empty or repeated label key, a protocol range that is empty or starts at 0, access_tokens with
  // protocol_max below 6 on a node that dials (parent_urls, discovery_parent_type, or
  // discovery.etcd_endpoints with sibling_direct, which dials other trees' nodes: two-way
  // authentication needs 6; only a root without discovery, or with sibling_direct off, may stay
  // below), discovery_parent_type without discovery.etcd_endpoints or with parent_urls (the rule
  // would be ignored), discovery_parent_labels without discovery_parent_type,
  // discovery_parent_type or discovery_parent_labels breaking the limits of the node's own type and
  // labels, a delivery mode other than end_to_end and next_hop, end_to_end with protocol_max below
  // 3 (flows), a compression codec with protocol_max below 6 (where it is negotiated),
  // message_limit 0 or above 1 GiB - 85 (1073741739), link_queue_bytes below one frame of
  // message_limit,
  // post_queue_bytes below one message (message_limit rounded up to 8, plus 64), pending_max_bytes
  // below one message (unless pending_max_messages is 0: queueing off), forward_overflow_bytes
  // below one message (message_limit plus the bus overhead), retransmit_max_bytes below one message
  // with a trace context, post_queue_messages, link_queue_packets, max_outstanding_responses,
  // max_outstanding_calls, max_flow_sources, directory_max_entries, broadcast_max_targets,
  // retransmit_max_messages, ack_every or default_ttl 0, an unknown compression codec or a level
  // outside its range, a zero timeout or interval, delivery_timeout_ms or resend_timeout_ms above
  // one day (86400000), heartbeat_timeout_ms below twice
  // heartbeat_interval_ms, reconnect_min_ms > reconnect_max_ms, jitter outside [0, 1],
  // max_unregistered_per_address above a non-zero max_unregistered; with a shm:// listen URL:
  // message_limit above the largest shm record carries (about 4 MiB), shm_ring_bytes not a power of
  // two, above 2^46, or too small for two records of max(message_limit + 85, 64 KiB),
  // shm_abandon_timeout_us 0; the links' stream
  // config refused by stream_channel::validate ("node_config.tls: ..." for tls settings no link
  // could use, e.g. a psk_token under 16 bytes); with discovery.etcd_endpoints set, discovery's own
  // rules (uvbus::validate(discovery_config), "node_config.discovery.").
  [[nodiscard]] static errc validate(bus_id id, const node_config& cfg,
                                     std::string* detail = nullptr);

  // Opens the listeners (and the shm ring), then connects to the parent if any. Errors (nothing
  // started): validate()'s, wrong_state (already started, or stopped: a node starts once), the
  // listener's errors (address_in_use, permission_denied, busy, ...), and with discovery the
  // refusal of etcd_discovery::start() (invalid_argument "node_config.discovery: ...": the
  // node's own entry above discovery.max_entry_bytes). Every refusal is
  // recorded in last_error() with the field or URL at fault and logged through on_log (error
  // level, from the loop).
  [[nodiscard]] errc start();
  // Graceful stop: pending messages fail (closed); end-to-end messages already sent get up to
  // stop_flush_ms for their acknowledgements (then the rest is reported closed); every peer gets
  // a goodbye, every stream link flushes its queue and closes, listeners and the shm ring close.
  // With discovery, the etcd lease is revoked first (within request_timeout_ms; twice that when
  // etcd authentication must first get a token). on_down(closed)
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
  //   invalid_argument   null data with a non-zero size, an invalid opt.trace, or target 0 (the
  //                      reserved id, no node's: post() refuses it too, on the calling thread)
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
  //   invalid_argument   data is null with a non-zero size, an invalid opt.trace, target 0
  //   wrong_state        not started
  //   closed             stopped
  //   no_memory          the mailbox could not grow (post_queue_bytes may be above 1 GiB):
  //                      nothing queued
  // The bytes are copied before post() returns. last_error() is not updated (it is the loop's).
  [[nodiscard]] errc post(bus_id target, uint32_t type, const void* data, size_t size,
                          const send_options& opt = {}, uint64_t* message_id = nullptr);
  // Runs task on the loop thread, in post order with the messages, as a callback of this node
  // (it may call any node function, and destroy the node). An accepted task runs even after
  // stop() (before on_down(closed)); none runs after destruction. Errors: invalid_argument
  // (empty task), queue_full, wrong_state, closed, no_memory, as above (refused: the task is not
  // kept, and no later task runs in its place).
  [[nodiscard]] errc post(std::function<void()> task);

  // Asks node `target` (any node with a route) for a command's result: routes (text, one line per
  // route), counters (text, name=value lines) or echo (returns args). cb fires exactly once, from
  // the loop: (ok, result) or (error, empty): timeout after response_timeout_ms, unknown_route,
  // closed, message_too_large (an answer other than routes above what one of the target's frames
  // carries: max(message_limit + 85, 65536) - 54 bytes). A routes text that large is cut at a
  // line's end, its last line "... N more routes not shown (answer limit L bytes)". An answer the
  // target could not send (no route back, a full link) is counted in its forward_dropped and logged
  // there (rate-limited); the asker gets timeout. So is a command a relay on the way cannot route
  // (unknown_route only when this node itself has no route: a relay's drop notice about a command
  // would reach older nodes of the same protocol version as a report for another message). Errors
  // at once (cb never called): as send_data.
  // cb runs as a callback of this node (node_callbacks' rules: it may destroy the node); none runs
  // after the node is destroyed.
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
  // pick() (uvbus/fanout.h) then call() to the node picked (*chosen, if given). If that node leaves
  // the directory before its answer came, cb gets not_connected at once: the request is not sent
  // again, to its next incarnation or to another node (it may have been handled), so the caller
  // can choose another node. Errors at once (cb never called): pick()'s (unknown_route when no
  // node matches) and call()'s.
  [[nodiscard]] errc call_any(const std::string& type, const std::vector<node_label>& labels,
                              uint32_t msg_type, const void* data, size_t size, uint32_t timeout_ms,
                              call_fn cb, const pick_options& how = {},
                              const send_options& opt = {}, bus_id* chosen = nullptr,
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
  // unknown_route (*out unchanged) if none; invalid_argument: null out, >16 labels, >128-byte text,
  // a policy outside pick_policy.
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
  // One send to every node of `to` (uvbus/fanout.h) but this one: once over each tree link behind
  // which the directory knows a target, each relay fanning it out alike (one copy per link); from
  // a root, a node known only from etcd (no common tree) gets its own over the direct link a send
  // takes. Each target's on_data gets it (source: this node, type msg_type) and acknowledges it;
  // cb gets exactly one summary per accepted broadcast: ok when all that matched here
  // acknowledged, not_connected once each of the others left the directory or got no copy from
  // here, else timeout at timeout_ms (the rest failed; an acknowledgement read later counts for
  // nothing), closed at stop(). Not resent. A target
  // towards which no copy leaves this node (its next hop's queue full, a link below protocol
  // version 6, one known only from etcd while this node has a parent, a direct copy refused) is
  // failed at once, broadcast_report::detail saying why. Errors at once (cb never called, nothing
  // sent): queue_full when a full queue refused a copy and none went out (on_writable(hop) follows
  // once that hop drains, as for send_data), or 4096 broadcasts, or broadcast_max_targets expected
  // targets in all, await their summary (the detail names the limit); unknown_route (no node
  // matches), invalid_argument (empty cb, timeout_ms 0, a subnet wider than 64 bits, a type, label
  // key or value over 128 bytes or over 16 labels: the wire carries no more), message_too_large
  // (size plus the selector's bytes above message_limit), wrong_state, closed. *broadcast_id (if
  // given) is the report's id. Of opt only ttl is used; require_response changes nothing (every
  // target acknowledges anyway); a trace is refused with invalid_argument (none is carried).
  [[nodiscard]] errc broadcast(const broadcast_target& to, uint32_t msg_type, const void* data,
                               size_t size, uint32_t timeout_ms, broadcast_fn cb,
                               const send_options& opt = {}, uint64_t* broadcast_id = nullptr);

  [[nodiscard]] bus_id id() const noexcept;
  // The URLs actually listened on (port 0 resolved), in config order.
  [[nodiscard]] std::vector<std::string> listen_urls() const;
  [[nodiscard]] std::vector<endpoint_info> peers() const;
  // The registered direct peer with this id; false if none. out may be null (only whether it is).
  [[nodiscard]] bool peer(bus_id id, endpoint_info* out) const;
  [[nodiscard]] node_counters counters() const noexcept;
  // The same text the routes command returns (a peer's host name with its control bytes escaped
  // as \xNN, as in log lines: a peer cannot add lines of its own).
  [[nodiscard]] std::string routes_text() const;
  [[nodiscard]] const node_config& config() const noexcept;
  // The last error a call of this node returned, with the detail naming the field, URL or rule
  // (empty detail: nothing more to say than the code). A call that returns ok leaves it unchanged.
  [[nodiscard]] error_info last_error() const;
  // Where each source's flow stands here: for each source, the epoch and the highest sequence
  // delivered in order, and the epochs the flow left (an opaque blob naming this node's id;
  // docs/protocol.md "Flow positions"). Pass it to the next process of this id as
  // node_config::inherit_flow_positions, taken in on_down(closed) after stop(): only then does
  // nothing change (during stop()'s flush, up to stop_flush_ms, links stay open and messages are
  // still delivered; positions taken earlier miss them, and the next process delivers them
  // again). A node of another id refuses it.
  [[nodiscard]] std::vector<uint8_t> flow_positions() const;
  // The metrics of this node in the Prometheus text exposition format (what metrics_url serves;
  // names and units in docs/observability.md). Usable without the endpoint.
  [[nodiscard]] std::string metrics_text() const;
  // The metrics endpoint's bound URL (port 0 resolved); empty when metrics_url is empty.
  [[nodiscard]] std::string metrics_url() const;
  // latency_histograms: p50/p90/p99/p99.9/max of the send-to-acknowledgement time of messages to
  // target, or of user type `type`; false if none was measured. Only the first 64 user types
  // measured get a histogram of their own: latency_of_type() is false for a later one, whose
  // samples are summed in metrics_text()'s type="other" series (with those of the other later
  // ones).
  [[nodiscard]] bool latency_to(bus_id target, latency_percentiles* out) const;
  [[nodiscard]] bool latency_of_type(uint32_t type, latency_percentiles* out) const;
  // Inside on_data: the trace context the message being delivered carried (send_options::trace),
  // or nullptr if it carried none, or an invalid one (all-zero ids: a peer's fault, never handed
  // on). nullptr outside on_data; the pointer is valid until on_data returns.
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
