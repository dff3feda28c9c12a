// Stream channel: framed messages over libuv TCP (ipv4://, ipv6://, dns://) and unix sockets
// (unix://), with small-packet coalescing and bounded, back-pressured send queues.
//
// Threading: a stream_channel belongs to the thread that constructs it, which must run its
// uv_loop_t. Every member function checks the calling thread first: a call from another thread is
// a caller bug — debug builds abort naming the function, release builds return errc::wrong_thread
// (or an empty value) and do nothing. Every callback runs on that thread (see stream_callbacks).
//
// SIGPIPE: a write to a peer that has gone raises SIGPIPE, whose default action kills the process.
// Constructing a stream_channel sets SIGPIPE to SIG_IGN when it is still at its default (a handler
// or disposition the application installed is left alone), so a vanished peer only costs its
// connection: the write fails with EPIPE and the connection closes with connection_reset.
//
// Errors are values (uvbus::errc). Contract shared with libuv, word for word: when a function which
// takes a callback returns an error, the callback will never be called. Here that means: a send()
// that returns an error is never reported (and leaves nothing queued, so a retry cannot duplicate
// it); a connect() that returns an error never produces on_connected; a listen() that returns an
// error never produces on_accepted.
//
// Lifetime of a connection (connection_id, by value):
//   * outbound: connect() returns the id at once; on_connected(conn, status) fires exactly once.
//     If status != ok the connection is gone once that callback returns (no on_disconnected).
//   * inbound: on_accepted(conn) fires when a peer connects to one of our listeners.
//   * after on_accepted, or on_connected with ok, on_disconnected(conn, reason) fires exactly once.
//   * the id works from connect()/on_accepted until the final callback above returns; afterwards
//     every call on it fails cleanly (errc::closed), and it never names another connection.
//
// Packet fate (cumulative reports): every packet accepted by a successful send() gets a sequence
// number on its connection (1, 2, 3, ...) and is covered exactly once, in order, by either
//   * on_written(conn, through): all of its bytes reached the kernel (one call per write batch,
//     naming the highest such sequence), or
//   * on_send_failed(conn, first, last, reason): the connection died, was disconnected with force,
//     or the channel closed before all of its bytes reached the kernel.
// All reports of a connection come before its on_disconnected.
// On a TLS link (uvbus/tls.h) "reached the kernel" means "was encrypted": the ciphertext of a
// batch is sent right after it, and the next batch waits until it has all gone to the kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "uvbus/buffer.h"
#include "uvbus/error.h"
#include "uvbus/log.h"
#include "uvbus/queue_config.h"
#include "uvbus/tls.h"

typedef struct uv_loop_s uv_loop_t;  // NOLINT(modernize-use-using): matches libuv's declaration

