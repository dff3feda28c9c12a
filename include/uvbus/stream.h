// Stream channel: framed messages over libuv TCP (ipv4://, ipv6://, dns://) and unix sockets
// (unix://), with small-packet coalescing (DESIGN §1, §3) and bounded, back-pressured send queues.
//
// Threading: a stream_channel is owned by one uv_loop_t and is single-threaded. Every member
// function must be called on the loop's thread, and every callback runs on that thread, from inside
// uv_run() (or from inside stream_channel::close(), see there). Nothing is thread-safe.
//
// SIGPIPE: a write to a peer that has gone raises SIGPIPE, whose default action kills the process.
// Constructing a stream_channel sets SIGPIPE to SIG_IGN when it is still at its default (a handler
// or disposition the application installed is left alone), so a vanished peer only costs its
// connection: the write fails with EPIPE and the connection closes with connection_reset.
//
// Errors are values (uvbus::errc). Contract shared with libuv, word for word: when a function which
// takes a callback returns an error, the callback will never be called. Here that means: a send()
// that returns an error never produces an on_written report for that packet (and leaves nothing
// queued, so a retry cannot duplicate it); a connect() that returns an error never produces
// on_connected; a listen() that returns an error never produces on_accepted.
//
// Lifetime of a connection (stream_connection*, a cheap pointer handle):
//   * outbound: connect() returns the handle at once; on_connected(conn, status) fires exactly
//   once.
//     If status != ok the connection is gone once that callback returns (no on_disconnected).
//   * inbound: on_accepted(conn) fires when a peer connects to one of our listeners.
//   * after on_accepted, or on_connected with ok, on_disconnected(conn, reason) fires exactly once.
//   * the pointer is valid from connect()/on_accepted until the final callback above returns; using
//     it afterwards is undefined. stream_connection::id() is unique in the process and never
//     reused, for callers that need a key that cannot dangle.
//
// Packet fate: every packet accepted by a successful send() ends in exactly one of
//   * delivered to the kernel (reported with errc::ok through on_written only if
//     stream_config::report_written is set), or
//   * failed (always reported through on_written with the reason, when on_written is set): the
//     connection died or was disconnected before all of its bytes reached the kernel. A packet
//     whose bytes were only partly written is reported failed.
// Reports for one connection come in send() order, and all of them come before on_disconnected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "uvbus/buffer.h"
#include "uvbus/error.h"
#include "uvbus/queue_config.h"

typedef struct uv_loop_s uv_loop_t;  // NOLINT(modernize-use-using): matches libuv's declaration

