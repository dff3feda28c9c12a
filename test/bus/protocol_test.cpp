// The bus protocol's wire format: golden byte vectors (docs/protocol.md shows the same bytes) and
// bounds checks on every parser.
#include "bus/wire.h"

#include "core/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace uvbus::proto::protocol_test {
namespace {

std::vector<uint8_t> hex(const char* s) {
  std::vector<uint8_t> v;
  auto nib = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  while (*s) {
    if (*s == ' ') {
      ++s;
      continue;
    }
    v.push_back(static_cast<uint8_t>(nib(s[0]) << 4 | nib(s[1])));
    s += 2;
  }
  return v;
}

header golden_header() {
  header h;
  h.version = 1;
  h.type = msg_type::data;
  h.flags = flag_require_response;
  h.ttl = 16;
  h.body_len = 5;
  h.source = 0x0102030405060708ull;
  h.target = 0x1112131415161718ull;
  h.sequence = 0x2122232425262728ull;
  return h;
}

const char* kGoldenHeader =
    "01 06 01 10 05000000 0807060504030201 1817161514131211 2827262524232221";

TEST(Protocol, HeaderEncodesToTheDocumentedBytes) {
  uint8_t out[kHeaderSize];
  encode_header(golden_header(), out);
  EXPECT_EQ(std::vector<uint8_t>(out, out + kHeaderSize), hex(kGoldenHeader));
}

TEST(Protocol, DataMessageGoldenVector) {
  // "hi" of user type 0x2A from 0x10 to 0x20, sequence 1, ttl 16, no flags.
  header h;
  h.type = msg_type::data;
  h.source = 0x10;
  h.target = 0x20;
  h.sequence = 1;
  std::vector<uint8_t> body(kDataPrefix);
  encode_data_prefix(0x2A, body.data());
  body.push_back('h');
  body.push_back('i');
  EXPECT_EQ(build(h, body), hex("01 06 00 10 06000000 1000000000000000 2000000000000000 "
                                "0100000000000000 2a000000 6869"));
}

TEST(Protocol, DataMessageInsideAStreamFrame) {
  // The same message as it travels in a stream frame: hash32 LE, varint length (38), payload.
  header h;
  h.source = 0x10;
  h.target = 0x20;
  h.sequence = 1;
  std::vector<uint8_t> body(kDataPrefix);
  encode_data_prefix(0x2A, body.data());
  body.push_back('h');
  body.push_back('i');
  const auto m = build(h, body);
  uint8_t frame[64];
  const size_t n = frame_encode(m.data(), m.size(), frame, sizeof frame);
  EXPECT_EQ(std::vector<uint8_t>(frame, frame + n),
            hex("5234c993 26 01060010 06000000 1000000000000000 2000000000000000 "
                "0100000000000000 2a000000 6869"));
}

TEST(Protocol, HeaderRoundTrips) {
  auto bytes = hex(kGoldenHeader);
  bytes.resize(kHeaderSize + 5, 0xEE);
  header h;
  ASSERT_EQ(parse_header(bytes.data(), bytes.size(), &h), errc::ok);
  const header g = golden_header();
  EXPECT_EQ(h.version, g.version);
  EXPECT_EQ(h.type, g.type);
  EXPECT_EQ(h.flags, g.flags);
  EXPECT_EQ(h.ttl, g.ttl);
  EXPECT_EQ(h.body_len, 5u);
  EXPECT_EQ(h.source, g.source);
  EXPECT_EQ(h.target, g.target);
  EXPECT_EQ(h.sequence, g.sequence);
}

TEST(Protocol, HeaderParserRejectsEveryMalformedField) {
  auto good = hex(kGoldenHeader);
  good.resize(kHeaderSize + 5);
  header h;
  h.ttl = 99;  // must stay untouched on failure
  for (size_t n = 0; n < kHeaderSize; ++n) {
    EXPECT_EQ(parse_header(good.data(), n, &h), errc::protocol_error) << n;
  }
  EXPECT_EQ(parse_header(nullptr, 0, &h), errc::protocol_error);
  auto bad = good;
  bad[0] = 0;  // version 0
  EXPECT_EQ(parse_header(bad.data(), bad.size(), &h), errc::protocol_error);
  bad = good;
  bad[0] = kMaxVersion + 1;
  EXPECT_EQ(parse_header(bad.data(), bad.size(), &h), errc::protocol_error);
  bad = good;
  bad[1] = 0;  // type 0
  EXPECT_EQ(parse_header(bad.data(), bad.size(), &h), errc::protocol_error);
  bad[1] = kMaxMsgType + 1;
  EXPECT_EQ(parse_header(bad.data(), bad.size(), &h), errc::protocol_error);
  bad = good;
  bad[2] = 0x80;  // unknown flag
  EXPECT_EQ(parse_header(bad.data(), bad.size(), &h), errc::protocol_error);
  // body_len must match the bytes that follow exactly: one short, one long, and 2^32-1.
  EXPECT_EQ(parse_header(good.data(), good.size() - 1, &h), errc::protocol_error);
  bad = good;
  bad.push_back(0);
  EXPECT_EQ(parse_header(bad.data(), bad.size(), &h), errc::protocol_error);
  bad = good;
  bad[4] = bad[5] = bad[6] = bad[7] = 0xFF;
  EXPECT_EQ(parse_header(bad.data(), bad.size(), &h), errc::protocol_error);
  EXPECT_EQ(h.ttl, 99);
  EXPECT_EQ(parse_header(good.data(), good.size(), &h), errc::ok);
}

node_info sample_info() {
  node_info n;
  n.id = 0x1234;
  n.pid = 4242;
  n.host_id = "boot/host";
  n.hostname = "host";
  n.subnets = {{0x1200, 8}, {0xFFFF000000000000ull, 48}};
  n.listen = {"ipv4://127.0.0.1:1", "shm://x"};
  return n;
}

TEST(Protocol, RegisterGoldenVector) {
  register_body b;
  b.role = link_role::child;
  b.min_version = 1;
  b.max_version = 4;
  b.info.id = 0x21;
  b.info.pid = 7;
  b.info.host_id = "h";
  b.info.hostname = "n";
  b.info.subnets = {{0x2100, 8}};
  b.info.listen = {"unix://s"};
  for (size_t i = 0; i < kProofSize; ++i) b.proof[i] = static_cast<uint8_t>(i);
  std::vector<uint8_t> out;
  encode_register(b, &out);
  EXPECT_EQ(out, hex("01 04 01 2100000000000000 07000000 01 68 01 6e 01 0021000000000000 08 "
                     "01 0800 756e69783a2f2f73 "
                     "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"));
}

// Version 3 flows: a flow data message's body prefix and a flow acknowledgement, byte for byte.
TEST(Protocol, FlowGoldenVectors) {
  uint8_t prefix[kFlowPrefix];
  encode_flow_prefix(7, 0x0102030405060708ull, prefix);
  EXPECT_EQ(std::vector<uint8_t>(prefix, prefix + kFlowPrefix), hex("07000000 0807060504030201"));
  const std::vector<uint8_t> body = hex("07000000 0807060504030201 6869");
  data_body d;
  uint64_t epoch = 0;
  ASSERT_EQ(parse_flow_data(body.data(), body.size(), &d, &epoch), errc::ok);
  EXPECT_EQ(d.user_type, 7u);
  EXPECT_EQ(epoch, 0x0102030405060708ull);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.payload), d.size), "hi");
  EXPECT_EQ(parse_flow_data(body.data(), kFlowPrefix - 1, &d, &epoch), errc::protocol_error);

  uint8_t ack[kFlowAckSize];
  encode_flow_ack({0x11, 0x22, 0x0100, ack_kind::gap}, ack);
  EXPECT_EQ(std::vector<uint8_t>(ack, ack + kFlowAckSize),
            hex("1100000000000000 2200000000000000 0001000000000000 01"));
  flow_ack_body a;
  ASSERT_EQ(parse_flow_ack(ack, kFlowAckSize, &a), errc::ok);
  EXPECT_EQ(a.epoch, 0x11u);
  EXPECT_EQ(a.incarnation, 0x22u);
  EXPECT_EQ(a.through, 0x100u);
  EXPECT_EQ(a.kind, ack_kind::gap);
  ack[24] = 3;  // no such kind
  EXPECT_EQ(parse_flow_ack(ack, kFlowAckSize, &a), errc::protocol_error);
  EXPECT_EQ(parse_flow_ack(ack, kFlowAckSize - 1, &a), errc::protocol_error);
}

