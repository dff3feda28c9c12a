// Private state of the stream channel (never installed).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <uv.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/frame.h"
#include "core/intrusive_list.h"
#include "core/log_limiter.h"
#include "core/thread_check.h"
#include "core/write_queue.h"
#include "uvbus/address.h"
#include "uvbus/stream.h"
#include "uvbus/tls.h"

namespace uvbus {

namespace detail {

class tls_context;
class tls_session;
struct tls_session_deleter {  // defined in stream_tls.cpp, where tls_session is complete
  void operator()(tls_session* s) const noexcept;
};

// libuv handles a connection may own; the first member of each is a uv_handle_t, so a
// pointer to the union is a valid uv_handle_t* / uv_stream_t*.
union stream_handle {
  uv_handle_t handle;
  uv_stream_t stream;
  uv_tcp_t tcp;
  uv_pipe_t pipe;
};

enum class conn_state : uint8_t {
  resolving,   // dns:// name lookup in progress
  connecting,  // uv_tcp_connect / uv_pipe_connect in progress
  connected,
  draining,  // graceful disconnect: flushing the queue, then shutdown
  closing,   // ended; waiting for libuv to release the handles
};

struct listener_impl;

// The source address of an accepted connection, for max_unregistered_per_address: the IP address
// (an IPv4-mapped IPv6 address as IPv4), or one key shared by every unix-socket peer.
struct source_key {
  std::array<uint8_t, 16> bytes{};
  uint8_t family = 0;  // 4, 6, or 1 for unix
  friend bool operator==(const source_key& a, const source_key& b) noexcept {
    return a.family == b.family && a.bytes == b.bytes;
  }
};
struct source_hash {
  size_t operator()(const source_key& k) const noexcept {
    uint64_t h = 1469598103934665603ULL ^ k.family;  // FNV-1a
    for (const uint8_t b : k.bytes) h = (h ^ b) * 1099511628211ULL;
    return static_cast<size_t>(h);
  }
};
// The key of a peer's address (family 0 for an address of another kind).
source_key source_of(const sockaddr* sa) noexcept;

struct conn_impl {
  explicit conn_impl(stream_channel::impl* c) : ch(c) {}

  stream_channel::impl* ch;
  connection_id id;
  void* user_data = nullptr;
  bool outbound = false;
  listener_id listener;
  std::string peer_url;
  stream_connection_metrics metrics;
  stream_handle h{};
  bool is_unix = false;
  bool handle_open = false;  // h is initialised and uv_close() has not been called on it
  bool reading = false;
  bool paused = false;
  bool writing = false;        // wreq is in flight (it carries the rest of the queue's front block)
  bool dirty = false;          // on the channel's flush list
  bool want_writable = false;  // a send() returned queue_full: call on_writable once drained
  bool reported = false;       // the final callbacks have fired
  bool connected_once = false;  // on_accepted / on_connected(ok) fired: end with on_disconnected
  bool shutting_down = false;
  bool unregistered = false;  // counted against the max_unregistered caps (see source)
  // deliver() is inside on_received for this connection: the payload may point into the decoder,
  // so a graceful disconnect() from there leaves the decoder to deliver() (which resets it after).
  bool delivering = false;
  conn_state state = conn_state::connecting;
  errc reason = errc::ok;
  int pending = 0;  // libuv objects still referring to this connection (handles, requests)

  detail::source_key source;           // accepted connections: the peer's address
  std::unique_ptr<write_queue> queue;  // created on the first send
  // How many bytes the next merge copies at most: what the socket took the last time it took only
  // part of a merge, doubled after every merge it took whole (0: merge_cap). See kMinMergeWindow.
  size_t merge_window = 0;
  uint8_t* prepared = nullptr;  // prepare_send(): the open reservation's frame
  size_t prepared_size = 0;     // and its payload size
  size_t prepared_hdr = 0;      // and its header's size
  frame_decoder decoder;
  uint64_t last_read_ms = 0;   // uv_now() of the last read that returned bytes (or of the accept)
  uint64_t last_flush_ms = 0;  // uv_now() of the last flush (send_ring_idle_ms counts from it)
  // TLS links (stream_tls.cpp): the context says the link must be TLS; the session exists from
  // the TCP connect / accept on (the handshake runs while state is still connecting).
  std::shared_ptr<const tls_context> tls_ctx;
  std::unique_ptr<tls_session, tls_session_deleter> secure;

