// The bus node. See include/uvbus/node.h for the contracts and docs/bus.md for the design.
//
// Structure: one stream_channel carries every peer link (handshake, heartbeats, and data unless
// shared memory is used); one optional shm_reader receives data that same-host peers write into
// our ring; one shm_writer per same-host peer that offers a ring. A periodic tick timer drives
// heartbeats and every timeout; a uv_idle handle runs deferred callbacks (so nothing calls back
// from inside a member function) and retries relays blocked on a full shared-memory ring.
#include "uvbus/node.h"

#include <uv.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <unordered_map>

#include "bus/auth.h"
#include "bus/routing.h"
#include "uvbus/address.h"
#include "uvbus/shm.h"
#include "uvbus/stream.h"

namespace uvbus {

using detail::hop;
using detail::peer_kind;
using proto::msg_type;

const char* to_string(channel_kind k) noexcept {
  switch (k) {
    case channel_kind::none:
      return "none";
    case channel_kind::stream:
      return "stream";
    case channel_kind::shm:
      return "shm";
  }
  return "unknown";
}

const char* to_string(peer_role r) noexcept {
  switch (r) {
    case peer_role::parent:
      return "parent";
    case peer_role::child:
      return "child";
    case peer_role::sibling:
      return "sibling";
    case peer_role::tool:
      return "tool";
  }
  return "unknown";
}

namespace {

constexpr size_t kBusOverhead = proto::kHeaderSize + proto::kDataPrefix;
constexpr uint32_t kSiblingRetryMs =
    5000;  // after a failed direct attempt, use the parent this long
constexpr size_t kMaxSpans = 64;

uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

peer_role role_of(peer_kind k) {
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
  uint64_t tag = 0;  // message id when a report is owed, else 0
  bus_id target = 0;
  uint64_t deadline_ms = 0;
};

struct pending_queue {
  std::deque<pending_msg> q;
  size_t bytes = 0;
};

struct link;

struct in_flight {
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
  bool shm_reader_paused = false;  // we stopped our shm reader because of this overflow
  bool user_blocked = false;       // a send_data() got queue_full: tell on_writable
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
  stream_connection* conn = nullptr;
  uint64_t conn_id = 0;
  link_state state = link_state::connecting;
  bool outbound = false;
  bool is_parent = false;
  proto::link_role role = proto::link_role::child;
  bus_id expect_id = 0;  // connector to a sibling: whom we expect
  uint8_t nonce[proto::kNonceSize] = {};
  uint64_t deadline_ms = 0;
  peer_ep* peer = nullptr;
  errc close_reason = errc::ok;  // set when we close it for a reason of our own
  bool paused = false;
  bool reported = false;  // parent link: on_registration already told about this attempt
  // Tags of reported packets sent on this link, in send order (the channel reports each
  // connection's packets in send order, so the front always matches the next report).
  std::deque<in_flight> reports;
};

enum class sib_state : uint8_t { lookup, connecting, via_parent };

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

struct self_msg {
  bus_id source;
  uint32_t type;
  std::vector<uint8_t> bytes;
  uint64_t seq;
  bool require_response;
};

// libuv handles live in their own heap block so their close callbacks may run after the node is
// destroyed; the last close callback frees the block.
struct handles {
  uv_timer_t tick{};
  uv_timer_t reconnect{};
  uv_idle_t idle{};
  int open = 0;
};

}  // namespace

struct node::impl {
  uv_loop_t* loop;
  bus_id self;
  node_config cfg;
  node_callbacks cbs;
  detail::routing_table table;
  std::unique_ptr<stream_channel> streams;
  std::unique_ptr<shm_reader> reader;
  handles* h = nullptr;
  std::string host_id;
  std::string hostname;
  std::vector<std::string> listen_urls;
  std::string shm_url;  // our ring, if any

  enum class run_state : uint8_t { idle, running, stopping, stopped } state = run_state::idle;
  bool is_up = false;
  bool parent_failed = false;  // refused for a configuration error: no more retries
  link* parent_link = nullptr;
  bus_id parent_id = 0;
  uint32_t reconnect_attempt = 0;
  bool reconnect_armed = false;
  std::mt19937_64 rng{mono_ns()};

  std::unordered_map<uint64_t, std::unique_ptr<link>> links;  // by stream connection id
  std::unordered_map<bus_id, std::unique_ptr<peer_ep>> peers;
  std::unordered_map<bus_id, sibling_entry> siblings;
  pending_queue parent_pending;
  std::map<uint64_t, pending_reply> replies;  // by sequence (deadlines grow with it)
  uint64_t next_seq = 1;

  std::vector<delivery_report> deferred_reports;
  std::vector<self_msg> deferred_self;
  std::vector<std::pair<bus_id, errc>> deferred_down;
  bool deferred_up = false;
  bool stop_done_pending = false;
  std::vector<peer_ep*> shm_overflow;  // peers whose shm overflow needs retrying
  bool shm_paused = false;

  node_counters counters;
  // The last target's next hop, so a stream of messages to one target skips the routing lookups.
  // Cleared whenever a peer comes or goes.
  bus_id cached_target = 0;
  peer_ep* cached_hop = nullptr;
  std::vector<const_buffer> gather;
  std::vector<shm_span> shm_gather;

  impl(uv_loop_t* l, bus_id id, node_config c, node_callbacks cb)
      : loop(l), self(id), cfg(std::move(c)), cbs(std::move(cb)), table(id, cfg.subnets) {}

  // --------------------------------------------------------------------------- helpers --
  uint64_t now_ms() const { return uv_now(loop); }

  void log(log_level lv, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    if (!cbs.on_log) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cbs.on_log(lv, buf);
  }
  void error(errc e, const std::string& what) {
    log(log_level::warn, "%s: %s", what.c_str(), to_string(e));
    if (cbs.on_error) cbs.on_error(e, what);
  }

  void arm_idle() {
    if (h != nullptr && !uv_is_active(reinterpret_cast<uv_handle_t*>(&h->idle))) {
      uv_idle_start(&h->idle, &impl::on_idle);
    }
  }
  void defer_report(uint64_t tag, bus_id target, errc status, bool e2e) {
    if (tag == 0) return;
    if (status == errc::ok) {
      ++counters.reports_ok;
    } else {
      ++counters.reports_failed;
    }
    if (!cbs.on_report) return;
    deferred_reports.push_back({tag, target, status, e2e});
    arm_idle();
  }
  // Reports a message's channel-level fate: with require_response the channel outcome only
  // matters when it is a failure (success waits for the acknowledgement).
  void channel_outcome(uint64_t tag, bus_id target, errc status) {
    if (tag == 0) return;
    auto it = replies.find(tag);
    if (it != replies.end()) {
      if (status == errc::ok) return;
      replies.erase(it);
    }
    defer_report(tag, target, status, false);
  }

  endpoint_info info_of(const peer_ep& p) const {
    endpoint_info e;
    e.id = p.id;
    e.role = role_of(p.kind);
    e.data_channel = p.shm ? channel_kind::shm : channel_kind::stream;
    e.info = p.info;
    e.rtt_ns = p.rtt_ns;
    return e;
  }

  proto::node_info my_info() const {
    proto::node_info n;
    n.id = self;
    n.pid = static_cast<uint32_t>(getpid());
    n.host_id = host_id;
    n.hostname = hostname;
    n.subnets = cfg.subnets;
    n.listen = listen_urls;
    return n;
  }

  proto::header make_header(msg_type t, bus_id target, uint64_t seq) const {
    proto::header hd;
    hd.type = t;
    hd.source = self;
    hd.target = target;
    hd.sequence = seq;
    hd.ttl = cfg.default_ttl;
    return hd;
  }

  // Sends one link-local control message over a link's stream connection.
  errc send_control(link* lk, proto::header hd, const std::vector<uint8_t>& body) {
    const std::vector<uint8_t> m = proto::build(hd, body);
    return streams->send(lk->conn, m.data(), m.size(), 0);
  }

  void close_link(link* lk, errc why, disconnect_mode mode = disconnect_mode::force) {
    if (lk->state == link_state::closing) return;
    lk->state = link_state::closing;
    if (lk->close_reason == errc::ok) lk->close_reason = why;
    (void)streams->disconnect(lk->conn, mode);
  }