TEST(Protocol, TraceGoldenVector) {
  // A version-4 data message with a trace context: header (flag_trace), the 25-byte trace block,
  // then the data prefix and the payload. Without a trace the same message is 25 bytes shorter.
  trace_context t;
  for (int i = 0; i < 16; ++i) t.trace_id[i] = static_cast<uint8_t>(0xa0 + i);
  for (int i = 0; i < 8; ++i) t.span_id[i] = static_cast<uint8_t>(0xb0 + i);
  t.flags = 1;
  header h;
  h.version = 1;
  h.type = msg_type::data;
  h.flags = flag_trace;
  h.ttl = 16;
  h.body_len = kTraceSize + kDataPrefix + 2;
  h.source = 0x101;
  h.target = 0x102;
  h.sequence = 5;
  std::vector<uint8_t> m(kHeaderSize + h.body_len);
  encode_header(h, m.data());
  encode_trace(t, m.data() + kHeaderSize);
  encode_data_prefix(7, m.data() + kHeaderSize + kTraceSize);
  m[m.size() - 2] = 'h';
  m[m.size() - 1] = 'i';
  EXPECT_EQ(m, hex("01 06 08 10 1f000000 0101000000000000 0201000000000000 0500000000000000"
                   " a0a1a2a3a4a5a6a7a8a9aaabacadaeaf b0b1b2b3b4b5b6b7 01"
                   " 07000000 6869"));
  header p;
  ASSERT_EQ(parse_header(m.data(), m.size(), &p), errc::ok);
  EXPECT_EQ(p.flags, flag_trace);
  trace_context back;
  parse_trace(m.data() + kHeaderSize, &back);
  EXPECT_EQ(back, t);
  EXPECT_EQ(to_traceparent(t), "00-a0a1a2a3a4a5a6a7a8a9aaabacadaeaf-b0b1b2b3b4b5b6b7-01");
}

