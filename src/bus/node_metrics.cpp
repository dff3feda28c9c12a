// Bus node, metrics: the Prometheus text of node::metrics_text() (node, per-peer, channel and
// process families; docs/observability.md) and the HTTP endpoint that serves it
// (node_config::metrics_url).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <unordered_map>

#include "bus/node_impl.h"
#include "obs/prom_text.h"
#include "uvbus/version.h"

namespace uvbus {

using obs::label;
using obs::metric_type;
using obs::prom_text;

namespace {

struct counter_row {
  const char* name;
  const char* help;
  uint64_t value;
};

void counters_out(prom_text* t, const counter_row* rows, size_t n, metric_type type) {
  for (size_t i = 0; i < n; ++i) {
    t->family(rows[i].name, rows[i].help, type);
    t->sample(static_cast<double>(rows[i].value));
  }
}

// Protocol version 6's counters: link compression, shared-memory writer tags, broadcast; and
// what pick() keeps and the children's directory changes held (gauges).
void v6_families(prom_text* t, const node_counters& c, const detail::fanout_state& f,
                 const std::unordered_map<bus_id, std::unique_ptr<peer_ep>>& peers) {
  size_t dir_held = 0;
  for (const auto& [id, p] : peers) dir_held += p->dir_held.size();
  const counter_row rows[] = {
      {"uvbus_node_compressed_sent_total", "Messages sent compressed.", c.compressed_sent},
      {"uvbus_node_compressed_raw_bytes_total", "Bodies of compressed messages, before.",
       c.compressed_raw_bytes},
      {"uvbus_node_compressed_wire_bytes_total", "Bodies of compressed messages, as sent.",
       c.compressed_wire_bytes},
      {"uvbus_node_decompressed_total", "Compressed messages received and restored.",
       c.decompressed},
      {"uvbus_node_shm_rejected_total",
       "Ring records refused: no valid writer tag, or a source the writer may not speak for.",
       c.shm_rejected},
      {"uvbus_node_broadcasts_sent_total", "node::broadcast()s accepted.", c.broadcasts_sent},
      {"uvbus_node_broadcasts_received_total", "Broadcasts delivered to on_data here.",
       c.broadcasts_received},
      {"uvbus_node_broadcasts_forwarded_total", "Broadcast copies relayed to a next link.",
       c.broadcasts_forwarded},
      {"uvbus_node_directory_skipped_total",
       "New directory entries left out: directory_max_entries reached.", c.directory_skipped},
  };
  counters_out(t, rows, sizeof rows / sizeof rows[0], metric_type::counter);
  const counter_row gauges[] = {
      {"uvbus_node_pick_cursors", "Cursors pick() keeps now (per type and labels asked for).",
       f.cursors.size()},
      {"uvbus_node_pick_cursor_bytes",
       "Bytes of those cursors' keys and matching ids (at most 1 MiB).", f.cursor_bytes},
      {"uvbus_node_load_hints", "Load hints of other nodes kept now (pick() least_loaded).",
       f.loads.size()},
      {"uvbus_node_directory_held",
       "Children's directory changes waiting for their budget now (node_config::"
       "directory_max_entries new ids each at most).",
       dir_held},
  };
  counters_out(t, gauges, sizeof gauges / sizeof gauges[0], metric_type::gauge);
}

std::string hex_id(bus_id id) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, id);
  return buf;
}

}  // namespace