  // --------------------------------------------------------------------------- transmit --
  // Sends a routed message (data, forward, ack, command, reply) to a registered peer over shared
  // memory when it has a ring for us, else over its stream link. tag != 0 asks for a report.
  errc transmit(peer_ep* p, const const_buffer* bufs, size_t n, uint64_t tag, bus_id target,
                bool* via_shm = nullptr) {
    // Traffic in either direction keeps a sibling link from being dropped as idle.
    if (p->kind == peer_kind::sibling) p->last_data_ms = now_ms();
    if (p->shm) {
      shm_gather.resize(n);
      for (size_t i = 0; i < n; ++i) shm_gather[i] = {bufs[i].data, bufs[i].size};
      errc e = p->shm->send(shm_gather.data(), n);
      // abandoned: we stalled mid-record (preempted past the reader's timeout) and the reader
      // skipped it, so the message was NOT delivered and sending it again cannot duplicate it.
      for (int retry = 0; e == errc::abandoned && retry < 3; ++retry) {
        ++counters.shm_abandoned_retries;
        e = p->shm->send(shm_gather.data(), n);
      }
      if (e == errc::ok) {
        if (via_shm != nullptr) *via_shm = true;
        if (tag != 0) channel_outcome(tag, target, errc::ok);
        return e;
      }
      if (e != errc::not_connected) return e;
      // The peer's reader is gone (it restarted or is dying): fall back to its stream link.
      log(log_level::info, "peer 0x%" PRIx64 ": shared memory reader gone, using the stream",
          p->id);
      p->shm.reset();
    }
    if (p->lk == nullptr || p->lk->state != link_state::registered) return errc::not_connected;
    const errc e = streams->send(p->lk->conn, bufs, n, tag);
    if (e == errc::ok && tag != 0) p->lk->reports.push_back({tag, target});
    if (e == errc::queue_full) p->user_blocked = true;
    if (via_shm != nullptr) *via_shm = false;
    return e;
  }

  errc transmit_bytes(peer_ep* p, const std::vector<uint8_t>& m, uint64_t tag, bus_id target) {
    const const_buffer b{m.data(), m.size()};
    return transmit(p, &b, 1, tag, target);
  }

  peer_ep* find_peer(bus_id id) {
    auto it = peers.find(id);
    return it == peers.end() ? nullptr : it->second.get();
  }

  peer_ep* parent_peer() {
    if (parent_link == nullptr || parent_link->state != link_state::registered) return nullptr;
    return parent_link->peer;
  }

  bool queue_allowed(const pending_queue& q, size_t bytes) const {
    return q.q.size() < cfg.pending_max_messages && q.bytes + bytes <= cfg.pending_max_bytes;
  }

  errc enqueue(pending_queue* q, const const_buffer* bufs, size_t n, size_t total, uint64_t tag,
               bus_id target) {
    if (cfg.pending_max_messages == 0) return errc::not_connected;
    if (!queue_allowed(*q, total)) return errc::queue_full;
    pending_msg m;
    m.bytes.resize(total);
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      if (bufs[i].size != 0) std::memcpy(m.bytes.data() + off, bufs[i].data, bufs[i].size);
      off += bufs[i].size;
    }
    m.tag = tag;
    m.target = target;
    m.deadline_ms = now_ms() + cfg.pending_timeout_ms;
    q->bytes += total;
    q->q.push_back(std::move(m));
    ++counters.pending_now;
    return errc::ok;
  }

  void fail_queue(pending_queue* q, errc why) {
    while (!q->q.empty()) {
      pending_msg& m = q->q.front();
      channel_outcome(m.tag, m.target, why);
      q->bytes -= m.bytes.size();
      q->q.pop_front();
      --counters.pending_now;
    }
  }

  // Sends a queue's messages through peer p, in order.
  void flush_queue(pending_queue* q, peer_ep* p) {
    while (!q->q.empty()) {
      pending_msg& m = q->q.front();
      const errc e = transmit_bytes(p, m.bytes, m.tag, m.target);
      if (e != errc::ok) channel_outcome(m.tag, m.target, e);
      q->bytes -= m.bytes.size();
      q->q.pop_front();
      --counters.pending_now;
    }
  }

  // Routes a whole message (given as buffers whose first 32 bytes are its header) that this node
  // originates: picks the next hop, queues while the link is coming up.
  errc route_out(bus_id target, const const_buffer* bufs, size_t n, size_t total, uint64_t tag,
                 bool* via_shm) {
    if (cached_hop != nullptr && cached_target == target) {
      return transmit(cached_hop, bufs, n, tag, target, via_shm);
    }
    const detail::route r = table.lookup(target);
    if (r.kind == hop::direct || r.kind == hop::child) {
      peer_ep* p = find_peer(r.next);
      if (p == nullptr) return errc::unknown_route;
      cached_target = target;
      cached_hop = p;
      return transmit(p, bufs, n, tag, target, via_shm);
    }
    if (r.kind == hop::self) return errc::invalid_argument;
    if (r.kind == hop::none && (table.owns(target) || cfg.parent_url.empty())) {
      return errc::unknown_route;
    }
    // Up through the parent, or directly to a sibling.
    if (cfg.sibling_direct && target != parent_id && parent_peer() != nullptr &&
        !table.owns(target)) {
      auto it = siblings.find(target);
      if (it == siblings.end()) {
        it = siblings.emplace(target, sibling_entry{}).first;
        if (start_lookup(target) != errc::ok) {
          it->second.state = sib_state::via_parent;
          it->second.until_ms = now_ms() + kSiblingRetryMs;
        }
      }
      sibling_entry& s = it->second;
      if (s.state == sib_state::via_parent && now_ms() >= s.until_ms) {
        s.state = sib_state::lookup;
        if (start_lookup(target) != errc::ok) {
          s.state = sib_state::via_parent;
          s.until_ms = now_ms() + kSiblingRetryMs;
        }
      }
      if (s.state != sib_state::via_parent) return enqueue(&s.pending, bufs, n, total, tag, target);
    }
    peer_ep* pp = parent_peer();
    if (pp != nullptr) {
      // Only cache the parent hop when no sibling entry could claim this target later.
      if (!cfg.sibling_direct || table.owns(target) || target == parent_id) {
        cached_target = target;
        cached_hop = pp;
      }
      return transmit(pp, bufs, n, tag, target, via_shm);
    }
    if (parent_failed) return errc::not_connected;
    return enqueue(&parent_pending, bufs, n, total, tag, target);
  }

  // ------------------------------------------------------------------------- send_data --
  errc send_data(bus_id target, uint32_t type, const data_span* spans, size_t count,
                 const send_options& opt, uint64_t* message_id) {
    if (state != run_state::running) return errc::closed;
    if (count > kMaxSpans || (spans == nullptr && count != 0)) return errc::invalid_argument;
    size_t size = 0;
    for (size_t i = 0; i < count; ++i) {
      if (spans[i].data == nullptr && spans[i].size != 0) return errc::invalid_argument;
      size += spans[i].size;
    }
    if (size > cfg.message_limit) return errc::message_too_large;
    const bool rr = opt.require_response;
    if (rr && replies.size() >= cfg.max_outstanding_responses) return errc::queue_full;
    const uint64_t seq = next_seq++;
    const uint64_t tag = (cbs.on_report || rr) ? seq : 0;
    if (target == self) {
      self_msg m{self, type, {}, seq, rr};
      m.bytes.reserve(size);
      for (size_t i = 0; i < count; ++i) {
        const auto* b = static_cast<const uint8_t*>(spans[i].data);
        m.bytes.insert(m.bytes.end(), b, b + spans[i].size);
      }
      deferred_self.push_back(std::move(m));
      arm_idle();
      ++counters.data_sent;
      if (message_id != nullptr) *message_id = seq;
      return errc::ok;
    }
    uint8_t head[kBusOverhead];
    proto::header hd = make_header(msg_type::data, target, seq);
    if (rr) hd.flags |= proto::flag_require_response;
    if (opt.ttl != 0) hd.ttl = opt.ttl;
    hd.body_len = static_cast<uint32_t>(proto::kDataPrefix + size);
    proto::encode_header(hd, head);
    proto::encode_data_prefix(type, head + proto::kHeaderSize);
    gather.resize(count + 1);
    gather[0] = {head, sizeof head};
    for (size_t i = 0; i < count; ++i) gather[i + 1] = {spans[i].data, spans[i].size};
    // Register the reply wait first: a shm send reports success synchronously.
    if (rr) replies[seq] = pending_reply{target, now_ms() + cfg.response_timeout_ms, {}, seq};
    bool via_shm = false;
    // gather may be reused by a nested call (transmit does not re-enter), so pass a copy pointer.
    const errc e =
        route_out(target, gather.data(), gather.size(), sizeof head + size, tag, &via_shm);
    if (e != errc::ok) {
      if (rr) replies.erase(seq);
      return e;
    }
    ++counters.data_sent;
    if (via_shm) {
      ++counters.data_sent_shm;
    } else {
      ++counters.data_sent_stream;
    }
    if (message_id != nullptr) *message_id = seq;
    return errc::ok;
  }