namespace uvbus {

namespace detail {
struct stream_access;  // the test hook's door (src/stream/test_access.h); not part of the API
}

enum class disconnect_mode : uint8_t {
  // Stop accepting sends (they return errc::closed) and delivering (nothing more of the
  // connection reaches on_received, not even the rest of the chunk it was called from: what
  // still arrives is read and dropped, so that a peer's writes never stall on us), let every
  // queued packet reach the kernel, shut the write side down, then close. on_disconnected reports
  // errc::ok. If the connection dies first, the remaining packets are reported failed and the
  // reason is that error.
  graceful,
  // Close now: every queued packet is reported failed with errc::cancelled, then on_disconnected
  // reports errc::cancelled.
  force,
};

// libatbus's default stream message limit, so an unmodified libatbus peer is never refused.
inline constexpr size_t kDefaultMessageLimit = size_t{256} * 1024;
// Largest frame header: a 4-byte MurmurHash3 plus a varint length of at most 10 bytes.
inline constexpr size_t kFrameMaxHeader = 14;
inline constexpr size_t kDefaultMergeThreshold = 3072;
inline constexpr size_t kDefaultReadBufferSize = size_t{256} * 1024;

struct stream_config {
  // Largest payload accepted by send() (larger: errc::message_too_large) and by the receiver (a
  // larger announced length closes the connection with errc::oversize).
  size_t message_limit = kDefaultMessageLimit;
  // Per-connection send queue (see write_queue.h). A block holds one whole frame (payload plus at
  // most kFrameMaxHeader bytes), so max_bytes/ring_bytes must hold at least one frame of
  // message_limit. The ring (static mode) is allocated on the connection's first send, not before,
  // so a connection that never sends costs no queue memory; it starts at queue.ring_initial_bytes
  // (4 KiB) and doubles only as the queue fills, so one that sends little (a handshake) costs
  // little. A ring still at its initial size goes back whenever the queue drains (to a
  // per-thread pool if it is 16 KiB or less, else to the allocator), so a quiet connection holds
  // no send buffer; a ring that grew is kept while traffic flows and freed once the queue has
  // been idle for send_ring_idle_ms (below).
  write_queue_config queue = {};
  // Frames smaller than this many bytes are coalesced: when a write is issued, as many queued small
  // frames as fit are copied into one per-thread merge buffer and written with one system call.
  // Larger frames are written straight from the queue, never copied again. 0 turns coalescing
  // off: one write per packet (what a bus without coalescing does; for comparison). At most 1 GiB
  // (the per-thread merge buffer holds at least one threshold).
  size_t merge_threshold = kDefaultMergeThreshold;
  bool tcp_nodelay = true;
  bool tcp_keepalive = false;
  // First probe after this idle time, when tcp_keepalive is set: 1 to 32767 s (what Linux takes).
  unsigned keepalive_delay_s = 60;
  // TCP listeners bind with SO_REUSEPORT: several channels (one per loop thread, or several
  // processes of the same user) may listen on the same address and port, and the kernel spreads
  // new connections over them by a hash of each connection's addresses and ports. This is how a
  // server uses more than one loop (and core) for many connections (docs/stream.md, "Several
  // loops on one port"). Every socket on the port must set it (else address_in_use), and Linux
  // lets only sockets of the same effective user share a port. Port 0 picks a new port for each
  // listen(): the first channel listens on port 0, the others on the port it got. A listener
  // that closes loses the connections still waiting in its own backlog (the kernel resets them
  // unless net.ipv4.tcp_migrate_req is set); those already accepted are not affected. Unix
  // listeners ignore it, and so does listen_fd() (an adopted socket keeps the options its binder
  // set). Each channel applies its own max_connections and max_unregistered(_per_address): N
  // channels sharing a port admit up to N times each cap.
  bool tcp_reuse_port = false;
  int backlog = 128;
  unsigned unix_socket_mode = 0600;  // permissions of a unix listener's socket file (<= 07777)
  // Send buffer (SO_SNDBUF) asked for on every unix socket connection, both ends; 0 keeps the
  // kernel's default (net.core.wmem_default, 208 KiB on most systems), and the kernel caps any
  // request at net.core.wmem_max. Unlike TCP's, a unix socket's buffer never grows by itself, and
  // at 208 KiB a fast sender meets a full socket every few hundred microseconds: 1 MiB carried
  // 35-40 % more small messages (docs/stream.md). The kernel charges only the bytes queued, so an
  // idle connection costs nothing for it. TCP sockets are left to the kernel's autotuning.
  size_t unix_send_buffer = size_t{1} << 20;
  // Size of the per-thread read buffer handed to libuv (one read can carry hundreds of frames).
  // Shared by all channels of the thread (the largest request wins); never per connection.
  size_t read_buffer_size = kDefaultReadBufferSize;
  // An outbound connection that has not connected within this time fails with errc::timeout.
  // The time counts from connect(), dns resolution included. A dns:// answer with several
  // addresses splits it: each attempt gets the time left divided by the addresses left (10 s and
  // two addresses: 5 s for the first, the rest for the second), so an address that never answers
  // (packets dropped) cannot use up the time of those after it; one that refuses passes on at
  // once. The last attempt's error is reported. 0: no timeout beyond the kernel's, per address.
  uint32_t connect_timeout_ms = 10000;
  // A connection that holds part of a frame and receives no byte for this long is closed with
  // errc::timeout (a peer that stops sending mid-frame cannot pin its partial-frame buffer, up to
  // message_limit + 14 bytes, its capacity up to about twice that while it grows, forever). Any
  // byte starts the clock again: a peer trickling a byte now and then keeps its frame open for as
  // long as it trickles (what bounds such peers is how many there can be: max_connections,
  // max_unregistered). On a TLS link part of a TLS record counts too (it pins OpenSSL's record
  // buffers, about 17 KiB each way), and part of a post-handshake message (up to about 128 KiB).
  // Checked by one timer per channel every timeout/4 (at least every 10 ms), so a stalled
  // half-frame is closed within 1.25 x the timeout. A connection paused with pause_reading() is
  // not checked (the wait is the owner's, not the peer's): its clock starts again at
  // resume_reading(). A TLS link draining after a graceful disconnect() is, while its session
  // holds part of a record or of a post-handshake message (its close_notify waits for the rest).
  // 0: never.
  uint32_t partial_frame_timeout_ms = 30000;
  // A send ring that grew beyond queue.ring_initial_bytes is freed once its connection's queue has
  // been empty, with nothing written, for this long (the same timer checks, at least every half
  // of it): a connection that once queued a burst does not keep up to queue.ring_bytes for its
  // life. Its next send starts a small ring again. On a TLS link the ciphertext buffers (up to
  // about twice the largest write batch's ciphertext, kept while traffic flows) are freed the
  // same way; the next write allocates them again. 0: grown rings and ciphertext buffers are kept.
  uint32_t send_ring_idle_ms = 5000;
  // Accepted connections beyond this many live connections (inbound + outbound) of the channel are
  // closed at once, without on_accepted, and counted in connections_rejected: the bound on what
  // strangers can make a listener hold. 0: no limit.
  uint32_t max_connections = 16384;
  // Caps on accepted connections the owner has not vouched for yet with mark_registered() (for a
  // bus node: peers that have not finished registration). An accept that would make more than
  // max_unregistered such connections on the channel, or more than max_unregistered_per_address
  // of them from one source address (an IPv4 or IPv6 address, whatever the port; every unix-socket
  // peer counts as the same address), is closed at once without on_accepted, counted in
  // connections_rejected and logged (warn, rate limited). A connection stops counting when it is
  // marked registered or released. 0: no cap. Both are off here, since a channel whose owner never
  // calls mark_registered() would count every connection for its whole life; the bus node turns
  // them on (node_config::max_unregistered, 1024, and max_unregistered_per_address, 64).
  uint32_t max_unregistered = 0;
  uint32_t max_unregistered_per_address = 0;
  // TLS for every listen() and connect() of the channel that does not name its own (the tls_config
  // overloads below). Off by default. See uvbus/tls.h and docs/security.md.
  tls_config tls = {};
};

// Per-connection counters. Totals only ever grow; the queue_* fields are current values.
struct stream_connection_metrics {
  uint64_t packets_sent = 0;  // packets whose bytes all reached the kernel
  uint64_t bytes_sent = 0;    // their payload bytes (frame headers not counted)
  uint64_t packets_received = 0;
  uint64_t bytes_received = 0;  // payload bytes delivered to on_received
  uint64_t write_calls = 0;     // write system calls issued (write/writev/uv_write)
  uint64_t packets_merged = 0;  // packets copied into the merge buffer (coalesced)
  uint64_t read_calls = 0;      // reads that returned data
  uint64_t send_refused = 0;    // send(), sendv(), prepare_send() calls that returned queue_full
                                // or no_memory
  uint64_t send_failed = 0;     // accepted packets later reported failed
  uint64_t decode_errors = 0;   // bad hash, oversize, bad varint (each closes the connection)
  // Socket read/write errors other than a clean EOF (on a TLS link: after the handshake; see
  // stream_channel_metrics::tls_failed).
  uint64_t io_errors = 0;
  uint64_t partial_frame_timeouts = 0;  // closed for stalling mid-frame (partial_frame_timeout_ms)
  size_t queue_bytes = 0;               // frame bytes waiting in the send queue now
  size_t queue_packets = 0;             // packets waiting in the send queue now
  size_t queue_peak_bytes = 0;          // highest queue_bytes seen
  // Memory the send path holds now: the queue's ring (or blocks), and on a TLS link also its
  // ciphertext buffers.
  size_t queue_memory_bytes = 0;
  // Memory the connection holds now for a frame cut by the end of a read (0 between reads that
  // end at a frame boundary: a quiet connection holds no receive buffer).
  size_t receive_memory_bytes = 0;
};

// Per-channel counters: the sums of every connection's totals, live and closed, plus events.
struct stream_channel_metrics {
  stream_connection_metrics totals;  // queue_* fields: sums over live connections
  uint64_t connections_accepted = 0;
  uint64_t connections_connected = 0;  // outbound connects that succeeded
  uint64_t connect_failed = 0;         // outbound connects that failed (incl. cancelled)
  uint64_t connections_closed = 0;     // connections that reported on_disconnected
  uint64_t connections_open = 0;       // connecting + connected right now
  uint64_t listeners_open = 0;
  // Accepted then closed at once, over a cap: max_connections, max_unregistered or
  // max_unregistered_per_address (the last two also counted apart below); or out of descriptors
  // (waiting clients shed with the channel's reserve descriptor, docs/stream.md).
  uint64_t connections_rejected = 0;
  uint64_t rejected_unregistered = 0;  // ... because max_unregistered was reached
  uint64_t rejected_per_address = 0;   // ... because max_unregistered_per_address was reached
  uint64_t unregistered_open = 0;      // accepted, not yet mark_registered(), not yet released
  // TLS links closed by a failure of TLS itself: handshakes that failed or timed out (including
  // a socket error or an end of stream before the link was announced), records that did not
  // decrypt (tampering) or could not be encrypted, KeyUpdate storms (logged with the reason, warn,
  // rate limited). Each failure counts once: a socket error after the handshake is its
  // connection's io_error and never a tls_failed too; a tls_failed is never an io_error.
  uint64_t tls_failed = 0;
};

// A connection, by value: a slot index and a generation, so an id whose connection has ended
// never matches a later connection (ids are never handed out twice). 0 is never a valid id. Every
// call taking an id fails cleanly with errc::closed once that connection is gone (after its final
// callback returned) — never undefined behaviour.
struct connection_id {
  uint64_t value = 0;
  explicit operator bool() const noexcept { return value != 0; }
  friend bool operator==(connection_id a, connection_id b) noexcept { return a.value == b.value; }
  friend bool operator!=(connection_id a, connection_id b) noexcept { return a.value != b.value; }
  friend bool operator<(connection_id a, connection_id b) noexcept { return a.value < b.value; }
};

// A listening socket, by value: unique in the process, never reused, 0 never valid. Calls on a
// closed listener's id fail with errc::closed (or return an empty value).
struct listener_id {
  uint64_t value = 0;
  explicit operator bool() const noexcept { return value != 0; }
  friend bool operator==(listener_id a, listener_id b) noexcept { return a.value == b.value; }
  friend bool operator!=(listener_id a, listener_id b) noexcept { return a.value != b.value; }
  friend bool operator<(listener_id a, listener_id b) noexcept { return a.value < b.value; }
};

// Callbacks: std::function members, any of which may be empty; set at construction or with
// set_callbacks(). Contract shared by all of them:
//   * Thread: they run on the loop's thread, from inside uv_run() — never from inside a member
//     function call, except close(), which reports every connection's fate before it returns.
//   * Re-entrancy: a callback may call any member function of the channel, including send(),
//     disconnect() and close(), on any connection. It must NOT destroy the channel (call close()
//     and destroy it after the callback returned); debug builds abort if it does.
//   * Ids: the id passed in stays valid (calls on it work) until the connection's final callback
//     (on_disconnected, or on_connected with an error) returns.
struct stream_callbacks {
  // Log lines about the channel's own events: a connection closed for a corrupt stream
  // (bad_hash, bad_varint, oversize: warn) or a stalled one (timeout: warn), an accepted
  // connection rejected over max_connections, max_unregistered or max_unregistered_per_address
  // (warn), a TLS link that failed its handshake or broke its rules, with the reason (warn), a
  // failed accept (error), a stale unix socket file replaced by listen() (info, from the loop
  // after the call). Rate limited per kind (uvbus/log.h). Same thread and rules as the other
  // callbacks; it may not close the channel.
  log_fn on_log;

