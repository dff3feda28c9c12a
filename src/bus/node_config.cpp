// node::validate: every rule a node_config must meet, each refusal naming the field and the rule.
#include <algorithm>
#include <string>

#include "bus/node_impl.h"
#include "core/compress.h"
#include "core/frame.h"
#include "shm/layout.h"

namespace uvbus {

namespace {

// The largest message_limit: its frame on a link (plus kMaxBusOverhead) is at most 1 GiB.
constexpr size_t kMaxMessageLimit = (size_t{1} << 30) - kMaxBusOverhead;
// delivery_timeout_ms and resend_timeout_ms at most one day: the resend timer's backoff
// (node_flow.cpp: twice the round trip, up to 8x, doubled) then stays within 32 bits.
constexpr uint32_t kMaxFlowTimerMs = 86400000;

errc refuse(std::string* detail, errc e, const std::string& text) {
  if (detail != nullptr) *detail = "node_config." + text;
  return e;
}

std::string quoted(const std::string& s) {
  return "\"" + s + "\"";
}

// A URL of `field` (the field name with its index) that must parse; *out gets it.
errc check_url(const std::string& field, const std::string& url, address* out,
               std::string* detail) {
  if (url.size() > proto::kMaxUrlBytes) {
    return refuse(detail, errc::invalid_argument,
                  field + " " + quoted(url) + ": longer than " +
                      std::to_string(proto::kMaxUrlBytes) + " bytes");
  }
  std::string why;
  if (const errc e = parse_address(url, out, &why); e != errc::ok) {
    return refuse(detail, e, field + " " + quoted(url) + ": " + why);
  }
  return errc::ok;
}

errc check_listen(const node_config& cfg, std::string* detail) {
  if (cfg.listen.size() > proto::kMaxListen) {
    return refuse(detail, errc::invalid_argument,
                  "listen: " + std::to_string(cfg.listen.size()) + " URLs, at most " +
                      std::to_string(proto::kMaxListen));
  }
  int shm_count = 0;
  for (size_t i = 0; i < cfg.listen.size(); ++i) {
    const std::string field = "listen[" + std::to_string(i) + "]";
    address a;
    const errc e = check_url(field, cfg.listen[i], &a, detail);
    if (e != errc::ok) return e;
    if (a.kind == scheme::mem) {
      return refuse(detail, errc::unsupported_scheme,
                    field + " " + quoted(cfg.listen[i]) +
                        ": mem:// is an in-process ring, not a node address");
    }
    if (a.kind == scheme::shm && ++shm_count > 1) {
      return refuse(detail, errc::invalid_argument,
                    field + " " + quoted(cfg.listen[i]) + ": at most one shm:// URL");
    }
  }
  return errc::ok;
}

errc check_inherited(const node_config& cfg, std::string* detail) {
  for (size_t i = 0; i < cfg.inherit_listeners.size(); ++i) {
    const inherited_listener& in = cfg.inherit_listeners[i];
    const std::string field = "inherit_listeners[" + std::to_string(i) + "] " + quoted(in.url);
    if (in.fd < 0) {
      // start() takes every inherited socket and closes those it did not adopt, also when it
      // fails: the fds it leaves in config() are -1.
      return refuse(detail, errc::invalid_argument,
                    field + ": fd " + std::to_string(in.fd) +
                        ": no socket (if the entry was closed by an earlier start(), which owns "
                        "the inherited sockets even when it fails: hand them over again)");
    }
    address a;
    if (parse_address(in.url, &a) != errc::ok || !a.is_stream()) {
      return refuse(detail, errc::invalid_argument,
                    field + ": not a stream URL (ipv4, ipv6, dns, unix): no listener adopts it");
    }
    if (std::none_of(cfg.listen.begin(), cfg.listen.end(),
                     [&](const std::string& u) { return detail::inherited_fits(u, in.url); })) {
      return refuse(detail, errc::invalid_argument,
                    field + ": no URL of node_config.listen it can serve");
    }
    for (size_t j = 0; j < i; ++j) {
      if (cfg.inherit_listeners[j].url == in.url) {
        return refuse(detail, errc::invalid_argument,
                      field + ": the same URL as inherit_listeners[" + std::to_string(j) + "]");
      }
      // Two listeners on one socket: each would close it (the second time perhaps another
      // thread's descriptor by then).
      if (cfg.inherit_listeners[j].fd == in.fd) {
        return refuse(detail, errc::invalid_argument,
                      field + ": the same fd as inherit_listeners[" + std::to_string(j) + "] (" +
                          std::to_string(in.fd) + ")");
      }
    }
  }
  // start() gives each listen URL one socket (node_handover.cpp): one left over would be closed
  // and the peers waiting in its backlog reset.
  const std::vector<int> taken = detail::match_inherited(cfg.listen, cfg.inherit_listeners);
  for (size_t i = 0; i < cfg.inherit_listeners.size(); ++i) {
    if (std::find(taken.begin(), taken.end(), static_cast<int>(i)) != taken.end()) continue;
    return refuse(detail, errc::invalid_argument,
                  "inherit_listeners[" + std::to_string(i) + "] " +
                      quoted(cfg.inherit_listeners[i].url) +
                      ": each URL of node_config.listen it fits adopts another inherited socket "
                      "(one socket per URL)");
  }
  return errc::ok;
}

// The positions a planned restart hands over: node `id`'s, whole, of a release this one reads,
// and no more sources than max_flow_sources (kept, the extra ones would have every new source's
// first message refused until they go idle).
errc check_positions(bus_id id, const node_config& cfg, std::string* detail) {
  const std::vector<uint8_t>& blob = cfg.inherit_flow_positions;
  if (blob.empty()) return errc::ok;
  const std::string field = "inherit_flow_positions (" + std::to_string(blob.size()) + " bytes) ";
  std::vector<detail::flow_position> got;
  std::string why;
  if (detail::parse_flow_positions(id, blob.data(), blob.size(), &got, &why) != errc::ok) {
    return refuse(detail, errc::invalid_argument, field + why);
  }
  if (got.size() > cfg.max_flow_sources) {
    return refuse(detail, errc::invalid_argument,
                  field + "holds " + std::to_string(got.size()) +
                      " sources' positions, more than max_flow_sources (" +
                      std::to_string(cfg.max_flow_sources) + ")");
  }
  return errc::ok;
}

errc check_parents(const node_config& cfg, std::string* detail) {
  if (cfg.parent_urls.size() > proto::kMaxListen) {
    return refuse(detail, errc::invalid_argument,
                  "parent_urls: " + std::to_string(cfg.parent_urls.size()) + " URLs, at most " +
                      std::to_string(proto::kMaxListen));
  }
  for (size_t i = 0; i < cfg.parent_urls.size(); ++i) {
    const std::string field = "parent_urls[" + std::to_string(i) + "]";
    address a;
    const errc e = check_url(field, cfg.parent_urls[i], &a, detail);
    if (e != errc::ok) return e;
    if (!a.is_stream()) {
      return refuse(detail, errc::unsupported_scheme,
                    field + " " + quoted(cfg.parent_urls[i]) +
                        ": a parent is reached over a stream URL (ipv4, ipv6, dns, unix)");
    }
    // Every dial would be refused (bad_url) or never resolve: the node would retry for ever.
    if (a.kind != scheme::unix_socket && a.port == 0) {
      return refuse(detail, errc::bad_url,
                    field + " " + quoted(cfg.parent_urls[i]) + ": port 0 cannot be dialled");
    }
    if (a.kind == scheme::dns && std::any_of(a.host.begin(), a.host.end(), [](char ch) {
          return static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f;
        })) {
      return refuse(detail, errc::bad_url,
                    field + " " + quoted(cfg.parent_urls[i]) +
                        ": the host holds a space or control byte (no name resolves so)");
    }
  }
  if (cfg.join_as_tool && cfg.parent_urls.empty()) {
    return refuse(detail, errc::invalid_argument,
                  "join_as_tool: a tool registers to a parent, and parent_urls is empty");
  }
  if (cfg.join_as_tool && !cfg.subnets.empty()) {
    return refuse(detail, errc::invalid_argument,
                  "join_as_tool: a tool accepts no children, and subnets has " +
                      std::to_string(cfg.subnets.size()) + " entries");
  }
  // Its etcd entry would list it in its parent's directory, which refuses a tool whose id it lists
  // (duplicate_id, for ever): a tool is never announced.
  if (cfg.join_as_tool && !cfg.discovery.etcd_endpoints.empty()) {
    return refuse(detail, errc::invalid_argument,
                  "join_as_tool: a tool is never announced, and discovery.etcd_endpoints is set");
  }
  return errc::ok;
}

// A directory text (name, type, a label's key or value): at most kMaxDirText bytes.
bool too_long(const std::string& s) {
  return s.size() > proto::kMaxDirText;
}

errc check_text(const std::string& field, const std::string& s, std::string* detail) {
  if (!too_long(s)) return errc::ok;
  return refuse(detail, errc::invalid_argument,
                field + ": " + std::to_string(s.size()) + " bytes, at most " +
                    std::to_string(proto::kMaxDirText));
}

// Labels a directory entry can carry: at most kMaxLabels, distinct non-empty keys, each text
// within kMaxDirText. `field` names the list (labels, discovery_parent_labels).
errc check_label_list(const std::string& field, const std::vector<node_label>& labels,
                      std::string* detail) {
  if (labels.size() > proto::kMaxLabels) {
    return refuse(detail, errc::invalid_argument,
                  field + ": " + std::to_string(labels.size()) + " labels, at most " +
                      std::to_string(proto::kMaxLabels));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    const auto& [k, v] = labels[i];
    if (k.empty()) return refuse(detail, errc::invalid_argument, at + ": the key is empty");
    if (too_long(k) || too_long(v)) {
      return refuse(detail, errc::invalid_argument,
                    at + " \"" + k.substr(0, 32) + "\": key or value over " +
                        std::to_string(proto::kMaxDirText) + " bytes");
    }
    for (size_t j = 0; j < i; ++j) {
      if (labels[j].first == k) {
        std::string why = at;
        why.append(": key \"").append(k).append("\" repeats ").append(field);
        why.append("[").append(std::to_string(j)).append("]");
        return refuse(detail, errc::invalid_argument, why);
      }
    }
  }
  return errc::ok;
}

// name, type, labels: the node's directory entry; discovery_parent_type / _labels: the entry of
// the parent it looks for, so within the same limits (a rule no entry can meet finds no parent).
errc check_labels(const node_config& cfg, std::string* detail) {
  errc e = check_text("name", cfg.name, detail);
  if (e == errc::ok) e = check_text("type", cfg.type, detail);
  if (e == errc::ok) e = check_label_list("labels", cfg.labels, detail);
  if (e != errc::ok) return e;
  if (!cfg.discovery_parent_type.empty() && cfg.discovery.etcd_endpoints.empty()) {
    // Without discovery the rule is never applied: the node would come up as a lone root.
    return refuse(detail, errc::invalid_argument,
                  "discovery_parent_type is set but discovery.etcd_endpoints is empty");
  }
  if (!cfg.discovery_parent_type.empty() && !cfg.parent_urls.empty()) {
    // The node registers to parent_urls: the rule would never be applied.
    return refuse(detail, errc::invalid_argument,
                  "discovery_parent_type is set with parent_urls (" +
                      std::to_string(cfg.parent_urls.size()) +
                      " URLs): the node registers to those, the rule would be ignored");
  }
  if (cfg.discovery_parent_type.empty() && !cfg.discovery_parent_labels.empty()) {
    // Labels alone are no rule (the type names the parent's kind): they would be ignored.
    return refuse(detail, errc::invalid_argument,
                  "discovery_parent_labels are set but discovery_parent_type is empty");
  }
  e = check_text("discovery_parent_type", cfg.discovery_parent_type, detail);
  if (e == errc::ok) {
    e = check_label_list("discovery_parent_labels", cfg.discovery_parent_labels, detail);
  }
  return e;
}

errc check_ids(const node_config& cfg, std::string* detail) {
  if (cfg.subnets.size() > proto::kMaxSubnets) {
    return refuse(detail, errc::invalid_argument,
                  "subnets: " + std::to_string(cfg.subnets.size()) + " subnets, at most " +
                      std::to_string(proto::kMaxSubnets));
  }
  for (size_t i = 0; i < cfg.subnets.size(); ++i) {
    if (!cfg.subnets[i].valid()) {
      return refuse(detail, errc::invalid_argument,
                    "subnets[" + std::to_string(i) + "].mask_bits (" +
                        std::to_string(cfg.subnets[i].mask_bits) + ") must be at most 64");
    }
  }
  for (size_t i = 0; i < cfg.access_tokens.size(); ++i) {
    if (cfg.access_tokens[i].empty()) {
      return refuse(detail, errc::invalid_argument,
                    "access_tokens[" + std::to_string(i) +
                        "] is empty (leave access_tokens empty to require no proof)");
    }
  }
  if (cfg.host_id.size() > proto::kMaxHostIdBytes) {
    return refuse(detail, errc::invalid_argument,
                  "host_id: longer than " + std::to_string(proto::kMaxHostIdBytes) + " bytes");
  }
  if (const errc e = check_labels(cfg, detail); e != errc::ok) return e;
  // Versions above what this build speaks are allowed (tests stand in for a newer peer with
  // them); such a node simply finds no common version with an older one.
  if (cfg.protocol_min == 0 || cfg.protocol_min > cfg.protocol_max) {
    return refuse(detail, errc::invalid_argument,
                  "protocol_min .. protocol_max (" + std::to_string(cfg.protocol_min) + " .. " +
                      std::to_string(cfg.protocol_max) + ") must be a non-empty range from 1");
  }
  // Below version 6 a connector sends no nonce, so it can never check the acceptor's proof and
  // refuses every parent and sibling (node_secure.cpp): a dialling node would never come up, nor
  // reach a node of another tree (discovery with sibling_direct dials those directly). An
  // acceptor only (a root without either) may stay at 5: its version-6 children refuse it, which
  // they report.
  const bool dials = !cfg.parent_urls.empty() || !cfg.discovery_parent_type.empty() ||
                     (!cfg.discovery.etcd_endpoints.empty() && cfg.sibling_direct);
  if (!cfg.access_tokens.empty() && dials && cfg.protocol_max < 6) {
    return refuse(detail, errc::invalid_argument,
                  "protocol_max (" + std::to_string(cfg.protocol_max) +
                      ") must be at least 6 with access_tokens when this node dials a parent, or "
                      "other trees' nodes (discovery with sibling_direct): two-way authentication");
  }
  if (cfg.default_ttl == 0) {
    return refuse(detail, errc::invalid_argument, "default_ttl must be at least 1");
  }
  return errc::ok;
}

// The delivery mode and the codec, each against the versions that carry it.
errc check_compression(const node_config& cfg, std::string* detail) {
  if (cfg.delivery != delivery_mode::end_to_end && cfg.delivery != delivery_mode::next_hop) {
    return refuse(detail, errc::invalid_argument,
                  "delivery (" + std::to_string(static_cast<int>(cfg.delivery)) +
                      ") is not end_to_end or next_hop");
  }
  // Flows are version 3: below it every message to another node is refused (version_mismatch).
  if (cfg.delivery == delivery_mode::end_to_end && cfg.protocol_max < 3) {
    return refuse(detail, errc::invalid_argument,
                  "delivery end_to_end needs protocol_max (" + std::to_string(cfg.protocol_max) +
                      ") of at least 3 (flows); next_hop works at any version");
  }
  const auto c = static_cast<codec>(cfg.compression);
  if (c != codec::none && c != codec::lz4 && c != codec::zstd) {
    return refuse(detail, errc::invalid_argument,
                  "compression (" + std::to_string(static_cast<int>(cfg.compression)) +
                      ") is not none, lz4 or zstd");
  }
  // Negotiated in version 6's registration extension: below it no link is ever compressed.
  if (c != codec::none && cfg.protocol_max < 6) {
    return refuse(detail, errc::invalid_argument,
                  std::string("compression (") + to_string(c) + ") needs protocol_max (" +
                      std::to_string(cfg.protocol_max) + ") of at least 6, where it is negotiated");
  }
  const codec_levels lv = levels_of(c);
  if (cfg.compression_level < lv.min || cfg.compression_level > lv.max) {
    return refuse(detail, errc::invalid_argument,
                  "compression_level (" + std::to_string(cfg.compression_level) + ") must be " +
                      std::to_string(lv.min) + " .. " + std::to_string(lv.max) + " for " +
                      to_string(c));
  }
  return errc::ok;
}

errc check_caps(const node_config& cfg, std::string* detail) {
  if (cfg.max_unregistered != 0 && cfg.max_unregistered_per_address > cfg.max_unregistered) {
    return refuse(detail, errc::invalid_argument,
                  "max_unregistered_per_address (" +
                      std::to_string(cfg.max_unregistered_per_address) +
                      ") must not exceed max_unregistered (" +
                      std::to_string(cfg.max_unregistered) + "): it could never apply (0: no cap)");
  }
  return errc::ok;
}

errc check_sizes(const node_config& cfg, std::string* detail) {
  // A link's frame limit is message_limit plus the bus overhead, and a stream's is at most 1 GiB.
  if (cfg.message_limit == 0 || cfg.message_limit > kMaxMessageLimit) {
    return refuse(detail, errc::invalid_argument,
                  "message_limit (" + std::to_string(cfg.message_limit) + ") must be 1 .. " +
                      std::to_string(kMaxMessageLimit) + " (1 GiB less " +
                      std::to_string(kMaxBusOverhead) + " bytes of bus overhead)");
  }
  const size_t frame = frame_size(cfg.message_limit + kMaxBusOverhead);
  if (cfg.link_queue_bytes < frame) {
    return refuse(detail, errc::invalid_argument,
                  "link_queue_bytes (" + std::to_string(cfg.link_queue_bytes) +
                      ") must hold one frame of message_limit (" + std::to_string(frame) +
                      " bytes)");
  }
  // A pending queue (and the grace hold) that cannot take one message of the limit refuses every
  // one (queue_full) while the link is coming up; 0 messages turns queueing off instead.
  const size_t one_msg = cfg.message_limit + kMaxBusOverhead;
  if (cfg.pending_max_messages != 0 && cfg.pending_max_bytes < one_msg) {
    return refuse(detail, errc::invalid_argument,
                  "pending_max_bytes (" + std::to_string(cfg.pending_max_bytes) +
                      ") must hold one message of message_limit (" + std::to_string(one_msg) +
                      " bytes), or pending_max_messages be 0 (queueing off)");
  }
  // An overflow that cannot take one message drops every relayed message that meets a full next
  // hop instead of holding it (and pausing the link it came from).
  if (cfg.forward_overflow_bytes < one_msg) {
    return refuse(detail, errc::invalid_argument,
                  "forward_overflow_bytes (" + std::to_string(cfg.forward_overflow_bytes) +
                      ") must hold one message of message_limit (" + std::to_string(one_msg) +
                      " bytes)");
  }
  if (cfg.link_queue_packets == 0) {
    return refuse(detail, errc::invalid_argument, "link_queue_packets must be at least 1");
  }
  if (cfg.post_queue_messages == 0) {
    return refuse(detail, errc::invalid_argument, "post_queue_messages must be at least 1");
  }
  if (cfg.post_queue_bytes < detail::post_item_bytes(cfg.message_limit)) {
    return refuse(detail, errc::invalid_argument,
                  "post_queue_bytes (" + std::to_string(cfg.post_queue_bytes) +
                      ") must hold one message of message_limit (" +
                      std::to_string(detail::post_item_bytes(cfg.message_limit)) + " bytes)");
  }
  if (cfg.max_outstanding_responses == 0) {
    return refuse(detail, errc::invalid_argument, "max_outstanding_responses must be at least 1");
  }
  if (cfg.max_outstanding_calls == 0) {  // every call() would be refused with queue_full
    return refuse(detail, errc::invalid_argument, "max_outstanding_calls must be at least 1");
  }
  if (cfg.max_flow_sources == 0) {  // every new source would be refused
    return refuse(detail, errc::invalid_argument, "max_flow_sources must be at least 1");
  }
  if (cfg.directory_max_entries == 0) {
    return refuse(detail, errc::invalid_argument, "directory_max_entries must be at least 1");
  }
  if (cfg.broadcast_max_targets == 0) {  // every broadcast() would be refused with queue_full
    return refuse(detail, errc::invalid_argument, "broadcast_max_targets must be at least 1");
  }
  if (cfg.retransmit_max_messages == 0 || cfg.ack_every == 0) {
    return refuse(detail, errc::invalid_argument,
                  cfg.ack_every == 0 ? "ack_every must be at least 1"
                                     : "retransmit_max_messages must be at least 1");
  }
  // One message of message_limit with a trace context: its header, flow prefix and trace block.
  const size_t one = cfg.message_limit + 44 + proto::kTraceSize;
  if (cfg.retransmit_max_bytes < one) {
    return refuse(detail, errc::invalid_argument,
                  "retransmit_max_bytes (" + std::to_string(cfg.retransmit_max_bytes) +
                      ") must hold one message of message_limit with a trace context (" +
                      std::to_string(one) + " bytes)");
  }
  return errc::ok;
}

errc check_timers(const node_config& cfg, std::string* detail) {
  const std::pair<const char*, uint32_t> nonzero[] = {
      {"handshake_timeout_ms", cfg.handshake_timeout_ms},
      {"heartbeat_interval_ms", cfg.heartbeat_interval_ms},
      {"heartbeat_timeout_ms", cfg.heartbeat_timeout_ms},
      {"pending_timeout_ms", cfg.pending_timeout_ms},
      {"response_timeout_ms", cfg.response_timeout_ms},
      {"reconnect_min_ms", cfg.reconnect_min_ms},
      {"sibling_idle_ms", cfg.sibling_idle_ms},
      {"delivery_timeout_ms", cfg.delivery_timeout_ms},
      {"resend_timeout_ms", cfg.resend_timeout_ms},
      {"flow_idle_ms", cfg.flow_idle_ms},
  };
  for (const auto& [name, v] : nonzero) {
    if (v == 0) return refuse(detail, errc::invalid_argument, std::string(name) + " must not be 0");
  }
  if (uint64_t{cfg.heartbeat_timeout_ms} < uint64_t{2} * cfg.heartbeat_interval_ms) {
    return refuse(detail, errc::invalid_argument,
                  "heartbeat_timeout_ms (" + std::to_string(cfg.heartbeat_timeout_ms) +
                      ") must be at least twice heartbeat_interval_ms (" +
                      std::to_string(cfg.heartbeat_interval_ms) +
                      "): one late ping must not drop a link");
  }
  for (const auto& [name, v] :
       {std::pair<const char*, uint32_t>{"delivery_timeout_ms", cfg.delivery_timeout_ms},
        {"resend_timeout_ms", cfg.resend_timeout_ms}}) {
    if (v > kMaxFlowTimerMs) {
      return refuse(detail, errc::invalid_argument,
                    std::string(name) + " (" + std::to_string(v) + ") must be at most " +
                        std::to_string(kMaxFlowTimerMs) + " (one day)");
    }
  }
  if (cfg.reconnect_min_ms > cfg.reconnect_max_ms) {
    return refuse(detail, errc::invalid_argument,
                  "reconnect_min_ms (" + std::to_string(cfg.reconnect_min_ms) +
                      ") must not exceed reconnect_max_ms (" +
                      std::to_string(cfg.reconnect_max_ms) + ")");
  }
  if (!(cfg.reconnect_jitter >= 0 && cfg.reconnect_jitter <= 1)) {
    return refuse(
        detail, errc::invalid_argument,
        "reconnect_jitter (" + std::to_string(cfg.reconnect_jitter) + ") must be within 0 .. 1");
  }
  return errc::ok;
}

errc check_shm(const node_config& cfg, std::string* detail) {
  bool has_ring = false;
  for (const std::string& u : cfg.listen) {
    address a;
    if (parse_address(u, &a) == errc::ok && a.kind == scheme::shm) has_ring = true;
  }
  if (!has_ring) return errc::ok;
  if (cfg.shm_abandon_timeout_us == 0) {
    return refuse(detail, errc::invalid_argument, "shm_abandon_timeout_us must not be 0");
  }
  if (cfg.shm_ring_bytes > (size_t{1} << 46)) {
    return refuse(detail, errc::invalid_argument,
                  "shm_ring_bytes (" + std::to_string(cfg.shm_ring_bytes) +
                      ") must be at most 2^46 (70368744177664)");
  }
  shm_config sc = detail::ring_config(cfg);
  if (shm_validate(sc) == errc::ok) return errc::ok;
  // A record spans at most kMaxRecordNodes nodes: no ring carries a larger message.
  const uint64_t largest =
      shm_detail::kMaxRecordNodes * sc.node_size - shm_detail::kRecordHeaderSize;
  if (sc.max_record_size > largest) {
    return refuse(detail, errc::invalid_argument,
                  "message_limit (" + std::to_string(cfg.message_limit) +
                      ") is above the largest a shm:// listen URL carries (" +
                      std::to_string(largest - kMaxBusOverhead) + ": a shm record is at most " +
                      std::to_string(largest) + " bytes, the message's header included)");
  }
  // The smallest ring that would do, for the message.
  size_t need = 0;
  for (size_t r = 4096; r != 0 && r <= (size_t{1} << 40); r <<= 1) {
    sc.ring_bytes = r;
    if (shm_validate(sc) == errc::ok) {
      need = r;
      break;
    }
  }
  return refuse(detail, errc::invalid_argument,
                "shm_ring_bytes (" + std::to_string(cfg.shm_ring_bytes) +
                    ") must be a power of two holding two records of " +
                    std::to_string(sc.max_record_size) + " bytes (max(message_limit + " +
                    std::to_string(kMaxBusOverhead) + ", 65536))" +
                    (need != 0 ? " (at least " + std::to_string(need) + ")" : std::string()));
}

}  // namespace

shm_config detail::ring_config(const node_config& cfg) {
  shm_config shc;
  shc.ring_bytes = cfg.shm_ring_bytes;
  shc.abandon_timeout_us = cfg.shm_abandon_timeout_us;
  shc.max_record_size = static_cast<uint32_t>(
      std::max<size_t>(cfg.message_limit + kMaxBusOverhead, size_t{64} * 1024));
  return shc;
}

stream_config detail::link_stream_config(const node_config& cfg) {
  stream_config sc;
  sc.message_limit = std::max<size_t>(cfg.message_limit + kMaxBusOverhead, size_t{64} * 1024);
  sc.queue.mode = queue_mode::static_ring;
  sc.queue.ring_bytes = std::max(cfg.link_queue_bytes, 2 * (sc.message_limit + 64));
  sc.queue.max_bytes = sc.queue.ring_bytes;
  sc.queue.max_blocks = cfg.link_queue_packets;
  sc.tcp_nodelay = cfg.tcp_nodelay;
  sc.connect_timeout_ms = cfg.handshake_timeout_ms;
  sc.max_unregistered = cfg.max_unregistered;
  sc.max_unregistered_per_address = cfg.max_unregistered_per_address;
  sc.tls = cfg.tls;
  return sc;
}

errc node::validate(bus_id id, const node_config& cfg, std::string* detail) {
  if (id == 0) {
    if (detail != nullptr) *detail = "bus id 0 is reserved (it means \"no node\" on the wire)";
    return errc::invalid_argument;
  }
  errc e = check_listen(cfg, detail);
  if (e == errc::ok) e = check_inherited(cfg, detail);
  if (e == errc::ok) e = check_positions(id, cfg, detail);
  if (e == errc::ok && (cfg.latency_sample_every == 0 ||
                        (cfg.latency_sample_every & (cfg.latency_sample_every - 1)) != 0)) {
    e = refuse(detail, errc::invalid_argument,
               "latency_sample_every: " + std::to_string(cfg.latency_sample_every) +
                   " is not a power of two");
  }
  if (e == errc::ok && !cfg.metrics_url.empty()) {
    obs::http_url u;
    std::string why;
    if (obs::parse_http_url(cfg.metrics_url, &u, &why) != errc::ok) {
      e = refuse(detail, errc::bad_url, "metrics_url " + quoted(cfg.metrics_url) + ": " + why);
    }
  }
  if (e == errc::ok) e = check_parents(cfg, detail);
  if (e == errc::ok) e = check_ids(cfg, detail);
  if (e == errc::ok) e = check_sizes(cfg, detail);
  if (e == errc::ok) e = check_caps(cfg, detail);
  if (e == errc::ok) e = check_compression(cfg, detail);
  if (e == errc::ok) e = check_timers(cfg, detail);
  if (e == errc::ok) e = check_shm(cfg, detail);
  if (e == errc::ok) {
    // The links' stream config (tls, the queue sizes): a refusal there would fail every listen
    // and every dial at run time, the node retrying for ever.
    std::string why;
    const errc se = stream_channel::validate(detail::link_stream_config(cfg), &why);
    if (se != errc::ok && why.rfind("tls", 0) != 0)
      why = "link_queue_bytes (the links' queue): " + why;
    if (se != errc::ok) e = refuse(detail, se, why);
  }
  if (e == errc::ok && !cfg.discovery.etcd_endpoints.empty()) {
    std::string why;
    if (uvbus::validate(cfg.discovery, &why) != errc::ok) {
      e = refuse(detail, errc::invalid_argument, "discovery." + why);
    }
  }
  return e;
}

}  // namespace uvbus