TEST(Protocol, CallGoldenVector) {
  // A version-5 request: header (flag_call), data prefix, the 13-byte call block (kind request,
  // call id 0x0000000100000002, code = the caller's timeout 1000 ms), then the payload.
  header h;
  h.type = msg_type::data;
  h.flags = flag_call;
  h.ttl = 16;
  h.body_len = kDataPrefix + kCallSize + 2;
  h.source = 0x101;
  h.target = 0x102;
  h.sequence = 6;
  std::vector<uint8_t> m(kHeaderSize + h.body_len);
  encode_header(h, m.data());
  encode_data_prefix(7, m.data() + kHeaderSize);
  encode_call({call_kind::request, 0x0000000100000002ULL, 1000}, m.data() + kHeaderSize + 4);
  m[m.size() - 2] = 'h';
  m[m.size() - 1] = 'i';
  EXPECT_EQ(m, hex("01 06 10 10 13000000 0101000000000000 0201000000000000 0600000000000000"
                   " 07000000 01 0200000001000000 e8030000 6869"));
  call_block c;
  ASSERT_EQ(parse_call(m.data() + kHeaderSize + 4, kCallSize + 2, &c), errc::ok);
  EXPECT_EQ(c.kind, call_kind::request);
  EXPECT_EQ(c.call_id, 0x0000000100000002ULL);
  EXPECT_EQ(c.code, 1000u);
  // Short, unknown kind, call id 0: refused.
  EXPECT_EQ(parse_call(m.data() + kHeaderSize + 4, kCallSize - 1, &c), errc::protocol_error);
  uint8_t bad[kCallSize] = {4, 1};
  EXPECT_EQ(parse_call(bad, sizeof bad, &c), errc::protocol_error);
  uint8_t zero[kCallSize] = {2};
  EXPECT_EQ(parse_call(zero, sizeof zero, &c), errc::protocol_error);
}