  // A peer connected to one of our listeners (listener(conn) tells which one).
  std::function<void(connection_id conn)> on_accepted;

  // An outbound connect() finished: status ok, or connection_refused, resolve_failed, timeout,
  // cancelled (disconnect() before it connected), closed (close() before it connected, from
  // inside close()), io_error, ... On failure this is the connection's final callback (no
  // on_disconnected follows).
  std::function<void(connection_id conn, errc status)> on_connected;

  // The connection ended; fires once, after every on_written / on_send_failed of its packets.
  // reason:
  //   ok                 a graceful end: our disconnect(graceful) completed, or the peer closed
  //                      the connection at a frame boundary (a clean EOF, e.g. the peer's own
  //                      graceful disconnect or close())
  //   closed             our channel was close()d
  //   connection_reset   the peer reset the connection, or its EOF cut a frame in the middle
  //   cancelled          disconnect(force)
  //   bad_hash / oversize / bad_varint  the peer sent a corrupt stream (counted in decode_errors)
  //   protocol_error     TLS links: a record failed (tampering) or the peer sent a KeyUpdate storm
  //   peer_not_authenticated  TLS links: the peer refused our certificate after our handshake
  //                      completed (TLS 1.3 clients finish first)
  //   timeout            partial_frame_timeout_ms, io_error, ...
  std::function<void(connection_id conn, errc reason)> on_disconnected;

