// A hand-made bus child for tests that need a peer speaking the wire protocol directly: it
// registers with a real parent (asking for lz4 if `compress`; as `role`, declaring `subnets`),
// records every message it receives after registration, and sends any message it is told to,
// including ones a real node never sends (forged sources, drop notices, flow data without
// acknowledgements).
#pragma once

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bus/auth.h"
#include "bus/bus_harness.h"
#include "bus/wire.h"
#include "core/endian.h"
#include "uvbus/stream.h"

namespace uvbus::test {

struct raw_child {
  bus_id id = 0;      // the id it registers as
  bus_id parent = 0;  // the parent's id: the target of what it sends
  std::unique_ptr<stream_channel> ch;
  connection_id conn{};
  bool registered = false;
  bool closed = false;
  bool compress = true;
  proto::link_role role = proto::link_role::child;  // what it registers as
  std::vector<subnet> subnets;                      // the subnets it declares
  proto::reason reply_status = proto::reason::ok;   // the registration reply's status ...
  std::string reply_message;                        // ... and message
  std::function<void(raw_child&)> on_registered;
  bool pause_after_register = false;  // stop reading once registered (a next hop that stalls)
  uint8_t max_version = proto::kMaxVersion;  // the highest protocol version it offers
  std::string host_id = "raw";               // the host it claims to run on ...
  std::string hostname;                      // ... its host name ...
  std::vector<std::string> listen;           // ... and its listen URLs (a ring: shm://name)
  std::string token;  // with access tokens: the one its registration proves (empty: none)
  struct message {
    proto::header hd;
    std::vector<uint8_t> body;
  };
  std::vector<message> got;  // every message after registration, in arrival order

  raw_child(bus_id self, bus_id parent_id) : id(self), parent(parent_id) {}