namespace uvbus {

enum class disconnect_mode : uint8_t {
  // Stop accepting sends (they return errc::closed), let every queued packet reach the kernel,
  // shut the write side down, then close. on_disconnected reports errc::ok. If the connection
  // dies first, the remaining packets are reported failed and the reason is that error.
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
  // so a connection that never sends costs no queue memory.
  write_queue_config queue = {};
  // Frames smaller than this many bytes are coalesced: when a write is issued, as many queued small
  // frames as fit are copied into one per-thread merge buffer and written with one system call.
  // Larger frames are written straight from the queue, never copied again. 0 turns coalescing
  // off: one write per packet (what a bus without coalescing does; for comparison).
  size_t merge_threshold = kDefaultMergeThreshold;
  // Report successful deliveries through on_written too (one call per packet). Failures are always
  // reported when on_written is set.
  bool report_written = false;
  bool tcp_nodelay = true;
  bool tcp_keepalive = false;
  unsigned keepalive_delay_s = 60;  // first probe after this idle time, when tcp_keepalive is set
  int backlog = 128;
  unsigned unix_socket_mode = 0600;  // permissions of a unix listener's socket file
  // Size of the per-thread read buffer handed to libuv (one read can carry hundreds of frames).
  // Shared by all channels of the thread (the largest request wins); never per connection.
  size_t read_buffer_size = kDefaultReadBufferSize;
  // An outbound connection that has not connected within this time fails with errc::timeout.
  // 0: no timeout beyond the kernel's.
  uint32_t connect_timeout_ms = 10000;
  // A connection that holds part of a frame and receives no byte for this long is closed with
  // errc::timeout (a slow-loris peer cannot pin its partial-frame buffer, up to message_limit + 14
  // bytes, forever). Checked by one timer per channel every timeout/4 (at least every 10 ms), so a
  // stalled half-frame is closed within 1.25 x the timeout. 0: never.
  uint32_t partial_frame_timeout_ms = 30000;
  // Accepted connections beyond this many live connections (inbound + outbound) of the channel are
  // closed at once, without on_accepted, and counted in connections_rejected: the bound on what
  // strangers can make a listener hold. 0: no limit.
  uint32_t max_connections = 16384;
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
  uint64_t send_refused = 0;    // send() calls that returned queue_full
  uint64_t send_failed = 0;     // accepted packets later reported failed
  uint64_t decode_errors = 0;   // bad hash, oversize, bad varint (each closes the connection)
  uint64_t io_errors = 0;       // read/write errors other than a clean EOF
  uint64_t partial_frame_timeouts = 0;  // closed for stalling mid-frame (partial_frame_timeout_ms)
  size_t queue_bytes = 0;               // frame bytes waiting in the send queue now
  size_t queue_packets = 0;             // packets waiting in the send queue now
  size_t queue_peak_bytes = 0;          // highest queue_bytes seen
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
  uint64_t connections_rejected = 0;  // accepted then closed at once: max_connections reached
};

class stream_channel;

// A listening socket. Valid from listen() until close_listener()/close() returns.
class stream_listener {
 public:
  stream_listener(const stream_listener&) = delete;
  stream_listener& operator=(const stream_listener&) = delete;

  // The bound address as a URL: with port 0 in listen(), the port the system chose; dns:// URLs
  // come back as the ipv4:// or ipv6:// literal they resolved to.
  [[nodiscard]] const std::string& url() const noexcept { return url_; }
  [[nodiscard]] uint16_t port() const noexcept { return port_; }
  [[nodiscard]] void* user_data() const noexcept { return user_data_; }
  void set_user_data(void* p) noexcept { user_data_ = p; }

 protected:
  stream_listener() = default;
  ~stream_listener() = default;
  std::string url_;
  uint16_t port_ = 0;
  void* user_data_ = nullptr;
};

// A connection handle; see the lifetime rules at the top of this file.
class stream_connection {
 public:
  stream_connection(const stream_connection&) = delete;
  stream_connection& operator=(const stream_connection&) = delete;

  // Unique within the process (across channels), never reused, never 0.
  [[nodiscard]] uint64_t id() const noexcept { return id_; }
  [[nodiscard]] void* user_data() const noexcept { return user_data_; }
  void set_user_data(void* p) noexcept { user_data_ = p; }
  // True for connections made with connect(), false for accepted ones.
  [[nodiscard]] bool outbound() const noexcept { return outbound_; }
  // The listener that accepted this connection (nullptr for outbound ones). It may have been
  // closed since; compare only, do not dereference then.
  [[nodiscard]] const stream_listener* listener() const noexcept { return listener_; }
  // The URL given to connect(), or for accepted TCP connections the peer's address
  // ("ipv4://1.2.3.4:5678"); for accepted unix connections the listener's URL.
  [[nodiscard]] const std::string& peer_url() const noexcept { return peer_url_; }
  [[nodiscard]] const stream_connection_metrics& metrics() const noexcept { return metrics_; }

 protected:
  stream_connection() = default;
  ~stream_connection() = default;
  uint64_t id_ = 0;
  void* user_data_ = nullptr;
  bool outbound_ = false;
  const stream_listener* listener_ = nullptr;
  std::string peer_url_;
  stream_connection_metrics metrics_;
};

// Callbacks: plain function pointers plus one context pointer (no std::function per packet). Any
// of them may be null. They may call any stream_channel member function, including send(),
// disconnect() and close() on the same connection or channel, but must not destroy the channel.
struct stream_callbacks {
  void* ctx = nullptr;  // passed back as the first argument of every callback