  // One whole, checksum-verified message. [data, data + size) points into the channel's read
  // buffer (or a partial-frame buffer) and is valid only until this callback returns: copy what
  // you keep. Messages of one connection arrive in order. If the callback disconnects the
  // connection (graceful or force) or closes the channel, no further message of that connection
  // is delivered.
  std::function<void(connection_id conn, const uint8_t* data, size_t size)> on_received;

  // Cumulative delivery report: every packet of conn with sequence <= written_through has had all
  // of its bytes accepted by the kernel. Fires at most once per completed write batch (one flush of
  // the connection, however many packets it carried), only when set, and costs nothing per packet.
  std::function<void(connection_id conn, uint64_t written_through)> on_written;

  // The accepted packets first..last (sequence numbers, inclusive) of conn will never be written:
  // the connection died (reason: its error), was disconnected with force (cancelled) or the
  // channel was closed (closed). Fires at most once per connection, after its last on_written and
  // before on_disconnected. A packet whose bytes were only partly written is in this range.
  // Together, on_written and on_send_failed cover every accepted packet exactly once.
  std::function<void(connection_id conn, uint64_t first, uint64_t last, errc reason)>
      on_send_failed;

  // Only when set: each packet of that failed range, oldest first, just before on_send_failed.
  // [data, data + size) is the packet's payload as it was sent, valid only until this callback
  // returns (it is still in the connection's queue, so setting this costs nothing per packet).
  // Lets a relay tell the sources of what it had accepted and will never forward. conn is ending:
  // every call on it fails (closed); sends on other connections and close() are allowed.
  std::function<void(connection_id conn, const uint8_t* data, size_t size)> on_unsent;