void node::impl::node_families(prom_text* t) const {
  const node_counters c = counters_now();
  const std::string id = hex_id(self);
  const label info[] = {{"id", id}, {"version", kVersionString}};
  t->family("uvbus_node_info", "The node's bus id and library version (value 1).",
            metric_type::gauge);
  t->sample(info, 2, 1);
  t->family("uvbus_node_uptime_seconds", "Seconds since the node started.", metric_type::gauge);
  t->sample(state == run_state::idle ? 0.0 : static_cast<double>(now_ms() - started_ms) / 1000.0);
  t->family("uvbus_node_messages_sent_total",
            "Sends accepted (send_data, send_any, post, call requests and replies), by the channel "
            "of their first hop.",
            metric_type::counter);
  const label stream_l[] = {{"channel", "stream"}};
  const label shm_l[] = {{"channel", "shm"}};
  t->sample(stream_l, 1, static_cast<double>(c.data_sent_stream));
  t->sample(shm_l, 1, static_cast<double>(c.data_sent_shm));
  t->family("uvbus_node_reports_total", "Delivery reports given, by status.", metric_type::counter);
  const label ok_l[] = {{"status", "ok"}};
  const label failed_l[] = {{"status", "failed"}};
  t->sample(ok_l, 1, static_cast<double>(c.reports_ok));
  t->sample(failed_l, 1, static_cast<double>(c.reports_failed));
  t->family("uvbus_node_dropped_total", "Messages this node dropped, by reason.",
            metric_type::counter);
  const label fwd_l[] = {{"reason", "forward"}};
  const label ttl_l[] = {{"reason", "ttl_expired"}};
  t->sample(fwd_l, 1, static_cast<double>(c.forward_dropped));
  t->sample(ttl_l, 1, static_cast<double>(c.ttl_expired));
  t->family("uvbus_node_registrations_total", "Peer registrations this node answered, by result.",
            metric_type::counter);
  const label acc_l[] = {{"result", "accepted"}};
  const label ref_l[] = {{"result", "refused"}};
  t->sample(acc_l, 1, static_cast<double>(c.registrations_accepted));
  t->sample(ref_l, 1, static_cast<double>(c.registrations_refused));
  const counter_row rows[] = {
      {"uvbus_node_messages_delivered_total",
       "Messages and call requests delivered to on_data (not broadcasts).", c.data_received},
      {"uvbus_node_forwarded_total", "User messages relayed for other nodes.", c.forwarded},
      {"uvbus_node_reconnects_total", "Parent connection attempts after the first.", c.reconnects},
      {"uvbus_node_heartbeat_timeouts_total", "Peers dropped for silence.", c.heartbeat_timeouts},
      {"uvbus_node_protocol_errors_total", "Malformed messages (their link was closed).",
       c.protocol_errors},
      {"uvbus_node_drop_notices_sent_total", "Relay: sources told their message was dropped.",
       c.drop_notices_sent},
      {"uvbus_node_held_for_child_total",
       "Relay: messages held for a child, or its parent, to register.", c.held_for_child},
      {"uvbus_node_flow_resent_total", "Flow messages sent again.", c.flow_resent},
      {"uvbus_node_flow_acks_sent_total", "Flow acknowledgements sent.", c.flow_acks_sent},
      {"uvbus_node_flow_acks_received_total", "Flow acknowledgements received.",
       c.flow_acks_received},
      {"uvbus_node_flow_duplicates_total", "Duplicate flow messages dropped here.",
       c.flow_duplicates},
      {"uvbus_node_flow_out_of_order_total", "Flow messages after a gap dropped here.",
       c.flow_out_of_order},
      {"uvbus_node_flow_stale_total", "Late sync messages of a source's earlier epoch dropped.",
       c.flow_stale},
      {"uvbus_node_flow_sources_refused_total", "New flow sources refused beyond max_flow_sources.",
       c.flow_sources_refused},
      {"uvbus_node_calls_started_total", "node::call()s accepted.", c.calls_started},
      {"uvbus_node_calls_ok_total", "Calls answered with a reply.", c.calls_ok},
      {"uvbus_node_calls_failed_total",
       "Calls ended otherwise: error answer, timeout, refusal, stop.", c.calls_failed},
      {"uvbus_node_requests_received_total", "Requests delivered to on_data here.",
       c.requests_received},
      {"uvbus_node_answers_sent_total", "Replies and error answers sent.", c.answers_sent},
  };
  counters_out(t, rows, sizeof rows / sizeof rows[0], metric_type::counter);
  v6_families(t, c, *fan, peers);
  const counter_row gauges[] = {
      {"uvbus_node_pending_messages", "Messages waiting for a link now.", c.pending_now},
      {"uvbus_node_flow_unacked_messages", "Messages in retransmit buffers now.",
       c.flow_unacked_now},
      {"uvbus_node_flow_unacked_bytes", "Bytes in retransmit buffers now.", c.flow_unacked_bytes},
      {"uvbus_node_flow_targets", "Targets this node has a flow to.", c.flow_targets},
      {"uvbus_node_flow_sources", "Sources whose flow position this node keeps.", c.flow_sources},
      {"uvbus_node_flow_buffer_bytes", "Memory the flows' retransmit buffers hold now.",
       c.flow_buffer_bytes},
      {"uvbus_node_peers", "Registered direct peers now.", peers.size()},
      {"uvbus_node_calls_open", "Calls awaiting their answer now.", calls_open},
  };
  counters_out(t, gauges, sizeof gauges / sizeof gauges[0], metric_type::gauge);
}