  // Sequence numbers: accepted packets are 1..accepted_seq; 1..written_seq have all their bytes in
  // the kernel (popped from the queue); on_written has been told up to reported_seq. The queue
  // holds exactly the packets written_seq+1..accepted_seq (plus an open reservation).
  uint64_t accepted_seq = 0;
  uint64_t written_seq = 0;
  uint64_t reported_seq = 0;

  uv_write_t wreq{};
  uv_shutdown_t sreq{};
  uv_connect_t creq{};
  uv_timer_t* timer = nullptr;      // connect timeout, only while connecting
  uv_getaddrinfo_t* gai = nullptr;  // only while resolving
  // dns:// dials: the resolved TCP addresses, tried in order (next_addr: the next one to try), and
  // the uv_now() by which the whole dial must have connected (connect_timeout_ms; 0: none).
  std::vector<sockaddr_storage> addrs;
  size_t next_addr = 0;
  uint64_t dial_deadline_ms = 0;
  // An abstract unix dial (connected by hand, stream_dial.cpp): its outcome, reported by connect_cb
  // from the timer on the next loop turn.
  int abstract_status = 0;
  bool abstract_due = false;

  list_hook<conn_impl> hook;  // the channel's list of live connections
  conn_impl* dirty_next = nullptr;

  stream_connection_metrics& m() noexcept { return metrics; }
  uv_stream_t* stream() noexcept { return &h.stream; }
  uv_handle_t* handle() noexcept { return &h.handle; }
  bool active() const noexcept {
    return state == conn_state::connected || state == conn_state::draining;
  }
};

// A listening socket the channel accepts from by itself (stream_accept.cpp): a uv_poll_t watches
// it, and accept4() takes at most kAcceptBatch clients per readable event.
struct listener_impl {
  explicit listener_impl(stream_channel::impl* c) : ch(c) {}

  stream_channel::impl* ch;
  listener_id id;
  std::string url;
  uint16_t port = 0;
  void* user_data = nullptr;
  uv_poll_t poll{};
  int fd = -1;                // the listening socket, owned (closed with the listener)
  bool poll_open = false;     // poll is initialised and uv_close() has not been called on it
  bool waiting = false;       // not polled until the channel's accept_timer fires (accept failed)
  uint32_t failed_tries = 0;  // accept failures in a row (the first is logged, and the recovery)
  bool is_unix = false;
  bool closing = false;
  std::string unix_path;  // removed on close if it is still the file we created
  uint64_t unix_dev = 0;
  uint64_t unix_ino = 0;
  std::shared_ptr<const tls_context> tls_ctx;  // its connections are TLS (nullptr: clear)
  list_hook<listener_impl> hook;
};

using conn_list = intrusive_list<conn_impl, &conn_impl::hook>;
using listener_list = intrusive_list<listener_impl, &listener_impl::hook>;

// Slot table behind connection_id: value = generation << 32 | slot index. Generations come from a
// process-wide counter, so an id is unique in the process and never names a later connection.
class conn_table {
 public:
  connection_id add(conn_impl* c);
  void remove(connection_id id) noexcept;  // an id already removed: nothing
  [[nodiscard]] conn_impl* find(connection_id id) const noexcept {
    const auto idx = static_cast<uint32_t>(id.value);
    if (idx >= slots_.size()) return nullptr;
    const slot& s = slots_[idx];
    return s.gen == static_cast<uint32_t>(id.value >> 32) ? s.c : nullptr;
  }

