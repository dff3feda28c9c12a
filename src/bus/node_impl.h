// The bus node's private state (node::impl). Member functions: node.cpp (lifecycle, helpers,
// public wrappers), node_delivery.cpp (sending, pending queues, reports, timers), node_link.cpp
// (links, registration), node_route.cpp (routed messages, forwarding, siblings, shm input,
// commands), node_call.cpp (request/reply), the other node_*.cpp (each says what it owns).
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
#include <random>
#include <unordered_map>

#include "bus/auth.h"
#include "bus/flow.h"
#include "bus/node_fanout.h"
#include "bus/node_grace.h"
#include "bus/node_secure.h"
#include "bus/node_types.h"
#include "bus/routing.h"
#include "bus/wire.h"
#include "core/ring_fifo.h"
#include "core/thread_check.h"
#include "core/u64_map.h"
#include "obs/http_endpoint.h"
#include "obs/prom_text.h"
#include "uvbus/address.h"
#include "uvbus/node.h"
#include "uvbus/shm.h"
#include "uvbus/stream.h"

namespace uvbus {

struct node::impl {
  using hop = detail::hop;
  using peer_kind = detail::peer_kind;
  using msg_type = proto::msg_type;
  using pending_msg = detail::pending_msg;
  using pending_queue = detail::pending_queue;
  using link = detail::link;
  using in_flight = detail::in_flight;
  using peer_ep = detail::peer_ep;
  using link_state = detail::link_state;
  using sib_state = detail::sib_state;
  using sibling_entry = detail::sibling_entry;
  using pending_reply = detail::pending_reply;
  using self_msg = detail::self_msg;
  using handles = detail::handles;

  uv_loop_t* loop;
  bus_id self;
  node_config cfg;
  node_callbacks cbs;
  detail::owner_thread owner;  // the constructing thread: every public call is checked against it
  error_info last_err;
  // Destruction from inside a callback: every user callback runs through fire(), which counts
  // the depth. ~node at depth > 0 only sets `dead` (no callback fires after that) and arms the
  // idle handle, whose callback (outside every channel callback) destroys the impl.
  bool dead = false;
  int cb_depth = 0;
  std::unique_ptr<node_callbacks> next_cbs;  // set_callbacks() from inside a callback
  detail::routing_table table;
  std::unique_ptr<stream_channel> streams;
  std::unique_ptr<shm_reader> reader;
  handles* h = nullptr;
  std::string host_id;
  std::string hostname;
  std::vector<std::string> listen_urls;
  std::unique_ptr<obs::http_endpoint> metrics_http;  // node_config::metrics_url
  // The trace context of the message on_data is delivering (node::incoming_trace()).
  const trace_context* incoming = nullptr;
  // strip_trace()'s output: the header without flag_trace, then the spans after the trace block.
  uint8_t strip_head[proto::kHeaderSize] = {};
  std::vector<const_buffer> strip_spans;
  // The stream listeners, with their URL as configured (detach_listeners()).
  std::vector<std::pair<std::string, listener_id>> stream_listeners;
  std::string shm_url;  // our ring, if any

  enum class run_state : uint8_t { idle, running, stopping, stopped } state = run_state::idle;
  bool is_up = false;
  bool parent_failed = false;      // refused for a configuration error: no more retries
  errc parent_refusal = errc::ok;  // ... and why (what sends return from then on)
  link* parent_link = nullptr;
  bus_id parent_id = 0;
  uint32_t reconnect_attempt = 0;  // reset by a parent link that stayed up reconnect_max_ms
  uint64_t parent_up_ms = 0;       // when the parent last accepted our registration
  size_t parent_index = 0;         // the entry of cfg.parent_urls tried now
  bool reconnect_armed = false;
  std::mt19937_64 rng{detail::mono_ns()};

  std::unordered_map<uint64_t, std::unique_ptr<link>> links;  // by stream connection id
  std::vector<link*> tick_links;  // tick()'s copy of `links`, its capacity kept between ticks
  std::unordered_map<bus_id, std::unique_ptr<peer_ep>> peers;
  std::unordered_map<bus_id, sibling_entry> siblings;
  pending_queue parent_pending;
  detail::reply_map replies;  // by sequence (deadlines grow with it): node_types.h
  // Message ids and sequences, unique per node. node::post() takes one at a time from next_seq
  // on any thread; the loop thread takes a block of kSeqBlock at once and hands them out with
  // plain increments (take_seq): a locked add per message waited for the store buffer to drain
  // the message's copies (perf of a TCP node sender: send_data 10.6 -> 8.2 % of samples without
  // it). Ids of one thread increase; across threads they are unique but not in taking order.
  static constexpr uint64_t kSeqBlock = 4096;
  std::atomic<uint64_t> next_seq{1};
  uint64_t seq_next = 0;  // the loop thread's block: [seq_next, seq_end)
  uint64_t seq_end = 0;
  uint64_t take_seq() noexcept {
    if (seq_next == seq_end) {
      seq_next = next_seq.fetch_add(kSeqBlock, std::memory_order_relaxed);
      seq_end = seq_next + kSeqBlock;
    }
    return seq_next++;
  }