namespace {

// One peer's figures, or the sum of the peers past the series cap (peer "other").
struct peer_row {
  std::string peer;
  std::string role;
  std::string channel;
  double rtt_s = 0;
  stream_connection_metrics link;
  uint64_t shm_queue_full = 0;
  uint64_t peers = 1;
};

// The counters of a link's figures (not its queue gauges), summed.
void sum_counters(stream_connection_metrics* to, const stream_connection_metrics& m) {
  to->bytes_sent += m.bytes_sent;
  to->bytes_received += m.bytes_received;
  to->packets_sent += m.packets_sent;
  to->packets_received += m.packets_received;
  to->write_calls += m.write_calls;
  to->packets_merged += m.packets_merged;
  to->send_refused += m.send_refused;
}

// How much a counter grew since `before` (the whole of `now` on another link, or after a reset).
uint64_t grown(uint64_t now, uint64_t before, bool same) {
  return same && now >= before ? now - before : now;
}

// Adds what the link's counters grew since `before` to *to.
void add_growth(stream_connection_metrics* to, const stream_connection_metrics& now,
                const stream_connection_metrics& before, bool same) {
  to->bytes_sent += grown(now.bytes_sent, before.bytes_sent, same);
  to->bytes_received += grown(now.bytes_received, before.bytes_received, same);
  to->packets_sent += grown(now.packets_sent, before.packets_sent, same);
  to->packets_received += grown(now.packets_received, before.packets_received, same);
  to->write_calls += grown(now.write_calls, before.write_calls, same);
  to->packets_merged += grown(now.packets_merged, before.packets_merged, same);
  to->send_refused += grown(now.send_refused, before.send_refused, same);
}

// family + one sample per row from get(row); the rows' labels are peer, role, channel.
template <class Get>
void per_peer(prom_text* t, const std::vector<peer_row>& rows, const char* name, const char* help,
              metric_type type, Get get) {
  t->family(name, help, type);
  for (const peer_row& r : rows) {
    const label l[] = {{"peer", r.peer}, {"role", r.role}, {"channel", r.channel}};
    t->sample(l, 3, get(r));
  }
}

}  // namespace