  // Back-pressure release: a send() on conn returned queue_full, and the queue has since drained to
  // at most half of its byte limit and half of its packet limit. Fires once per queue_full episode,
  // never if the connection ends first. Typical use: send until queue_full, resume here.
  std::function<void(connection_id conn)> on_writable;
};

class stream_channel {
 public:
  // Never fails: an invalid configuration (see validate()) makes listen() and connect() return
  // errc::invalid_argument (last_error() says which field). The loop must outlive the channel and
  // be run after destruction until the channel's handles have closed (as usual with libuv). The
  // channel belongs to the constructing thread, which must be the loop's thread.
  explicit stream_channel(uv_loop_t* loop, const stream_config& cfg = {},
                          stream_callbacks cbs = {});
  // Closes like close(), but WITHOUT calling any callback (the owner is going away). Must not run
  // inside one of the channel's callbacks.
  ~stream_channel();
  stream_channel(const stream_channel&) = delete;
  stream_channel& operator=(const stream_channel&) = delete;

  // invalid_argument when: message_limit is 0 or above 1 GiB, the queue config is invalid
  // (queue.ring_bytes below 64 or above SIZE_MAX / 2; in dynamic mode queue.max_bytes or
  // queue.max_blocks 0) or too small for one frame of message_limit, merge_threshold above 1 GiB,
  // read_buffer_size below 4 KiB or above 1 GiB, backlog <= 0, keepalive_delay_s outside 1..32767
  // with tcp_keepalive set, unix_socket_mode above 07777, unix_send_buffer above 1 GiB,
  // max_unregistered_per_address above a non-zero max_unregistered (it could never apply); with
  // tls.mode set, the TLS settings' errors (uvbus/tls.h). *detail (if given) names the field and
  // the rule.
  [[nodiscard]] static errc validate(const stream_config& cfg,
                                     std::string* detail = nullptr) noexcept;