 private:
  struct slot {
    conn_impl* c = nullptr;
    uint32_t gen = 0;  // the last id's generation (0: never used); c == nullptr: free
    uint32_t next_free = 0;
  };
  std::vector<slot> slots_;
  uint32_t free_head_ = UINT32_MAX;
};

// Counts callback nesting: destroying the channel inside a callback is refused (debug abort), and
// set_callbacks() inside one is applied when the outermost callback returns.
struct callback_scope {
  explicit callback_scope(stream_channel::impl* ch) noexcept;
  ~callback_scope();
  callback_scope(const callback_scope&) = delete;
  callback_scope& operator=(const callback_scope&) = delete;
  stream_channel::impl* ch;
};

// Tuning of the write path.
inline constexpr size_t kMinMergeBuffer = size_t{64} * 1024;
// Largest stream_config::unix_send_buffer (setsockopt takes an int; the kernel caps it far lower).
inline constexpr size_t kMaxUnixSendBuffer = size_t{1} << 30;
inline constexpr unsigned kMaxKeepaliveS = 32767;  // Linux's bound on TCP_KEEPIDLE
// A socket that takes only part of a merge (a unix socket: its send buffer is about 208 KiB, and
// nothing autotunes it) would have the untaken frames copied into the merge buffer again on the
// next flush, several times over when the peer reads slower than we send. So a connection merges
// at most what its socket last took (never below this), and twice as much after each merge it
// took whole, up to the buffer.
inline constexpr size_t kMinMergeWindow = size_t{16} * 1024;
// The merge window after a merged write of len bytes of which the socket took w, given the
// window it was made with (0: the whole buffer, cap). EAGAIN (w == 0) says nothing about the
// socket's size and leaves the window as it is.
constexpr size_t next_merge_window(size_t window, size_t w, size_t len, size_t cap) noexcept {
  if (w == len) return window == 0 || window * 2 >= cap ? 0 : window * 2;
  if (w == 0) return window;
  return w > kMinMergeWindow ? w : kMinMergeWindow;
}
// A flush hands the socket at most this much before giving other connections (and the loop) a
// turn; the connection stays on the flush list.
inline constexpr size_t kFlushBudget = size_t{1024} * 1024;
// One writev() carries at most this many queue blocks and (beyond its first block) this many bytes.
inline constexpr size_t kMaxGather = 16;
inline constexpr size_t kGatherBytes = size_t{256} * 1024;
// Queued frames get their checksums in batches of this many (murmur3_x86_32_batch's lanes): when
// this many are waiting, and before any flush writes the queue.
inline constexpr size_t kSealBatch = 16;
// The sweep (stalled half-frames, idle grown rings) looks at about this many connections a firing
// once there are more, and fires at most every kSweepMinMs (stream_channel::impl::sweep()).
inline constexpr size_t kSweepSlice = 256;
inline constexpr uint64_t kSweepMinMs = 10;
// How a pass over n connections is cut: ceil(n / slice) firings (fewer if they would come closer
// than kSweepMinMs), delay_ms apart, each looking at up to `share` connections, the connections
// spread evenly; so a pass from the front takes at most period_ms (one firing when n <= slice).
struct sweep_plan {
  uint64_t delay_ms;
  size_t share;
};
inline sweep_plan plan_sweep(size_t n, size_t slice, uint64_t period_ms) noexcept {
  uint64_t k = slice == 0 ? n : (n + slice - 1) / slice;
  k = std::clamp<uint64_t>(k, 1, std::max<uint64_t>(1, period_ms / kSweepMinMs));
  return {period_ms / k, static_cast<size_t>((n + k - 1) / k)};
}
// Payloads below the channel's seal_min_bytes (murmur3_batch_min_mean_bytes(): 0 with AVX-512,
// 24 B with AVX2, 256 B with the scalar kernel) are hashed one at a time as they are queued
// unless a batch is already waiting.

// A libuv status as an errc (UV_EOF: connection_reset; resolver errors: resolve_failed).
errc from_uv(int status) noexcept;
// The listener's accept loop: at most this many clients per readable event, so that one busy
// listener cannot keep the loop from everything else; at most kShedBatch waiting clients closed at
// once out of descriptors; a listener whose accept failed in a way no shedding mends is polled
// again after kAcceptRetryMs (stream_accept.cpp).
inline constexpr int kAcceptBatch = 32;
inline constexpr int kShedBatch = 256;
inline constexpr uint64_t kAcceptRetryMs = 100;
// A unix:// URL's host names a Linux abstract socket when it starts with '@' ("unix://@name": no
// file, sun_path[0] = '\0' and the name after it).
inline bool is_abstract(const std::string& host) noexcept {
  return !host.empty() && host[0] == '@';
}
// The socket address of a unix:// host (a path, or "@name") and its length (abstract: the name's
// bytes only, no NUL after it), or 0 if it does not fit.
socklen_t unix_sockaddr(const std::string& host, sockaddr_un* out) noexcept;
// A unix socket address as a unix:// host: the path, or "@name" for an abstract one.
std::string unix_host(const sockaddr_un* sun, socklen_t len);
// A TCP socket address as a URL: "ipv4://1.2.3.4:5", "ipv6://[::1]:5", with the scope id of a
// link-local IPv6 address as its interface number ("ipv6://[fe80::1%2]:5"); empty for another
// family.
std::string sockaddr_url(const sockaddr* sa);
// A literal address (ipv4/ipv6) into a sockaddr.
errc literal_sockaddr(const address& a, sockaddr_storage* out);
// Adds a connection's totals (and with_queue: its current queue figures) to `to`.
void add_totals(stream_connection_metrics& to, const stream_connection_metrics& m, bool with_queue);

// The kinds of channel events on_log rate-limits separately.
enum stream_log_kind : size_t {
  kLogBadHash,
  kLogBadVarint,
  kLogOversize,
  kLogStalled,
  kLogRejected,
  kLogAcceptFailed,
  kLogStaleFile,
  kLogUnregistered,
  kLogTls,
};

}  // namespace detail

// The channel's state and every operation on it. Defined in several files by concern:
// stream_channel.cpp (lifecycle, bookkeeping, close, metrics, public API), stream_connection.cpp
// (write and read paths, endings), stream_dial.cpp (connect, dns, connect timeout) and
// stream_listen.cpp (listeners) with stream_accept.cpp (accept, max_connections).
struct stream_channel::impl {
  using conn_impl = detail::conn_impl;
  using listener_impl = detail::listener_impl;
  using conn_state = detail::conn_state;