// The peers past metrics_max_peers are summed under peer="other" from what their counters grew
// since the last render (peer_seen), so that series only grows: a peer that leaves, or moves to a
// series of its own, takes nothing out of it (what it did since the last render is not counted).
void node::impl::peer_families(prom_text* t) const {
  std::vector<const peer_ep*> sorted;
  sorted.reserve(peers.size());
  for (const auto& [id, p] : peers) sorted.push_back(p.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const peer_ep* a, const peer_ep* b) { return a->id < b->id; });
  detail::peer_metrics_memory& mem = peer_seen;
  std::vector<peer_row> rows;
  peer_row other{"other", "any", "any", 0, {}, 0, 0};
  for (const peer_ep* p : sorted) {
    const bool own = rows.size() < cfg.metrics_max_peers;
    stream_connection_metrics m;
    const uint64_t conn = p->lk != nullptr ? p->lk->conn_id : 0;
    if (p->lk == nullptr || !streams || streams->connection_metrics(p->lk->conn, &m) != errc::ok) {
      m = {};
    }
    const uint64_t shm_full = p->shm ? p->shm->metrics().queue_full : 0;
    detail::peer_metrics_memory::seen& was = mem.last[p->id];
    if (own) {
      peer_row& r = rows.emplace_back();
      const endpoint_info e = info_of(*p);
      r.peer = hex_id(p->id);
      r.role = to_string(e.role);
      r.channel = to_string(e.data_channel);
      r.rtt_s = static_cast<double>(p->rtt_ns) / 1e9;
      r.link = m;
      r.shm_queue_full = shm_full;
    } else {
      mem.other_shown = true;
      ++other.peers;
      add_growth(&mem.other, m, was.link, was.conn == conn);
      mem.other_shm_full += grown(shm_full, was.shm_full, was.shm == p->shm.get());
      other.link.queue_bytes += m.queue_bytes;
      other.link.queue_packets += m.queue_packets;
    }
    was = {conn, p->shm.get(), m, shm_full};
  }
  for (auto it = mem.last.begin(); it != mem.last.end();) {
    it = peers.count(it->first) != 0 ? std::next(it) : mem.last.erase(it);
  }
  if (mem.other_shown) {
    sum_counters(&other.link, mem.other);
    other.shm_queue_full = mem.other_shm_full;
    rows.push_back(std::move(other));
  }
  const auto d = [](uint64_t v) { return static_cast<double>(v); };
  per_peer(t, rows, "uvbus_peer_rtt_seconds", "Last heartbeat round trip (0: none yet).",
           metric_type::gauge, [](const peer_row& r) { return r.rtt_s; });
  per_peer(t, rows, "uvbus_peer_sent_bytes_total", "Payload bytes written to the peer's link.",
           metric_type::counter, [&](const peer_row& r) { return d(r.link.bytes_sent); });
  per_peer(t, rows, "uvbus_peer_received_bytes_total", "Payload bytes read from the peer's link.",
           metric_type::counter, [&](const peer_row& r) { return d(r.link.bytes_received); });
  per_peer(t, rows, "uvbus_peer_sent_frames_total", "Frames written to the peer's link.",
           metric_type::counter, [&](const peer_row& r) { return d(r.link.packets_sent); });
  per_peer(t, rows, "uvbus_peer_received_frames_total", "Frames read from the peer's link.",
           metric_type::counter, [&](const peer_row& r) { return d(r.link.packets_received); });
  per_peer(t, rows, "uvbus_peer_write_calls_total", "Write system calls on the peer's link.",
           metric_type::counter, [&](const peer_row& r) { return d(r.link.write_calls); });
  per_peer(t, rows, "uvbus_peer_merged_frames_total",
           "Frames coalesced in the merge buffer on the peer's link.", metric_type::counter,
           [&](const peer_row& r) { return d(r.link.packets_merged); });
  per_peer(t, rows, "uvbus_peer_queue_bytes", "Frame bytes waiting in the link's send queue.",
           metric_type::gauge, [&](const peer_row& r) { return d(r.link.queue_bytes); });
  per_peer(t, rows, "uvbus_peer_queue_refused_total", "Sends the link's full queue refused.",
           metric_type::counter, [&](const peer_row& r) { return d(r.link.send_refused); });
  per_peer(t, rows, "uvbus_peer_shm_queue_full_total",
           "Sends the peer's full shared-memory ring refused.", metric_type::counter,
           [&](const peer_row& r) { return d(r.shm_queue_full); });
  t->family("uvbus_peer_queue_limit_bytes", "Each link's send queue limit.", metric_type::gauge);
  t->sample(static_cast<double>(link_stream_config().queue.max_bytes));
  t->family("uvbus_peer_series_cap", "Peers shown one by one (node_config::metrics_max_peers).",
            metric_type::gauge);
  t->sample(static_cast<double>(cfg.metrics_max_peers));
}