  // Replaces the callbacks. Outside a callback it takes effect at once; inside one, once the
  // outermost running callback returns (the running std::function is never destroyed under
  // itself), so the events of a close() called from that callback still go to the old ones.
  // Returns closed (and changes nothing) after close().
  errc set_callbacks(stream_callbacks cbs);

  // Binds and listens. ipv4://, ipv6:// (both bracketed and libatbus forms), dns:// (resolved
  // synchronously here; the first address is used) and unix://. Port 0 picks a free port: read it
  // back with listener_url() or listener_port(). Unix: a stale socket file whose listener is dead
  // is replaced; a file with a live listener gives address_in_use; a path that exists but is not a
  // socket gives already_exists. The file gets stream_config::unix_socket_mode and is removed when
  // the listener closes. unix://@name is a Linux abstract socket: no file, no mode (any process of
  // the network namespace may connect), address_in_use while another listener has the name. The
  // channel accepts by itself, at most 32 clients per listener per loop turn; an accept that
  // fails for want of descriptors sheds the waiting clients, or waits 100 ms (docs/stream.md,
  // "The accept loop"). Errors (last_error() names the URL and the problem): bad_url,
  // unsupported_scheme, invalid_argument, closed, address_in_use, permission_denied,
  // resolve_failed, already_exists, not_found (a unix path in a missing directory), io_error.
  [[nodiscard]] errc listen(std::string_view url, listener_id* out = nullptr,
                            void* user_data = nullptr);
  // The same with this listener's own TLS settings (instead of stream_config::tls): with a mode
  // other than off, every connection it accepts must complete a TLS 1.3 handshake (within
  // tls.handshake_timeout_ms) before on_accepted; one that fails is closed unannounced, counted in
  // tls_failed and logged. The settings are checked and their files read here: errors as above,
  // plus invalid_argument (also a file OpenSSL cannot load, a key not matching its certificate,
  // a ciphersuites list it refuses), not_found, permission_denied (a file that cannot be read),
  // tls_handshake_failed (OpenSSL itself failed) (last_error() names the setting or file).
  [[nodiscard]] errc listen(std::string_view url, const tls_config& tls, listener_id* out = nullptr,
                            void* user_data = nullptr);
  // Listens on a socket that is already bound and listening, typically one a previous process of
  // this service gave away with detach_listener() (a planned hand-over, uvbus/handover.h). url
  // names what it must be: a unix:// URL, a socket bound to that path; an ipv4:// or ipv6:// URL, a
  // socket of that family bound to that address (0.0.0.0 and 127.0.0.1 differ) and port (any port
  // for port 0); a dns:// URL, a TCP socket of that port. The listener's URL is the bound address.
  // Connections waiting in the socket's backlog are accepted at once. The channel owns fd from the
  // call on: it is closed with the listener, or at once on any error (wrong_thread too, before a
  // debug build aborts). Errors: bad_url, unsupported_scheme, closed, invalid_argument
  // (last_error() says why the socket does not fit: "not listening", "bound to port 1234", ...),
  // no_memory.
  [[nodiscard]] errc listen_fd(std::string_view url, int fd, listener_id* out = nullptr,
                               void* user_data = nullptr);
  // Stops accepting on l and gives its socket away: *fd receives a close-on-exec duplicate that
  // stays bound and listening (the caller owns it), so that peers connecting meanwhile wait in the
  // kernel's backlog for whoever adopts it with listen_fd() instead of being refused. A unix
  // listener's socket file stays. Errors: closed (unknown or closed listener, or fd null),
  // io_error and the like when the duplicate fails (the listener then stays).
  [[nodiscard]] errc detach_listener(listener_id l, int* fd);
  // Stops listening (connections it accepted stay open) and removes a unix socket file.
  // Errors: closed (unknown or already closed listener, or channel closed).
  errc close_listener(listener_id l);
  // The bound address as a URL: with port 0 in listen(), the port the system chose; dns:// URLs
  // come back as the ipv4:// or ipv6:// literal they resolved to. Empty for an unknown listener.
  [[nodiscard]] std::string listener_url(listener_id l) const;
  [[nodiscard]] uint16_t listener_port(listener_id l) const;  // 0 for an unknown listener
  [[nodiscard]] void* listener_user_data(listener_id l) const;