  errc send_command(bus_id target, proto::command_id cmd, const void* args, size_t size,
                    command_cb cb) {
    if (state != run_state::running) return errc::closed;
    if (!cb) return errc::invalid_argument;
    if (size > cfg.message_limit) return errc::message_too_large;
    if (replies.size() >= cfg.max_outstanding_responses) return errc::queue_full;
    const uint64_t seq = next_seq++;
    std::vector<uint8_t> body;
    proto::encode_command(static_cast<uint32_t>(cmd), args, size, &body);
    if (target == self) {
      std::string out =
          run_command(static_cast<uint32_t>(cmd), static_cast<const uint8_t*>(args), size);
      // Deliver from the loop, through the same reply path.
      replies[seq] = pending_reply{self, now_ms() + cfg.response_timeout_ms, std::move(cb), 0};
      std::vector<uint8_t> rb;
      proto::encode_command_reply(static_cast<uint32_t>(cmd), proto::reason::ok, out.data(),
                                  out.size(), &rb);
      self_replies.emplace_back(seq, std::move(rb));
      arm_idle();
      return errc::ok;
    }
    const std::vector<uint8_t> m = proto::build(make_header(msg_type::command, target, seq), body);
    replies[seq] = pending_reply{target, now_ms() + cfg.response_timeout_ms, std::move(cb), 0};
    const const_buffer b{m.data(), m.size()};
    const errc e = route_out(target, &b, 1, m.size(), 0, nullptr);
    if (e != errc::ok) replies.erase(seq);
    return e;
  }
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> self_replies;

  // ----------------------------------------------------------------------- siblings --
  errc start_lookup(bus_id target) {
    peer_ep* pp = parent_peer();
    if (pp == nullptr) return errc::not_connected;
    uint8_t arg[8];
    for (int i = 0; i < 8; ++i) arg[i] = static_cast<uint8_t>(target >> (8 * i));
    const uint64_t seq = next_seq++;
    std::vector<uint8_t> body;
    proto::encode_command(static_cast<uint32_t>(proto::command_id::lookup), arg, 8, &body);
    const std::vector<uint8_t> m = proto::build(make_header(msg_type::command, pp->id, seq), body);
    replies[seq] = pending_reply{
        pp->id, now_ms() + cfg.handshake_timeout_ms,
        [this, target](errc st, const uint8_t* p, size_t n) { on_lookup(target, st, p, n); }, 0};
    const errc e = transmit_bytes(pp, m, 0, pp->id);
    if (e != errc::ok) replies.erase(seq);
    return e;
  }

  void sibling_via_parent(bus_id target, const char* why) {
    auto it = siblings.find(target);
    if (it == siblings.end()) return;
    log(log_level::info, "sibling 0x%" PRIx64 ": %s, routing through the parent", target, why);
    it->second.state = sib_state::via_parent;
    it->second.until_ms = now_ms() + kSiblingRetryMs;
    peer_ep* pp = parent_peer();
    if (pp != nullptr) {
      flush_queue(&it->second.pending, pp);
    } else {
      // Keep order: the parent queue takes them (they still expire on their own deadlines).
      for (auto& m : it->second.pending.q) {
        parent_pending.bytes += m.bytes.size();
        parent_pending.q.push_back(std::move(m));
      }
      it->second.pending.q.clear();
      it->second.pending.bytes = 0;
    }
  }

  void on_lookup(bus_id target, errc st, const uint8_t* p, size_t n) {
    auto it = siblings.find(target);
    if (it == siblings.end() || it->second.state != sib_state::lookup) return;
    proto::node_info info;
    if (st != errc::ok || proto::parse_node_info(p, n, &info) != errc::ok || info.id != target) {
      sibling_via_parent(target, "not a direct child of the parent");
      return;
    }
    if (state != run_state::running) return;
    // Prefer a unix socket on the same host, else the first TCP address.
    std::string url;
    for (const std::string& u : info.listen) {
      address a;
      if (parse_address(u, &a) != errc::ok) continue;
      if (a.kind == scheme::unix_socket && info.host_id == host_id) {
        url = u;
        break;
      }
      if (url.empty() && a.is_stream() && a.kind != scheme::unix_socket) url = u;
    }
    if (url.empty()) {
      sibling_via_parent(target, "no stream address");
      return;
    }
    stream_connection* c = nullptr;
    if (streams->connect(url, &c) != errc::ok) {
      sibling_via_parent(target, "connect failed");
      return;
    }
    it->second.state = sib_state::connecting;
    link* lk = add_link(c, true);
    lk->role = proto::link_role::sibling;
    lk->expect_id = target;
  }

  // --------------------------------------------------------------------------- links --
  link* add_link(stream_connection* c, bool outbound) {
    auto lk = std::make_unique<link>();
    lk->conn = c;
    lk->conn_id = c->id();
    lk->outbound = outbound;
    lk->state = outbound ? link_state::connecting : link_state::await_register;
    lk->deadline_ms = now_ms() + cfg.handshake_timeout_ms +
                      (outbound ? cfg.handshake_timeout_ms : 0);  // connect + handshake
    c->set_user_data(lk.get());
    link* raw = lk.get();
    links[raw->conn_id] = std::move(lk);
    return raw;
  }

  void connect_parent() {
    if (state != run_state::running || cfg.parent_url.empty() || parent_link != nullptr ||
        parent_failed) {
      return;
    }
    stream_connection* c = nullptr;
    const errc e = streams->connect(cfg.parent_url, &c);
    if (e != errc::ok) {
      registration_result(e, "connect to the parent failed at once");
      schedule_reconnect();
      return;
    }
    parent_link = add_link(c, true);
    parent_link->is_parent = true;
    parent_link->role = proto::link_role::child;
  }

  void schedule_reconnect() {
    if (state != run_state::running || parent_failed || reconnect_armed) return;
    const double base = std::min<double>(
        cfg.reconnect_max_ms,
        cfg.reconnect_min_ms * std::pow(2.0, std::min<uint32_t>(reconnect_attempt, 30)));
    std::uniform_real_distribution<double> d(-cfg.reconnect_jitter, cfg.reconnect_jitter);
    const double delay = std::max(1.0, base * (1.0 + d(rng)));
    ++reconnect_attempt;
    reconnect_armed = true;
    uv_timer_start(&h->reconnect, &impl::on_reconnect_timer, static_cast<uint64_t>(delay), 0);
    log(log_level::info, "reconnecting to the parent in %.0f ms", delay);
  }

  static void on_reconnect_timer(uv_timer_t* t) {
    auto* self = static_cast<impl*>(t->data);
    self->reconnect_armed = false;
    ++self->counters.reconnects;
    self->connect_parent();
  }

  void registration_result(errc e, const std::string& detail) {
    if (cbs.on_registration) cbs.on_registration(e, detail);
  }

  // ---------------------------------------------------------------- stream callbacks --
  static impl* from(void* ctx) { return static_cast<impl*>(ctx); }
  static link* link_of(stream_connection* c) { return static_cast<link*>(c->user_data()); }

  static void s_accepted(void* ctx, stream_connection* c) {
    impl* n = from(ctx);
    link* lk = n->add_link(c, false);
    if (n->state != run_state::running) {
      n->close_link(lk, errc::closed);
      return;
    }
    proto::challenge_body ch;
    ch.min_version = n->cfg.protocol_min;
    ch.max_version = n->cfg.protocol_max;
    ch.acceptor_id = n->self;
    if (!detail::random_bytes(lk->nonce, sizeof lk->nonce)) {
      n->error(errc::io_error, "no random bytes for a registration nonce");
      n->close_link(lk, errc::io_error);
      return;
    }
    std::memcpy(ch.nonce, lk->nonce, sizeof lk->nonce);
    std::vector<uint8_t> body;
    proto::encode_challenge(ch, &body);
    if (n->send_control(lk, n->make_header(msg_type::challenge, 0, 0), body) != errc::ok) {
      n->close_link(lk, errc::io_error);
    }
  }

  static void s_connected(void* ctx, stream_connection* c, errc status) {
    impl* n = from(ctx);
    link* lk = link_of(c);
    if (lk == nullptr) return;
    if (status == errc::ok) {
      if (lk->state == link_state::connecting) lk->state = link_state::await_challenge;
      return;
    }
    // Failed: no on_disconnected follows.
    n->link_gone(lk, status);
  }

  static void s_disconnected(void* ctx, stream_connection* c, errc reason) {
    impl* n = from(ctx);
    link* lk = link_of(c);
    if (lk == nullptr) return;
    n->link_gone(lk, lk->close_reason != errc::ok ? lk->close_reason : reason);
  }

  static void s_written(void* ctx, stream_connection* c, uint64_t tag, errc status) {
    impl* n = from(ctx);
    if (tag == 0) return;
    link* lk = link_of(c);
    if (lk == nullptr) return;
    // Reports come in send order; the front entry is this packet.
    while (!lk->reports.empty()) {
      const in_flight f = lk->reports.front();
      lk->reports.pop_front();
      if (f.tag == tag) {
        n->channel_outcome(f.tag, f.target, status);
        return;
      }
      // Not expected (the channel reports every tagged packet), but never lose a report.
      n->channel_outcome(f.tag, f.target, errc::io_error);
    }
  }