  void start(uv_loop_t* loop, const std::string& url) {
    stream_callbacks cb;
    cb.on_received = [this](connection_id c, const uint8_t* d, size_t n) { on_msg(c, d, n); };
    cb.on_disconnected = [this](connection_id, errc) { closed = true; };
    ch = std::make_unique<stream_channel>(loop, stream_config{}, std::move(cb));
    ASSERT_EQ(ch->connect(url, &conn), errc::ok);
  }
  // A message of type t to the parent, claiming to come from `source` (0: itself).
  void send(proto::msg_type t, const std::vector<uint8_t>& body, uint8_t flags = 0,
            bus_id source = 0, uint64_t seq = 0) {
    send_to(parent, t, body, flags, source, seq);
  }
  // The same to `target` (the parent routes it on).
  void send_to(bus_id target, proto::msg_type t, const std::vector<uint8_t>& body,
               uint8_t flags = 0, bus_id source = 0, uint64_t seq = 0) {
    proto::header h;
    h.type = t;
    h.flags = flags;
    h.source = source != 0 ? source : id;
    h.target = target;
    h.sequence = seq;
    const std::vector<uint8_t> m = proto::build(h, body);
    (void)ch->send(conn, m.data(), m.size());
  }
  // Flow data number `seq` of flow `epoch` that claims to come from `source`, flagged sync
  // (unless !sync) so that a receiver without state for the epoch takes it.
  void send_flow(bus_id source, uint64_t seq, const std::string& text, uint64_t epoch = 1,
                 bool sync = true) {
    std::vector<uint8_t> body(proto::kFlowPrefix + text.size());
    proto::encode_flow_prefix(1, epoch, body.data());
    std::memcpy(body.data() + proto::kFlowPrefix, text.data(), text.size());
    const uint8_t flags = proto::flag_flow | (sync ? proto::flag_sync : 0);
    send(proto::msg_type::data, body, flags, source, seq);
  }
  // A relay's notice that flow message `seq` from the parent to this child was dropped for `why`.
  void send_flow_drop_notice(uint64_t seq, proto::reason why) {
    std::vector<uint8_t> body;
    proto::encode_dropped({seq, id, why}, &body);
    send(proto::msg_type::dropped, body, proto::flag_flow);
  }
  // Stops reading its connection: what the parent sends it backs up (it still sends).
  void pause_reading() { ASSERT_EQ(ch->pause_reading(conn), errc::ok); }
  void resume_reading() { ASSERT_EQ(ch->resume_reading(conn), errc::ok); }
  // A heartbeat to the parent, so that it is not dropped as silent while it does not read.
  void ping() {
    std::vector<uint8_t> body(proto::kPingSize);
    proto::encode_ping({1}, body.data());
    send(proto::msg_type::ping, body);
  }
  void on_msg(connection_id, const uint8_t* d, size_t n) {
    proto::header hd;
    if (proto::parse_header(d, n, &hd) != errc::ok) return;
    if (hd.type == proto::msg_type::challenge) {
      proto::challenge_body chb;
      ASSERT_EQ(proto::parse_challenge(d + proto::kHeaderSize, hd.body_len, &chb), errc::ok);
      proto::register_body rb;
      rb.role = role;
      rb.max_version = max_version;
      rb.info.id = id;
      rb.info.host_id = host_id;
      rb.info.hostname = hostname;
      rb.info.listen = listen;
      rb.info.subnets = subnets;
      if (!token.empty()) {
        const std::vector<uint8_t> in = proto::auth_input(chb.nonce, id, role);
        ASSERT_TRUE(detail::hmac_sha256(token, in.data(), in.size(), rb.proof));
      }
      if (compress) {
        rb.ext.present = true;
        rb.ext.has_compression = true;
        rb.ext.compression = 1;  // lz4
      }
      std::vector<uint8_t> body;
      proto::encode_register(rb, &body);
      send(proto::msg_type::register_req, body);
    } else if (hd.type == proto::msg_type::register_reply) {
      proto::register_reply_body rr;
      ASSERT_EQ(proto::parse_register_reply(d + proto::kHeaderSize, hd.body_len, &rr), errc::ok);
      reply_status = rr.status;
      reply_message = rr.message;
      registered = rr.status == proto::reason::ok;
      if (!registered) return;
      if (pause_after_register) (void)ch->pause_reading(conn);
      if (on_registered) on_registered(*this);
    } else if (registered) {
      got.push_back({hd, std::vector<uint8_t>(d + proto::kHeaderSize, d + n)});
    }
  }
};

// A shared-memory record of message m: the envelope naming `writer` with its 56-bit `tag`, then m.
inline std::vector<uint8_t> enveloped(const std::vector<uint8_t>& m, bus_id writer, uint64_t tag) {
  std::vector<uint8_t> out(proto::kShmEnvelopeSize);
  out[0] = proto::kShmEnvelopeMarker;
  for (int i = 0; i < 7; ++i) out[1 + i] = static_cast<uint8_t>(tag >> (8 * i));
  store_le<uint64_t>(out.data() + 8, writer);
  out.insert(out.end(), m.begin(), m.end());
  return out;
}

// The tag `writer` puts on its records in `reader`'s ring under access token `token`.
inline uint64_t true_tag(const std::string& token, bus_id reader, bus_id writer) {
  const std::vector<uint8_t> in = proto::shm_tag_input(reader, writer);
  uint8_t mac[detail::kMacSize];
  EXPECT_TRUE(detail::hmac_sha256(token, in.data(), in.size(), mac));
  uint64_t t = 0;
  for (int i = 0; i < 7; ++i) t |= uint64_t{mac[i]} << (8 * i);
  return t;
}

// Sends 60 000-byte messages from t to c (a raw child with pause_after_register and compress off:
// it does not read) until t refuses one: the kernel's buffers and the link's queue are full. With
// `ping` the child pings every 100 ms (only its reading stalls). Returns how many t accepted; the
// test fails when no refusal comes within kWait.
inline size_t fill_unread_link(uv_loop_t* loop, bus_node* t, raw_child* c, bool ping) {
  const std::string payload(60000, 'x');
  size_t accepted = 0;
  auto next_ping = std::chrono::steady_clock::now();
  EXPECT_TRUE(run_until(
      loop,
      [&] {
        if (ping && std::chrono::steady_clock::now() >= next_ping) {
          c->ping();
          next_ping = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        }
        for (int i = 0; i < 16; ++i) {
          if (send_str(t, c->id, 1, payload) != errc::ok) return true;
          ++accepted;
        }
        return false;
      },
      kWait));
  return accepted;
}

// How many of t's reports failed, each expected to carry `want` (the reason the messages a closed
// link still held were reported with).
inline size_t failed_reports(const bus_node& t, errc want) {
  size_t failed = 0;
  for (const delivery_report& r : t.reports) {
    if (r.status == errc::ok) continue;
    ++failed;
    EXPECT_EQ(r.status, want) << to_string(r.status);
  }
  return failed;
}

}  // namespace uvbus::test