  // Starts connecting; the result comes through on_connected. dns:// names are resolved with
  // uv_getaddrinfo and every address returned is tried in order, each within its share of
  // connect_timeout_ms (see there). *out (if given) receives the id
  // at once, e.g. to disconnect() a pending connect. Errors (no callback then; last_error() names
  // the URL and the problem): bad_url, unsupported_scheme, invalid_argument, closed, no_memory,
  // and immediate system errors.
  [[nodiscard]] errc connect(std::string_view url, connection_id* out = nullptr,
                             void* user_data = nullptr);
  // The same with this dial's own TLS settings (instead of stream_config::tls). With a mode other
  // than off, on_connected(ok) fires once the TLS handshake completed and the peer authenticated;
  // otherwise on_connected reports tls_handshake_failed, peer_not_authenticated (a certificate was
  // refused, by either side), timeout (tls.handshake_timeout_ms) or connection_reset, and the
  // reason is logged. Settings errors as for the listen() overload.
  [[nodiscard]] errc connect(std::string_view url, const tls_config& tls,
                             connection_id* out = nullptr, void* user_data = nullptr);

  // Ends a connection (see disconnect_mode). The callbacks fire later from the loop, never from
  // inside this call. Calling it again upgrades graceful to force; otherwise it returns closed.
  // A pending connect ends with on_connected(cancelled). Errors: closed (gone or ending).
  errc disconnect(connection_id conn, disconnect_mode mode = disconnect_mode::graceful);

  // Queues one message (the frame is encoded and hashed once, into the connection's queue) and
  // schedules a write: if none is in flight, the packet goes to the kernel before the loop next
  // blocks for I/O (in the current loop iteration), coalesced with every other small packet sent
  // to this connection meanwhile. The caller's bytes are copied before send() returns. On success
  // *seq (if given) receives the packet's sequence number on conn: 1, 2, 3, ... in send order, the
  // numbers on_written and on_send_failed report. Errors (nothing is queued, no callback fires):
  //   message_too_large  size > message_limit (sendv: the parts' total)
  //   queue_full         the queue is full now (retriable; on_writable tells when to retry)
  //   no_memory          the queue's storage (its ring, a larger ring, a dynamic block) could not
  //                      be allocated; the connection goes on. No on_writable follows: retry on
  //                      a later event of your own, or disconnect
  //   not_connected      still connecting (retriable)
  //   closed             the connection is gone or ending, disconnect() was called, or the channel
  //                      closed
  //   invalid_argument   data == nullptr with size > 0
  [[nodiscard]] errc send(connection_id conn, const void* data, size_t size,
                          uint64_t* seq = nullptr);
  // Gather form: the message is the concatenation of bufs[0..count).
  [[nodiscard]] errc sendv(connection_id conn, const const_buffer* bufs, size_t count,
                           uint64_t* seq = nullptr);