void node::impl::channel_families(prom_text* t) const {
  const auto d = [](uint64_t v) { return static_cast<double>(v); };
  if (streams) {
    const stream_channel_metrics m = streams->metrics();
    const counter_row gauges[] = {
        {"uvbus_stream_connections", "Stream connections open now.", m.connections_open},
        {"uvbus_stream_listeners", "Stream listeners open now.", m.listeners_open},
    };
    counters_out(t, gauges, 2, metric_type::gauge);
    const counter_row rows[] = {
        {"uvbus_stream_accepted_total", "Connections accepted.", m.connections_accepted},
        {"uvbus_stream_rejected_total",
         "Connections refused at accept: max_connections or the unregistered caps.",
         m.connections_rejected},
        {"uvbus_stream_connect_failures_total", "Outbound connects that failed.", m.connect_failed},
        {"uvbus_stream_decode_errors_total", "Corrupt frames (bad hash, length, size).",
         m.totals.decode_errors},
        {"uvbus_stream_sent_bytes_total", "Payload bytes written, all links.", m.totals.bytes_sent},
        {"uvbus_stream_received_bytes_total", "Payload bytes read, all links.",
         m.totals.bytes_received},
    };
    counters_out(t, rows, sizeof rows / sizeof rows[0], metric_type::counter);
  }
  if (reader) {
    const shm_metrics m = reader->metrics();
    const label ring[] = {{"ring", shm_url}};
    const auto one = [&](const char* name, const char* help, metric_type type, uint64_t v) {
      t->family(name, help, type);
      t->sample(ring, 1, d(v));
    };
    one("uvbus_shm_ring_fill_bytes", "Ring bytes written and not yet released by this reader.",
        metric_type::gauge, m.fill_bytes);
    one("uvbus_shm_ring_capacity_bytes", "Ring size.", metric_type::gauge, m.capacity_bytes);
    one("uvbus_shm_records_read_total", "Records delivered from the ring.", metric_type::counter,
        m.records_read);
    one("uvbus_shm_abandoned_total", "Records skipped: a writer did not commit in time.",
        metric_type::counter, m.abandoned);
    one("uvbus_shm_checksum_failures_total", "Records skipped: checksum mismatch.",
        metric_type::counter, m.checksum_failures);
    one("uvbus_shm_corrupt_total", "Records skipped: impossible header.", metric_type::counter,
        m.corrupt);
  }
  t->family("uvbus_metrics_scrapes_total", "Requests served by the metrics endpoint.",
            metric_type::counter);
  t->sample(d(metrics_http ? metrics_http->requests() : 0));
  t->family("uvbus_metrics_deadline_closes_total",
            "Metrics endpoint connections closed: request or answer past its deadline.",
            metric_type::counter);
  t->sample(d(metrics_http ? metrics_http->deadline_closes() : 0));
  t->family("uvbus_metrics_shed_clients_total",
            "Metrics endpoint clients closed unserved: out of descriptors.", metric_type::counter);
  t->sample(d(metrics_http ? metrics_http->shed_clients() : 0));
}

std::string node::impl::metrics_text() const {
  prom_text t;
  node_families(&t);
  peer_families(&t);
  latency_families(&t);
  channel_families(&t);
  return t.take();
}

errc node::impl::start_metrics() {
  if (cfg.metrics_url.empty()) return errc::ok;
  metrics_http = std::make_unique<obs::http_endpoint>();
  obs::http_url u;
  (void)obs::parse_http_url(cfg.metrics_url, &u, nullptr);  // validated
  std::string why;
  const errc e = metrics_http->start(
      loop, cfg.metrics_url,
      [this, path = u.path](std::string_view p, obs::http_response* out) {
        if (p != path) {
          out->status = 404;
          out->body = "not found: the metrics are at " + path + "\n";
          return;
        }
        out->body = metrics_text();
      },
      &why);
  if (e != errc::ok) {
    metrics_http.reset();
    return refuse_call(e, "node_config.metrics_url \"" + cfg.metrics_url + "\": " + why);
  }
  return errc::ok;
}

void node::impl::stop_metrics() {
  if (metrics_http) metrics_http->stop();
}

void node::impl::record_latency(detail::tx_flow& f, const detail::tx_entry& e) {
  const uint64_t ns = detail::mono_ns() - e.sent_ns;
  if (!f.latency) f.latency = std::make_unique<latency_histogram>();
  f.latency->record(ns);
  if (f.metrics_series == detail::tx_flow::series::other) peer_seen.latency_other->record(ns);
  // The user type sits after the header (and the trace block, if any) in the stored message.
  const uint8_t* m = f.store.buf.get() + e.offset;
  const size_t at = proto::kHeaderSize + ((m[2] & proto::flag_trace) != 0 ? proto::kTraceSize : 0);
  uint64_t type = load_le<uint32_t>(m + at);
  if (type_latency.count(type) == 0 && type_latency.size() >= kMaxTypeHistograms) {
    type = kOtherType;
  }
  auto& h = type_latency[type];
  if (!h) h = std::make_unique<latency_histogram>();
  h->record(ns);
}