  static void s_writable(void* ctx, stream_connection* c) {
    impl* n = from(ctx);
    link* lk = link_of(c);
    if (lk == nullptr || lk->peer == nullptr) return;
    peer_ep* p = lk->peer;
    n->drain_overflow(p);
    if (p->user_blocked && p->overflow.empty()) {
      p->user_blocked = false;
      if (n->cbs.on_writable) n->cbs.on_writable(p->id);
    }
  }

  static void s_received(void* ctx, stream_connection* c, const uint8_t* data, size_t size) {
    impl* n = from(ctx);
    link* lk = link_of(c);
    if (lk == nullptr || lk->state == link_state::closing) return;
    proto::header hd;
    if (proto::parse_header(data, size, &hd) != errc::ok) {
      n->protocol_violation(lk, "malformed bus header");
      return;
    }
    const uint8_t* body = data + proto::kHeaderSize;
    switch (lk->state) {
      case link_state::await_challenge:
        n->on_challenge(lk, hd, body);
        return;
      case link_state::await_register:
        n->on_register(lk, hd, body);
        return;
      case link_state::await_reply:
        n->on_register_reply(lk, hd, body);
        return;
      case link_state::registered:
        break;
      default:
        n->protocol_violation(lk, "message before the handshake");
        return;
    }
    peer_ep* p = lk->peer;
    p->last_rx_ms = n->now_ms();
    switch (hd.type) {
      case msg_type::ping: {
        std::vector<uint8_t> b(body, body + hd.body_len);
        proto::ping_body pb;
        if (proto::parse_ping(body, hd.body_len, &pb) != errc::ok) {
          n->protocol_violation(lk, "bad ping");
          return;
        }
        (void)n->send_control(lk, n->make_header(msg_type::pong, p->id, hd.sequence), b);
        return;
      }
      case msg_type::pong: {
        proto::ping_body pb;
        if (proto::parse_ping(body, hd.body_len, &pb) != errc::ok) {
          n->protocol_violation(lk, "bad pong");
          return;
        }
        const uint64_t now = mono_ns();
        if (now >= pb.send_time_ns) p->rtt_ns = now - pb.send_time_ns;
        return;
      }
      case msg_type::bye:
        n->log(log_level::info, "peer 0x%" PRIx64 " said goodbye", p->id);
        n->close_link(lk, errc::closed, disconnect_mode::graceful);
        return;
      case msg_type::challenge:
      case msg_type::register_req:
      case msg_type::register_reply:
        n->protocol_violation(lk, "handshake message on a registered link");
        return;
      default:
        break;
    }
    if (hd.source != p->id && !n->table.source_allowed(p->id, hd.source)) {
      n->protocol_violation(lk, "source id not allowed on this link");
      return;
    }
    if (p->kind == peer_kind::sibling) p->last_data_ms = p->last_rx_ms;
    n->on_routed(lk, hd, data, size);
  }

  void protocol_violation(link* lk, const char* what) {
    ++counters.protocol_errors;
    char buf[160];
    std::snprintf(buf, sizeof buf, "connection %" PRIu64 " (%s): %s", lk->conn_id,
                  lk->conn->peer_url().c_str(), what);
    error(errc::protocol_error, buf);
    close_link(lk, errc::protocol_error);
  }

  // ------------------------------------------------------------------ handshake: connector --
  void on_challenge(link* lk, const proto::header& hd, const uint8_t* body) {
    proto::challenge_body ch;
    if (hd.type != msg_type::challenge ||
        proto::parse_challenge(body, hd.body_len, &ch) != errc::ok) {
      protocol_violation(lk, "expected a challenge");
      return;
    }
    if (detail::negotiate_version(cfg.protocol_min, cfg.protocol_max, ch.min_version,
                                  ch.max_version) == 0) {
      // Send our register anyway: the acceptor refuses it with version_mismatch, which is the
      // reason both sides then log.
    }
    proto::register_body rb;
    rb.min_version = cfg.protocol_min;
    rb.max_version = cfg.protocol_max;
    rb.role = lk->role;
    rb.info = my_info();
    if (!cfg.access_tokens.empty()) {
      const std::vector<uint8_t> in = proto::auth_input(ch.nonce, self, lk->role);
      if (!detail::hmac_sha256(cfg.access_tokens.front(), in.data(), in.size(), rb.proof)) {
        protocol_violation(lk, "HMAC failed");
        return;
      }
    }
    std::vector<uint8_t> b;
    proto::encode_register(rb, &b);
    if (send_control(lk, make_header(msg_type::register_req, ch.acceptor_id, 0), b) != errc::ok) {
      close_link(lk, errc::io_error);
      return;
    }
    lk->state = link_state::await_reply;
  }

  void on_register_reply(link* lk, const proto::header& hd, const uint8_t* body) {
    proto::register_reply_body rr;
    if (hd.type != msg_type::register_reply ||
        proto::parse_register_reply(body, hd.body_len, &rr) != errc::ok) {
      protocol_violation(lk, "expected a registration reply");
      return;
    }
    errc result = proto::errc_from_reason(static_cast<uint16_t>(rr.status));
    if (result == errc::ok && lk->expect_id != 0 && rr.info.id != lk->expect_id) {
      result = errc::protocol_error;
      rr.message = "the sibling answered with another id";
    }
    if (result == errc::ok && lk->is_parent && rr.info.id == self) result = errc::duplicate_id;
    if (result != errc::ok) {
      log(log_level::warn, "registration to %s refused: %s (%s)", lk->conn->peer_url().c_str(),
          to_string(result), rr.message.c_str());
      lk->close_reason = result;
      if (lk->is_parent) {
        if (result == errc::access_denied || result == errc::out_of_subnet ||
            result == errc::version_mismatch) {
          parent_failed = true;
          fail_queue(&parent_pending, result);
        }
        lk->reported = true;
        registration_result(result, rr.message);
      }
      close_link(lk, result, disconnect_mode::graceful);
      return;
    }
    const peer_kind kind = lk->is_parent ? peer_kind::parent : peer_kind::sibling;
    if (kind == peer_kind::sibling) {
      if (peer_ep* old = find_peer(rr.info.id); old != nullptr) {
        // Both siblings connected to each other at once: keep the link the smaller id initiated
        // (both sides apply the same rule, so they keep the same connection).
        if (self < old->id && old->kind == peer_kind::sibling) {
          move_peer(old, lk);
        } else {
          close_link(lk, errc::duplicate_id, disconnect_mode::graceful);
        }
        settle_sibling(old->id);
        return;
      }
    }
    peer_ep* p = add_peer(lk, kind, std::move(rr.info));
    if (lk->is_parent) {
      parent_id = p->id;
      table.set_parent(p->id);
      reconnect_attempt = 0;
      is_up = true;
      log(log_level::info, "registered with parent 0x%" PRIx64, p->id);
      registration_result(errc::ok, rr.message);
      if (cbs.on_up) cbs.on_up(p->id);
      flush_queue(&parent_pending, p);
    } else {
      settle_sibling(p->id);
    }
  }

  // ------------------------------------------------------------------- handshake: acceptor --
  void refuse(link* lk, errc why, const std::string& msg, const proto::node_info& who) {
    ++counters.registrations_refused;
    char buf[256];
    std::snprintf(buf, sizeof buf, "refused registration of 0x%" PRIx64 " (pid %u, %s) from %s: %s",
                  who.id, who.pid, who.hostname.c_str(), lk->conn->peer_url().c_str(), msg.c_str());
    error(why, buf);
    proto::register_reply_body rr;
    rr.status = proto::reason_from_errc(why);
    rr.version = cfg.protocol_max;
    rr.info.id = self;
    rr.message = msg;
    std::vector<uint8_t> b;
    proto::encode_register_reply(rr, &b);
    (void)send_control(lk, make_header(msg_type::register_reply, who.id, 0), b);
    close_link(lk, why, disconnect_mode::graceful);
  }