  detail::owner_thread owner;
  uv_loop_t* loop;
  stream_config cfg;
  stream_callbacks cb;
  stream_callbacks next_cb;  // set_callbacks() inside a callback: applied when it returns
  bool has_next_cb = false;
  int callback_depth = 0;
  error_info last_err;
  errc cfg_error = errc::ok;
  std::string cfg_detail;  // validate()'s detail for cfg_error
  size_t merge_cap;
  size_t seal_min_bytes;  // see kSealBatch
  size_t low_bytes;       // on_writable fires at or below these
  size_t low_packets;     //
  bool closed = false;
  bool owner_gone = false;
  int handles = 0;  // libuv handles/requests of the channel itself and of its listeners
  // A descriptor (/dev/null) held while the channel has a listener, closed to take waiting clients
  // off a backlog that accept() fails on for want of a descriptor: shed_backlog().
  int reserve_fd = -1;
  // Polls again the listeners whose accept failed (listener_impl::waiting) after kAcceptRetryMs;
  // active only while one waits, and then it keeps the loop alive as the listener did.
  uv_timer_t accept_timer{};
  uint64_t accept_errors = 0;  // accept() failures no shedding mended (tests: stream_access)

  uv_check_t check{};
  uv_idle_t idle{};
  bool idle_on = false;
  // Lines about events inside a member call (listen() replacing a stale socket file): logged from
  // the loop (flush_dirty()), since no callback fires inside a call (stream.h).
  struct deferred_line {
    size_t kind;
    log_level level;
    std::string text;
  };
  std::vector<deferred_line> deferred_logs;
  uv_timer_t sweep_timer{};                  // stalled half-frames, idle grown send rings (sweep())
  uint64_t sweep_period_ms = 0;              // every connection is looked at once in this time
  conn_impl* sweep_next = nullptr;           // where the next slice starts (nullptr: at the front)
  size_t sweep_slice = detail::kSweepSlice;  // tests set it lower (stream_access)
  size_t sweep_largest_slice = 0;            // the most connections one firing looked at (tests)
  uint64_t sweep_firings = 0;                // (tests)

  detail::conn_list conns;
  detail::listener_list listeners;
  detail::conn_table table;
  conn_impl* dirty_head = nullptr;

  // Accepted connections not yet mark_registered(), per source address (retired.unregistered_open
  // counts them all). An entry lives while its count is not 0: at most max_unregistered of them.
  std::unordered_map<detail::source_key, uint32_t, detail::source_hash> unregistered_by_source;
  std::vector<sockaddr_storage> test_dns_answer;  // detail::stream_access::set_dns_answer()
  detail::log_limiter log_limit;                  // on_log: per kind of event (log_kind)
  stream_channel_metrics retired;  // totals of connections already released, and event counts

  impl(uv_loop_t* l, const stream_config& c, stream_callbacks cbs);