  // A peer connected to one of our listeners. conn->listener() tells which one.
  void (*on_accepted)(void* ctx, stream_connection* conn) = nullptr;

  // An outbound connect() finished: status ok, or connection_refused, resolve_failed, timeout,
  // cancelled (disconnect() or close() before it connected), io_error, ... On failure conn is
  // released when this returns.
  void (*on_connected)(void* ctx, stream_connection* conn, errc status) = nullptr;

  // The connection ended; fires once, after every report of its packets. reason: ok (graceful
  // disconnect() completed), cancelled (disconnect(force)), closed (channel close()),
  // connection_reset (peer closed or reset), bad_hash / oversize / bad_varint (the peer sent a
  // corrupt stream; counted in decode_errors), io_error, ... conn is released when this returns.
  void (*on_disconnected)(void* ctx, stream_connection* conn, errc reason) = nullptr;

  // One whole, checksum-verified message. The view [data, data + size) points into the channel's
  // read buffer (or a partial-frame buffer) and is valid only until this callback returns: copy
  // what you keep. Messages of one connection arrive in order. If the callback disconnects the
  // connection (or closes the channel), no further message of that connection is delivered.
  void (*on_received)(void* ctx, stream_connection* conn, const uint8_t* data,
                      size_t size) = nullptr;

  // The fate of one packet accepted by send(), identified by the tag given to send(). status ok:
  // all of its bytes reached the kernel (only with stream_config::report_written). Otherwise the
  // packet was not (fully) sent: the reason is the connection's error, cancelled (force
  // disconnect) or closed (channel close()).
  void (*on_written)(void* ctx, stream_connection* conn, uint64_t tag, errc status) = nullptr;

  // Back-pressure release: a send() on conn returned queue_full, and the queue has since drained to
  // at most half of its byte limit and half of its packet limit. Fires once per queue_full episode,
  // never if the connection ends first. Typical use: send until queue_full, resume here.
  void (*on_writable)(void* ctx, stream_connection* conn) = nullptr;
};

class stream_channel {
 public:
  // Never fails: an invalid configuration (see validate()) makes listen() and connect() return
  // errc::invalid_argument. The loop must outlive the channel and be run after destruction until
  // the channel's handles have closed (as usual with libuv).
  explicit stream_channel(uv_loop_t* loop, const stream_config& cfg = {},
                          const stream_callbacks& cbs = {});
  // Closes like close(), but WITHOUT calling any callback (the owner is going away).
  ~stream_channel();
  stream_channel(const stream_channel&) = delete;
  stream_channel& operator=(const stream_channel&) = delete;

  // invalid_argument when: message_limit is 0 or above 1 GiB, the queue config is invalid or too
  // small for one frame of message_limit, read_buffer_size < 4 KiB, backlog <= 0.
  [[nodiscard]] static errc validate(const stream_config& cfg) noexcept;

  // Replaces the callbacks (e.g. to set ctx after construction). Takes effect at once.
  void set_callbacks(const stream_callbacks& cbs) noexcept;

  // Binds and listens. ipv4://, ipv6:// (both bracketed and libatbus forms), dns:// (resolved
  // synchronously here; the first address is used) and unix://. Port 0 picks a free port: read it
  // back with (*out)->url() or port(). Unix: a stale socket file whose listener is dead is
  // replaced; a file with a live listener gives address_in_use; a path that exists but is not a
  // socket gives already_exists. The file gets stream_config::unix_socket_mode and is removed when
  // the listener closes. Errors: bad_url, unsupported_scheme, invalid_argument, closed,
  // address_in_use, permission_denied, resolve_failed, already_exists, io_error.
  [[nodiscard]] errc listen(std::string_view url, stream_listener** out = nullptr,
                            void* user_data = nullptr);
  // Stops listening (connections it accepted stay open) and removes a unix socket file.
  [[nodiscard]] errc close_listener(stream_listener* l);