  void on_register(link* lk, const proto::header& hd, const uint8_t* body) {
    proto::register_body rb;
    if (hd.type != msg_type::register_req ||
        proto::parse_register(body, hd.body_len, &rb) != errc::ok) {
      protocol_violation(lk, "expected a registration");
      return;
    }
    const proto::node_info& who = rb.info;
    const uint8_t version = detail::negotiate_version(cfg.protocol_min, cfg.protocol_max,
                                                      rb.min_version, rb.max_version);
    if (version == 0) {
      refuse(lk, errc::version_mismatch, "no common protocol version", who);
      return;
    }
    if (!cfg.access_tokens.empty()) {
      const std::vector<uint8_t> in = proto::auth_input(lk->nonce, who.id, rb.role);
      if (!detail::verify_proof(cfg.access_tokens, in.data(), in.size(), rb.proof)) {
        refuse(lk, errc::access_denied, "no matching access token", who);
        return;
      }
    }
    peer_kind kind = peer_kind::child;
    errc ok = errc::ok;
    if (rb.role == proto::link_role::child) {
      ok = table.check_child(who.id, who.subnets);
    } else {
      kind = rb.role == proto::link_role::sibling ? peer_kind::sibling : peer_kind::tool;
      ok = table.check_peer(who.id);
      if (ok == errc::ok && table.owns(who.id)) ok = errc::out_of_subnet;
      peer_ep* old = find_peer(who.id);
      if (ok == errc::duplicate_id && kind == peer_kind::sibling && old != nullptr &&
          old->kind == peer_kind::sibling && who.id < self) {
        // The simultaneous-connect rule (see on_register_reply): the smaller id's link wins.
        if (!accept_reply(lk, who.id, version)) return;
        move_peer(old, lk);
        return;
      }
    }
    if (ok != errc::ok) {
      char msg[128];
      if (ok == errc::out_of_subnet) {
        std::snprintf(msg, sizeof msg, "id 0x%" PRIx64 " or its subnets are outside ours", who.id);
      } else {
        std::snprintf(msg, sizeof msg, "id 0x%" PRIx64 " is already registered", who.id);
      }
      refuse(lk, ok, msg, who);
      return;
    }
    if (!accept_reply(lk, who.id, version)) return;
    log(log_level::info, "accepted %s 0x%" PRIx64 " (pid %u on %s)", detail::to_string(kind),
        who.id, who.pid, who.hostname.c_str());
    peer_ep* p = add_peer(lk, kind, who);
    // A sibling we were about to connect to connected to us first.
    if (kind == peer_kind::sibling) settle_sibling(p->id);
  }

  // Once a sibling is registered (on whichever link), its waiting messages go to it.
  void settle_sibling(bus_id id) {
    auto it = siblings.find(id);
    peer_ep* p = find_peer(id);
    if (it == siblings.end() || p == nullptr) return;
    flush_queue(&it->second.pending, p);
    siblings.erase(it);
  }

  bool accept_reply(link* lk, bus_id to, uint8_t version) {
    ++counters.registrations_accepted;
    proto::register_reply_body rr;
    rr.status = proto::reason::ok;
    rr.version = version;
    rr.info = my_info();
    std::vector<uint8_t> b;
    proto::encode_register_reply(rr, &b);
    if (send_control(lk, make_header(msg_type::register_reply, to, 0), b) != errc::ok) {
      close_link(lk, errc::io_error);
      return false;
    }
    return true;
  }

  // Moves a registered peer onto another (just registered) link and closes its old link quietly.
  void move_peer(peer_ep* p, link* to) {
    link* old = p->lk;
    old->peer = nullptr;
    old->close_reason = errc::duplicate_id;
    to->peer = p;
    to->state = link_state::registered;
    p->lk = to;
    close_link(old, errc::duplicate_id, disconnect_mode::graceful);
  }

  peer_ep* add_peer(link* lk, peer_kind kind, proto::node_info info) {
    auto p = std::make_unique<peer_ep>();
    p->id = info.id;
    p->kind = kind;
    p->info = std::move(info);
    p->lk = lk;
    p->last_rx_ms = p->last_ping_ms = p->last_data_ms = now_ms();
    lk->peer = p.get();
    lk->state = link_state::registered;
    // Every peer's subnets are kept for source checks (a sibling relays for its descendants);
    // only children's take part in routing.
    table.add(p->id, kind, p->info.subnets);
    // Same host and a ring offered: our data for it goes through shared memory.
    if (cfg.enable_shm && kind != peer_kind::tool && p->info.host_id == host_id) {
      for (const std::string& u : p->info.listen) {
        address a;
        if (parse_address(u, &a) != errc::ok || a.kind != scheme::shm) continue;
        auto w = std::make_unique<shm_writer>();
        const errc e = w->open(a);
        if (e == errc::ok) {
          p->shm = std::move(w);
        } else {
          log(log_level::info,
              "peer 0x%" PRIx64 ": shared memory %s unusable (%s), using the stream", p->id,
              u.c_str(), to_string(e));
        }
        break;
      }
    }
    peer_ep* raw = p.get();
    peers[raw->id] = std::move(p);
    cached_hop = nullptr;
    if (cbs.on_endpoint_added) cbs.on_endpoint_added(info_of(*raw));
    return raw;
  }

  // A stream connection ended (or failed to connect).
  void link_gone(link* lk, errc reason) {
    std::unique_ptr<link> owned;
    auto it = links.find(lk->conn_id);
    if (it != links.end()) {
      owned = std::move(it->second);
      links.erase(it);
    }
    lk->conn->set_user_data(nullptr);
    // Anything still awaiting a channel report on this link failed with it (the channel reports
    // every packet before on_disconnected, so this is only a safety net).
    while (!lk->reports.empty()) {
      channel_outcome(lk->reports.front().tag, lk->reports.front().target, reason);
      lk->reports.pop_front();
    }
    if (peer_ep* p = lk->peer; p != nullptr) {
      cached_hop = nullptr;
      counters.forward_dropped += p->overflow.size();
      resume_paused(p);
      const endpoint_info info = info_of(*p);
      table.remove(p->id);
      shm_overflow.erase(std::remove(shm_overflow.begin(), shm_overflow.end(), p),
                         shm_overflow.end());
      peers.erase(p->id);
      log(log_level::info, "%s 0x%" PRIx64 " gone: %s", to_string(info.role), info.id,
          to_string(reason));
      if (cbs.on_endpoint_removed) cbs.on_endpoint_removed(info, reason);
    }
    if (lk->is_parent) {
      const bool was_up = is_up;
      parent_link = nullptr;
      is_up = false;
      table.clear_parent();
      if (lk->peer == nullptr && state == run_state::running && !lk->reported) {
        registration_result(reason, "connection to the parent failed");
      }
      if (was_up && state == run_state::running && cbs.on_down) cbs.on_down(reason);
      // Siblings being looked up wait in the parent queue now.
      for (auto& [id, s] : siblings) {
        if (s.state == sib_state::lookup) sibling_via_parent(id, "parent lost");
      }
      schedule_reconnect();
    } else if (lk->outbound && lk->expect_id != 0 && lk->peer == nullptr) {
      if (find_peer(lk->expect_id) != nullptr) {
        settle_sibling(lk->expect_id);
      } else {
        sibling_via_parent(lk->expect_id, to_string(reason));
      }
    }
    maybe_finish_stop();
  }

  // ------------------------------------------------------------------- routed messages --
  void on_routed(link* from, const proto::header& hd, const uint8_t* data, size_t size) {
    if (hd.target != self) {
      forward(from, hd, data, size);
      return;
    }
    const uint8_t* body = data + proto::kHeaderSize;
    switch (hd.type) {
      case msg_type::data:
      case msg_type::forward: {
        proto::data_body d;
        if (proto::parse_data(body, hd.body_len, &d) != errc::ok) {
          if (from != nullptr) protocol_violation(from, "bad data body");
          return;
        }
        ++counters.data_received;
        if (cbs.on_data) cbs.on_data(hd.source, d.user_type, d.payload, d.size);
        if ((hd.flags & proto::flag_require_response) != 0) {
          send_ack(hd.source, hd.sequence, proto::reason::ok);
        }
        return;
      }
      case msg_type::ack: {
        proto::ack_body a;
        if (proto::parse_ack(body, hd.body_len, &a) != errc::ok) {
          if (from != nullptr) protocol_violation(from, "bad ack");
          return;
        }
        auto it = replies.find(a.acked_sequence);
        if (it == replies.end() || it->second.cb) return;  // late (already timed out)
        const bus_id target = it->second.target;
        replies.erase(it);
        defer_report(a.acked_sequence, target,
                     proto::errc_from_reason(static_cast<uint16_t>(a.status)), true);
        return;
      }
      case msg_type::command: {
        proto::command_body c;
        if (proto::parse_command(body, hd.body_len, &c) != errc::ok) {
          if (from != nullptr) protocol_violation(from, "bad command");
          return;
        }
        proto::reason st = proto::reason::ok;
        std::string out;
        if (c.command == static_cast<uint32_t>(proto::command_id::lookup)) {
          st = lookup_child(c.args, c.args_size, &out);
        } else if (c.command == static_cast<uint32_t>(proto::command_id::routes) ||
                   c.command == static_cast<uint32_t>(proto::command_id::counters) ||
                   c.command == static_cast<uint32_t>(proto::command_id::echo)) {
          out = run_command(c.command, c.args, c.args_size);
        } else {
          st = proto::reason::invalid_argument;
        }
        std::vector<uint8_t> b;
        proto::encode_command_reply(c.command, st, out.data(), out.size(), &b);
        const std::vector<uint8_t> m =
            proto::build(make_header(msg_type::command_reply, hd.source, hd.sequence), b);
        const const_buffer cb{m.data(), m.size()};
        (void)route_reply(hd.source, &cb, m.size());
        return;
      }
      case msg_type::command_reply: {
        proto::command_reply_body r;
        if (proto::parse_command_reply(body, hd.body_len, &r) != errc::ok) {
          if (from != nullptr) protocol_violation(from, "bad command reply");
          return;
        }
        auto it = replies.find(hd.sequence);
        if (it == replies.end() || !it->second.cb) return;
        command_cb cb = std::move(it->second.cb);
        replies.erase(it);
        cb(proto::errc_from_reason(static_cast<uint16_t>(r.status)), r.result, r.result_size);
        return;
      }
      default:
        if (from != nullptr) protocol_violation(from, "unexpected message type");
        return;
    }
  }