TEST(Protocol, TraceparentParsesOnlyWellFormedValues) {
  trace_context t;
  const std::string good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  ASSERT_EQ(parse_traceparent(good, &t), errc::ok);
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.flags, 1);
  EXPECT_EQ(to_traceparent(t), good);
  std::string why;
  const std::pair<std::string, const char*> bad[] = {
      {"", "55 characters"},
      {"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "of the form"},
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "trace id"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bx-01", "span id"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", "flags"},
      {"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "trace id is all zero"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "span id is all zero"},
  };
  for (const auto& [s, what] : bad) {
    EXPECT_EQ(parse_traceparent(s, &t, &why), errc::invalid_argument) << s;
    EXPECT_NE(why.find(what), std::string::npos) << s << ": " << why;
  }
  EXPECT_EQ(parse_traceparent(good, nullptr), errc::invalid_argument);
  EXPECT_FALSE(trace_context{}.valid());
}

TEST(Protocol, RegisterRoundTripsAndEveryTruncationFails) {
  register_body b;
  b.min_version = 1;
  b.max_version = 3;
  b.role = link_role::sibling;
  b.info = sample_info();
  std::memset(b.proof, 0xAB, kProofSize);
  std::vector<uint8_t> bytes;
  encode_register(b, &bytes);
  register_body r;
  ASSERT_EQ(parse_register(bytes.data(), bytes.size(), &r), errc::ok);
  EXPECT_EQ(r.max_version, 3);
  EXPECT_EQ(r.role, link_role::sibling);
  EXPECT_EQ(r.info.id, b.info.id);
  EXPECT_EQ(r.info.pid, b.info.pid);
  EXPECT_EQ(r.info.host_id, b.info.host_id);
  EXPECT_EQ(r.info.hostname, b.info.hostname);
  EXPECT_EQ(r.info.subnets, b.info.subnets);
  EXPECT_EQ(r.info.listen, b.info.listen);
  EXPECT_EQ(std::memcmp(r.proof, b.proof, kProofSize), 0);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(parse_register(bytes.data(), n, &r), errc::protocol_error) << n;
  }
  bytes.push_back(1);  // an extension block announcing one entry, cut short
  EXPECT_EQ(parse_register(bytes.data(), bytes.size(), &r), errc::protocol_error);
  bytes.back() = 0;  // an empty extension block (version 6) is well formed
  ASSERT_EQ(parse_register(bytes.data(), bytes.size(), &r), errc::ok);
  EXPECT_TRUE(r.ext.present);
}