  // Starts connecting; the result comes through on_connected. dns:// names are resolved with
  // uv_getaddrinfo and every address returned is tried in order. *out (if given) receives the
  // handle at once, e.g. to disconnect() a pending connect or to set_user_data() before
  // on_connected. Errors (no callback then): bad_url, unsupported_scheme, invalid_argument, closed,
  // no_memory, and immediate system errors.
  [[nodiscard]] errc connect(std::string_view url, stream_connection** out = nullptr,
                             void* user_data = nullptr);

  // Ends a connection (see disconnect_mode). The callbacks fire later from the loop, never from
  // inside this call. Calling it again upgrades graceful to force; otherwise it returns closed.
  // A pending connect ends with on_connected(cancelled). Errors: invalid_argument, closed.
  [[nodiscard]] errc disconnect(stream_connection* conn,
                                disconnect_mode mode = disconnect_mode::graceful);

  // Queues one message (the frame is encoded and hashed once, into the connection's queue) and
  // schedules a write: if none is in flight, the packet goes to the kernel before the loop next
  // blocks for I/O (in the current loop iteration), coalesced with every other small packet sent
  // to this connection meanwhile. The caller's bytes are copied before send() returns.
  // Errors (nothing is queued, no callback fires):
  //   message_too_large  size > message_limit
  //   queue_full         the queue is full now (retriable; on_writable tells when to retry)
  //   not_connected      still connecting (retriable)
  //   closed             disconnect() was called, the connection is ending, or the channel closed
  //   invalid_argument   null conn, or data == nullptr with size > 0
  [[nodiscard]] errc send(stream_connection* conn, const void* data, size_t size, uint64_t tag = 0);
  // Gather form: the message is the concatenation of bufs[0..n).
  [[nodiscard]] errc send(stream_connection* conn, const const_buffer* bufs, size_t n,
                          uint64_t tag = 0);
  [[nodiscard]] errc send(stream_connection* conn, std::initializer_list<const_buffer> bufs,
                          uint64_t tag = 0) {
    return send(conn, bufs.begin(), bufs.size(), tag);
  }

  // In-place form, for messages built directly in the send queue (saves the copy send() makes):
  // prepare_send() reserves room for a payload of exactly `size` bytes in conn's queue and returns
  // where to write it; commit_send() then hashes the payload, completes the frame and schedules the
  // write exactly like send(). On failure prepare_send() returns nullptr and sets *err to one of
  // send()'s errors (or invalid_argument while another reservation on conn is open); nothing is
  // queued. Between the two calls nothing else may be sent on conn, and control must not return to
  // the loop; cancel_send() drops the reservation instead (nothing is queued or reported).
  [[nodiscard]] uint8_t* prepare_send(stream_connection* conn, size_t size, uint64_t tag = 0,
                                      errc* err = nullptr);
  void commit_send(stream_connection* conn);
  void cancel_send(stream_connection* conn);

  // Receive-side flow control: stop / restart reading from conn. Called from on_received, the
  // pause takes effect after the messages of the chunk being delivered (they already left the
  // kernel and live in the shared read buffer); no further read is made until resume_reading().
  // Errors: invalid_argument, closed, not_connected.
  [[nodiscard]] errc pause_reading(stream_connection* conn);
  [[nodiscard]] errc resume_reading(stream_connection* conn);

  // Closes every listener (removing unix socket files) and every connection. Synchronously, before
  // it returns: every packet still queued or in flight is reported failed (errc::closed) exactly
  // once, pending connects get on_connected(closed), established connections get
  // on_disconnected(closed). No callback fires after close() returns; every later call returns
  // errc::closed. Idempotent. Run the loop afterwards so libuv can release the handles.
  void close();
  [[nodiscard]] bool closed() const noexcept;

  // Counters over the channel's lifetime (sums over live and closed connections).
  [[nodiscard]] stream_channel_metrics metrics() const noexcept;
  [[nodiscard]] const stream_config& config() const noexcept;
  [[nodiscard]] uv_loop_t* loop() const noexcept;

  struct impl;  // private, in src/stream/

 private:
  // Heap-allocated so that libuv close callbacks still find it if the channel object is destroyed
  // before the loop has run them.
  impl* impl_;
};

}  // namespace uvbus
