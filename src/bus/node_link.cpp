// Bus node, links: stream connections to peers, the stream channel's callbacks and the
// registration handshake (connector and acceptor side), up to a registered peer.
#include "bus/node_impl.h"

namespace uvbus {

using proto::msg_type;

// ----------------------------------------------------------------------------------- links --
link* node::impl::add_link(connection_id c, bool outbound) {
  auto lk = std::make_unique<link>();
  lk->conn = c;
  lk->conn_id = c.value;
  lk->outbound = outbound;
  lk->state = outbound ? link_state::connecting : link_state::await_register;
  lk->deadline_ms = now_ms() + cfg.handshake_timeout_ms +
                    (outbound ? cfg.handshake_timeout_ms : 0);  // connect + handshake
  link* raw = lk.get();
  forget_link();
  links[raw->conn_id] = std::move(lk);
  return raw;
}

void node::impl::connect_parent() {
  if (state != run_state::running || cfg.parent_urls.empty() || parent_link != nullptr ||
      parent_failed) {
    return;
  }
  connection_id c;
  const std::string& url = cfg.parent_urls[parent_index % cfg.parent_urls.size()];
  const errc e = streams->connect(url, &c);
  if (e != errc::ok) {
    registration_result(
        e, "connect to the parent " + url + " failed at once: " + streams->last_error().detail);
    schedule_reconnect();
    return;
  }
  parent_link = add_link(c, true);
  parent_link->is_parent = true;
  parent_link->role = cfg.join_as_tool ? proto::link_role::tool : proto::link_role::child;
}

void node::impl::schedule_reconnect() {
  if (state != run_state::running || parent_failed || reconnect_armed) return;
  if (disc_parent_left() || cfg.parent_urls.empty()) return;  // node_discovery.cpp
  // Every failure moves on to the next parent URL; the backoff grows once per round over them.
  parent_index = (parent_index + 1) % cfg.parent_urls.size();
  const uint32_t round = reconnect_attempt / static_cast<uint32_t>(cfg.parent_urls.size());
  const double base = std::min<double>(
      cfg.reconnect_max_ms, cfg.reconnect_min_ms * std::pow(2.0, std::min<uint32_t>(round, 30)));
  std::uniform_real_distribution<double> d(-cfg.reconnect_jitter, cfg.reconnect_jitter);
  const double delay = std::max(1.0, base * (1.0 + d(rng)));
  ++reconnect_attempt;
  reconnect_armed = true;
  uv_timer_start(&h->reconnect, &impl::on_reconnect_timer, static_cast<uint64_t>(delay), 0);
  log(log_level::info, "reconnecting to the parent (%s) in %.0f ms",
      cfg.parent_urls[parent_index].c_str(), delay);
}

void node::impl::on_tick(uv_timer_t* t) {
  auto* self = static_cast<impl*>(t->data);
  if (!self->dead) self->tick();  // destroyed in this loop turn: released at the next on_idle
}

void node::impl::on_reconnect_timer(uv_timer_t* t) {
  auto* self = static_cast<impl*>(t->data);
  if (self->dead) return;  // destroyed in this loop turn: released at the next on_idle
  self->reconnect_armed = false;
  ++self->counters.reconnects;
  self->connect_parent();
}

void node::impl::registration_result(errc e, const std::string& detail) {
  fire(cbs.on_registration, e, detail);
}

// ------------------------------------------------------------------------ stream callbacks --
void node::impl::s_accepted(connection_id c) {
  impl* n = this;
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

void node::impl::s_connected(connection_id c, errc status) {
  impl* n = this;
  link* lk = link_of(c);
  if (lk == nullptr) return;
  if (status == errc::ok) {
    if (lk->state == link_state::connecting) lk->state = link_state::await_challenge;
    return;
  }
  // Failed: no on_disconnected follows.
  n->link_gone(lk, status);
}

void node::impl::s_disconnected(connection_id c, errc reason) {
  impl* n = this;
  link* lk = link_of(c);
  if (lk == nullptr) return;
  if (lk->close_reason != errc::ok) {
    reason = lk->close_reason;
  } else if (reason == errc::ok) {
    reason = errc::connection_reset;  // the peer ended the link (a clean EOF): it is lost to us
  }
  n->link_gone(lk, reason);
}

void node::impl::s_written(connection_id c, uint64_t written_through) {
  link* lk = link_of(c);
  if (lk == nullptr) return;
  while (!lk->reports.empty() && lk->reports.front().seq <= written_through) {
    const in_flight f = lk->reports.front();
    lk->reports.pop_front();
    channel_outcome(f.tag, f.target, errc::ok);
  }
}

namespace {

// A handshake step's refusal of what came instead of `want` (of type `expect`), named: another
// message type (a peer sending data before registering), or a body that does not parse.
std::string unexpected(const char* want, msg_type expect, const proto::header& hd) {
  char buf[112];
  if (hd.type == expect) {
    std::snprintf(buf, sizeof buf, "expected %s: its %u-byte body does not parse", want,
                  static_cast<unsigned>(hd.body_len));
  } else {
    std::snprintf(buf, sizeof buf, "expected %s, got a %s message (type %u)", want,
                  proto::to_string(hd.type), static_cast<unsigned>(hd.type));
  }
  return buf;
}

// Whether [data, data + size) is a data message of another node's (one `self` relays).
bool relayed(bus_id self, const uint8_t* data, size_t size, proto::header* hd) {
  return proto::parse_header(data, size, hd) == errc::ok && hd->source != self &&
         (hd->type == msg_type::data || hd->type == msg_type::forward);
}

// The connector's checks of an acceptance before its proof (check_reply_ext); *msg: the fault.
errc acceptance_fault(node::impl& n, const link* lk, const proto::register_reply_body& rr,
                      std::string* msg) {
  if (lk->expect_id != 0 && rr.info.id != lk->expect_id) {
    *msg = "the sibling answered with another id";
    return errc::protocol_error;
  }
  // The version it chose must be one we offered, its id a node's: checked with tokens or without.
  if (std::string f =
          detail::reply_fault(rr.version, rr.info.id, n.cfg.protocol_min, n.cfg.protocol_max);
      !f.empty()) {
    *msg = std::move(f);
    return errc::protocol_error;
  }
  // A parent with our id or a registered peer's would replace that peer's entry under its link.
  if (lk->is_parent && (rr.info.id == n.self || n.find_peer(rr.info.id) != nullptr)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "the parent answered with id 0x%" PRIx64 ", %s", rr.info.id,
                  rr.info.id == n.self ? "ours" : "a registered peer's");
    *msg = buf;
    return errc::duplicate_id;
  }
  // A sibling relays only for subnets it could plausibly own (as on the acceptor's side).
  return lk->is_parent ? errc::ok : n.table.check_sibling(rr.info.id, rr.info.subnets, msg);
}

// A goodbye: its body is the u16 reason, exactly (anything else is a protocol error, as for any
// body); either way the link closes.
void on_bye(node::impl& n, link* lk, const proto::header& hd, const uint8_t* body) {
  proto::bye_body bb;
  if (proto::parse_bye(body, hd.body_len, &bb) != errc::ok) {
    n.protocol_violation(lk, "bad bye");
    return;
  }
  n.log(log_level::info, "peer 0x%" PRIx64 " said goodbye", lk->peer->id);
  n.close_link(lk, errc::closed, disconnect_mode::graceful);
}

// A parent's refusal for good (parent_failed): fail_queue() reports the tagged messages that
// waited for it, but a flow's copies there carry no tag, and their flow entries could go nowhere
// now (each reported timeout at its deadline). Each unsettled entry of those flows is reported
// with the refusal instead, as a next-hop message is. Call before fail_queue(); returns the flows
// whose sender waits for on_writable (the caller tells them, after its other callbacks).
std::vector<bus_id> fail_parent_flows(node::impl& n, errc why) {
  std::vector<bus_id> targets, writable;
  for (const pending_msg& m : n.parent_pending.q) {
    if (m.tag == 0 && n.tx_flows.count(m.target) != 0) targets.push_back(m.target);
  }
  std::sort(targets.begin(), targets.end());
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
  for (const bus_id t : targets) {
    detail::tx_flow& f = n.tx_flows.find(t)->second;
    for (size_t i = 0; i < f.entries.size(); ++i) {
      detail::tx_entry& e = f.entries[i];
      if (!e.settled) n.defer_report(e.message_id, t, why, true);
      e.settled = true;
    }
    f.need_sync = true;
    n.flow_settle_front(f, 0, errc::ok);
    if (f.user_blocked) writable.push_back(t);
    f.user_blocked = false;
  }
  return writable;
}

}  // namespace

// A message the link's queue held when it died (before s_send_failed). One this node relayed had
// been taken from its source as forwarded: the source is told now, as for any relay drop. The
// node's own messages have their reports (s_send_failed) or their flows. A stopping relay has
// told its sources what it held before its goodbyes; their links are closing now, so nothing more.
void node::impl::s_unsent(connection_id c, const uint8_t* data, size_t size) {
  link* lk = link_of(c);
  proto::header hd;
  if (lk != nullptr && !dead && state == run_state::running && relayed(self, data, size, &hd)) {
    relay_drop(hd, proto::reason::not_connected, false);  // one line for all, in s_send_failed
    ++lk->unsent_dropped;
  }
}

// A message a peer's coalescing ring writer dropped from its stage (the region removed, or the
// writer closed with the ring full): one this node relayed is told from the loop (this runs
// inside the writer's send, flush or destruction). Its tag (access tokens) comes first.
void node::impl::shm_unstaged(const uint8_t* data, size_t size) {
  if (size >= proto::kShmEnvelopeSize && data[0] == proto::kShmEnvelopeMarker) {
    data += proto::kShmEnvelopeSize;
    size -= proto::kShmEnvelopeSize;
  }
  proto::header hd;
  if (dead || !relayed(self, data, size, &hd)) return;
  unstaged.push_back(hd);
  arm_idle();
}

void node::impl::s_send_failed(connection_id c, uint64_t /*first*/, uint64_t last, errc reason) {
  link* lk = link_of(c);
  if (lk == nullptr) return;
  // The link's reason (s_disconnected), not the stream's (cancelled, or closed for a clean EOF).
  const errc own = lk->close_reason == errc::duplicate_id ? errc::not_connected : lk->close_reason;
  reason = own != errc::ok ? own : reason == errc::closed ? errc::connection_reset : reason;
  if (lk->unsent_dropped != 0) {
    log_later(log_level::warn,
              "%" PRIu64 " relayed messages queued for 0x%" PRIx64
              " were never written (%s): "
              "their sources were told",
              lk->unsent_dropped, lk->peer != nullptr ? lk->peer->id : 0, to_string(reason));
    lk->unsent_dropped = 0;
  }
  // Every entry up to `last` failed: the ones before `first` were reported written already.
  while (!lk->reports.empty() && lk->reports.front().seq <= last) {
    const in_flight f = lk->reports.front();
    lk->reports.pop_front();
    channel_outcome(f.tag, f.target, reason);
  }
}

void node::impl::s_writable(connection_id c) {
  impl* n = this;
  link* lk = link_of(c);
  if (lk == nullptr || lk->peer == nullptr) return;
  peer_ep* p = lk->peer;
  n->dir_drain(p);
  n->drain_backlog(p);
  n->drain_overflow(p);
  if (n->post_blocked) n->drain_posts();
  if (p->user_blocked && p->overflow.empty() && p->backlog.q.empty()) {
    p->user_blocked = false;
    n->fire(n->cbs.on_writable, p->id);
  }
}

void node::impl::s_received(connection_id c, const uint8_t* data, size_t size) {
  impl* n = this;
  link* lk = link_of(c);
  // Destroyed by a callback earlier in this read: nothing more of it is looked at.
  if (lk == nullptr || lk->state == link_state::closing || dead) return;
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
  if ((hd.flags & proto::flag_compressed) != 0) {
    if (!n->inflate_in(lk, &data, &size)) return;
    (void)proto::parse_header(data, size, &hd);  // the restored header: body_len changed
    body = data + proto::kHeaderSize;
  }
  peer_ep* p = lk->peer;
  p->last_rx_ms = n->now_ms();
  switch (hd.type) {
    case msg_type::ping: {
      proto::ping_body pb;  // the pong echoes the body (the pinger's clock) from the read buffer
      if (proto::parse_ping(body, hd.body_len, &pb) != errc::ok) {
        n->protocol_violation(lk, "bad ping");
        return;
      }
      (void)n->send_control(lk, n->make_header(msg_type::pong, p->id, hd.sequence), body,
                            hd.body_len);
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
    case msg_type::directory:
      n->on_directory_msg(lk, hd, body);
      return;
    case msg_type::bye:
      on_bye(*n, lk, hd, body);
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
  // Flow data for this node (the common case) needs none of on_routed()'s checks.
  if (n->plain_flow_data(hd)) {
    n->on_flow_data(lk, hd, body);
    return;
  }
  n->on_routed(lk, hd, data, size);
}

void node::impl::protocol_violation(link* lk, const char* what) {
  ++counters.protocol_errors;
  char buf[160];
  std::snprintf(buf, sizeof buf, "connection %" PRIu64 " (%s): %s", lk->conn_id,
                streams->peer_url(lk->conn).c_str(), what);
  error(errc::protocol_error, buf);
  close_link(lk, errc::protocol_error);
}

// -------------------------------------------------------------------- handshake: connector --
void node::impl::on_challenge(link* lk, const proto::header& hd, const uint8_t* body) {
  proto::challenge_body ch;
  if (hd.type != msg_type::challenge ||
      proto::parse_challenge(body, hd.body_len, &ch) != errc::ok) {
    protocol_violation(lk, unexpected("a challenge", msg_type::challenge, hd).c_str());
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
  register_ext(lk, ch, &rb);
  std::vector<uint8_t> b;
  proto::encode_register(rb, &b);
  if (send_control(lk, make_header(msg_type::register_req, ch.acceptor_id, 0), b) != errc::ok) {
    close_link(lk, errc::io_error);
    return;
  }
  lk->state = link_state::await_reply;
}

void node::impl::on_register_reply(link* lk, const proto::header& hd, const uint8_t* body) {
  proto::register_reply_body rr;
  if (hd.type != msg_type::register_reply ||
      proto::parse_register_reply(body, hd.body_len, &rr) != errc::ok) {
    protocol_violation(lk,
                       unexpected("a registration reply", msg_type::register_reply, hd).c_str());
    return;
  }
  rr.message =
      detail::printable(rr.message);  // the acceptor's words, for our log and on_registration
  errc result = proto::errc_from_reason(static_cast<uint16_t>(rr.status));
  if (result == errc::ok) result = acceptance_fault(*this, lk, rr, &rr.message);
  // Two-way authentication: the acceptor must prove a token of ours too, for an acceptance and
  // for a refusal. An unproven one is not a configuration refusal (an impostor must not stop us
  // retrying the real parent).
  const bool refused = rr.status != proto::reason::ok;  // the acceptor's verdict, not ours
  const bool unproven = (refused || result == errc::ok) && !check_reply_ext(lk, rr, &rr.message);
  if (unproven && !refused) result = errc::access_denied;
  if (result != errc::ok) {
    log(log_level::warn, "registration to %s refused: %s (%s)", streams->peer_url(lk->conn).c_str(),
        to_string(result), rr.message.c_str());
    lk->close_reason = result;
    std::vector<bus_id> writable;  // flows the refusal emptied
    if (lk->is_parent) {
      if (!unproven && (result == errc::access_denied || result == errc::out_of_subnet ||
                        result == errc::version_mismatch)) {
        parent_failed = true;
        parent_refusal = result;
        writable = fail_parent_flows(*this, result);
        fail_queue(&parent_pending, result);
        detail::drop_held_for_parent(*this);  // what our children sent up meanwhile
      }
      lk->reported = true;
      registration_result(result, rr.message);
    }
    close_link(lk, result, disconnect_mode::graceful);
    for (const bus_id id : writable) {
      if (dead) return;  // destroyed from a callback: nobody to tell
      fire(cbs.on_writable, id);
    }
    return;
  }
  lk->version = rr.version;
  const peer_kind kind = lk->is_parent ? peer_kind::parent : peer_kind::sibling;
  if (kind == peer_kind::sibling) {
    if (peer_ep* old = find_peer(rr.info.id); old != nullptr) {
      // Both siblings connected to each other at once: keep the link the smaller id initiated
      // (both sides apply the same rule, so they keep the same connection).
      if (self < old->id && old->kind == peer_kind::sibling) {
        move_peer(old, lk);
        if (dead) return;  // destroyed from its on_writable
      } else {
        close_link(lk, errc::duplicate_id, disconnect_mode::graceful);
      }
      settle_sibling(old->id);
      return;
    }
  }
  peer_ep* p = add_peer(lk, kind, std::move(rr.info));
  // Destroyed from on_endpoint_added (or a log line): nothing queued is sent. Stopped there: no
  // on_registration(ok) or on_up follows, nor is_up.
  if (dead || state != run_state::running) return;
  if (lk->is_parent) {
    parent_id = p->id;
    table.set_parent(p->id);
    parent_up_ms = now_ms();  // the backoff restarts only if this link lasts (link_gone)
    is_up = true;
    log(log_level::info, "registered with parent 0x%" PRIx64, p->id);
    registration_result(errc::ok, rr.message);
    fire(cbs.on_up, p->id);
    if (dead) return;  // destroyed by a callback above: what it queued is not sent
    flush_queue(&parent_pending, p);
  } else {
    settle_sibling(p->id);
  }
  flows_route_changed(false);
}

// --------------------------------------------------------------------- handshake: acceptor --
void node::impl::refuse(link* lk, errc why, const std::string& msg, const proto::register_body& rb,
                        size_t token) {
  const proto::node_info& who = rb.info;
  ++counters.registrations_refused;
  // The reason first: the host name (up to 255 bytes, 1020 escaped) comes last, whole.
  char buf[160];
  std::snprintf(buf, sizeof buf, "refused registration of 0x%" PRIx64 " from %s: ", who.id,
                streams->peer_url(lk->conn).c_str());
  const std::string what = buf + msg + " (pid " + std::to_string(who.pid) + ", host " +
                           detail::printable(who.hostname) + ")";
  error(why, what, detail::peer_log::refused_registration);  // its log line rate-limited
  proto::register_reply_body rr;
  rr.status = proto::reason_from_errc(why);
  rr.version = cfg.protocol_max;
  rr.info.id = self;
  rr.message = msg;
  reply_ext(lk, rb, token, rr.version, &rr);  // the proof of a refusal, when we can give one
  std::vector<uint8_t> b;
  proto::encode_register_reply(rr, &b);
  (void)send_control(lk, make_header(msg_type::register_reply, who.id, 0), b);
  close_link(lk, why, disconnect_mode::graceful);
}

void node::impl::on_register(link* lk, const proto::header& hd, const uint8_t* body) {
  proto::register_body rb;
  if (hd.type != msg_type::register_req ||
      proto::parse_register(body, hd.body_len, &rb) != errc::ok) {
    protocol_violation(lk, unexpected("a registration", msg_type::register_req, hd).c_str());
    return;
  }
  const proto::node_info& who = rb.info;
  const uint8_t version =
      detail::negotiate_version(cfg.protocol_min, cfg.protocol_max, rb.min_version, rb.max_version);
  // The token the connector proved, if any: we prove the same one back, in a refusal too.
  size_t token = SIZE_MAX;
  if (!cfg.access_tokens.empty()) {
    const std::vector<uint8_t> in = proto::auth_input(lk->nonce, who.id, rb.role);
    size_t which = 0;
    if (detail::verify_proof(cfg.access_tokens, in.data(), in.size(), rb.proof, &which)) {
      token = which;
    }
  }
  if (version == 0) {
    refuse(lk, errc::version_mismatch, "no common protocol version", rb, token);
    return;
  }
  if (!cfg.access_tokens.empty() && token == SIZE_MAX) {
    refuse(lk, errc::access_denied, "no matching access token", rb, SIZE_MAX);
    return;
  }
  if (who.id == 0) {  // node::validate's rule, for a peer that did not go through it
    refuse(lk, errc::invalid_argument, "bus id 0 is reserved (it means \"no node\" on the wire)",
           rb, token);
    return;
  }
  peer_kind kind = peer_kind::child;
  errc ok = errc::ok;
  std::string why;  // a child's or sibling's subnet that cannot be theirs, named
  if (rb.role == proto::link_role::child) {
    ok = table.check_child(who.id, who.subnets, &why);
  } else {
    kind = rb.role == proto::link_role::sibling ? peer_kind::sibling : peer_kind::tool;
    ok = table.check_peer(who.id, &why);
    if (ok == errc::ok && table.owns(who.id)) {
      ok = errc::out_of_subnet;
      why = "id " + detail::id_text(who.id) + " lies in our subnets: a child's, not a " +
            detail::to_string(kind) + "'s";
    }
    // Our parent's id (while its link is down too), or a node the directory places elsewhere.
    if (ok == errc::ok) {
      auto d = dir.find(who.id);
      detail::listing l;
      if (d != dir.end()) l = {true, d->second.via != kViaDiscovery, d->second.e.parent};
      ok = detail::check_claim(kind, who.id, parent_id, l, &why);
    }
    if (ok == errc::ok && kind == peer_kind::sibling) {
      ok = table.check_sibling(who.id, who.subnets, &why);
    }
    peer_ep* old = find_peer(who.id);
    if (ok == errc::duplicate_id && kind == peer_kind::sibling && old != nullptr &&
        old->kind == peer_kind::sibling && who.id < self) {
      // The simultaneous-connect rule (see on_register_reply): the smaller id's link wins.
      if (!accept_reply(lk, who.id, version, &rb, token)) return;
      move_peer(old, lk);
      return;
    }
  }
  if (ok != errc::ok) {  // every check above names its refusal in `why`
    refuse(lk, ok, why, rb, token);
    return;
  }
  if (!accept_reply(lk, who.id, version, &rb, token)) return;
  log(log_level::info, "accepted %s 0x%" PRIx64 " (pid %u on %s)", detail::to_string(kind), who.id,
      who.pid, detail::printable(who.hostname).c_str());
  // Destroyed from that on_log: nothing held is released to it. Stopped there: the link closes
  // (registering it would take it back from closing, and from the stop's deadline).
  if (dead || state != run_state::running) return;
  peer_ep* p = add_peer(lk, kind, who);
  if (dead) return;  // destroyed from on_endpoint_added (or a log line): nothing queued is sent
  // A sibling we were about to connect to connected to us first.
  if (kind == peer_kind::sibling) settle_sibling(p->id);
  flows_route_changed(false);
}

bool node::impl::accept_reply(link* lk, bus_id to, uint8_t version, const proto::register_body* rb,
                              size_t token) {
  ++counters.registrations_accepted;
  proto::register_reply_body rr;
  rr.status = proto::reason::ok;
  rr.version = version;
  lk->version = version;
  rr.info = my_info();
  if (rb != nullptr) reply_ext(lk, *rb, token, version, &rr);
  std::vector<uint8_t> b;
  proto::encode_register_reply(rr, &b);
  if (send_control(lk, make_header(msg_type::register_reply, to, 0), b) != errc::ok) {
    close_link(lk, errc::io_error);
    return false;
  }
  return true;
}

void node::impl::link_gone(link* lk, errc reason) {
  std::unique_ptr<link> owned;
  auto it = links.find(lk->conn_id);
  if (it != links.end()) {
    owned = std::move(it->second);
    forget_link();
    links.erase(it);
  }
  // What still awaits a channel report failed with the link (a safety net: all are reported).
  while (!lk->reports.empty()) {
    channel_outcome(lk->reports.front().tag, lk->reports.front().target, reason);
    lk->reports.pop_front();
  }
  bool lost_peer = false;
  if (peer_ep* p = lk->peer; p != nullptr) {
    cached_hop = nullptr;
    // What waited in its overflow can go nowhere now: dropped as a relay drops (counted, logged,
    // a drop notice or failed ack to each source; each leaves first: on_log may stop() us).
    while (!p->overflow.empty()) {
      const std::vector<uint8_t> m = std::move(p->overflow.front());
      p->overflow.pop_front();
      if (proto::header hd; proto::parse_header(m.data(), m.size(), &hd) == errc::ok) {
        relay_drop(hd, proto::reason::not_connected);
      } else {
        ++counters.forward_dropped;
      }
    }
    p->overflow_bytes = 0;
    fail_queue(&p->backlog, reason);  // our own messages still waiting for its link: reported
    resume_paused(p);
    const endpoint_info info = info_of(*p);
    if (p->kind == peer_kind::child && state == run_state::running) {
      grace.child_lost(p->id, now_ms(), p->info.subnets);  // its descendants wait for it too
    }
    table.remove(p->id);
    shm_overflow.erase(std::remove(shm_overflow.begin(), shm_overflow.end(), p),
                       shm_overflow.end());
    peers.erase(p->id);
    // The parent link's peer is gone: nothing may route through it from here on (a callback below
    // may send).
    if (lk->is_parent) parent_link = nullptr;
    log(log_level::info, "%s 0x%" PRIx64 " gone: %s", to_string(info.role), info.id,
        to_string(reason));
    fire(cbs.on_endpoint_removed, info, reason);
    if (!dead) dir_link_gone(info.id);
    lost_peer = true;
  }
  if (lk->is_parent) {
    const bool was_up = is_up;
    parent_link = nullptr;
    is_up = false;
    table.clear_parent();
    if (lk->peer == nullptr && state == run_state::running && !lk->reported) {
      registration_result(reason, "connection to the parent failed");
    }
    // on_down(closed) means this node stopped; a parent that said goodbye went away like any
    // other: connection_reset.
    if (was_up && state == run_state::running) {
      fire(cbs.on_down, reason == errc::closed ? errc::connection_reset : reason);
    }
    // Siblings being looked up wait in the parent queue now (by id: its log line may send, and
    // a send may add to `siblings`).
    std::vector<bus_id> looking;
    for (auto& [id, s] : siblings) {
      if (s.state == sib_state::lookup) looking.push_back(id);
    }
    for (bus_id id : looking) sibling_via_parent(id, "parent lost");
    // A parent that drops every registration at once is retried less and less often: the
    // backoff starts again only after a link that stayed registered for reconnect_max_ms.
    if (lost_peer && now_ms() - parent_up_ms >= cfg.reconnect_max_ms) reconnect_attempt = 0;
    schedule_reconnect();
  } else if (lk->outbound && lk->expect_id != 0 && lk->peer == nullptr) {
    if (find_peer(lk->expect_id) != nullptr) {
      settle_sibling(lk->expect_id);
    } else {
      sibling_via_parent(lk->expect_id, to_string(reason));
    }
  }
  if (dead) return;  // destroyed from on_down / on_endpoint_removed: nothing is resent
  if (lost_peer) flows_route_changed(true);
  maybe_finish_stop();
}

}  // namespace uvbus
