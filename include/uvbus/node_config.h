// The bus node's configuration (node_config) and the enums it uses: delivery mode, compression.
// Included by uvbus/node.h; every field's meaning, default and limits are documented here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "uvbus/directory.h"
#include "uvbus/discovery.h"
#include "uvbus/protocol.h"
#include "uvbus/subnet.h"
#include "uvbus/tls.h"

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
  // the rest of the bus. The tool reaches every node through the parent (sibling_direct does not
  // apply: it dials no other node); replies reach it from the parent and from the nodes below the
  // parent. Needs parent_urls, no subnets and no discovery
  // (a tool is never announced: its etcd entry would make its parent refuse its id).
  bool join_as_tool = false;

  // Largest user payload of send_data() (message_too_large above it), 1 .. 1 GiB - 85
  // (1073741739). A link's frame limit is max(this + 85, 64 KiB): the 85 bytes are the bus
  // header 32, flow prefix 12, trace block 25 and shared-memory writer tag 16. Every node of a bus
  // should agree.
  size_t message_limit = size_t{64} * 1024;
  // Per-connection stream send queue, bytes and packets (back-pressure: queue_full above them).
  // It must hold one frame of message_limit (message_limit + 85 and the frame's header); the
  // queue's real bound is max(link_queue_bytes, 2 x (the link's frame limit + 64)).
  size_t link_queue_bytes = size_t{2} << 20;
  size_t link_queue_packets = 65536;

  // Messages sent while their link is not up yet (parent reconnecting, sibling being looked up or
  // connected) wait in a bounded queue: at most this many messages and bytes per link, each at most
  // pending_timeout_ms, then they fail with errc::timeout. pending_max_messages = 0 disables
  // queueing: such sends return not_connected at once (one to a node outside our subnets goes
  // through the parent while its direct sibling link is looked up). pending_max_bytes must hold
  // one message of message_limit (validate()). When the link comes up they go in order; what its
  // queue does not take waits behind, with our later messages for that peer, and goes as it
  // drains. Default: 4096 messages / 4 MiB / 10 s.
  size_t pending_max_messages = 4096;
  size_t pending_max_bytes = size_t{4} << 20;
  uint32_t pending_timeout_ms = 10000;
  // A relay that just started (a parent restart), or that just lost a child's link, holds
  // messages it relays for that child's id (an id of its subnets with no child registered) this
  // long — from its start or the child's loss, whichever came later — waiting for the child to
  // register (again), instead of refusing them with unknown_route. Its own sends to the child are
  // not held: send_data() returns unknown_route (docs/bus.md "Known limits").
  // Bounded like the pending queues, per child and in total: all messages held, for every child
  // id together, are at most pending_max_messages / pending_max_bytes; beyond that a message is
  // refused as if no grace applied (unknown_route). 0: refuse at once. The same hold, within the
  // same bound and whatever this value, keeps what children send up while the parent reconnects,
  // for pending_timeout_ms (then refused not_connected: a flow retries), sent on when it is back
  // (refused unknown_route if it refuses this node for good); a long parent outage can so use up
  // the bound a restarting child's messages would need.
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
  // version 3) whatever its own mode; end_to_end needs version 3 on every link of the path
  // (validate() refuses it with protocol_max below 3; a send over an older link is refused with
  // version_mismatch).
  delivery_mode delivery = delivery_mode::end_to_end;
  // end_to_end: a message the target has not acknowledged after this time fails (timeout). At
  // most one day (86400000), as resend_timeout_ms: the resend timer's backoff stays in range.
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
  // end_to_end, target side: at most this many sources' positions are kept (>= 1). A new
  // source's first (sync) message beyond it is refused: its source gets a drop notice and reports
  // the message access_denied; counted in node_counters::flow_sources_refused and logged. A
  // message that is not sync from a source without a position makes no state (it is answered
  // with a resync request), so forged source ids cannot fill the table with messages alone.
  size_t max_flow_sources = 65536;
  // end_to_end: each flow's retransmit buffer (messages sent and not acknowledged yet, or waiting
  // to be sent again) holds at most this many messages and bytes (each message takes its payload
  // plus 44 bytes, 69 with a trace context; the bytes must hold one such message of
  // message_limit); beyond either, send_data() returns queue_full until acknowledgements drain it.
  size_t retransmit_max_messages = 65536;
  size_t retransmit_max_bytes = size_t{8} << 20;
  // end_to_end: when a flow's acknowledgements stop advancing for this long, its unacknowledged
  // messages are sent again (the wait doubles, up to 8x, while nothing advances). At most one
  // day (86400000).
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
  // send_data(require_response) and send_command() return queue_full. Under end-to-end delivery a
  // plain message to this node itself also waits as one until the next loop turn delivers it: it is
  // never refused for this bound, but counts towards it until then.
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
  // less cannot prove itself and is refused. So a node that dials (parent_urls,
  // discovery_parent_type, or discovery with sibling_direct: other trees' nodes) needs
  // protocol_max 6 with tokens; only a node that never dials may stay below. With tokens, every
  // message written into this node's shared-memory ring must carry its writer's tag, derived from
  // the token and the writer's id (docs/security.md): records without a valid one, or whose source
  // id that writer may not speak for, are dropped and counted (node_counters::shm_rejected).
  std::vector<std::string> access_tokens;
  // Protocol versions offered; the highest common one is used.
  uint8_t protocol_min = proto::kMinVersion;
  uint8_t protocol_max = proto::kMaxVersion;
  uint8_t default_ttl = proto::kDefaultTtl;

  // Use shared memory for data to peers on the same host that offer a shm:// URL.
  bool enable_shm = true;
  // Our shm:// ring's data bytes: a power of two, at most 2^46, holding two records of
  // max(message_limit + 85, 64 KiB) (validate() names the smallest that does).
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
  // Planned restart: node::flow_positions() of the previous process of this id, taken in its
  // on_down(closed) after stop() (not right after the call: its flush still delivers): this node
  // starts with them, so messages its sources send again (those the previous process delivered
  // but had not acknowledged) are recognised as duplicates, and late messages of the epochs its
  // flows left as stale. Each position counts as heard from at start() (then kept like any
  // silent flow's). validate() (and so start()) parses it and refuses with invalid_argument
  // another id's blob (naming both ids: taken, it would drop that node's sources' first messages
  // to this one as duplicates, reported ok), one cut short or of a later release, and one holding
  // more sources than max_flow_sources (naming both numbers: kept, every new source would be
  // refused until they went idle); a previous release's blob (without the left epochs, or naming
  // no id) is taken as it is. Empty: none.
  std::vector<uint8_t> inherit_flow_positions;
  // Planned hand-over: listening sockets of the previous process of this id (its
  // detach_listeners(), passed over with uvbus/handover.h). A stream URL of `listen` that an
  // entry's url fits (the same URL; or the same scheme and address, an IP literal however
  // written, with the listen URL's port 0 or equal; a dns:// URL by its port) adopts that socket
  // instead of binding, so peers that connected meanwhile wait in its backlog instead of being
  // refused. Each socket serves one URL (two entries of one URL or one fd are refused); exact fits
  // (the same URL, a fixed port) are matched first, port-0 URLs take what is left, in `listen`
  // order; validate() runs the same matching and refuses (invalid_argument naming
  // inherit_listeners[i]) an entry no URL is left for or whose url is not a stream URL, which
  // start() could only close. start() owns every fd from its call on: it is closed with its
  // listener, or by start() if it is not adopted (start() failed, or the socket did not fit: then
  // start() fails with invalid_argument naming inherit_listeners[i] and why; a failure that is not
  // the socket's, such as a TLS file, keeps its code and names the listen URL). The entries' fds
  // are -1 from then on (read them on the node's thread): a failed start() cannot be retried with
  // them (refused, saying so); hand the sockets over again. A start() refused with wrong_thread (a
  // release build, called off the node's thread) takes nothing, as a node never started: the fds
  // stay the caller's, in config().inherit_listeners, to start() on the node's thread or close.
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
  // version 6): used when both nodes ask for a codec, the acceptor's both ways, each side at its
  // level; so a codec needs protocol_max 6 (validate() refuses one below: it would never be used).
  // Data messages of >= compression_threshold bytes are compressed one by one, sent so only
  // if that saves bytes; the receiver restores each first, within the message limit (a bad block:
  // protocol_error; one our node cannot restore for want of memory: no_memory, the link closes,
  // the message unacknowledged: end-to-end delivery resends it). Shared memory: never compressed.
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
  // At most this many expected targets (at least 1), summed over the broadcasts awaiting their
  // summary (node::broadcast()), nodes that joined since and acknowledged included: beyond it
  // broadcast() returns queue_full naming this field. A target costs 9 bytes (its id and state)
  // while its broadcast waits: the default bounds them to 9 MiB (with 4096 broadcasts of 10 000
  // targets each, 330 MB before the bound), besides each waiting broadcast's own (its selector:
  // at most 4.2 KB).
  size_t broadcast_max_targets = size_t{1} << 20;
  // Discovery on etcd (uvbus/discovery.h, docs/cluster.md). With discovery.etcd_endpoints set,
  // start() registers this node's directory entry under discovery.prefix with a lease and merges
  // every node found there into directory(), lookup(), find() and on_directory, exactly as the
  // tree's own entries (parent = 0 for a node known only from etcd). stop() revokes the lease.
  // etcd being unreachable never stops the node: the last directory is kept. Default: off.
  discovery_config discovery;
  // With discovery on and parent_urls empty (validate() refuses it with parent_urls, which would
  // take precedence): register to the lowest-id discovered node of this
  // type ("" = none: the node is a root) carrying every label of discovery_parent_labels, at its
  // stream listen URLs; until one is found the node is not up and messages for the rest of the
  // bus wait in the parent queue (within their deadlines). A lost link is first retried at the
  // same parent's URLs, as with parent_urls; once that parent's entry has left etcd (stopped, or
  // its lease expired after a crash) the rule chooses again among the live ones (a parent that
  // refused the node for good no longer stops it dialling the new choice). A lower-id
  // candidate that appears later takes the node over (every node applying the rule to the same
  // directory has the same parent: no split trees); the old link is closed, flows resume.
  std::string discovery_parent_type;
  std::vector<node_label> discovery_parent_labels;
};

}  // namespace uvbus