namespace {

// Cumulative counts at fixed bounds 1 us * 2^k (k = 0..23, up to 8.4 s): the same buckets for
// every series. A histogram bucket counts below a bound when its upper bound is (error <= 1/32).
void fixed_buckets(const latency_histogram& h, std::pair<double, uint64_t>* out, size_t n) {
  size_t k = 0;
  uint64_t below = 0;
  uint64_t bound_ns = 1000;
  h.for_each_bucket([&](uint64_t upper, uint64_t cum) {
    while (k < n && upper > bound_ns) {
      out[k++] = {static_cast<double>(bound_ns) / 1e9, below};
      bound_ns *= 2;
    }
    below = cum;
  });
  for (; k < n; ++k, bound_ns *= 2) out[k] = {static_cast<double>(bound_ns) / 1e9, below};
}

}  // namespace

void node::impl::latency_families(prom_text* t) const {
  if (!cfg.latency_histograms) return;
  constexpr size_t kBounds = 24;
  std::pair<double, uint64_t> b[kBounds];
  t->family("uvbus_flow_ack_latency_seconds",
            "Send to end-to-end acknowledgement, per target (the first metrics_max_peers, the rest "
            "as other).",
            metric_type::histogram);
  std::vector<bus_id> targets;
  for (const auto& [id, f] : tx_flows) {
    if (f.latency) targets.push_back(id);
  }
  std::sort(targets.begin(), targets.end());
  // Past metrics_max_peers the targets are summed under target="other", as peers are, and that
  // series only grows: a target entering it brings what its histogram holds (none if it had a
  // series of its own: that was shown already) and records there from then on (record_latency).
  std::unique_ptr<latency_histogram>& other = peer_seen.latency_other;
  for (size_t i = 0; i < targets.size(); ++i) {
    const detail::tx_flow& f = tx_flows.at(targets[i]);
    using series = detail::tx_flow::series;
    if (i < cfg.metrics_max_peers) {
      f.metrics_series = series::own;
      continue;
    }
    if (!other) other = std::make_unique<latency_histogram>();
    if (f.metrics_series == series::none) other->merge(*f.latency);
    f.metrics_series = series::other;
  }
  if (targets.size() > cfg.metrics_max_peers) targets.resize(cfg.metrics_max_peers);
  const auto one = [&](const latency_histogram& h, const std::string& target) {
    fixed_buckets(h, b, kBounds);
    const label l[] = {{"target", target}};
    t->histogram(l, 1, b, kBounds, static_cast<double>(h.sum()) / 1e9, h.count());
  };
  for (const bus_id id : targets) one(*tx_flows.at(id).latency, hex_id(id));
  if (other) one(*other, "other");
  t->family("uvbus_type_ack_latency_seconds",
            "Send to end-to-end acknowledgement, per user message type.", metric_type::histogram);
  std::vector<uint64_t> types;
  types.reserve(type_latency.size());
  for (const auto& [type, h] : type_latency) types.push_back(type);
  std::sort(types.begin(), types.end());
  for (const uint64_t type : types) {
    const latency_histogram& h = *type_latency.at(type);
    fixed_buckets(h, b, kBounds);
    const std::string name = type == kOtherType ? "other" : std::to_string(type);
    const label l[] = {{"type", name}};
    t->histogram(l, 1, b, kBounds, static_cast<double>(h.sum()) / 1e9, h.count());
  }
}

bool node::impl::latency_to(bus_id target, latency_percentiles* out) const {
  auto it = tx_flows.find(target);
  if (it == tx_flows.end() || !it->second.latency) return false;
  *out = it->second.latency->percentiles();
  return true;
}

bool node::impl::latency_of_type(uint32_t type, latency_percentiles* out) const {
  auto it = type_latency.find(type);
  if (it == type_latency.end()) return false;
  *out = it->second->percentiles();
  return true;
}

}  // namespace uvbus