  // Replies and acks go back along the normal route but never wait in a sibling queue.
  errc route_reply(bus_id target, const const_buffer* bufs, size_t total) {
    const detail::route r = table.lookup(target);
    peer_ep* p = nullptr;
    if (r.kind == hop::direct || r.kind == hop::child || r.kind == hop::parent) {
      p = find_peer(r.next);
    }
    if (p == nullptr) {
      if (r.kind == hop::none && !cfg.parent_url.empty() && !table.owns(target) && !parent_failed) {
        return enqueue(&parent_pending, bufs, 1, total, 0, target);
      }
      return errc::unknown_route;
    }
    return transmit(p, bufs, 1, 0, target);
  }

  void send_ack(bus_id to, uint64_t seq, proto::reason st) {
    std::vector<uint8_t> b;
    proto::encode_ack({seq, st}, &b);
    const std::vector<uint8_t> m = proto::build(make_header(msg_type::ack, to, next_seq++), b);
    const const_buffer cb{m.data(), m.size()};
    (void)route_reply(to, &cb, m.size());
  }

  void forward(link* from, const proto::header& hd, const uint8_t* data, size_t size) {
    const bool rr = (hd.flags & proto::flag_require_response) != 0 &&
                    (hd.type == msg_type::data || hd.type == msg_type::forward);
    auto drop = [&](proto::reason why) {
      ++counters.forward_dropped;
      if (rr) send_ack(hd.source, hd.sequence, why);
    };
    if (hd.ttl == 0) {
      ++counters.ttl_expired;
      log(log_level::warn, "dropping message 0x%" PRIx64 " -> 0x%" PRIx64 ": TTL expired",
          hd.source, hd.target);
      drop(proto::reason::ttl_expired);
      return;
    }
    peer_ep* p = nullptr;
    if (cached_hop != nullptr && cached_target == hd.target) {
      p = cached_hop;
    } else {
      const detail::route r = table.lookup(hd.target);
      if (r.kind == hop::direct || r.kind == hop::child || r.kind == hop::parent) {
        p = find_peer(r.next);
        // Relayed traffic never takes a sibling shortcut, so any hop found here may be cached.
        if (p != nullptr) {
          cached_target = hd.target;
          cached_hop = p;
        }
      }
    }
    // Never send a message back where it came from (the parent does not know the target either).
    if (p == nullptr || (from != nullptr && from->peer == p)) {
      drop(proto::reason::unknown_route);
      return;
    }
    uint8_t head[proto::kHeaderSize];
    std::memcpy(head, data, proto::kHeaderSize);
    head[3] = static_cast<uint8_t>(hd.ttl - 1);
    if (hd.type == msg_type::data) head[1] = static_cast<uint8_t>(msg_type::forward);
    const const_buffer bufs[2] = {{head, sizeof head},
                                  {data + proto::kHeaderSize, size - proto::kHeaderSize}};
    if (!p->overflow.empty()) {
      overflow_push(p, from, bufs, size);
      return;
    }
    const errc e = transmit(p, bufs, 2, 0, hd.target);
    if (e == errc::ok) {
      ++counters.forwarded;
      return;
    }
    if (e == errc::queue_full) {
      overflow_push(p, from, bufs, size);
      return;
    }
    drop(proto::reason_from_errc(e));
  }

  void overflow_push(peer_ep* p, link* from, const const_buffer* bufs, size_t size) {
    if (p->overflow_bytes + size > cfg.forward_overflow_bytes) {
      ++counters.forward_dropped;
      return;
    }
    std::vector<uint8_t> m(size);
    std::memcpy(m.data(), bufs[0].data, bufs[0].size);
    std::memcpy(m.data() + bufs[0].size, bufs[1].data, bufs[1].size);
    p->overflow_bytes += size;
    p->overflow.push_back(std::move(m));
    // Back-pressure: stop reading the link (or the ring) that feeds this hop until it drains.
    if (from != nullptr) {
      if (!from->paused && streams->pause_reading(from->conn) == errc::ok) {
        from->paused = true;
        p->paused_links.push_back(from->conn_id);
      }
    } else if (!shm_paused && reader) {
      reader->stop();
      shm_paused = true;
      p->shm_reader_paused = true;
    }
    if (p->shm && std::find(shm_overflow.begin(), shm_overflow.end(), p) == shm_overflow.end()) {
      shm_overflow.push_back(p);
      arm_idle();
    }
  }

  void drain_overflow(peer_ep* p) {
    while (!p->overflow.empty()) {
      const std::vector<uint8_t>& m = p->overflow.front();
      const errc e = transmit_bytes(p, m, 0, 0);
      if (e == errc::queue_full) return;
      if (e == errc::ok) {
        ++counters.forwarded;
      } else {
        ++counters.forward_dropped;
      }
      p->overflow_bytes -= m.size();
      p->overflow.pop_front();
    }
    resume_paused(p);
  }

  void resume_paused(peer_ep* p) {
    for (uint64_t id : p->paused_links) {
      auto it = links.find(id);
      if (it != links.end() && it->second->paused) {
        it->second->paused = false;
        (void)streams->resume_reading(it->second->conn);
      }
    }
    p->paused_links.clear();
    if (p->shm_reader_paused) {
      p->shm_reader_paused = false;
      restart_shm_reader();
    }
  }

  void restart_shm_reader() {
    if (!shm_paused || !reader || state != run_state::running) return;
    for (peer_ep* q : shm_overflow) {
      if (q->shm_reader_paused) return;
    }
    shm_paused = false;
    (void)reader->start(loop, &impl::on_shm_records, this);
  }

  static void on_shm_records(void* user, const shm_record* recs, size_t count) {
    impl* n = static_cast<impl*>(user);
    // Liveness is refreshed once per run of records from one source, not per record.
    bus_id last_source = n->self;
    // A callback may stop the node mid-batch: nothing more is delivered then.
    for (size_t i = 0; i < count && n->state == run_state::running; ++i) {
      proto::header hd;
      if (proto::parse_header(recs[i].data, recs[i].size, &hd) != errc::ok) {
        ++n->counters.protocol_errors;
        continue;
      }
      switch (hd.type) {
        case msg_type::data:
        case msg_type::forward:
        case msg_type::ack:
        case msg_type::command:
        case msg_type::command_reply:
          if (hd.source != last_source) {
            last_source = hd.source;
            if (peer_ep* p = n->find_peer(hd.source); p != nullptr) {
              p->last_rx_ms = n->now_ms();
              p->last_data_ms = p->last_rx_ms;
            }
          }
          n->on_routed(nullptr, hd, recs[i].data, recs[i].size);
          break;
        default:
          ++n->counters.protocol_errors;
          break;
      }
    }
  }

  // ------------------------------------------------------------------------ commands --
  proto::reason lookup_child(const uint8_t* args, size_t n, std::string* out) {
    if (n != 8) return proto::reason::invalid_argument;
    uint64_t id = 0;
    for (int i = 7; i >= 0; --i) id = (id << 8) | args[i];
    peer_ep* p = find_peer(id);
    if (p == nullptr || p->kind != peer_kind::child) return proto::reason::unknown_route;
    std::vector<uint8_t> b;
    proto::encode_node_info(p->info, &b);
    out->assign(b.begin(), b.end());
    return proto::reason::ok;
  }

  std::string routes() const {
    std::string s;
    char buf[256];
    std::snprintf(buf, sizeof buf, "self 0x%" PRIx64 "\n", self);
    s += buf;
    for (const subnet& net : cfg.subnets) s += "subnet " + net.to_string() + "\n";
    for (const auto& [id, p] : peers) {
      std::snprintf(buf, sizeof buf, "%s 0x%" PRIx64 " via %s rtt_us=%" PRIu64 " host=%s",
                    detail::to_string(p->kind), id, p->shm ? "shm" : "stream", p->rtt_ns / 1000,
                    p->info.hostname.c_str());
      s += buf;
      for (const subnet& net : p->info.subnets) s += " subnet=" + net.to_string();
      s += "\n";
    }
    return s;
  }