TEST(Protocol, RegistrationExtensionsRoundTripAndRefuseMalformedEntries) {
  register_body b;
  b.info = sample_info();
  b.ext.present = true;
  b.ext.has_nonce = true;
  std::memset(b.ext.nonce, 0x5A, kNonceSize);
  b.ext.has_compression = true;
  b.ext.compression = 2;
  std::vector<uint8_t> bytes;
  encode_register(b, &bytes);
  register_body r;
  ASSERT_EQ(parse_register(bytes.data(), bytes.size(), &r), errc::ok);
  EXPECT_TRUE(r.ext.has_nonce);
  EXPECT_EQ(std::memcmp(r.ext.nonce, b.ext.nonce, kNonceSize), 0);
  EXPECT_FALSE(r.ext.has_proof);
  EXPECT_EQ(r.ext.compression, 2);
  // Cut anywhere inside the block: refused (cut before it: a plain version-5 registration).
  const size_t block = 1 + (2 + kNonceSize) + (2 + 1);
  for (size_t n = bytes.size() - block + 1; n < bytes.size(); ++n) {
    EXPECT_EQ(parse_register(bytes.data(), n, &r), errc::protocol_error) << n;
  }
  const size_t base = bytes.size() - block;
  auto with_block = [&](std::vector<uint8_t> blk) {
    std::vector<uint8_t> m(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(base));
    m.insert(m.end(), blk.begin(), blk.end());
    register_body out;
    return parse_register(m.data(), m.size(), &out);
  };
  EXPECT_EQ(with_block({1, 99, 2, 7, 7}), errc::ok) << "an unknown tag is skipped";
  EXPECT_EQ(with_block({1, 3, 2, 1, 1}), errc::protocol_error) << "wrong length";
  EXPECT_EQ(with_block({2, 3, 1, 1, 3, 1, 1}), errc::protocol_error) << "a tag twice";
  EXPECT_EQ(with_block({1, 3, 1, 3}), errc::protocol_error) << "codec 3";
  EXPECT_EQ(with_block({9}), errc::protocol_error) << "more than 8 entries";

  register_reply_body rb;
  rb.info = sample_info();
  rb.ext.present = true;
  rb.ext.has_proof = true;
  std::memset(rb.ext.proof, 0x33, kProofSize);
  rb.ext.has_compression = true;
  rb.ext.compression = 1;
  std::vector<uint8_t> rbytes;
  encode_register_reply(rb, &rbytes);
  register_reply_body rr;
  ASSERT_EQ(parse_register_reply(rbytes.data(), rbytes.size(), &rr), errc::ok);
  EXPECT_TRUE(rr.ext.has_proof);
  EXPECT_EQ(std::memcmp(rr.ext.proof, rb.ext.proof, kProofSize), 0);
  EXPECT_EQ(rr.ext.compression, 1);
}

TEST(Protocol, RegisterRejectsOutOfRangeFields) {
  register_body b;
  b.info = sample_info();
  std::vector<uint8_t> good;
  encode_register(b, &good);
  register_body r;
  auto bad = good;
  bad[2] = 9;  // role
  EXPECT_EQ(parse_register(bad.data(), bad.size(), &r), errc::protocol_error);
  bad = good;
  bad[0] = 2;  // min > max
  bad[1] = 1;
  EXPECT_EQ(parse_register(bad.data(), bad.size(), &r), errc::protocol_error);
  // mask bits 65: the first subnet's mask byte sits after id, pid, two strings and the count.
  const size_t mask_at = 3 + 8 + 4 + 1 + b.info.host_id.size() + 1 + b.info.hostname.size() + 1 + 8;
  ASSERT_EQ(good[mask_at], 8);
  bad = good;
  bad[mask_at] = 65;
  EXPECT_EQ(parse_register(bad.data(), bad.size(), &r), errc::protocol_error);
  bad[mask_at] = 64;
  EXPECT_EQ(parse_register(bad.data(), bad.size(), &r), errc::ok);
  // A subnet count above the limit.
  bad = good;
  bad[mask_at - 9] = static_cast<uint8_t>(kMaxSubnets + 1);
  EXPECT_EQ(parse_register(bad.data(), bad.size(), &r), errc::protocol_error);
}