  // Records the error (and its detail) as last_error() and returns it.
  errc fail(errc e, std::string detail = {});
  // A system call of listen() failed with uv_error (libuv's or a negative errno): kept in sys_error
  // for the detail ("too many open files"), mapped to an errc.
  errc sys_fail(int uv_error);
  // Closes the clients waiting on l's backlog with the reserve descriptor (at most kShedBatch);
  // how many. *end: the errno that stopped it (EAGAIN: the backlog is empty), 0 at the bound.
  uint64_t shed_backlog(listener_impl* l, int* end);
  // Opens the reserve descriptor if it is not; false if it cannot be (out of descriptors).
  bool reopen_reserve();
  int sys_error = 0;
  // A live connection's impl, or nullptr for a gone / unknown id.
  [[nodiscard]] conn_impl* find(connection_id id) const noexcept { return table.find(id); }
  [[nodiscard]] listener_impl* find(listener_id id) const noexcept;
  // Parses a listen/connect URL; on failure records last_error() naming the URL and the problem.
  errc check_url(std::string_view url, address* out);
  static uint64_t next_listener_id() noexcept;
  // Reports written_seq to on_written if it moved since the last report.
  void report_written(conn_impl* c);

  // One timer: closes connections stalled mid-frame for partial_frame_timeout_ms and frees the
  // grown send rings of connections quiet for send_ring_idle_ms, looking at every connection once
  // per sweep_period_ms, at most about kSweepSlice of them a firing.
  void sweep();
  void sweep_one(conn_impl* c, uint64_t now);
  static void on_sweep(uv_timer_t* t) { static_cast<impl*>(t->data)->sweep(); }
  void link(conn_impl* c);
  void unlink(conn_impl* c);
  void link(listener_impl* l);
  void unlink(listener_impl* l);
  void handle_released();
  void maybe_delete();
  conn_impl* new_conn(bool outbound, void* user);
  errc disconnect(conn_impl* c, disconnect_mode mode);
  void mark_dirty(conn_impl* c);
  void flush_dirty();
  // Called with the block still queued (in dynamic mode popping frees it).
  void count_sent(conn_impl* c, const write_queue::block& b);
  void note_queue_peak(conn_impl* c);  // before the queue shrinks
  // c's metrics with the queue gauges as they are now (complete_frame leaves them alone).
  static stream_connection_metrics live_metrics(const conn_impl* c);
  // Pops the blocks wholly covered by `written` bytes (reporting each delivered) and returns the
  // bytes of the next block already written.
  size_t consume(conn_impl* c, size_t written);
  // Pops the `count` blocks of a merged write of `len` bytes that went out whole (`span`, and
  // `payload` bytes of payload: the sum of their tags, write_queue::merge_front).
  void pop_merged(conn_impl* c, size_t len, size_t count, size_t span, uint64_t payload);
  void maybe_writable(conn_impl* c);
  void flush(conn_impl* c);
  void flush_queue(conn_impl* c);
  // A large frame at the front: it and the frames behind it go out in one writev(), large ones
  // straight from their queue blocks, small ones copied into the merge buffer (fewer system calls
  // than one write per large frame, and still no second copy of a large frame).
  size_t gather(const write_queue& q, uint8_t* mb, uv_buf_t* bufs, size_t* merged);
  void start_write(conn_impl* c, size_t offset);
  void on_write_done(conn_impl* c, int status);
  void maybe_shutdown(conn_impl* c);
  // Checks a send of `total` payload bytes and reserves its frame in c's queue; the payload goes
  // at frame + *hdr (the header's size, frame_header_size(total)). It and complete_frame() are
  // inlined into the three send entry points (stream_connection.cpp, where they are defined).
  [[gnu::always_inline]] inline uint8_t* reserve_frame(conn_impl* c, size_t total, size_t* hdr,
                                                       errc* err);
  // reserve_frame()'s rare cases (errors, the first send). These helpers stay out of line (cold,
  // noinline) so that the common path of a send inlines into its caller without a stack frame.
  [[gnu::cold, gnu::noinline]] uint8_t* reserve_unusual(conn_impl* c, size_t total, size_t* hdr,
                                                        errc* err);
  // A reservation refused with err: queue_full counts and asks for on_writable.
  [[gnu::cold, gnu::noinline]] void refused(conn_impl* c, errc err);
  // The payload is in place after the header room of hdr bytes: write the header (a checksum now,
  // or later in a batch: seal_frames), schedule.
  [[gnu::always_inline]] inline void complete_frame(conn_impl* c, uint8_t* frame, size_t hdr,
                                                    size_t total);
  // Hashes one frame at once (complete_frame() below seal_min_bytes) and counts it sealed.
  [[gnu::noinline]] static void seal_one(write_queue& q, uint8_t* frame, size_t hdr, size_t total);
  // Writes the checksums of every frame queued since the last call, kSealBatch at a time.
  [[gnu::noinline]] static void seal_frames(write_queue& q);
  errc send(conn_impl* c, const const_buffer* bufs, size_t n, uint64_t* seq);
  uint8_t* prepare_send(conn_impl* c, size_t size, errc* err);
  errc commit_send(conn_impl* c, uint64_t* seq);
  void cancel_send(conn_impl* c);
  static void alloc_cb(uv_handle_t* h, size_t, uv_buf_t* buf);
  static void read_cb(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  void on_read(conn_impl* c, ssize_t nread, const uv_buf_t* buf);
  void start_reading(conn_impl* c);
  // Decodes plaintext bytes into messages for on_received; false once c is no longer active.
  bool deliver(conn_impl* c, const uint8_t* data, size_t n);
  void end_conn(conn_impl* c, errc reason);
  void close_timer(conn_impl* c);
  // One libuv object referring to c is gone; the last one finishes the connection.
  void release(conn_impl* c);
  void remove_dirty(conn_impl* c);
  // Every queued packet failed, then the final callback. Runs once per connection.
  void report_final(conn_impl* c);
  void hand_back_unsent(conn_impl* c);
  // on_log, rate limited per kind (kinds: the log_kind enum of stream_channel.cpp).
  void log_event(size_t kind, log_level lv, const std::string& text);
  // The same from inside a member call: kept for the loop (deferred_logs), or close().
  void log_later(size_t kind, log_level lv, std::string text);
  void log_deferred();
  void start_idle();
  // Logs why a connection ended if that is worth a line (a corrupt or stalled peer).
  void log_end(const conn_impl* c, errc reason);
  void on_connected(conn_impl* c);
  void apply_tcp_options(conn_impl* c);
  void apply_unix_options(conn_impl* c);
  static void connect_cb(uv_connect_t* req, int status);
  // 0 or libuv's (negative) error: the caller keeps it for the reason and the detail.
  int start_tcp_connect(conn_impl* c, const sockaddr* sa);
  void try_next_address(conn_impl* c);
  // Gives up the attempt in flight (its error: e) and goes on with the next address once its
  // handle is closed.
  void abandon_attempt(conn_impl* c, errc e);
  static void resolved_cb(uv_getaddrinfo_t* req, int status, addrinfo* res);
  void start_connect_timer(conn_impl* c);
  static void connect_timer_cb(uv_timer_t* t);
  // The connect timer fired: the attempt's share is used up (next address) or the dial's time.
  void connect_timed_out(conn_impl* c);
  // A unix dial: to a path through libuv, to an abstract name connected here (libuv 1.44 cannot
  // name one) with the outcome due from the loop (c->abstract_due, finish_abstract_dial()).
  int start_unix_connect(conn_impl* c, const std::string& host);
  // Reports an abstract dial's outcome on the next loop turn through c's timer; false: no memory.
  bool finish_abstract_dial(conn_impl* c);
  errc connect(std::string_view url, connection_id* out, void* user);
  // The accept loop (stream_accept.cpp): l's socket is readable (or polling it failed).
  static void poll_cb(uv_poll_t* h, int status, int events);
  void on_readable(listener_impl* l);
  // fd came from l's accept4() (peer: its address): a connection, or closed over a cap.
  void take_accepted(listener_impl* l, int fd, const sockaddr_storage& peer);
  // accept() failed with err (an errno): sheds the backlog out of descriptors if the reserve makes
  // room, else logs, counts and stops polling l until the accept_timer.
  void accept_failed(listener_impl* l, int err);
  void pause_accepting(listener_impl* l);
  // accept_timer: every waiting listener is polled again.
  void resume_accepting();
  // Watches l->fd (bound and listening) with l->poll.
  errc start_polling(listener_impl* l);
  // A listener that failed in listen() or listen_fd(): its file removed, socket closed, freed.
  void discard_listener(listener_impl* l);
  // An accepted connection is ready (after its TLS handshake, if any): on_accepted.
  void accepted(conn_impl* c);
  // Counts c as unregistered, or refuses it over max_unregistered(_per_address): false then
  // (logged and counted; the caller closes it).
  bool admit_unregistered(const listener_impl* l, conn_impl* c);
  // c no longer counts as unregistered (marked registered, or released).
  void forget_unregistered(conn_impl* c);
  // A unix socket file at path: ok if there is none (any more), else why it cannot be bound.
  errc replace_stale_file(const std::string& path);
  errc listen_unix(listener_impl* l, const std::string& path);
  errc listen_tcp(listener_impl* l, const sockaddr* sa);
  errc listen(std::string_view url, listener_id* out, void* user);
  errc listen_fd(std::string_view url, int fd, listener_id* out, void* user);
  errc detach_listener(listener_impl* l, int* fd);
  // Removes the socket file only if it is still the one this listener created (another process
  // may have replaced a file it thought stale).
  static void remove_socket_file(listener_impl* l);
  errc close_listener(listener_impl* l);
  void close_all(bool with_callbacks);
  [[nodiscard]] stream_channel_metrics metrics() const;
  // Memory c's send path holds now (queue_memory_bytes): its queue's ring or blocks, and on a TLS
  // link its ciphertext buffers.
  [[nodiscard]] static size_t send_memory(const conn_impl* c) noexcept;

  // TLS links (stream_tls.cpp). The channel's own context (stream_config::tls), built on first use.
  std::shared_ptr<const detail::tls_context> default_tls;
  // The context for a listen or connect: per_call, else stream_config::tls (nullptr: clear).
  errc tls_context_for(const tls_config* per_call, std::shared_ptr<const detail::tls_context>* out);
  // At an accept: the listener's context built again when its certificate files changed (the
  // connections accepted from now on present the renewed certificate; a failed rebuild keeps the
  // old context, logged from the loop, and the next accept tries again). stream_tls.cpp.
  void refresh_listener_tls(listener_impl* l);
  errc listen_tls(std::string_view url, const tls_config* tls, listener_id* out, void* user);
  errc listen_fd_tls(std::string_view url, int fd, const tls_config* tls, listener_id* out,
                     void* user);
  errc connect_tls(std::string_view url, const tls_config* tls, connection_id* out, void* user);
  // TCP is up: creates the session, starts reading, the handshake and its deadline.
  void tls_start(conn_impl* c);
  // The most ciphertext the read side may leave waiting behind a stuck write (KeyUpdate replies):
  // the send queue's bound (ring_bytes, or max_bytes in dynamic mode).
  [[nodiscard]] size_t tls_reply_limit() const noexcept;
  void tls_on_read(conn_impl* c, ssize_t nread, const uv_buf_t* buf);
  void tls_handshake(conn_impl* c);
  // flush_queue()'s write: encrypts the batch (all of it) and sends the ciphertext; returns the
  // plaintext bytes taken, or a libuv error (the connection is then ended, and the error counted
  // once: a socket error in io_errors, a TLS one in tls_failed).
  int tls_write(conn_impl* c, const uv_buf_t* bufs, unsigned nbufs);
  // Sends the session's pending ciphertext: what the socket takes now, the rest with one uv_write
  // (c->writing). 0, or a libuv error (the caller ends the connection).
  int tls_send(conn_impl* c);
  void tls_write_done(conn_impl* c, int status);
  // Sends close_notify ahead of the shutdown; false: that write failed and ended the connection.
  bool tls_close_notify(conn_impl* c);
  // A TLS failure: logged with its detail, counted, the connection ended with e.
  void tls_fail(conn_impl* c, errc e, const std::string& detail);
  // A socket error (a libuv status) on a TLS link, counted once: before the link was announced
  // its handshake failed (tls_fail: tls_failed, logged naming `what`), afterwards an io_error.
  void tls_socket_error(conn_impl* c, int status, const char* what);
};

// The channel's .cpp files name these internal types unqualified.
using detail::add_totals;
using detail::conn_impl;
using detail::conn_state;
using detail::from_uv;
using detail::kAcceptBatch;
using detail::kAcceptRetryMs;
using detail::kFlushBudget;
using detail::kGatherBytes;
using detail::kLogAcceptFailed;
using detail::kLogBadHash;
using detail::kLogBadVarint;
using detail::kLogOversize;
using detail::kLogRejected;
using detail::kLogStaleFile;
using detail::kLogStalled;
using detail::kLogUnregistered;
using detail::kMaxGather;
using detail::kMaxKeepaliveS;
using detail::kMaxUnixSendBuffer;
using detail::kMinMergeBuffer;
using detail::kMinMergeWindow;
using detail::kSealBatch;
using detail::kShedBatch;
using detail::listener_impl;
using detail::literal_sockaddr;
using detail::next_merge_window;

}  // namespace uvbus