  // In-place form, for messages built directly in the send queue (saves the copy send() makes):
  // prepare_send() reserves room for a payload of exactly `size` bytes in conn's queue and returns
  // where to write it; commit_send() then hashes the payload, completes the frame and schedules the
  // write exactly like send(), and gives the sequence number. On failure prepare_send() returns
  // nullptr and sets *err to one of send()'s errors (or invalid_argument while another reservation
  // on conn is open); nothing is queued. Between the two calls nothing else may be sent on conn,
  // and control must not return to the loop; cancel_send() drops the reservation instead (nothing
  // is queued or reported). A reservation opened inside on_writable (which runs in the middle of
  // a flush) holds the rest of that flush back: nothing of conn is written until commit_send() or
  // cancel_send(). A reservation is not a packet: if the connection ends or is disconnected
  // (graceful or force) before commit_send(), commit_send() drops the reservation and returns
  // closed, and nothing is reported for it (a graceful drain then goes on without it).
  [[nodiscard]] uint8_t* prepare_send(connection_id conn, size_t size, errc* err = nullptr);
  errc commit_send(connection_id conn, uint64_t* seq = nullptr);
  void cancel_send(connection_id conn);

  // The owner vouches for an accepted connection (a bus node: its peer finished registration): it
  // stops counting against max_unregistered and max_unregistered_per_address. Idempotent; nothing
  // to do for an outbound connection. Errors: closed (gone or unknown).
  errc mark_registered(connection_id conn);

  // Receive-side flow control: stop / restart reading from conn. Called from on_received, the
  // pause takes effect after the messages of the chunk being delivered (they already left the
  // kernel and live in the shared read buffer); no further read is made until resume_reading().
  // However long the pause, it never counts as a stalled peer (partial_frame_timeout_ms restarts
  // at resume_reading()). Errors: closed, not_connected.
  errc pause_reading(connection_id conn);
  errc resume_reading(connection_id conn);

  // What a connection handle used to carry, by id. Each fails cleanly on a gone id: false,
  // nullptr, an empty string or errc::closed.
  [[nodiscard]] bool is_open(connection_id conn) const;  // known and not yet released
  bool set_user_data(connection_id conn, void* p);
  [[nodiscard]] void* user_data(connection_id conn) const;
  // True for connections made with connect(), false for accepted ones (and gone ids).
  [[nodiscard]] bool outbound(connection_id conn) const;
  // The listener that accepted conn (0 for outbound connections and gone ids). It may have been
  // closed since.
  [[nodiscard]] listener_id listener(connection_id conn) const;
  // The URL given to connect(), or for accepted TCP connections the peer's address
  // ("ipv4://1.2.3.4:5678"; a link-local IPv6 peer with its interface number as the scope id,
  // "ipv6://[fe80::1%2]:5678", which listen()/connect() do not take); for accepted unix
  // connections the listener's URL ("unix://@name" for an abstract socket).
  [[nodiscard]] std::string peer_url(connection_id conn) const;
  errc connection_metrics(connection_id conn, stream_connection_metrics* out) const;

  // Closes every listener (removing unix socket files) and every connection. Synchronously, before
  // it returns: every packet still queued or in flight is reported failed (errc::closed) exactly
  // once, pending connects get on_connected(closed), established connections get
  // on_disconnected(closed). No callback fires after close() returns (except, when close() is
  // called inside a connection's own final reports — on_unsent, on_send_failed — the rest of that
  // connection's reports, with its own reason, as the callback returns); every later call returns
  // errc::closed. Idempotent. Run the loop afterwards so libuv can release the handles.
  void close();
  [[nodiscard]] bool closed() const;

  // The last error a call returned, with the detail naming the URL/field and the rule; a call
  // that returns ok leaves it unchanged.
  [[nodiscard]] const error_info& last_error() const;

  // Counters over the channel's lifetime (sums over live and closed connections).
  [[nodiscard]] stream_channel_metrics metrics() const;
  [[nodiscard]] const stream_config& config() const;  // any thread (immutable)
  [[nodiscard]] uv_loop_t* loop() const;              // any thread (immutable)

  struct impl;  // private, in src/stream/

 private:
  friend struct detail::stream_access;
  // Heap-allocated so that libuv close callbacks still find it if the channel object is destroyed
  // before the loop has run them.
  impl* impl_;
};

}  // namespace uvbus
