// Fuzzes the bus message parsers (src/bus/wire.h) as a node meets them: one whole
// message (header + body) per input, exactly what arrives inside one frame or shm record.
//
//
// Invariants: parse_header accepts only what the header documents (n >= 32, known version and
// type, known flags, body_len == n - 32) and writes nothing on failure; every body parser for the
// header's type either fails with protocol_error (writing nothing) or succeeds with views inside
// the input; whatever parses re-encodes to the identical bytes (the wire format is canonical, so
// a node relaying a message can never change it by decoding and encoding it).
#include <cstring>
#include <memory>
#include <vector>

#include "bus/wire.h"
#include "fuzz_util.h"

namespace {

namespace proto = uvbus::proto;
using uvbus::errc;

bool inside(const uint8_t* view, size_t n, const uint8_t* p, size_t len) {
  return n == 0 || (view >= p && view + n <= p + len);
}

void check_same(const std::vector<uint8_t>& enc, const uint8_t* p, size_t n) {
  FUZZ_CHECK(enc.size() == n);
  FUZZ_CHECK(n == 0 || std::memcmp(enc.data(), p, n) == 0);
}

// The same bytes as a version-3 flow body (user type, epoch, payload): parse, re-encode, compare.
void check_flow_body(const uint8_t* p, size_t n) {
  proto::data_body fb;
  uint64_t epoch = 0;
  if (proto::parse_flow_data(p, n, &fb, &epoch) != errc::ok) return;
  FUZZ_CHECK(fb.size + proto::kFlowPrefix == n);
  FUZZ_CHECK(inside(fb.payload, fb.size, p, n));
  std::vector<uint8_t> enc(proto::kFlowPrefix);
  proto::encode_flow_prefix(fb.user_type, epoch, enc.data());
  enc.insert(enc.end(), fb.payload, fb.payload + fb.size);
  check_same(enc, p, n);
}

void check_dropped(const uint8_t* p, size_t n) {
  proto::dropped_body b;
  if (proto::parse_dropped(p, n, &b) != errc::ok) return;
  std::vector<uint8_t> enc;
  proto::encode_dropped(b, &enc);
  check_same(enc, p, n);
}

void check_directory(const uint8_t* p, size_t n) {
  proto::directory_body b;
  if (proto::parse_directory(p, n, &b) != errc::ok) return;
  std::vector<uint8_t> enc;
  proto::encode_directory(b, &enc);
  check_same(enc, p, n);
}

void check_broadcast(const uint8_t* p, size_t n) {
  proto::broadcast_body b;
  if (proto::parse_broadcast(p, n, &b) != errc::ok) return;
  FUZZ_CHECK(inside(b.payload, b.size, p, n));
  FUZZ_CHECK(b.to.labels.size() <= proto::kMaxLabels && b.to.net.mask_bits <= 64);
  std::vector<uint8_t> enc;
  proto::encode_broadcast_head(b.to, b.user_type, &enc);
  enc.insert(enc.end(), b.payload, b.payload + b.size);
  check_same(enc, p, n);
}

void check_flow_ack(const uint8_t* p, size_t n) {
  proto::flow_ack_body b;
  if (proto::parse_flow_ack(p, n, &b) != errc::ok) return;
  std::vector<uint8_t> enc(proto::kFlowAckSize);
  proto::encode_flow_ack(b, enc.data());
  check_same(enc, p, n);
}

// Registration bodies (register, register_reply) through their parsers and back.
void check_registration(proto::msg_type type, const uint8_t* p, size_t n) {
  std::vector<uint8_t> enc;
  if (type == proto::msg_type::register_req) {
    proto::register_body b;
    if (proto::parse_register(p, n, &b) != errc::ok) return;
    proto::encode_register(b, &enc);
    // An extension block re-encodes without unknown tags (fuzz_registration checks its fields).
    if (b.ext.present) {
      FUZZ_CHECK(enc.size() <= n);
      return;
    }
    return check_same(enc, p, n);
  }
  {
    proto::register_reply_body b;
    if (proto::parse_register_reply(p, n, &b) != errc::ok) return;
    proto::encode_register_reply(b, &enc);
    // Likewise for the reply's extension block.
    if (b.ext.present) {
      FUZZ_CHECK(enc.size() <= n);
      return;
    }
    return check_same(enc, p, n);
  }
}

void check_body(proto::msg_type type, const uint8_t* p, size_t n) {
  std::vector<uint8_t> enc;
  switch (type) {
    case proto::msg_type::challenge: {
      proto::challenge_body b;
      b.acceptor_id = 42;
      if (proto::parse_challenge(p, n, &b) != errc::ok) {
        FUZZ_CHECK(b.acceptor_id == 42);
        return;
      }
      FUZZ_CHECK(b.min_version >= 1 && b.min_version <= b.max_version);
      proto::encode_challenge(b, &enc);
      return check_same(enc, p, n);
    }
    case proto::msg_type::register_req:
    case proto::msg_type::register_reply:
      return check_registration(type, p, n);
    case proto::msg_type::ping:
    case proto::msg_type::pong: {
      proto::ping_body b;
      if (proto::parse_ping(p, n, &b) != errc::ok) return;
      enc.resize(proto::kPingSize);
      proto::encode_ping(b, enc.data());
      return check_same(enc, p, n);
    }
    case proto::msg_type::data:
    case proto::msg_type::forward: {
      check_flow_body(p, n);
      proto::data_body b;
      if (proto::parse_data(p, n, &b) != errc::ok) return;
      FUZZ_CHECK(b.size + proto::kDataPrefix == n);
      FUZZ_CHECK(inside(b.payload, b.size, p, n));
      enc.resize(proto::kDataPrefix);
      proto::encode_data_prefix(b.user_type, enc.data());
      enc.insert(enc.end(), b.payload, b.payload + b.size);
      return check_same(enc, p, n);
    }
    case proto::msg_type::ack: {
      proto::ack_body b;
      if (proto::parse_ack(p, n, &b) != errc::ok) return;
      enc.resize(proto::kAckSize);
      proto::encode_ack(b, enc.data());
      FUZZ_CHECK(proto::errc_from_reason(static_cast<uint16_t>(b.status)) != errc::ok ||
                 b.status == proto::reason::ok);
      return check_same(enc, p, n);
    }
    case proto::msg_type::command: {
      proto::command_body b;
      if (proto::parse_command(p, n, &b) != errc::ok) return;
      FUZZ_CHECK(inside(b.args, b.args_size, p, n));
      proto::encode_command(b.command, b.args, b.args_size, &enc);
      return check_same(enc, p, n);
    }
    case proto::msg_type::command_reply: {
      proto::command_reply_body b;
      if (proto::parse_command_reply(p, n, &b) != errc::ok) return;
      FUZZ_CHECK(inside(b.result, b.result_size, p, n));
      proto::encode_command_reply(b.command, b.status, b.result, b.result_size, &enc);
      return check_same(enc, p, n);
    }
    case proto::msg_type::bye: {
      proto::bye_body b;
      if (proto::parse_bye(p, n, &b) != errc::ok) return;
      proto::encode_bye(b, &enc);
      return check_same(enc, p, n);
    }
    case proto::msg_type::dropped:
      return check_dropped(p, n);
    case proto::msg_type::flow_ack:
      return check_flow_ack(p, n);
    case proto::msg_type::directory:
      return check_directory(p, n);
    case proto::msg_type::broadcast:
      return check_broadcast(p, n);
    case proto::msg_type::broadcast_ack:
      return;  // no body to parse: the header says it all
  }
  FUZZ_CHECK(false && "parse_header accepted an unknown type");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exactly-sized heap copy: ASan reports any read past the message.
  std::unique_ptr<uint8_t[]> msg(new uint8_t[size == 0 ? 1 : size]);
  if (size != 0) std::memcpy(msg.get(), data, size);
  const uint8_t* p = msg.get();

  proto::header h;
  h.sequence = 777;
  const errc e = proto::parse_header(p, size, &h);
  if (e != errc::ok) {
    FUZZ_CHECK(e == errc::protocol_error);
    FUZZ_CHECK(h.sequence == 777);
    // Whatever the header says, a body parser run over these bytes must stay in bounds too.
    if (size > 0) check_body(static_cast<proto::msg_type>(1 + p[0] % proto::kMaxMsgType), p, size);
    return 0;
  }
  FUZZ_CHECK(size >= proto::kHeaderSize);
  FUZZ_CHECK(h.body_len == size - proto::kHeaderSize);
  FUZZ_CHECK(h.version >= proto::kMinVersion && h.version <= proto::kMaxVersion);
  FUZZ_CHECK((h.flags & ~proto::kKnownFlags) == 0);
  uint8_t again[proto::kHeaderSize];
  proto::encode_header(h, again);
  FUZZ_CHECK(std::memcmp(again, p, proto::kHeaderSize) == 0);
  check_body(h.type, p + proto::kHeaderSize, h.body_len);
  if ((h.flags & proto::flag_trace) != 0 && h.body_len >= proto::kTraceSize) {
    uvbus::trace_context t;
    proto::parse_trace(p + proto::kHeaderSize, &t);
    check_body(h.type, p + proto::kHeaderSize + proto::kTraceSize, h.body_len - proto::kTraceSize);
  }
  // A call block sits at the start of the payload (after the data prefix).
  if ((h.flags & proto::flag_call) != 0 && h.body_len >= proto::kDataPrefix) {
    proto::call_block c;
    if (proto::parse_call(p + proto::kHeaderSize + proto::kDataPrefix,
                          h.body_len - proto::kDataPrefix, &c) == errc::ok) {
      uint8_t again_call[proto::kCallSize];
      proto::encode_call(c, again_call);
      FUZZ_CHECK(std::memcmp(again_call, p + proto::kHeaderSize + proto::kDataPrefix,
                             proto::kCallSize) == 0);
    }
  }
  return 0;
}