  std::string counters_text() const {
    std::string s;
    char buf[96];
    auto add = [&](const char* k, uint64_t v) {
      std::snprintf(buf, sizeof buf, "%s=%" PRIu64 "\n", k, v);
      s += buf;
    };
    const node_counters& c = counters;
    add("data_sent", c.data_sent);
    add("data_sent_stream", c.data_sent_stream);
    add("data_sent_shm", c.data_sent_shm);
    add("data_received", c.data_received);
    add("forwarded", c.forwarded);
    add("forward_dropped", c.forward_dropped);
    add("ttl_expired", c.ttl_expired);
    add("reports_ok", c.reports_ok);
    add("reports_failed", c.reports_failed);
    add("pending_now", c.pending_now);
    add("registrations_accepted", c.registrations_accepted);
    add("registrations_refused", c.registrations_refused);
    add("reconnects", c.reconnects);
    add("heartbeat_timeouts", c.heartbeat_timeouts);
    add("protocol_errors", c.protocol_errors);
    add("shm_abandoned_retries", c.shm_abandoned_retries);
    add("peers", peers.size());
    return s;
  }

  std::string run_command(uint32_t cmd, const uint8_t* args, size_t n) const {
    switch (static_cast<proto::command_id>(cmd)) {
      case proto::command_id::routes:
        return routes();
      case proto::command_id::counters:
        return counters_text();
      case proto::command_id::echo:
        return {reinterpret_cast<const char*>(args), n};
      default:
        return {};
    }
  }

  // --------------------------------------------------------------------------- timers --
  static void on_tick(uv_timer_t* t) { static_cast<impl*>(t->data)->tick(); }

