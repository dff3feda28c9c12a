// Bus node, tool commands: the built-in commands a node answers (lookup, routes, counters, echo).
#include <algorithm>
#include <cstdio>

#include "bus/node_impl.h"

namespace uvbus {

using proto::msg_type;

namespace {

constexpr size_t kReplyHead = 6;  // a command reply's command and status, before its text

// The largest answer text whose reply fits every link and ring of a node configured as `cfg`:
// their frame (record) limit, less the ring's writer envelope, the header and the reply head.
size_t answer_limit(const node_config& cfg) {
  const size_t frame =
      std::max<size_t>(cfg.message_limit + detail::kMaxBusOverhead, size_t{64} * 1024);
  return frame - proto::kShmEnvelopeSize - proto::kHeaderSize - kReplyHead;
}

// Cuts the text of whole lines *s (longer than limit) at a line's end so that it and one more line
// "... N more routes not shown (answer limit L bytes)" fit in limit bytes.
void cut_lines(std::string* s, size_t limit) {
  constexpr size_t kTail = 96;  // room for the last line (at most 88 bytes)
  const size_t at = limit > kTail ? s->rfind('\n', limit - kTail) : std::string::npos;
  const size_t keep = at == std::string::npos ? 0 : at + 1;
  const auto left =
      static_cast<size_t>(std::count(s->begin() + static_cast<ptrdiff_t>(keep), s->end(), '\n'));
  s->resize(keep);
  char buf[kTail];
  std::snprintf(buf, sizeof buf, "... %zu more routes not shown (answer limit %zu bytes)\n", left,
                limit);
  *s += buf;
}

}  // namespace

// A tool command addressed to this node: run it and route the reply back to its source.
void node::impl::on_command(link* from, const proto::header& hd, const uint8_t* body) {
  proto::command_body c;
  if (proto::parse_command(body, hd.body_len, &c) != errc::ok) {
    bad_body(from, hd, "bad command");
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
  // The answer must fit in one frame (a link's and a ring's limit): a longer routes text is cut
  // (its last line says how many were left out), any other answer refused with
  // message_too_large. Sent as it was, the link refused it and the asker waited for its timeout.
  const size_t limit = answer_limit(cfg);
  if (out.size() > limit) {
    if (c.command == static_cast<uint32_t>(proto::command_id::routes)) {
      cut_lines(&out, limit);
    } else {
      st = proto::reason::message_too_large;
      out.clear();
    }
  }
  std::vector<uint8_t> b;
  proto::encode_command_reply(c.command, st, out.data(), out.size(), &b);
  const proto::header rh = make_header(msg_type::command_reply, hd.source, hd.sequence);
  const std::vector<uint8_t> m = proto::build(rh, b);
  const const_buffer cb{m.data(), m.size()};
  const errc e = route_reply(hd.source, &cb, m.size());
  // Not sent (no route, link queue full, ...): counted and logged (rate-limited) as a drop here,
  // though the asker still only sees its timeout.
  if (e != errc::ok) relay_drop(rh, proto::reason_from_errc(e));
}

proto::reason node::impl::lookup_child(const uint8_t* args, size_t n, std::string* out) {
  if (n != 8) return proto::reason::invalid_argument;
  uint64_t id = 0;
  for (int i = 7; i >= 0; --i) id = (id << 8) | args[i];
  peer_ep* p = find_peer(id);
  if (p == nullptr || p->kind != peer_kind::child) {
    // unknown_route: no child of ours has this id (yet) and nothing else routes it; other: we do
    // route it (a grandchild, or up to our parent), so the asker should send it through us.
    const bool nowhere = table.owns(id) && table.lookup(id).kind == hop::none;
    return nowhere ? proto::reason::unknown_route : proto::reason::other;
  }
  std::vector<uint8_t> b;
  proto::encode_node_info(p->info, &b);
  out->assign(b.begin(), b.end());
  return proto::reason::ok;
}

std::string node::impl::routes() const {
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf, "self 0x%" PRIx64 "\n", self);
  s += buf;
  for (const subnet& net : cfg.subnets) s += "subnet " + net.to_string() + "\n";
  for (const auto& [id, p] : peers) {
    // The host name is the peer's text (up to 255 bytes): escaped as in log lines, never cut.
    std::snprintf(buf, sizeof buf,
                  "%s 0x%" PRIx64 " via %s rtt_us=%" PRIu64 " host=", detail::to_string(p->kind),
                  id, p->shm ? "shm" : "stream", p->rtt_ns / 1000);
    s += buf;
    s += detail::printable(p->info.hostname);
    for (const subnet& net : p->info.subnets) s += " subnet=" + net.to_string();
    s += "\n";
  }
  return s;
}

std::string node::impl::counters_text() const {
  std::string s;
  char buf[96];
  auto add = [&](const char* k, uint64_t v) {
    std::snprintf(buf, sizeof buf, "%s=%" PRIu64 "\n", k, v);
    s += buf;
  };
  const node_counters c = counters_now();
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
  add("drop_notices_sent", c.drop_notices_sent);
  add("drop_notices_received", c.drop_notices_received);
  add("held_for_child", c.held_for_child);
  add("flow_unacked_now", c.flow_unacked_now);
  add("flow_unacked_bytes", c.flow_unacked_bytes);
  add("flow_targets", c.flow_targets);
  add("flow_sources", c.flow_sources);
  add("flow_buffer_bytes", c.flow_buffer_bytes);
  add("flow_resent", c.flow_resent);
  add("flow_acks_sent", c.flow_acks_sent);
  add("flow_acks_received", c.flow_acks_received);
  add("flow_duplicates", c.flow_duplicates);
  add("flow_out_of_order", c.flow_out_of_order);
  add("flow_resyncs", c.flow_resyncs);
  add("flow_stale", c.flow_stale);
  add("flow_sources_refused", c.flow_sources_refused);
  add("calls_started", c.calls_started);
  add("calls_ok", c.calls_ok);
  add("calls_failed", c.calls_failed);
  add("requests_received", c.requests_received);
  add("answers_sent", c.answers_sent);
  add("answers_ignored", c.answers_ignored);
  add("compressed_sent", c.compressed_sent);
  add("compressed_raw_bytes", c.compressed_raw_bytes);
  add("compressed_wire_bytes", c.compressed_wire_bytes);
  add("decompressed", c.decompressed);
  add("shm_rejected", c.shm_rejected);
  add("broadcasts_sent", c.broadcasts_sent);
  add("broadcasts_received", c.broadcasts_received);
  add("broadcasts_forwarded", c.broadcasts_forwarded);
  add("directory_skipped", c.directory_skipped);
  add("peers", peers.size());
  return s;
}

std::string node::impl::run_command(uint32_t cmd, const uint8_t* args, size_t n) const {
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

}  // namespace uvbus