TEST(Protocol, ChallengeReplyAckPingByeCommandRoundTrip) {
  challenge_body c;
  c.acceptor_id = 77;
  for (size_t i = 0; i < kNonceSize; ++i) c.nonce[i] = static_cast<uint8_t>(255 - i);
  std::vector<uint8_t> v;
  encode_challenge(c, &v);
  ASSERT_EQ(v.size(), 42u);
  challenge_body c2;
  ASSERT_EQ(parse_challenge(v.data(), v.size(), &c2), errc::ok);
  EXPECT_EQ(c2.acceptor_id, 77u);
  EXPECT_EQ(std::memcmp(c2.nonce, c.nonce, kNonceSize), 0);
  EXPECT_EQ(parse_challenge(v.data(), v.size() - 1, &c2), errc::protocol_error);

  register_reply_body rr;
  rr.status = reason::out_of_subnet;
  rr.message = "id 0x99 is outside 0x1200/8";
  v.clear();
  encode_register_reply(rr, &v);
  register_reply_body rr2;
  ASSERT_EQ(parse_register_reply(v.data(), v.size(), &rr2), errc::ok);
  EXPECT_EQ(rr2.status, reason::out_of_subnet);
  EXPECT_EQ(rr2.message, rr.message);
  for (size_t n = 0; n < v.size(); ++n) {
    EXPECT_EQ(parse_register_reply(v.data(), n, &rr2), errc::protocol_error);
  }

  v.assign(kAckSize, 0);
  encode_ack({0x0102030405060708ull, reason::ttl_expired}, v.data());
  EXPECT_EQ(v, hex("0807060504030201 0800"));
  ack_body a;
  ASSERT_EQ(parse_ack(v.data(), v.size(), &a), errc::ok);
  EXPECT_EQ(a.status, reason::ttl_expired);
  v[8] = 0xFF;
  EXPECT_EQ(parse_ack(v.data(), v.size(), &a), errc::protocol_error);

  uint8_t pg[kPingSize];
  encode_ping({123456789}, pg);
  ping_body p;
  ASSERT_EQ(parse_ping(pg, sizeof pg, &p), errc::ok);
  EXPECT_EQ(p.send_time_ns, 123456789u);
  EXPECT_EQ(parse_ping(pg, 7, &p), errc::protocol_error);

  v.clear();
  encode_bye({reason::closing}, &v);
  EXPECT_EQ(v, hex("0600"));
  bye_body by;
  ASSERT_EQ(parse_bye(v.data(), v.size(), &by), errc::ok);

  v.clear();
  encode_command(static_cast<uint32_t>(command_id::echo), "abc", 3, &v);
  command_body cb;
  ASSERT_EQ(parse_command(v.data(), v.size(), &cb), errc::ok);
  EXPECT_EQ(cb.args_size, 3u);
  EXPECT_EQ(parse_command(v.data(), 3, &cb), errc::protocol_error);
  v.clear();
  encode_command_reply(2, reason::ok, "x=1\n", 4, &v);
  command_reply_body cr;
  ASSERT_EQ(parse_command_reply(v.data(), v.size(), &cr), errc::ok);
  EXPECT_EQ(cr.command, 2u);
  EXPECT_EQ(cr.result_size, 4u);
  EXPECT_EQ(parse_command_reply(v.data(), 5, &cr), errc::protocol_error);
}

TEST(Protocol, DirectoryRoundTripsAndEveryTruncationFails) {
  directory_body b;
  directory_entry e;
  e.id = 0x111;
  e.parent = 0x110;
  e.name = "logic-1";
  e.type = "logic";
  e.labels = {{"zone", "a"}, {"version", "7"}};
  e.listen = {"ipv4://127.0.0.1:1234", "shm://l1"};
  e.host_id = "host";
  e.hostname = "vm";
  e.pid = 42;
  e.start_time_ms = 1764000000000;
  e.protocol_version = 5;
  b.entries = {e, e};
  b.entries[1].id = 0x112;
  std::vector<uint8_t> m;
  encode_directory(b, &m);
  directory_body back;
  ASSERT_EQ(parse_directory(m.data(), m.size(), &back), errc::ok);
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0], e);
  EXPECT_EQ(back.entries[1].id, 0x112u);
  for (size_t n = 0; n < m.size(); ++n) {
    EXPECT_EQ(parse_directory(m.data(), n, &back), errc::protocol_error) << n;
  }
  m.push_back(0);
  EXPECT_EQ(parse_directory(m.data(), m.size(), &back), errc::protocol_error);  // trailing byte
  directory_body r;
  r.op = dir_op::remove;
  r.ids = {0x111, 0x112};
  m.clear();
  encode_directory(r, &m);
  EXPECT_EQ(m, hex("02 0200 1101000000000000 1201000000000000"));
  ASSERT_EQ(parse_directory(m.data(), m.size(), &back), errc::ok);
  EXPECT_EQ(back.ids, r.ids);
  // An unknown op, a count above the limit, an entry with id 0: refused.
  EXPECT_EQ(parse_directory(hex("04 0000").data(), 3, &back), errc::protocol_error);
  EXPECT_EQ(parse_directory(hex("02 0110").data(), 3, &back), errc::protocol_error);
  b.entries = {e};
  b.entries[0].id = 0;
  m.clear();
  encode_directory(b, &m);
  EXPECT_EQ(parse_directory(m.data(), m.size(), &back), errc::protocol_error);
}

