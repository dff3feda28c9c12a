// The bus wire codec: what a node puts inside the payload of each stream frame or shared-memory
// record. docs/protocol.md describes every byte; test/bus/protocol_test.cpp pins the encoding with
// golden byte vectors. Internal: the public names (versions, node_info, command_id) are in
// uvbus/protocol.h.
//
//   message = header (32 bytes, fixed, little-endian) body (header.body_len bytes)
//
// Every parser here is bounds-checked, never reads outside [p, p + n), never allocates for more
// than the input can hold, and returns errc::ok or errc::protocol_error (or message_too_large).
// Parsers only write their output on success. They are plain functions so they can be fuzzed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/endian.h"
#include "uvbus/directory.h"
#include "uvbus/error.h"
#include "uvbus/fanout.h"
#include "uvbus/protocol.h"
#include "uvbus/subnet.h"
#include "uvbus/trace.h"

namespace uvbus::proto {

// The header layout version written in every header's first byte. The layout is the same in every
// protocol version so far, so it stays 1 and a version-1 peer parses every header a newer node
// sends it.
inline constexpr uint8_t kHeaderVersion = 1;

inline constexpr size_t kHeaderSize = 32;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kProofSize = 32;  // HMAC-SHA256

// Limits on registration fields; a message above them is a protocol_error.
inline constexpr size_t kMaxSubnets = 16;
inline constexpr size_t kMaxListen = 8;
inline constexpr size_t kMaxUrlBytes = 256;
inline constexpr size_t kMaxHostIdBytes = 128;
inline constexpr size_t kMaxHostnameBytes = 255;
inline constexpr size_t kMaxReasonBytes = 255;

enum class msg_type : uint8_t {
  challenge = 1,       // acceptor -> connector: nonce and the acceptor's version range
  register_req = 2,    // connector -> acceptor: who I am + HMAC proof over the nonce
  register_reply = 3,  // acceptor -> connector: accepted (with the acceptor's info) or refused
  ping = 4,
  pong = 5,
  data = 6,     // user data on its first hop
  forward = 7,  // user data relayed by a node (same body as data; ttl already decremented)
  ack = 8,      // end-to-end delivery report for a message sent with flag_require_response
  command = 9,  // tool command (routes, counters, lookup of a child's addresses)
  command_reply = 10,
  bye = 11,  // graceful close: the sender stops sending on this link
  // Version 2: a relay dropped a message sent without require_response (whose source would
  // otherwise never learn it); routed back to the message's source.
  dropped = 12,
  // Version 3: the target's cumulative acknowledgement of a flow (or a request to resend).
  flow_ack = 13,
  // Version 5: directory entries or removals, between a parent and a child (link-local).
  directory = 14,
  // Version 6: a message for every node matching a selector, fanned out along tree links
  // (header.target 0, header.sequence the broadcast id), and a target's acknowledgement of it
  // (routed to the broadcast's source, header.sequence the broadcast id, empty body).
  broadcast = 15,
  broadcast_ack = 16,
};
inline constexpr uint8_t kMaxMsgType = 16;
const char* to_string(msg_type t) noexcept;

// Header flags.
inline constexpr uint8_t flag_require_response = 0x01;  // target answers with an ack
// Version 3, data/forward: the message belongs to a flow. header.sequence is its flow sequence
// (1, 2, ... per source and target) and the body carries the source's flow epoch after the user
// type (flow_data_body). On a dropped notice: message_id is a flow sequence.
inline constexpr uint8_t flag_flow = 0x02;
// Version 3, with flag_flow: every sequence below this one is settled (acknowledged or reported
// failed at the source): the target may start or resume the flow here, skipping any gap.
inline constexpr uint8_t flag_sync = 0x04;
// Version 4, data/forward: the body starts with a trace context (kTraceSize bytes: trace id 16,
// span id 8, trace flags 1), before the data or flow prefix. Never sent on a link below version 4
// (the sender strips it: strip_trace()).
inline constexpr uint8_t flag_trace = 0x08;
// Version 5, data/forward: the payload starts with a call block (kCallSize bytes: call_kind 1,
// call id 8, code 4): a request of node::call() or its reply. Never sent on a link below version 5.
inline constexpr uint8_t flag_call = 0x10;
// Version 6, data/forward on a stream link that negotiated a codec: the body (everything after
// the header) is one compressed block (core/compress.h) of the original body. Link-local: the
// receiver restores the message before anything else reads it, and a relay compresses again (or
// not) for its next link.
inline constexpr uint8_t flag_compressed = 0x20;
inline constexpr uint8_t kKnownFlags =
    flag_require_response | flag_flow | flag_sync | flag_trace | flag_call | flag_compressed;
inline constexpr size_t kTraceSize = 25;
inline constexpr size_t kCallSize = 13;

struct header {
  uint8_t version = kHeaderVersion;
  msg_type type = msg_type::data;
  uint8_t flags = 0;
  uint8_t ttl = kDefaultTtl;
  uint32_t body_len = 0;
  bus_id source = 0;
  bus_id target = 0;
  uint64_t sequence = 0;
};

// Writes h into out[0..32). Inline: it runs once per message on the send path.
inline void encode_header(const header& h, uint8_t* out) noexcept {
  out[0] = h.version;
  out[1] = static_cast<uint8_t>(h.type);
  out[2] = h.flags;
  out[3] = h.ttl;
  store_le<uint32_t>(out + 4, h.body_len);
  store_le<uint64_t>(out + 8, h.source);
  store_le<uint64_t>(out + 16, h.target);
  store_le<uint64_t>(out + 24, h.sequence);
}

// Parses the header of a whole message [p, p + n): n >= 32, layout version kHeaderVersion (every
// release wrote 1 there; a value of 2..6 relayed on would close a version-1 hop), a known type, no
// unknown flag bits, and body_len == n - 32 exactly. The body is then p + 32. *out is only written
// on success. Inline: it runs once per message on the receive path.
[[nodiscard]] inline errc parse_header(const uint8_t* p, size_t n, header* out) noexcept {
  if (p == nullptr || n < kHeaderSize) return errc::protocol_error;
  const uint8_t version = p[0];
  const uint8_t type = p[1];
  const uint8_t flags = p[2];
  if (version != kHeaderVersion) return errc::protocol_error;  // the layout, not the protocol
  if (type == 0 || type > kMaxMsgType) return errc::protocol_error;
  if ((flags & ~kKnownFlags) != 0) return errc::protocol_error;
  const auto body_len = load_le<uint32_t>(p + 4);
  if (body_len != n - kHeaderSize) return errc::protocol_error;
  out->version = version;
  out->type = static_cast<msg_type>(type);
  out->flags = flags;
  out->ttl = p[3];
  out->body_len = body_len;
  out->source = load_le<uint64_t>(p + 8);
  out->target = load_le<uint64_t>(p + 16);
  out->sequence = load_le<uint64_t>(p + 24);
  return errc::ok;
}

// Reasons carried on the wire (registration refusals, acks, bye). Stable numbers, unlike errc.
enum class reason : uint16_t {
  ok = 0,
  access_denied = 1,
  duplicate_id = 2,
  out_of_subnet = 3,
  version_mismatch = 4,
  protocol_error = 5,
  closing = 6,
  unknown_route = 7,
  ttl_expired = 8,
  timeout = 9,
  not_connected = 10,
  queue_full = 11,
  message_too_large = 12,
  invalid_argument = 13,
  other = 14,
};
[[nodiscard]] reason reason_from_errc(errc e) noexcept;
[[nodiscard]] errc errc_from_reason(uint16_t r) noexcept;  // unknown numbers -> protocol_error

// ----------------------------------------------------------------------------- bodies --

struct challenge_body {
  uint8_t min_version = kMinVersion;
  uint8_t max_version = kMaxVersion;
  bus_id acceptor_id = 0;
  uint8_t nonce[kNonceSize] = {};
};

enum class link_role : uint8_t {
  child = 1,    // the connector becomes the acceptor's child (must be in its subnets)
  sibling = 2,  // a direct link between two nodes that share a parent
  tool = 3,     // a client that only sends commands (never routed to)
};

// Version 6: optional fields after a register or register_reply body, sent only to a peer that
// speaks version 6 (the connector: when the challenge offers it; the acceptor: when the link
// negotiated it). Encoded as u8 count, then count x {u8 tag, u8 len, len bytes}; a parser skips
// tags it does not know, refuses a known tag with the wrong length, more than kMaxExtensions or
// a tag twice.
enum class ext_tag : uint8_t {
  nonce = 1,        // register: the connector's nonce (kNonceSize) for the acceptor's proof
  proof = 2,        // register_reply: HMAC-SHA256(token, accept_auth_input(nonce, acceptor, role)),
                    // or of refuse_auth_input(...) in a refusal (the connector's token matched)
  compression = 3,  // register: the codec the connector wants; reply: the link's codec (1 byte)
};
inline constexpr size_t kMaxExtensions = 8;
struct reg_extensions {
  bool present = false;  // encode: write the block; parse: it was there
  bool has_nonce = false;
  uint8_t nonce[kNonceSize] = {};
  bool has_proof = false;
  uint8_t proof[kProofSize] = {};
  bool has_compression = false;
  uint8_t compression = 0;  // codec: 0 none, 1 lz4, 2 zstd
};

struct register_body {
  uint8_t min_version = kMinVersion;
  uint8_t max_version = kMaxVersion;
  link_role role = link_role::child;
  node_info info;
  uint8_t proof[kProofSize] = {};  // HMAC-SHA256(token, auth_input(nonce, id, role)); 0s if none
  reg_extensions ext;
};

struct register_reply_body {
  reason status = reason::ok;
  uint8_t version = kMaxVersion;  // the version the link uses (when accepted)
  node_info info;                 // the acceptor's info (empty lists when refused)
  std::string message;            // human-readable detail, <= 255 bytes
  reg_extensions ext;
};

struct ping_body {
  uint64_t send_time_ns = 0;  // the pinger's monotonic clock, echoed back in the pong
};

// The trace block of a data message with flag_trace (the first kTraceSize body bytes).
inline void encode_trace(const trace_context& t, uint8_t* out) noexcept {
  std::memcpy(out, t.trace_id.data(), 16);
  std::memcpy(out + 16, t.span_id.data(), 8);
  out[24] = t.flags;
}
inline void parse_trace(const uint8_t* p, trace_context* out) noexcept {
  std::memcpy(out->trace_id.data(), p, 16);
  std::memcpy(out->span_id.data(), p + 16, 8);
  out->flags = p[24];
}

// The call block of a message with flag_call (the first kCallSize payload bytes).
enum class call_kind : uint8_t {
  request = 1,  // code: the caller's timeout in ms (the handler may give up after it)
  reply = 2,    // code: 0; the rest of the payload is the reply
  error = 3,    // code: the handler's error code; the rest of the payload is its detail text
};
struct call_block {
  call_kind kind = call_kind::request;
  uint64_t call_id = 0;  // the caller's; the reply carries it back unchanged
  uint32_t code = 0;
};
inline void encode_call(const call_block& c, uint8_t* out) noexcept {
  out[0] = static_cast<uint8_t>(c.kind);
  store_le<uint64_t>(out + 1, c.call_id);
  store_le<uint32_t>(out + 9, c.code);
}
// protocol_error for a short block, an unknown kind or call id 0.
[[nodiscard]] inline errc parse_call(const uint8_t* p, size_t n, call_block* out) noexcept {
  if (p == nullptr || n < kCallSize || p[0] < 1 || p[0] > 3) return errc::protocol_error;
  const auto id = load_le<uint64_t>(p + 1);
  if (id == 0) return errc::protocol_error;
  out->kind = static_cast<call_kind>(p[0]);
  out->call_id = id;
  out->code = load_le<uint32_t>(p + 9);
  return errc::ok;
}

// data and forward. The payload is a view into the parsed message (no copy).
struct data_body {
  uint32_t user_type = 0;
  const uint8_t* payload = nullptr;
  size_t size = 0;
};
inline constexpr size_t kDataPrefix = 4;  // user_type
// A flow message's body: user_type (4), the source's flow epoch (8), then the payload.
inline constexpr size_t kFlowPrefix = 12;
inline void encode_flow_prefix(uint32_t user_type, uint64_t epoch, uint8_t* out) noexcept {
  store_le<uint32_t>(out, user_type);
  store_le<uint64_t>(out + 4, epoch);
}
// Parses a flow message's body (header.flags has flag_flow); the payload is a view.
[[nodiscard]] inline errc parse_flow_data(const uint8_t* p, size_t n, data_body* out,
                                          uint64_t* epoch) noexcept {
  if (p == nullptr || n < kFlowPrefix) return errc::protocol_error;
  out->user_type = load_le<uint32_t>(p);
  *epoch = load_le<uint64_t>(p + 4);
  out->payload = p + kFlowPrefix;
  out->size = n - kFlowPrefix;
  return errc::ok;
}

// Version 3. What a flow_ack asks of the flow's source.
enum class ack_kind : uint8_t {
  ack = 0,     // everything up to `through` was delivered
  gap = 1,     // as ack, and a later message arrived out of order: resend after `through`
  resync = 2,  // the target holds no state for this epoch: resend from the first unacknowledged
               // message, flagged flag_sync
};
// header.source is the flow's target, header.target the flow's source.
struct flow_ack_body {
  uint64_t epoch = 0;        // the source's flow epoch this acknowledges
  uint64_t incarnation = 0;  // the target's incarnation (changes when it restarts)
  uint64_t through = 0;      // highest sequence delivered in order to on_data (0: none)
  ack_kind kind = ack_kind::ack;
};
inline constexpr size_t kFlowAckSize = 25;
inline void encode_flow_ack(const flow_ack_body& b, uint8_t* out) noexcept {
  store_le<uint64_t>(out, b.epoch);
  store_le<uint64_t>(out + 8, b.incarnation);
  store_le<uint64_t>(out + 16, b.through);
  out[24] = static_cast<uint8_t>(b.kind);
}
[[nodiscard]] inline errc parse_flow_ack(const uint8_t* p, size_t n, flow_ack_body* out) noexcept {
  if (p == nullptr || n != kFlowAckSize || p[24] > 2) return errc::protocol_error;
  out->epoch = load_le<uint64_t>(p);
  out->incarnation = load_le<uint64_t>(p + 8);
  out->through = load_le<uint64_t>(p + 16);
  out->kind = static_cast<ack_kind>(p[24]);
  return errc::ok;
}

struct ack_body {
  uint64_t acked_sequence = 0;  // the header.sequence of the data message
  reason status = reason::ok;   // ok: the target received it; else why it could not be delivered
};
inline constexpr size_t kAckSize = 10;  // an ack body: u64 sequence, u16 status
inline constexpr size_t kPingSize = 8;  // a ping or pong body: u64 send time

struct command_body {
  uint32_t command = 0;
  const uint8_t* args = nullptr;  // view into the message
  size_t args_size = 0;
};

struct command_reply_body {
  uint32_t command = 0;
  reason status = reason::ok;
  const uint8_t* result = nullptr;  // view into the message
  size_t result_size = 0;
};

// Version 5, link-local between a parent and a child: entries of the bus directory (upsert) or
// ids that left it (remove). Limits: a name, type, label key or value is at most kMaxDirText bytes,
// at most kMaxLabels labels; a body holds at most kMaxDirItems items.
// Version 6 adds load: (id, load hint) pairs (node::set_load), only to peers that speak it.
enum class dir_op : uint8_t { upsert = 1, remove = 2, load = 3 };
inline constexpr size_t kMaxDirText = 128;
inline constexpr size_t kMaxLabels = 16;
inline constexpr size_t kMaxDirItems = 4096;
struct directory_body {
  dir_op op = dir_op::upsert;
  std::vector<directory_entry> entries;            // upsert
  std::vector<bus_id> ids;                         // remove
  std::vector<std::pair<bus_id, uint32_t>> loads;  // load
};

// Version 6: a broadcast's body: the selector, the user type, the payload (a view).
//   u8 kind: 1 type and labels: str8 type, u8 count (<= kMaxLabels), count x (str8 key, str8 value)
//            2 subnet: u64 prefix, u8 mask bits (<= 64)
//   u32 user type, then the payload
struct broadcast_body {
  broadcast_target to;
  uint32_t user_type = 0;
  const uint8_t* payload = nullptr;
  size_t size = 0;
};
// The body's bytes before the payload.
void encode_broadcast_head(const broadcast_target& to, uint32_t user_type,
                           std::vector<uint8_t>* out);
[[nodiscard]] errc parse_broadcast(const uint8_t* p, size_t n, broadcast_body* out);
void encode_directory(const directory_body& b, std::vector<uint8_t>* out);
[[nodiscard]] errc parse_directory(const uint8_t* p, size_t n, directory_body* out);

struct bye_body {
  reason why = reason::closing;
};

// Version 2. A relay's notice that it dropped a message: header.source is the relay,
// header.target the dropped message's source.
struct dropped_body {
  uint64_t message_id = 0;  // the header.sequence of the dropped message
  bus_id original_target = 0;
  reason why = reason::unknown_route;
};

// Appenders: each adds the body's bytes to *out (which may already hold a header placeholder).
void encode_challenge(const challenge_body& b, std::vector<uint8_t>* out);
void encode_register(const register_body& b, std::vector<uint8_t>* out);
void encode_register_reply(const register_reply_body& b, std::vector<uint8_t>* out);
void encode_node_info(const node_info& n, std::vector<uint8_t>* out);
void encode_ping(const ping_body& b, uint8_t out[kPingSize]) noexcept;  // no allocation
void encode_ack(const ack_body& b, uint8_t out[kAckSize]) noexcept;     // no allocation
void encode_bye(const bye_body& b, std::vector<uint8_t>* out);
void encode_dropped(const dropped_body& b, std::vector<uint8_t>* out);
// Data prefix (user type) into out[0..4).
inline void encode_data_prefix(uint32_t user_type, uint8_t* out) noexcept {
  store_le<uint32_t>(out, user_type);
}
void encode_command(uint32_t command, const void* args, size_t n, std::vector<uint8_t>* out);
void encode_command_reply(uint32_t command, reason status, const void* result, size_t n,
                          std::vector<uint8_t>* out);

// Body parsers: [p, p + n) is exactly the body (header.body_len bytes). Trailing bytes are a
// protocol_error, except where a later version may append fields (none in version 1).
[[nodiscard]] errc parse_challenge(const uint8_t* p, size_t n, challenge_body* out);
[[nodiscard]] errc parse_register(const uint8_t* p, size_t n, register_body* out);
[[nodiscard]] errc parse_register_reply(const uint8_t* p, size_t n, register_reply_body* out);
[[nodiscard]] errc parse_node_info(const uint8_t* p, size_t n, node_info* out);
[[nodiscard]] errc parse_ping(const uint8_t* p, size_t n, ping_body* out) noexcept;
[[nodiscard]] errc parse_data(const uint8_t* p, size_t n, data_body* out) noexcept;
[[nodiscard]] errc parse_ack(const uint8_t* p, size_t n, ack_body* out) noexcept;
[[nodiscard]] errc parse_command(const uint8_t* p, size_t n, command_body* out) noexcept;
[[nodiscard]] errc parse_command_reply(const uint8_t* p, size_t n,
                                       command_reply_body* out) noexcept;
[[nodiscard]] errc parse_bye(const uint8_t* p, size_t n, bye_body* out) noexcept;
[[nodiscard]] errc parse_dropped(const uint8_t* p, size_t n, dropped_body* out) noexcept;

// A whole message: header (with body_len set from body) followed by body, as one buffer.
[[nodiscard]] std::vector<uint8_t> build(header h, const std::vector<uint8_t>& body);

// The bytes the registration HMAC covers: "uvbus-register-v1" || nonce || id (u64 LE) || role.
// Binding the id and role stops a proof captured for one registration being replayed for another;
// the acceptor's fresh nonce stops it being replayed at all.
[[nodiscard]] std::vector<uint8_t> auth_input(const uint8_t nonce[kNonceSize], bus_id id,
                                              link_role role);
// Version 6, the acceptor's answer: "uvbus-accept-v1" || the connector's nonce || the acceptor's
// id || role. Its own label, so that neither proof can stand in for the other.
[[nodiscard]] std::vector<uint8_t> accept_auth_input(const uint8_t nonce[kNonceSize],
                                                     bus_id acceptor, link_role role);
// The acceptor's proof in a refusal (a configuration error the connector then takes as final):
// "uvbus-refuse-v1" || the connector's nonce || the acceptor's id || role || status (u16 LE). The
// status is bound, so a proven refusal cannot be turned into another verdict.
[[nodiscard]] std::vector<uint8_t> refuse_auth_input(const uint8_t nonce[kNonceSize],
                                                     bus_id acceptor, link_role role,
                                                     reason status);
// What a writer puts before each message it writes into a peer's shared-memory ring when the
// bus has access tokens (docs/protocol.md "Shared-memory writer tags"): the marker byte, 7 bytes
// of HMAC-SHA256(token, shm_tag_input(reader, writer)), and the writer's id (u64 LE).
inline constexpr size_t kShmEnvelopeSize = 16;
inline constexpr uint8_t kShmEnvelopeMarker = 0xe6;  // never a header's first byte (its version)
[[nodiscard]] std::vector<uint8_t> shm_tag_input(bus_id reader, bus_id writer);

}  // namespace uvbus::proto