  void tick() {
    const uint64_t now = now_ms();
    std::vector<link*> expired;
    for (auto& [id, lk] : links) {
      if (lk->state == link_state::closing) continue;
      if (lk->state != link_state::registered) {
        if (now >= lk->deadline_ms) expired.push_back(lk.get());
        continue;
      }
      peer_ep* p = lk->peer;
      if (now - p->last_rx_ms > cfg.heartbeat_timeout_ms) {
        ++counters.heartbeat_timeouts;
        log(log_level::warn, "%s 0x%" PRIx64 " silent for %" PRIu64 " ms: dropping",
            detail::to_string(p->kind), p->id, now - p->last_rx_ms);
        close_link(lk.get(), errc::timeout);
        continue;
      }
      if (p->kind == peer_kind::sibling && now - p->last_data_ms > cfg.sibling_idle_ms) {
        std::vector<uint8_t> b;
        proto::encode_bye({proto::reason::closing}, &b);
        (void)send_control(lk.get(), make_header(msg_type::bye, p->id, 0), b);
        close_link(lk.get(), errc::closed, disconnect_mode::graceful);
        continue;
      }
      if (now - p->last_ping_ms >= cfg.heartbeat_interval_ms) {
        p->last_ping_ms = now;
        std::vector<uint8_t> b;
        proto::encode_ping({mono_ns()}, &b);
        (void)send_control(lk.get(), make_header(msg_type::ping, p->id, next_seq++), b);
      }
    }
    for (link* lk : expired) {
      log(log_level::warn, "connection %s: handshake timed out", lk->conn->peer_url().c_str());
      close_link(lk, errc::timeout);
    }
    expire_queue(&parent_pending, now);
    for (auto it = siblings.begin(); it != siblings.end();) {
      expire_queue(&it->second.pending, now);
      if (it->second.state == sib_state::via_parent && now >= it->second.until_ms &&
          it->second.pending.q.empty()) {
        it = siblings.erase(it);
      } else {
        ++it;
      }
    }
    // Replies: deadlines grow with the sequence only per kind, so scan everything (bounded by the
    // messages in flight with require_response, which the pending limits keep small).
    std::vector<std::pair<uint64_t, pending_reply>> late;
    for (auto it = replies.begin(); it != replies.end();) {
      if (now >= it->second.deadline_ms) {
        late.emplace_back(it->first, std::move(it->second));
        it = replies.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& [seq, r] : late) {
      if (r.cb) {
        r.cb(errc::timeout, nullptr, 0);
      } else {
        defer_report(r.report_tag, r.target, errc::timeout, true);
      }
    }
  }

  void expire_queue(pending_queue* q, uint64_t now) {
    while (!q->q.empty() && now >= q->q.front().deadline_ms) {
      pending_msg& m = q->q.front();
      channel_outcome(m.tag, m.target, errc::timeout);
      q->bytes -= m.bytes.size();
      q->q.pop_front();
      --counters.pending_now;
    }
  }

  static void on_idle(uv_idle_t* t) { static_cast<impl*>(t->data)->run_deferred(); }

  void run_deferred() {
    // Retry relays blocked on a full ring (no wake-up exists for ring space).
    if (!shm_overflow.empty()) {
      std::vector<peer_ep*> ps = shm_overflow;
      for (peer_ep* p : ps) {
        drain_overflow(p);
        if (p->overflow.empty()) {
          shm_overflow.erase(std::remove(shm_overflow.begin(), shm_overflow.end(), p),
                             shm_overflow.end());
        }
      }
      restart_shm_reader();
    }
    if (deferred_up) {
      deferred_up = false;
      if (cbs.on_up) cbs.on_up(self);
    }
    if (!deferred_self.empty()) {
      std::vector<self_msg> msgs;
      msgs.swap(deferred_self);
      for (self_msg& m : msgs) {
        ++counters.data_received;
        if (cbs.on_data) cbs.on_data(m.source, m.type, m.bytes.data(), m.bytes.size());
        const bool tracked = m.require_response || cbs.on_report;
        if (m.require_response) replies.erase(m.seq);
        if (tracked) defer_report(m.seq, self, errc::ok, m.require_response);
      }
    }
    if (!self_replies.empty()) {
      auto rs = std::move(self_replies);
      self_replies.clear();
      for (auto& [seq, body] : rs) {
        auto it = replies.find(seq);
        if (it == replies.end()) continue;
        command_cb cb = std::move(it->second.cb);
        replies.erase(it);
        proto::command_reply_body r;
        if (proto::parse_command_reply(body.data(), body.size(), &r) == errc::ok && cb) {
          cb(errc::ok, r.result, r.result_size);
        }
      }
    }
    if (!deferred_reports.empty()) {
      std::vector<delivery_report> rs;
      rs.swap(deferred_reports);
      for (const delivery_report& r : rs) {
        if (cbs.on_report) cbs.on_report(r);
      }
      if (deferred_reports.empty()) {
        rs.clear();
        deferred_reports.swap(rs);  // keep the capacity: no allocation per message
      }
    }
    if (stop_done_pending) {
      stop_done_pending = false;
      finish_stop();
    }
    if (deferred_reports.empty() && deferred_self.empty() && self_replies.empty() &&
        shm_overflow.empty() && !deferred_up && !stop_done_pending && h != nullptr) {
      uv_idle_stop(&h->idle);
    }
  }

  // ---------------------------------------------------------------------- start / stop --
  errc start() {
    if (state != run_state::idle) return errc::closed;
    const errc v = node::validate(self, cfg);
    if (v != errc::ok) return v;
    host_id = cfg.host_id.empty() ? detail::host_identity() : cfg.host_id;
    hostname = detail::host_name();

    stream_config sc;
    sc.message_limit = std::max<size_t>(cfg.message_limit + kBusOverhead, size_t{64} * 1024);
    sc.queue.mode = queue_mode::static_ring;
    sc.queue.ring_bytes = std::max(cfg.link_queue_bytes, 2 * (sc.message_limit + 64));
    sc.queue.max_bytes = sc.queue.ring_bytes;
    sc.queue.max_blocks = cfg.link_queue_packets;
    sc.report_written = static_cast<bool>(cbs.on_report);
    sc.tcp_nodelay = cfg.tcp_nodelay;
    sc.connect_timeout_ms = cfg.handshake_timeout_ms;
    stream_callbacks scb;
    scb.ctx = this;
    scb.on_accepted = &impl::s_accepted;
    scb.on_connected = &impl::s_connected;
    scb.on_disconnected = &impl::s_disconnected;
    scb.on_received = &impl::s_received;
    scb.on_written = &impl::s_written;
    scb.on_writable = &impl::s_writable;
    auto ch = std::make_unique<stream_channel>(loop, sc, scb);

    std::vector<std::string> urls;
    std::unique_ptr<shm_reader> rd;
    for (const std::string& u : cfg.listen) {
      address a;
      (void)parse_address(u, &a);  // validated
      if (a.kind == scheme::shm) {
        rd = std::make_unique<shm_reader>();
        shm_config shc;
        shc.ring_bytes = cfg.shm_ring_bytes;
        shc.abandon_timeout_us = cfg.shm_abandon_timeout_us;
        shc.max_record_size = static_cast<uint32_t>(
            std::max<size_t>(cfg.message_limit + kBusOverhead, size_t{64} * 1024));
        const errc e = rd->open(a, shc);
        if (e != errc::ok) return e;
        shm_url = a.to_string();
        urls.push_back(shm_url);
        continue;
      }
      stream_listener* l = nullptr;
      const errc e = ch->listen(u, &l);
      if (e != errc::ok) {
        ch.reset();
        if (rd) rd->close();
        return e;
      }
      urls.push_back(l->url());
    }
    if (rd) {
      const errc e = rd->start(loop, &impl::on_shm_records, this);
      if (e != errc::ok) {
        rd->close();
        return e;
      }
    }
    streams = std::move(ch);
    reader = std::move(rd);
    listen_urls = std::move(urls);

    h = new handles;
    h->tick.data = h->reconnect.data = h->idle.data = this;
    uv_timer_init(loop, &h->tick);
    uv_timer_init(loop, &h->reconnect);
    uv_idle_init(loop, &h->idle);
    h->open = 3;
    uint64_t period =
        std::min({cfg.heartbeat_interval_ms, cfg.heartbeat_timeout_ms, cfg.handshake_timeout_ms,
                  cfg.pending_timeout_ms, cfg.response_timeout_ms}) /
        4;
    period = std::clamp<uint64_t>(period, 5, 250);
    uv_timer_start(&h->tick, &impl::on_tick, period, period);

    state = run_state::running;
    if (cfg.parent_url.empty()) {
      is_up = true;
      deferred_up = true;
      arm_idle();
    } else {
      connect_parent();
    }
    return errc::ok;
  }

  void stop() {
    if (state != run_state::running) return;
    state = run_state::stopping;
    fail_queue(&parent_pending, errc::closed);
    for (auto& [id, s] : siblings) fail_queue(&s.pending, errc::closed);
    siblings.clear();
    std::vector<std::pair<uint64_t, pending_reply>> rs(replies.begin(), replies.end());
    replies.clear();
    for (auto& [seq, r] : rs) {
      if (r.cb) {
        command_cb cb = std::move(r.cb);
        deferred_cmd_fail.push_back(std::move(cb));
      } else {
        defer_report(r.report_tag, r.target, errc::closed, true);
      }
    }
    uv_timer_stop(&h->reconnect);
    for (auto& [id, lk] : links) {
      if (lk->state == link_state::registered) {
        std::vector<uint8_t> b;
        proto::encode_bye({proto::reason::closing}, &b);
        (void)send_control(lk.get(), make_header(msg_type::bye, lk->peer->id, 0), b);
      }
      if (lk->state != link_state::closing) {
        lk->state = link_state::closing;
        if (lk->close_reason == errc::ok) lk->close_reason = errc::closed;
        (void)streams->disconnect(lk->conn, disconnect_mode::graceful);
      }
    }
    // Only stop the reader here: stop() may be called from on_data inside the ring's callback,
    // where closing the ring is not allowed. finish_stop() (from the loop) closes and removes it.
    if (reader) reader->stop();
    maybe_finish_stop();
  }
  std::vector<command_cb> deferred_cmd_fail;

  void maybe_finish_stop() {
    if (state != run_state::stopping || !links.empty()) return;
    stop_done_pending = true;
    arm_idle();
  }

  void finish_stop() {
    if (state != run_state::stopping) return;
    state = run_state::stopped;
    is_up = false;
    if (reader) reader->close();
    for (auto& [id, p] : peers) {
      if (p->shm) p->shm->close();
    }
    streams->close();
    uv_timer_stop(&h->tick);
    auto cmds = std::move(deferred_cmd_fail);
    deferred_cmd_fail.clear();
    for (auto& cb : cmds) cb(errc::closed, nullptr, 0);
    if (cbs.on_down) cbs.on_down(errc::closed);
  }

  static void on_handle_closed(uv_handle_t* hd) {
    auto* hs = static_cast<handles*>(hd->data);
    if (--hs->open == 0) delete hs;
  }

  void destroy() {
    if (h != nullptr) {
      h->tick.data = h->reconnect.data = h->idle.data = h;
      uv_close(reinterpret_cast<uv_handle_t*>(&h->tick), &impl::on_handle_closed);
      uv_close(reinterpret_cast<uv_handle_t*>(&h->reconnect), &impl::on_handle_closed);
      uv_close(reinterpret_cast<uv_handle_t*>(&h->idle), &impl::on_handle_closed);
      h = nullptr;
    }
    if (reader) reader->close();
    peers.clear();
    // The channel's destructor closes everything without callbacks.
    streams.reset();
    links.clear();
  }
};

// ------------------------------------------------------------------------------ node --
node::node(uv_loop_t* loop, bus_id id, node_config cfg, node_callbacks cbs)
    : impl_(new impl(loop, id, std::move(cfg), std::move(cbs))) {}

node::~node() {
  impl_->destroy();
  delete impl_;
}

errc node::validate(bus_id id, const node_config& cfg) {
  (void)id;
  if (cfg.subnets.size() > proto::kMaxSubnets || cfg.listen.size() > proto::kMaxListen) {
    return errc::invalid_argument;
  }
  for (const subnet& s : cfg.subnets) {
    if (!s.valid()) return errc::invalid_argument;
  }
  int shm_count = 0;
  for (const std::string& u : cfg.listen) {
    address a;
    if (parse_address(u, &a) != errc::ok || u.size() > proto::kMaxUrlBytes) {
      return errc::invalid_argument;
    }
    if (a.kind == scheme::shm) ++shm_count;
    if (a.kind == scheme::mem) return errc::invalid_argument;
  }
  if (shm_count > 1) return errc::invalid_argument;
  if (!cfg.parent_url.empty()) {
    address a;
    if (parse_address(cfg.parent_url, &a) != errc::ok || !a.is_stream()) {
      return errc::invalid_argument;
    }
  }
  if (cfg.protocol_min == 0 || cfg.protocol_min > cfg.protocol_max) return errc::invalid_argument;
  if (cfg.message_limit == 0 || cfg.message_limit > (size_t{1} << 30)) {
    return errc::invalid_argument;
  }
  if (cfg.handshake_timeout_ms == 0 || cfg.heartbeat_interval_ms == 0 ||
      cfg.heartbeat_timeout_ms == 0 || cfg.pending_timeout_ms == 0 ||
      cfg.response_timeout_ms == 0 || cfg.reconnect_min_ms == 0 ||
      cfg.reconnect_min_ms > cfg.reconnect_max_ms || cfg.sibling_idle_ms == 0) {
    return errc::invalid_argument;
  }
  if (!(cfg.reconnect_jitter >= 0 && cfg.reconnect_jitter <= 1)) return errc::invalid_argument;
  if (cfg.default_ttl == 0 || cfg.link_queue_packets == 0) return errc::invalid_argument;
  for (const std::string& t : cfg.access_tokens) {
    if (t.empty()) return errc::invalid_argument;
  }
  return errc::ok;
}

errc node::start() {
  return impl_->start();
}
void node::stop() {
  impl_->stop();
}
bool node::running() const noexcept {
  return impl_->state == impl::run_state::running;
}
bool node::up() const noexcept {
  return impl_->is_up;
}

errc node::send_data(bus_id target, uint32_t type, const void* data, size_t size,
                     const send_options& opt, uint64_t* message_id) {
  if (data == nullptr && size != 0) return errc::invalid_argument;
  const data_span s{data, size};
  return impl_->send_data(target, type, &s, 1, opt, message_id);
}

errc node::send_data(bus_id target, uint32_t type, const data_span* spans, size_t count,
                     const send_options& opt, uint64_t* message_id) {
  return impl_->send_data(target, type, spans, count, opt, message_id);
}

errc node::send_command(bus_id target, proto::command_id command, const void* args, size_t size,
                        command_cb cb) {
  if (args == nullptr && size != 0) return errc::invalid_argument;
  return impl_->send_command(target, command, args, size, std::move(cb));
}

bus_id node::id() const noexcept {
  return impl_->self;
}
std::vector<std::string> node::listen_urls() const {
  return impl_->listen_urls;
}

std::vector<endpoint_info> node::peers() const {
  std::vector<endpoint_info> v;
  for (const auto& [id, p] : impl_->peers) v.push_back(impl_->info_of(*p));
  return v;
}

bool node::peer(bus_id id, endpoint_info* out) const {
  auto it = impl_->peers.find(id);
  if (it == impl_->peers.end()) return false;
  *out = impl_->info_of(*it->second);
  return true;
}

node_counters node::counters() const noexcept {
  return impl_->counters;
}
std::string node::routes_text() const {
  return impl_->routes();
}
const node_config& node::config() const noexcept {
  return impl_->cfg;
}

}  // namespace uvbus