  std::vector<std::pair<log_level, std::string>> deferred_logs;  // logged by a member function
  std::vector<delivery_report> deferred_reports;
  std::vector<self_msg> deferred_self;
  std::vector<std::pair<bus_id, errc>> deferred_down;
  bool deferred_up = false;
  bool stop_done_pending = false;
  std::vector<peer_ep*> shm_overflow;   // peers whose shm overflow needs retrying
  std::vector<proto::header> unstaged;  // relayed messages a ring's stage dropped: told later
  bool shm_paused = false;

  node_counters counters;
  // The last target's next hop (a stream of messages skips the lookups); cleared as peers change.
  bus_id cached_target = 0;
  peer_ep* cached_hop = nullptr;
  peer_ep* full_hop = nullptr;  // the hop (link or ring) of transmit()'s last queue_full
  std::vector<const_buffer> gather;
  detail::log_limiter peer_logs;  // the log lines a peer can repeat at will (peer_log)

  impl(uv_loop_t* l, bus_id id, node_config c, node_callbacks cb)
      : loop(l), self(id), cfg(std::move(c)), cbs(std::move(cb)), table(id, cfg.subnets) {
    incarnation = (rng() ^ (uint64_t{std::random_device{}()} << 32)) | 1;
    flow_seq_floor = 1 + (rng() & kFlowSeqBaseMask);
  }
  // -------------------------------------------------------------------------- child grace --
  // node_grace.cpp: relayed messages for children of ours not registered (yet, again).
  uint64_t started_ms = 0;
  detail::grace_state grace;  // children lost lately (and their subnets), what is held for them
  // True when it waits for its child, or (an id outside our subnets) for our reconnecting parent,
  // or was refused here (stopping, a full queue: transient); false: the caller refuses.
  bool hold_for_child(const proto::header& hd, const uint8_t* data, size_t size);
  void release_held(peer_ep* child);  // what is held for ids that route to it now
  void release_queue(peer_ep* child, pending_queue* q);
  void grace_tick(uint64_t now);
  void drop_relayed_for_stop();  // held and overflowing messages, their sources told
  // ---------------------------------------------------------------------------------- flows --
  // node_flow.cpp. incarnation: random, nonzero, per node object: this node's flow epoch as a
  // source and its incarnation as a target.
  uint64_t incarnation = 0;
  std::unordered_map<bus_id, detail::tx_flow> tx_flows;
  // node_config::latency_histograms: per user type (at most kMaxTypeHistograms types; the rest
  // under kOtherType, no user type's key). Per target: in its tx_flow.
  std::unordered_map<uint64_t, std::unique_ptr<latency_histogram>> type_latency;
  std::unordered_map<bus_id, detail::rx_flow> rx_flows;
  std::vector<bus_id> ack_queue;     // rx flows owing an acknowledgement (sent from the check)
  std::vector<bus_id> flow_blocked;  // tx flows that met a full queue (retried by the timer)
  bus_id cached_flow_target = 0;
  detail::tx_flow* cached_flow = nullptr;
  // The first sequence of a new flow: above every sequence of the flows forgotten so far. It
  // starts at a random point below 2^40 per incarnation, so a relay's drop notice (which names a
  // sequence, not an epoch) meant for a dead incarnation of this node never names one of this.
  static constexpr uint64_t kFlowSeqBaseMask = (uint64_t{1} << 40) - 1;
  uint64_t flow_seq_floor = 1;
  bus_id cached_rx_source = 0;  // the last source's rx flow: one hash lookup per run of messages
  detail::rx_flow* cached_rx = nullptr;
  detail::resync_limiter resync_limit;  // resyncs to sources without a position (node_flow.cpp)
  detail::tx_flow& tx_flow_for(bus_id target) {
    if (cached_flow != nullptr && cached_flow_target == target) return *cached_flow;
    return tx_flow_lookup(target);
  }
  detail::tx_flow& tx_flow_lookup(bus_id target);
  // Room for n bytes at the tail of f's buffer (nullptr: it cannot grow that far); flow_grow()
  // is the rare case of a buffer that must grow. flow_alloc, flow_reserve and flow_commit are
  // defined inline in node_flow_send.cpp, and only callable there.
  uint8_t* flow_alloc(detail::tx_flow& f, size_t n, size_t* offset);
  uint8_t* flow_grow(detail::tx_flow& f, size_t n, size_t* offset);
  errc flow_send(bus_id target, uint32_t type, const const_buffer* spans, size_t count, size_t size,
                 const send_options& opt, uint64_t message_id, bool* via_shm);
  // flow_send() in two steps: flow_reserve() writes the header and flow prefix of a message of
  // `size` payload bytes into f's retransmit buffer and returns where the payload goes (nullptr:
  // the buffer is full, queue_full); flow_commit() sends it (or queues it behind earlier ones) and
  // records it. Nothing else may allocate in f between the two; a failed commit takes the bytes
  // back, and so does flow_unreserve() (a cancelled reservation).
  struct flow_slot {
    size_t offset = 0;  // of the message in f.store
    size_t size = 0;    // header, prefixes and payload
  };
  // A flow message's send ended with e: counted when accepted, its id given.
  errc flow_sent(errc e, bool via_shm, uint64_t seq, uint64_t* message_id) {
    if (e != errc::ok) return e;
    ++counters.data_sent;
    ++(via_shm ? counters.data_sent_shm : counters.data_sent_stream);
    if (message_id != nullptr) *message_id = seq;
    return e;
  }
  uint8_t* flow_reserve(detail::tx_flow& f, uint32_t type, size_t size, const send_options& opt,
                        flow_slot* slot);
  errc flow_commit(detail::tx_flow& f, const flow_slot& slot, uint64_t message_id, bool* via_shm);
  static void flow_unreserve(detail::tx_flow& f, const flow_slot& slot) {
    f.store.tail = slot.offset;
  }
  void flow_pump(detail::tx_flow& f);  // sends what waits in order, from next_unsent
  void flow_block(detail::tx_flow& f);
  static void on_flow_timer(uv_timer_t* t);
  void pump_blocked();
  // Sends everything unacknowledged again, the first message flagged sync.
  void flow_resend(detail::tx_flow& f);
  // The resend timer: the first few unacknowledged messages again (the first flagged sync).
  void flow_probe(detail::tx_flow& f);
  // Removes the acknowledged front (reporting `status`) and any settled front entries.
  void flow_settle_front(detail::tx_flow& f, uint64_t through, errc status);
  void on_flow_ack(const proto::header& hd, const proto::flow_ack_body& a);
  void flow_drop_notice(bus_id target, uint64_t seq, errc why);
  // Adaptive resend timeout: max(resend_timeout_ms, 2 x smoothed acknowledgement time).
  void flow_sample_rtt(detail::tx_flow& f, uint64_t through);
  [[nodiscard]] uint32_t flow_base_rto(const detail::tx_flow& f) const;
  void flows_tick(uint64_t now);
  bool forget_idle_flow(const detail::tx_flow& f, uint64_t now);
  // The counters with the flow gauges counted now (flow_targets, flow_buffer_bytes).
  node_counters counters_now() const;
  // A link was lost (resend what is unacknowledged) or came up (send what waits).
  void flows_route_changed(bool lost);
  void flows_stop();
  void on_flow_data(link* from, const proto::header& hd, const uint8_t* body);
  void queue_ack(bus_id source, detail::rx_flow& r, proto::ack_kind k);
  void send_flow_ack(bus_id to, detail::rx_flow& r);
  static void on_ack_check(uv_check_t* c);
  void flush_acks();
  // A planned handover (docs/bus.md "Planned upgrade"): the target-side positions of every flow,
  // so the new process drops what the old one delivered (docs/protocol.md "Flow positions").
  [[nodiscard]] std::vector<uint8_t> flow_positions_export() const;
  // An acknowledged entry's send-to-acknowledgement time, into its target's and type's histograms.
  void record_latency(detail::tx_flow& f, const detail::tx_entry& e);
  // Whether flow sequence seq is one latency_histograms measures (1 in latency_sample_every).
  [[nodiscard]] bool latency_sampled(uint64_t seq) const noexcept {
    return cfg.latency_histograms && (seq & (cfg.latency_sample_every - 1)) == 0;
  }
  void latency_families(obs::prom_text* t) const;
  bool latency_to(bus_id target, latency_percentiles* out) const;
  bool latency_of_type(uint32_t type, latency_percentiles* out) const;
  static constexpr size_t kMaxTypeHistograms = 64;
  static constexpr uint64_t kOtherType = uint64_t{1} << 32;
  // cfg.inherit_flow_positions into rx_flows (validate() refused a blob it would not take).
  void flow_positions_import();
  // ------------------------------------------------------------------------------- helpers --
  // Calls a user callback (or a command callback) unless it is empty or the node was destroyed.
  template <class F, class... A>
  void fire(const F& f, A&&... a) {
    if (dead || !f) return;
    ++cb_depth;
    f(std::forward<A>(a)...);
    if (--cb_depth == 0 && next_cbs && !dead) {
      cbs = std::move(*next_cbs);
      next_cbs.reset();
    }
  }
  errc fail(errc e, std::string detail);  // for node::last_error(); returns e
  // The same for a refused send_data / send_datav / send_command (detail only for caller errors).
  errc send_failed(errc e, bus_id target, size_t size, const send_options* opt = nullptr);
  uint64_t now_ms() const { return uv_now(loop); }
  void log(log_level lv, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  // log() from the loop: for a line inside a member function, where no callback may fire.
  void log_later(log_level lv, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  void error(errc e, const std::string& what, detail::peer_log limit = detail::peer_log::none);
  void arm_idle();
  void defer_report(uint64_t tag, bus_id target, errc status, bool e2e);
  // Reports a message's channel-level fate: with require_response the channel outcome only
  // matters when it is a failure (success waits for the acknowledgement).
  void channel_outcome(uint64_t tag, bus_id target, errc status);
  bool still_owed(uint64_t tag) const;  // false: a require_response report already given
  endpoint_info info_of(const peer_ep& p) const;
  proto::node_info my_info() const;
  proto::header make_header(msg_type t, bus_id target, uint64_t seq) const;
  // Sends one link-local control message over a link's stream connection.
  errc send_control(link* lk, proto::header hd, const std::vector<uint8_t>& body);
  errc send_control(link* lk, proto::header hd, const uint8_t* body, size_t size);
  void close_link(link* lk, errc why, disconnect_mode mode = disconnect_mode::force);
  // ------------------------------------------------------------------------------ transmit --
  // Sends a routed message (data, forward, ack, command, reply) to a registered peer over shared
  // memory when it has a ring for us, else over its stream link. tag != 0 asks for a report.
  // bufs without its trace block, for a link below version 4: strip_spans (until the next call).
  void strip_trace(const const_buffer* bufs, size_t n);
  errc transmit(peer_ep* p, const const_buffer* bufs, size_t n, uint64_t tag, bus_id target,
                bool* via_shm = nullptr);
  errc transmit_bytes(peer_ep* p, const std::vector<uint8_t>& m, uint64_t tag, bus_id target);
  peer_ep* find_peer(bus_id id);
  peer_ep* parent_peer();
  bool queue_allowed(const pending_queue& q, size_t bytes) const;
  errc enqueue(pending_queue* q, const const_buffer* bufs, size_t n, size_t total, uint64_t tag,
               bus_id target);
  void fail_queue(pending_queue* q, errc why);
  void flush_queue(pending_queue* q, peer_ep* p);  // sends q's messages through p, in order
  void drain_backlog(peer_ep* p);  // p->backlog into its link as its queue takes it, in order
  // Routes a whole message (buffers, the first 32 bytes its header) that this node originates:
  // picks the next hop, queues while the link is coming up. The cached hop of the last target is
  // taken inline; route_lookup() is the rest.
  errc route_out(bus_id target, const const_buffer* bufs, size_t n, size_t total, uint64_t tag,
                 bool* via_shm) {
    if (cached_hop != nullptr && cached_target == target) {
      return transmit(cached_hop, bufs, n, tag, target, via_shm);
    }
    return route_lookup(target, bufs, n, total, tag, via_shm);
  }
  errc route_lookup(bus_id target, const const_buffer* bufs, size_t n, size_t total, uint64_t tag,
                    bool* via_shm);
  // route_out() for the application's own send: a stream hop that refused it owes on_writable
  errc user_route_out(bus_id target, const const_buffer* bufs, size_t n, size_t total, uint64_t tag,
                      bool* via_shm);
  errc blocked_by(peer_ep* p);  // the application's send met p's full queue: owes on_writable(p)
  // The common case of transmit() without a report, taken inline by a flow's first send and by a
  // relay: p's registered stream link when the message can go to it as it is (version 5 or later
  // takes every flag a routed message carries; no codec, no ring, not a sibling, whose idle clock
  // transmit() keeps). Else nullptr, and the caller uses transmit().
  static link* plain_stream(const peer_ep* p) noexcept {
    link* lk = p->lk;
    if (p->shm || p->kind == peer_kind::sibling || lk == nullptr) return nullptr;
    return lk->state == link_state::registered && lk->codec == 0 && lk->version >= 5 ? lk : nullptr;
  }
  // One whole message to a plain_stream() link (send(), not sendv(): a single span keeps the
  // channel's copy loop out of the inlined path, 40 instructions a message).
  errc send_plain(peer_ep* p, link* lk, const uint8_t* m, size_t size) {
    const errc e = streams->send(lk->conn, m, size);
    return e == errc::queue_full ? blocked_by(p) : e;
  }
  // A flow message's first send (without a report): to the cached hop's ring or stream link
  // when that takes it as it is, else through route_out().
  errc flow_out(bus_id target, const uint8_t* m, size_t total, bool* via_shm) {
    peer_ep* p = cached_target == target ? cached_hop : nullptr;
    if (p != nullptr && p->shm && plain_ring(p)) {
      if (!p->shm->coalescing()) (void)p->shm->coalesce(loop);
      const errc e = p->shm->send(m, total);
      // abandoned (retried) and not_connected (the stream instead): transmit() below.
      if (e != errc::abandoned && e != errc::not_connected) {
        *via_shm = e == errc::ok;
        return e == errc::queue_full ? blocked_by(p) : e;
      }
    } else if (link* lk = p != nullptr ? plain_stream(p) : nullptr; lk != nullptr) {
      *via_shm = false;
      return send_plain(p, lk, m, total);
    }
    const const_buffer b{m, total};
    return user_route_out(target, &b, 1, total, 0, via_shm);
  }
  // p's ring takes a routed message as it is: untagged, not a sibling's, and a link of version 5
  // or later (see plain_stream()).
  static bool plain_ring(const peer_ep* p) noexcept {
    return !p->shm_tagged && p->kind != peer_kind::sibling && p->lk != nullptr &&
           p->lk->version >= 5;
  }
  errc forward_out(peer_ep* p, const proto::header& hd, const uint8_t* data, size_t size,
                   const const_buffer* bufs);
  // -------------------------------------------------------------------------- prepare_data --
  // An open prepare_data() reservation (node_flow_send.cpp).
  struct prepared_send {
    bool open = false;
    bus_id target = 0;
    uint32_t type = 0;
    size_t size = 0;
    send_options opt;
    trace_context trace;              // opt.trace points here when the caller gave one
    detail::tx_flow* flow = nullptr;  // end_to_end to another node: the room is in its buffer
    flow_slot slot;                   // ... here
    std::vector<uint8_t> buf;         // otherwise the payload waits here
  } prep;
  uint8_t* prepare_data(bus_id target, uint32_t type, size_t size, const send_options& opt,
                        errc* err);
  errc commit_data(uint64_t* message_id);
  // cancel_data(), and stop() with a reservation open.
  void drop_prepared();
  // ----------------------------------------------------------------------------- send_data --
  // seq: the message id node::post() allocated already (0: allocate one).
  errc send_data(bus_id target, uint32_t type, const const_buffer* spans, size_t count,
                 const send_options& opt, uint64_t* message_id, uint64_t seq = 0);
  errc send_command(bus_id target, proto::command_id cmd, const void* args, size_t size,
                    command_cb cb);
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> self_replies;

  // ------------------------------------------------------------------------------ siblings --
  errc start_lookup(bus_id target);
  void sibling_via_parent(bus_id target, const char* why);
  void on_lookup(bus_id target, errc st, const uint8_t* p, size_t n);
  [[nodiscard]] std::string sibling_url(const std::vector<std::string>& listen,
                                        const std::string& host) const;
  // Connects to the sibling entry's node at url (state connecting), or routes its queue through
  // the parent when there is no URL or the connect fails at once.
  void dial_sibling(bus_id target, const std::string& url);

  // --------------------------------------------------------------------------------- links --
  link* add_link(connection_id c, bool outbound);
  void connect_parent();
  void schedule_reconnect();
  static void on_reconnect_timer(uv_timer_t* t);
  void registration_result(errc e, const std::string& detail);

  // ---------------------------------------------------------------------- stream callbacks --
  // Keeps the last link found (a read's frames come one after another); forget_link() first.
  link* link_of(connection_id c) const {
    if (c.value == last_link_id && last_link != nullptr) return last_link;
    auto it = links.find(c.value);
    if (it == links.end()) return nullptr;
    last_link_id = c.value;
    last_link = it->second.get();
    return last_link;
  }
  void forget_link() const noexcept { last_link = nullptr; }
  mutable uint64_t last_link_id = 0;
  mutable link* last_link = nullptr;
  void s_accepted(connection_id c);
  void s_connected(connection_id c, errc status);
  void s_disconnected(connection_id c, errc reason);
  // Cumulative stream reports: one pass over the link's FIFO of reported messages.
  void s_written(connection_id c, uint64_t written_through);
  void s_send_failed(connection_id c, uint64_t first, uint64_t last, errc reason);
  void s_unsent(connection_id c, const uint8_t* data, size_t size);
  void shm_unstaged(const uint8_t* data, size_t size);
  void s_writable(connection_id c);
  void s_received(connection_id c, const uint8_t* data, size_t size);
  void protocol_violation(link* lk, const char* what);
  [[gnu::cold, gnu::noinline]] void bad_body(link* from, const proto::header& hd, const char* why);

  // ------------------------------------------------------------------ handshake: connector --
  void on_challenge(link* lk, const proto::header& hd, const uint8_t* body);
  void on_register_reply(link* lk, const proto::header& hd, const uint8_t* body);

  // ------------------------------------------------------------------- handshake: acceptor --
  void refuse(link* lk, errc why, const std::string& msg, const proto::register_body& rb, size_t t);
  void on_register(link* lk, const proto::header& hd, const uint8_t* body);
  // Once a sibling is registered (on whichever link), its waiting messages go to it.
  void settle_sibling(bus_id id);
  bool accept_reply(link* lk, bus_id to, uint8_t version, const proto::register_body* rb = nullptr,
                    size_t token = 0);

  // ---- version 6, node_secure.cpp: registration extensions (proofs, codec), compression of data
  // messages on a link (spans / restored message valid until the next call; a bad one closes the
  // link), shared-memory writer tags (shm_accept strips the envelope; false: refused, counted).
  void register_ext(link* lk, const proto::challenge_body& ch, proto::register_body* rb);
  void reply_ext(link* lk, const proto::register_body& rb, size_t token, uint8_t version,
                 proto::register_reply_body* rr);
  bool check_reply_ext(link* lk, const proto::register_reply_body& rr, std::string* why);
  void compress_out(link* lk, const const_buffer** bufs, size_t* n);
  bool inflate_in(link* lk, const uint8_t** data, size_t* size);
  void shm_tag_peer(peer_ep* p);
  bool shm_accept(const uint8_t** data, size_t* size, bus_id* writer);
  std::unique_ptr<detail::link_security> sec = std::make_unique<detail::link_security>();
  std::unique_ptr<detail::fanout_state> fan = std::make_unique<detail::fanout_state>();
  // Moves a registered peer onto another (just registered) link and closes its old link quietly.
  void move_peer(peer_ep* p, link* to);
  peer_ep* add_peer(link* lk, peer_kind kind, proto::node_info info);
  void link_gone(link* lk, errc reason);  // a stream connection ended (or failed to connect)

  // ----------------------------------------------------------------------- routed messages --
  // Flow data for us without a trace block: on_routed()'s checks in one test (taken first).
  [[nodiscard]] bool plain_flow_data(const proto::header& hd) const {
    return hd.type == msg_type::data && hd.target == self &&
           (hd.flags & (proto::flag_flow | proto::flag_trace)) == proto::flag_flow;
  }
  void on_routed(link* from, const proto::header& hd, const uint8_t* data, size_t size);
  void on_local_data(link* from, const proto::header& hd, const uint8_t* body);
  const proto::header* owed_ack = nullptr;  // its require_response message in on_data (stop())
  void on_traced_data(link* from, const proto::header& hd, const uint8_t* body);
  void on_command(link* from, const proto::header& hd, const uint8_t* body);
  void on_notice(link* from, const proto::header& hd, const uint8_t* body);
  errc route_reply(bus_id target, const const_buffer* bufs, size_t total);
  void send_ack(bus_id to, uint64_t seq, proto::reason st);
  [[gnu::always_inline]] inline void forward(link* from, const proto::header& hd,
                                             const uint8_t* data, size_t size);
  // The header of a relayed message as it leaves: type forward (from data), one hop less.
  static void forward_header(const proto::header& hd, const uint8_t* data, uint8_t* head) {
    std::memcpy(head, data, proto::kHeaderSize);
    head[3] = static_cast<uint8_t>(hd.ttl - 1);
    if (hd.type == msg_type::data) head[1] = static_cast<uint8_t>(msg_type::forward);
  }
  // A relayed message (its header) is dropped here: count, log (rate-limited; not if !log_line)
  // and tell its source: an ack with the reason for require_response, else a drop notice (v2+).
  void relay_drop(const proto::header& hd, proto::reason why, bool log_line = true);
  void send_drop_notice(const proto::header& hd, proto::reason why);
  bool log_allowed(detail::peer_log kind);  // whether kind's burst has room (peer_logs)
  void flush_logs(uint64_t now);            // each kind's "N more" line once its window passed
  // A drop notice (or a late negative ack) for one of our messages.
  void on_drop_notice(uint64_t message_id, bus_id target, errc why);
  // The negotiated protocol version of a peer's link (0 if it has none).
  static uint8_t version_of(const peer_ep* p);
  // False when the overflow is full (not taken). push: pauses `from` (or the ring); keep: no one.
  bool overflow_push(peer_ep* p, link* from, const const_buffer* bufs, size_t size);
  bool overflow_keep(peer_ep* p, std::vector<uint8_t>* m);
  void drain_overflow(peer_ep* p);
  void resume_paused(peer_ep* p);
  void close_stalled_hop(link* lk, uint64_t now);  // node_delivery.cpp
  void restart_shm_reader();
  static void on_shm_records(void* user, const shm_record* recs, size_t count);

  // ------------------------------------------------------------------------------ commands --
  proto::reason lookup_child(const uint8_t* args, size_t n, std::string* out);
  std::string routes() const;
  std::string counters_text() const;
  std::string run_command(uint32_t cmd, const uint8_t* args, size_t n) const;

  // ---------------------------------------------------------------------------------- post --
  detail::mailbox mbox;
  std::vector<uint8_t> post_backlog;  // the swapped-out mailbox being run
  size_t post_offset = 0;
  std::vector<std::function<void()>> post_tasks;
  size_t post_task_next = 0;
  size_t post_batch_items = 0;  // records in post_backlog, and how many of them have run
  size_t post_batch_done = 0;
  bool post_blocked = false;  // a posted message met queue_full: retry on writable / tick
  bool posting = false;       // in run_posted(): a queue_full owes no on_writable (no call got it)
  errc post_message(bus_id target, uint32_t type, const void* data, size_t size,
                    const send_options& opt, uint64_t* message_id);
  errc post_task(std::function<void()> task);
  errc mailbox_refusal() const;
  bool mailbox_full(size_t need) const;
  void mailbox_append(const void* rec, const void* data, size_t size);
  void close_mailbox(detail::mailbox::status st);
  static void on_post_async(uv_async_t* a);
  errc run_posted(const uint8_t* at);
  void drain_posts();
  // Stopping: runs everything the mailbox accepted before stop() (no send can wait any more).
  void drain_posts_for_stop();
  bool posts_drained();
  // -------------------------------------------------------------------------------- timers --
  static void on_tick(uv_timer_t* t);
  void tick();
  void sibling_tick(uint64_t now);  // tick()'s part for the sibling entries
  void expire_queue(pending_queue* q, uint64_t now);
  static void on_idle(uv_idle_t* t);
  void run_deferred();
  // Stopping: nothing deferred is owed any more, so on_down(closed) may come.
  bool stop_settled();

  // -------------------------------------------------------------------------- start / stop --
  errc start();
  stream_config link_stream_config() const;
  void node_families(obs::prom_text* t) const;  // metrics (node_metrics.cpp)
  void peer_families(obs::prom_text* t) const;
  mutable detail::peer_metrics_memory peer_seen;  // what peer_families() read last
  void channel_families(obs::prom_text* t) const;
  [[nodiscard]] std::string metrics_text() const;
  errc start_metrics();
  void stop_metrics();
  std::unique_ptr<stream_channel> make_channel();
  // Opens the stream listeners and the shm ring of cfg.listen (their URLs into *urls).
  // Listens on u: on the inherited socket configured for u if there is one (node_handover.cpp).
  errc open_stream_listener(stream_channel* ch, const std::string& u, size_t index, listener_id* l);
  // Closes the inherited sockets that were not adopted (every return of start()).
  void close_inherited() noexcept;
  errc detach_listeners(std::vector<inherited_listener>* out);
  errc open_listeners(stream_channel* ch, std::unique_ptr<shm_reader>* rd,
                      std::vector<std::string>* urls);
  void open_handles();
  void start_timers();
  // Refuses start() (or another call) with a detail: last_error() and, from the loop, on_log.
  errc refuse_call(errc e, std::string detail);
  void stop();
  // stop(), second half (after the flows' flush, if any): goodbyes, graceful closes.
  void close_links_for_stop();
  // Whether a registered link is left: without one no acknowledgement can come (stop's wait ends).
  [[nodiscard]] bool any_registered_link() const {
    for (const auto& [id, lk] : links) {
      if (lk->state == link_state::registered) return true;
    }
    return false;
  }
  // While stop() waits for flows to be acknowledged: until when (0: not waiting).
  uint64_t stop_flush_until = 0;
  [[nodiscard]] bool flows_may_send() const {
    return state == run_state::running || stop_flush_until != 0;
  }
  std::vector<command_cb> deferred_cmd_fail;

  // ------------------------------------------------------------------------- request/reply --
  // node_call.cpp. A call is a data message whose payload starts with a call block (flag_call).
  std::vector<detail::call_slot> call_slots;
  std::vector<uint32_t> call_free;
  size_t calls_open = 0;
  // (deadline_ms, call id), a min-heap; entries of ended calls are skipped (and pruned: call()).
  std::vector<std::pair<uint64_t, uint64_t>> call_deadlines;
  uint64_t call_timer_at = 0;  // when h->calls fires (0: stopped)
  // The message id of each request still owed a report -> its call id: the report is the call's
  // (a failure ends it), never on_report's. A flat table (no allocation per call; tick() trims it).
  detail::u64_map call_by_message;
  // Calls ended without an answer from inside the node (stop(), a failed request's report from the
  // flow timer or a pending queue): their callbacks run from the loop, never from there.
  std::vector<std::pair<call_fn, errc>> deferred_call_fail;
  const reply_handle* incoming_req = nullptr;  // node::incoming_request()
  // Set around the send_data() of a call or an answer: the flag for the header.
  uint8_t send_call_flag = 0;
  errc call(bus_id target, uint32_t type, const void* data, size_t size, uint32_t timeout_ms,
            call_fn cb, const send_options& opt, uint64_t* call_id);
  errc answer(reply_handle& h, proto::call_kind kind, uint32_t code, const void* data, size_t size);
  // Every delivery to on_data goes through here: a request sets incoming_request(), an answer
  // ends its call instead of reaching on_data.
  void deliver(bus_id source, uint8_t flags, uint32_t type, const uint8_t* p, size_t n);
  // True when the report of message `message_id` belonged to a call (it is consumed here).
  bool call_report(uint64_t message_id, errc status);
  detail::call_slot* find_call(uint64_t call_id);
  // Ends call `call_id` (frees its slot, counts it) and returns its callback for the caller to run.
  call_fn take_call(uint64_t call_id, errc status);
  void finish_call(uint64_t call_id, const call_result& r);
  void arm_call_timer();
  static void on_call_timer(uv_timer_t* t);
  void fail_calls_for_stop();
  void run_deferred_calls();

  // ----------------------------------------------------------------------------- directory --
  // node_directory.cpp. Every other node known, by id, with the tree peer it was learned from.
  // Every change of an entry bumps fan->dir_gen (pick()'s cached matches).
  struct dir_item {
    directory_entry e;
    bus_id via = 0;
  };
  std::map<bus_id, dir_item> dir;
  uint64_t start_unix_ms = 0;
  [[nodiscard]] directory_entry self_entry() const;
  [[nodiscard]] bool dir_peer(const peer_ep* p) const;  // parent or child speaking version 5
  // dir_peer, or a tool (it gets the directory, never sends one); never from a tool node.
  [[nodiscard]] bool dir_sends_to(const peer_ep* p) const;
  void dir_link_up(peer_ep* p);
  // Asks again for entries left out once there is room, answers peers that asked (tick).
  void dir_tick(uint64_t now);
  void dir_link_gone(bus_id peer);
  void on_directory_msg(link* lk, const proto::header& hd, const uint8_t* body);
  void dir_upsert(peer_ep* from, std::vector<directory_entry>& entries, bool paced = true);
  // Whether a new entry (node `id`) fits under directory_max_entries; counts and logs it if not.
  bool dir_has_room(bus_id id);
  void dir_remove(peer_ep* from, const std::vector<bus_id>& ids, bool paced = true);
  // Sends b to every tree peer but `except` / to p (chunked); what meets a full queue waits in p
  // for dir_drain() (on_writable, tick): removals to send, a pass over the directory owed.
  void dir_broadcast(bus_id except, const proto::directory_body& b);
  void dir_send(peer_ep* p, const proto::directory_body& b);
  errc dir_out(peer_ep* p, const proto::directory_body& chunk);
  void dir_owe_pass(peer_ep* p);
  void dir_owe_removes(peer_ep* p, std::vector<bus_id>::const_iterator from,
                       std::vector<bus_id>::const_iterator to);
  void dir_drain(peer_ep* p);
  // ----------------------------------------------------------------------------- discovery --
  // node_discovery.cpp: node_config::discovery. Entries learned from etcd sit in `dir` with
  // via = kViaDiscovery (never flooded along the tree).
  static constexpr bus_id kViaDiscovery = ~bus_id{0};
  std::unique_ptr<etcd_discovery> disc;
  bool disc_parent_wanted = false;  // discovery_parent_type set, no parent chosen yet
  bool disc_rule = false;           // the parent comes from discovery_parent_type
  bus_id disc_parent = 0;           // the parent the rule chose (0: none)
  bool disc_stopping = false;       // stop()'s lease revoke is under way: on_down waits for it
  size_t disc_skipped = 0;          // etcd entries left out for want of room (dir_tick: again)
  // A parent is configured, or the discovery rule is still looking for one.
  [[nodiscard]] bool has_parent() const { return !cfg.parent_urls.empty() || disc_parent_wanted; }
  errc disc_start();
  void disc_stop();
  void disc_event(directory_event ev, const directory_entry& e);
  void disc_pick_parent();
  // A tree entry is going away: if etcd still lists the node, it stays as etcd's entry (a changed
  // event if it differs) and this returns true; false: the caller removes it.
  bool disc_keep(dir_item& item);
  // The chosen parent left etcd while we have no working link to it: choose again. Returns
  // true when it did (the reconnect to the old parent is off).
  bool disc_parent_left();
  // A node etcd lists that the tree does not know: its sibling entry, dialled directly (nullptr
  // when target is not such a node).
  detail::sibling_entry* disc_sibling(bus_id target);
  void maybe_finish_stop();
  void finish_stop();
  static void on_handle_closed(uv_handle_t* hd);
  void destroy();
};

// The node's .cpp files name these internal types unqualified.
using detail::call_slot;
using detail::handles;
using detail::hop;
using detail::in_flight;
using detail::kBusOverhead;
using detail::kMaxBusOverhead;
using detail::kMaxSpans;
using detail::kSiblingRetryMs;
using detail::kTagE2e;
using detail::link;
using detail::link_state;
using detail::mono_ns;
using detail::peer_ep;
using detail::peer_kind;
using detail::pending_msg;
using detail::pending_queue;
using detail::pending_reply;
using detail::role_of;
using detail::self_msg;
using detail::sib_state;
using detail::sibling_entry;
}  // namespace uvbus