TEST(Protocol, DropNoticeGoldenVectorAndBounds) {
  std::vector<uint8_t> v;
  encode_dropped({0x0102030405060708ull, 0x1112131415161718ull, reason::unknown_route}, &v);
  EXPECT_EQ(v, hex("0807060504030201 1817161514131211 0700"));
  dropped_body d;
  ASSERT_EQ(parse_dropped(v.data(), v.size(), &d), errc::ok);
  EXPECT_EQ(d.message_id, 0x0102030405060708ull);
  EXPECT_EQ(d.original_target, 0x1112131415161718ull);
  EXPECT_EQ(d.why, reason::unknown_route);
  for (size_t n = 0; n < v.size(); ++n) {
    EXPECT_EQ(parse_dropped(v.data(), n, &d), errc::protocol_error) << n;
  }
  v.push_back(0);
  EXPECT_EQ(parse_dropped(v.data(), v.size(), &d), errc::protocol_error);
  v.pop_back();
  v[16] = 0xFF;
  EXPECT_EQ(parse_dropped(v.data(), v.size(), &d), errc::protocol_error);
  v[16] = 0;  // ok: no relay drops a message for no reason (it would read as a success report)
  EXPECT_EQ(parse_dropped(v.data(), v.size(), &d), errc::protocol_error);
  // Headers keep layout version 1 whatever the protocol version, so version-1 peers parse them.
  EXPECT_EQ(header{}.version, 1);
  EXPECT_EQ(std::string(to_string(msg_type::dropped)), "dropped");
}

TEST(Protocol, DataBodyIsAViewAndNeedsItsPrefix) {
  uint8_t b[6] = {1, 0, 0, 0, 'o', 'k'};
  data_body d;
  ASSERT_EQ(parse_data(b, sizeof b, &d), errc::ok);
  EXPECT_EQ(d.user_type, 1u);
  EXPECT_EQ(d.payload, b + 4);
  EXPECT_EQ(d.size, 2u);
  ASSERT_EQ(parse_data(b, 4, &d), errc::ok);
  EXPECT_EQ(d.size, 0u);
  EXPECT_EQ(parse_data(b, 3, &d), errc::protocol_error);
}

TEST(Protocol, ReasonsMapBothWays) {
  for (uint16_t r = 0; r <= static_cast<uint16_t>(reason::other); ++r) {
    const errc e = errc_from_reason(r);
    if (static_cast<reason>(r) == reason::other) continue;
    EXPECT_EQ(static_cast<uint16_t>(reason_from_errc(e)), r) << r;
  }
  EXPECT_EQ(errc_from_reason(999), errc::protocol_error);
}

TEST(Protocol, AuthInputBindsNonceIdAndRole) {
  uint8_t nonce[kNonceSize] = {};
  const auto a = auth_input(nonce, 1, link_role::child);
  EXPECT_NE(a, auth_input(nonce, 2, link_role::child));
  EXPECT_NE(a, auth_input(nonce, 1, link_role::sibling));
  nonce[31] = 1;
  EXPECT_NE(a, auth_input(nonce, 1, link_role::child));
  EXPECT_EQ(a.size(), 17 + kNonceSize + 8 + 1);
}

}  // namespace
}  // namespace uvbus::proto::protocol_test
