// Protocol version 6's link protection on live nodes: two-way authentication (an acceptor that
// cannot prove a token is refused by the connector), token rotation, link compression negotiated
// at registration (and a compression bomb from a hand-made peer), a registered peer forging a
// source in flow data, a tool or sibling declaring subnets it cannot own, shared-memory writer
// tags (records without a valid tag, or speaking for another node, are dropped and counted), and a
// TLS setting only OpenSSL refuses (refused by start()).
#include <gtest/gtest.h>
#include <uv.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bus/auth.h"
#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "bus/wire.h"
#include "core/compress.h"
#include "core/endian.h"
#include "uvbus/shm.h"
#include "uvbus/stream.h"

namespace uvbus::node_secure_test {
namespace {

using test::bus_node;
using test::fast_config;
using test::raw_child;

constexpr bus_id kRoot = 0x10000;
constexpr bus_id kChild = 0x10001;
constexpr bus_id kOther = 0x10002;
const subnet kNet{0x10000, 48};

node_config with_tokens(std::vector<std::string> tokens) {
  node_config c = fast_config();
  c.access_tokens = std::move(tokens);
  return c;
}

// A compressible message: a game-like record repeated with small changes.
std::string snapshot(size_t n, uint32_t seed) {
  std::string s;
  while (s.size() < n) {
    s += R"({"entity":)" + std::to_string(seed++ % 97) + R"(,"x":1.25,"y":-3.5,"hp":100})";
  }
  s.resize(n);
  return s;
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& ch : s) ch = static_cast<char>(rng());
  return s;
}

// A plain data message's body (user type 1).
std::vector<uint8_t> data_body(const std::string& text) {
  std::vector<uint8_t> body(proto::kDataPrefix + text.size());
  proto::encode_data_prefix(1, body.data());
  std::memcpy(body.data() + proto::kDataPrefix, text.data(), text.size());
  return body;
}

bool error_named(const bus_node& n, const std::string& what) {
  for (const std::string& e : n.error_texts) {
    if (e.find(what) != std::string::npos) return true;
  }
  return false;
}

class NodeSecure : public test::bus_fixture {};

TEST_F(NodeSecure, BothSidesProveTheirTokenAndRotationWorks) {
  // The root accepts the old and the new token; the child proves the new one: the root must
  // answer with the same (new) token, which is the only one the child knows.
  bus_node* root = make_root(kRoot, {kNet}, with_tokens({"old", "new"}));
  bus_node* child = make_child(kChild, root, {}, with_tokens({"new"}));
  ASSERT_TRUE(wait([&] { return child->ups == 1; }));
  ASSERT_EQ(test::send_str(child, kRoot, 7, "hello"), errc::ok);
  ASSERT_TRUE(wait([&] { return root->got.size() == 1; }));
  EXPECT_EQ(root->got[0].bytes, "hello");
}

TEST_F(NodeSecure, AParentThatCannotProveATokenIsRefusedAndRetried) {
  // An acceptor without tokens accepts anyone, so it cannot prove one: the child refuses it
  // (access_denied, with the reason) and, since an impostor must not stop it, keeps retrying.
  bus_node* root = make_root(kRoot, {kNet});
  bus_node* child = make_child(kChild, root, {}, with_tokens({"secret"}));
  ASSERT_TRUE(wait([&] { return child->registrations.size() >= 2; }));
  EXPECT_EQ(child->ups, 0);
  EXPECT_EQ(child->registrations[0], errc::access_denied);
  EXPECT_NE(child->registration_details[0].find("did not prove"), std::string::npos)
      << child->registration_details[0];
  EXPECT_EQ(test::send_str(child, kRoot, 1, "x"), errc::ok) << "not a refusal for good";
}

TEST_F(NodeSecure, AVersion5AcceptorCannotProveItselfAndIsRefused) {
  node_config rc = with_tokens({"secret"});
  rc.protocol_max = 5;
  bus_node* root = make_root(kRoot, {kNet}, rc);
  bus_node* child = make_child(kChild, root, {}, with_tokens({"secret"}));
  ASSERT_TRUE(wait([&] { return !child->registrations.empty(); }));
  EXPECT_EQ(child->registrations[0], errc::access_denied);
  EXPECT_NE(child->registration_details[0].find("version 5"), std::string::npos)
      << child->registration_details[0];
  EXPECT_EQ(child->ups, 0);
}

// Whatever answers at the parent's URL without the token (a process that took the port, a
// spoofed address) refuses every registration with a configuration error and no proof. With
// tokens the child cannot tell that from its real parent's verdict, so it must not give up:
// it reports the refusal, says it is unproven, and keeps retrying (its sends wait, as for an
// acceptor that cannot prove a token).
class refusing_acceptor {
 public:
  refusing_acceptor(uv_loop_t* loop, proto::reason why, std::string message = "go away")
      : why_(why), message_(std::move(message)) {
    stream_callbacks cb;
    cb.on_accepted = [this](connection_id c) { challenge(c); };
    cb.on_received = [this](connection_id c, const uint8_t* d, size_t n) { answer(c, d, n); };
    ch_ = std::make_unique<stream_channel>(loop, stream_config{}, std::move(cb));
    listener_id l;
    EXPECT_EQ(ch_->listen("ipv4://127.0.0.1:0", &l), errc::ok);
    url = ch_->listener_url(l);
  }
  void close() { ch_->close(); }
  [[nodiscard]] bool closed() const { return ch_->closed(); }
  std::string url;
  int refused = 0;

 private:
  void send(connection_id c, proto::msg_type t, const std::vector<uint8_t>& body) {
    proto::header h;
    h.type = t;
    h.source = kRoot;
    const std::vector<uint8_t> m = proto::build(h, body);
    (void)ch_->send(c, m.data(), m.size());
  }
  void challenge(connection_id c) {
    proto::challenge_body ch;
    ch.acceptor_id = kRoot;
    std::vector<uint8_t> b;
    proto::encode_challenge(ch, &b);
    send(c, proto::msg_type::challenge, b);
  }
  void answer(connection_id c, const uint8_t* d, size_t n) {
    proto::header hd;
    if (proto::parse_header(d, n, &hd) != errc::ok || hd.type != proto::msg_type::register_req) {
      return;
    }
    proto::register_reply_body rr;
    rr.status = why_;
    rr.info.id = kRoot;
    rr.message = message_;
    std::vector<uint8_t> b;
    proto::encode_register_reply(rr, &b);
    send(c, proto::msg_type::register_reply, b);
    ++refused;
    (void)ch_->disconnect(c);
  }
  proto::reason why_;
  std::string message_;
  std::unique_ptr<stream_channel> ch_;
};

TEST_F(NodeSecure, AnUnprovenRefusalDoesNotStopAChildWithTokens) {
  const proto::reason kinds[] = {proto::reason::access_denied, proto::reason::out_of_subnet,
                                 proto::reason::version_mismatch};
  for (const proto::reason why : kinds) {
    refusing_acceptor fake(&loop_, why);
    node_config cc = with_tokens({"secret"});
    cc.parent_urls = {fake.url};
    bus_node* child = make(kChild, cc);
    ASSERT_TRUE(wait([&] { return !child->registrations.empty(); }));
    EXPECT_NE(child->registration_details[0].find("not proven"), std::string::npos)
        << child->registration_details[0];
    EXPECT_EQ(test::send_str(child, kRoot, 1, "x"), errc::ok) << "not a refusal for good";
    EXPECT_TRUE(wait([&] { return fake.refused >= 3; }))
        << "refused " << fake.refused << " time(s) for " << static_cast<int>(why);
    destroy(child);
    fake.close();
    ASSERT_TRUE(wait([&] { return fake.closed(); }));
  }
}

bool has_control_byte(const std::string& s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  }
  return false;
}

// Text a peer sends before it has proved anything (its host name in a registration, the message
// of a refusal) reaches the other side's log lines and error details escaped: a peer without the
// token cannot write lines of its own ("accepted child ...") into a node's log.
TEST_F(NodeSecure, UnprovenPeerTextCannotForgeLogLines) {
  const std::string forged = "x\n[info] accepted child 0x10001\x1b[2K\r";
  bus_node* root = make_root(kRoot, {kNet}, with_tokens({"secret"}));
  raw_child raw(kChild, kRoot);  // no token: refused
  raw.compress = false;
  raw.hostname = forged;
  raw.start(&loop_, root->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return root->n->counters().registrations_refused == 1 && raw.closed; }));
  ASSERT_FALSE(root->error_texts.empty());
  for (const std::string& e : root->error_texts) EXPECT_FALSE(has_control_byte(e)) << e;
  for (const auto& [lv, m] : root->logs) EXPECT_FALSE(has_control_byte(m)) << m;
  EXPECT_TRUE(error_named(*root, "x\\x0a[info] accepted child")) << root->error_texts[0];
  // The longest host name (255 bytes, escaped to 1020) does not push the reason out of it.
  raw_child longest(kOther, kRoot);
  longest.compress = false;
  longest.hostname = std::string(255, '\n');
  longest.start(&loop_, root->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return root->error_texts.size() == 2 && longest.closed; }));
  EXPECT_NE(root->error_texts[1].find("no matching access token"), std::string::npos)
      << root->error_texts[1];
  EXPECT_TRUE(root->logged("no matching access token (pid 0, host \\x0a"));

  refusing_acceptor fake(&loop_, proto::reason::access_denied, forged);
  node_config cc = with_tokens({"secret"});
  cc.parent_urls = {fake.url};
  bus_node* child = make(kOther, cc);
  ASSERT_TRUE(wait([&] { return !child->registrations.empty(); }));
  for (const std::string& d : child->registration_details) EXPECT_FALSE(has_control_byte(d)) << d;
  for (const auto& [lv, m] : child->logs) EXPECT_FALSE(has_control_byte(m)) << m;
  EXPECT_NE(child->registration_details[0].find("x\\x0a[info]"), std::string::npos)
      << child->registration_details[0];
  destroy(child);
  fake.close();
  raw.ch->close();
  longest.ch->close();
  ASSERT_TRUE(wait([&] { return fake.closed() && raw.ch->closed() && longest.ch->closed(); }));
}

// The real parent proves its refusal (it verified our token): a configuration error stays final.
TEST_F(NodeSecure, AProvenRefusalIsFinal) {
  bus_node* root = make_root(kRoot, {kNet}, with_tokens({"old", "secret"}));
  bus_node* child = make_child(0x10000000000001ULL, root, {}, with_tokens({"secret"}));  // outside
  ASSERT_TRUE(wait([&] { return !child->registrations.empty(); }));
  EXPECT_EQ(child->registrations[0], errc::out_of_subnet);
  run_for(std::chrono::milliseconds(200));
  EXPECT_EQ(child->registrations.size(), 1u);
  EXPECT_EQ(root->n->counters().registrations_refused, 1u);
  EXPECT_EQ(test::send_str(child, kRoot, 1, "x"), errc::out_of_subnet);
}

// A peer may register again and again without the token. Every refusal reaches on_error and the
// counter, but the log is rate-limited: at most 5 lines a second, the rest counted in one "N more"
// line once the second has passed. (Refusals that straddle a window are logged in both.)
TEST_F(NodeSecure, RefusedRegistrationsAreLoggedAtABoundedRate) {
  bus_node* root = make_root(kRoot, {kNet}, with_tokens({"secret"}));
  constexpr size_t kTries = 20;
  std::vector<std::unique_ptr<raw_child>> raws;
  for (size_t i = 0; i < kTries; ++i) {
    raws.push_back(std::make_unique<raw_child>(kChild + i, kRoot));
    raws.back()->compress = false;
    raws.back()->start(&loop_, root->n->listen_urls().at(0));
  }
  ASSERT_TRUE(wait([&] { return root->n->counters().registrations_refused == kTries; }));
  EXPECT_EQ(root->error_texts.size(), kTries);
  // Every refusal is in a line of its own or in a summary, and some are only in a summary.
  auto accounted = [&](size_t* lines, uint64_t* summed) {
    *lines = 0;
    *summed = 0;
    for (const auto& [lv, m] : root->logs) {
      if (m.find("refused registration of") != std::string::npos) ++*lines;
      if (m.find(" more registrations refused (log rate-limited)") != std::string::npos) {
        *summed += std::strtoull(m.c_str(), nullptr, 10);
      }
    }
    return *lines + *summed == kTries;
  };
  size_t lines = 0;
  uint64_t summed = 0;
  ASSERT_TRUE(wait([&] { return accounted(&lines, &summed); })) << lines << " + " << summed;
  EXPECT_LT(lines, kTries);
  EXPECT_GT(summed, 0u);
  for (auto& r : raws) r->ch->close();
  ASSERT_TRUE(wait([&] {
    for (auto& r : raws) {
      if (!r->ch->closed()) return false;
    }
    return true;
  }));
}

// Bus id 0 means "no node" on the wire (node::validate refuses it for a node): a hand-made peer
// registering as 0 (a child of a root whose subnet holds it: kNet) is refused with the reason.
// It registered before: the root listed a peer 0.
TEST_F(NodeSecure, APeerCannotRegisterAsIdZero) {
  bus_node* root = make_root(kRoot, {kNet});
  raw_child raw(0, kRoot);
  raw.compress = false;
  raw.start(&loop_, root->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return raw.registered || raw.closed; }));
  EXPECT_FALSE(raw.registered);
  EXPECT_EQ(raw.reply_status, proto::reason::invalid_argument);
  EXPECT_NE(raw.reply_message.find("bus id 0 is reserved"), std::string::npos) << raw.reply_message;
  EXPECT_EQ(root->n->peers().size(), 0u);
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A peer that answers the challenge with something other than a registration is closed as a
// protocol error whose detail names what came: data before registering (the message type), or a
// registration whose body does not parse (its size). Both read "expected a registration" before.
TEST_F(NodeSecure, WhatCameInsteadOfARegistrationIsNamed) {
  bus_node* root = make_root(kRoot, {kNet}, with_tokens({"secret"}));
  struct answer {
    proto::msg_type type;
    std::vector<uint8_t> body;
    const char* named;
  };
  const answer answers[] = {
      {proto::msg_type::data, data_body("early"), "expected a registration, got a data message"},
      {proto::msg_type::register_req,
       {1, 2, 3},
       "expected a registration: its 3-byte body does not parse"}};
  for (const answer& a : answers) {
    connection_id conn{};
    bool closed = false;
    stream_callbacks cb;
    std::unique_ptr<stream_channel> ch;
    cb.on_received = [&](connection_id c, const uint8_t*, size_t) {
      proto::header h;
      h.type = a.type;
      h.source = kChild;
      h.target = kRoot;
      const std::vector<uint8_t> m = proto::build(h, a.body);
      (void)ch->send(c, m.data(), m.size());
    };
    cb.on_disconnected = [&](connection_id, errc) { closed = true; };
    ch = std::make_unique<stream_channel>(&loop_, stream_config{}, std::move(cb));
    ASSERT_EQ(ch->connect(root->n->listen_urls().at(0), &conn), errc::ok);
    ASSERT_TRUE(wait([&] { return closed; }));
    EXPECT_TRUE(error_named(*root, a.named)) << root->error_texts.back();
    ch->close();
    ASSERT_TRUE(wait([&] { return ch->closed(); }));
  }
  EXPECT_EQ(root->n->counters().protocol_errors, 2u);
  EXPECT_EQ(root->n->counters().registrations_accepted, 0u);
}

TEST_F(NodeSecure, CompressionIsNegotiatedAndRestoresEveryMessage) {
  node_config rc = fast_config();
  rc.compression = compression_codec::zstd;
  node_config cc = fast_config();
  cc.compression = compression_codec::lz4;  // the acceptor's codec wins: zstd both ways
  bus_node* root = make_root(kRoot, {kNet}, rc);
  bus_node* child = make_child(kChild, root, {}, cc);
  ASSERT_TRUE(wait([&] { return child->ups == 1; }));
  const std::string big = snapshot(8000, 1);
  const std::string noise = random_bytes(4000, 2);
  const std::string small = snapshot(100, 3);  // below compression_threshold
  for (const std::string* s : {&big, &noise, &small}) {
    ASSERT_EQ(test::send_str(child, kRoot, 1, *s), errc::ok);
    ASSERT_EQ(test::send_str(root, kChild, 2, *s), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return root->got.size() == 3 && child->got.size() == 3; }));
  for (bus_node* t : {root, child}) {
    EXPECT_EQ(t->got[0].bytes, big);
    EXPECT_EQ(t->got[1].bytes, noise);
    EXPECT_EQ(t->got[2].bytes, small);
    const node_counters k = t->n->counters();
    EXPECT_EQ(k.compressed_sent, 1u) << "only the compressible message above the threshold";
    EXPECT_EQ(k.decompressed, 1u);
    EXPECT_LT(k.compressed_wire_bytes * 4, k.compressed_raw_bytes);
  }
}

TEST_F(NodeSecure, CompressionNeedsBothSides) {
  node_config rc = fast_config();
  rc.compression = compression_codec::zstd;
  bus_node* root = make_root(kRoot, {kNet}, rc);
  bus_node* child = make_child(kChild, root);  // none
  ASSERT_TRUE(wait([&] { return child->ups == 1; }));
  const std::string big = snapshot(8000, 1);
  ASSERT_EQ(test::send_str(root, kChild, 2, big), errc::ok);
  ASSERT_TRUE(wait([&] { return child->got.size() == 1; }));
  EXPECT_EQ(child->got[0].bytes, big);
  EXPECT_EQ(root->n->counters().compressed_sent, 0u);
}

TEST_F(NodeSecure, BadCompressionSettingsAreRefusedByName) {
  node_config c = fast_config();
  c.compression = compression_codec::lz4;
  c.compression_level = 99;
  std::string why;
  EXPECT_EQ(node::validate(kRoot, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("compression_level (99)"), std::string::npos) << why;
  c.compression = static_cast<compression_codec>(9);
  c.compression_level = 0;
  EXPECT_EQ(node::validate(kRoot, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("compression (9)"), std::string::npos) << why;
}

// A suite OpenSSL refuses passed start(), then every dial failed for ever: start() refuses it.
TEST_F(NodeSecure, ATlsSuiteOpenSslRefusesIsRefusedByStart) {
  node_config c = fast_config();
  c.listen.clear();  // a leaf: only dials, which failed
  c.parent_urls = {"ipv4://127.0.0.1:1"};
  c.tls.mode = tls_mode::psk;
  c.tls.psk_token = std::string(20, 't');
  c.tls.ciphersuites = "TLS_BOGUS_SHA256";
  bus_node* leaf = make(kChild, c, false);
  EXPECT_EQ(leaf->n->start(), errc::invalid_argument);
  EXPECT_NE(leaf->n->last_error().detail.find("tls: ciphersuites 'TLS_BOGUS_SHA256'"),
            std::string::npos)
      << leaf->n->last_error().detail;
  EXPECT_FALSE(leaf->n->running());
}

// A registered peer that speaks for its sibling in flow data (the message kind the receive path
// tests first): its link is closed with the reason named and nothing it forged is delivered,
// while its own flow data before that was, and the honest sibling is unaffected.
TEST_F(NodeSecure, FlowDataWithAForgedSourceClosesOnlyItsOwnLink) {
  bus_node* root = make_root(kRoot, {kNet}, fast_config());
  bus_node* honest = make_child(kChild, root);
  ASSERT_TRUE(wait([&] { return honest->ups == 1; }));
  raw_child raw(kOther, kRoot);
  raw.compress = false;
  raw.on_registered = [](raw_child& r) {
    r.send_flow(kOther, 1, "mine");
    r.send_flow(kChild, 2, "forged");
  };
  raw.start(&loop_, root->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return raw.closed; }));
  EXPECT_TRUE(raw.registered);
  ASSERT_EQ(root->got.size(), 1u);
  EXPECT_EQ(root->got[0].source, kOther);
  EXPECT_EQ(root->got[0].bytes, "mine");
  EXPECT_GE(root->n->counters().protocol_errors, 1u);
  bool named = false;
  for (const std::string& e : root->error_texts)
    named = named || e.find("source id") != std::string::npos;
  EXPECT_TRUE(named);
  ASSERT_EQ(test::send_str(honest, kRoot, 1, "still here"), errc::ok);
  ASSERT_TRUE(wait([&] { return root->got.size() == 2; }));
  EXPECT_EQ(root->got[1].source, kChild);
  EXPECT_EQ(root->got[1].bytes, "still here");
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A tool speaks only as itself: subnets it declares (here every id) are not honoured, so its
// message claiming to come from an honest child closes its link with the reason named and is not
// delivered, while its own message before that was.
TEST_F(NodeSecure, AToolDeclaringEveryIdCannotSpeakForAChild) {
  bus_node* root = make_root(kRoot, {kNet}, fast_config());
  bus_node* honest = make_child(kChild, root);
  ASSERT_TRUE(wait([&] { return honest->ups == 1; }));
  constexpr bus_id kTool = 0x7000000000000;  // outside the root's subnets, as a tool's id is
  raw_child raw(kTool, kRoot);
  raw.compress = false;
  raw.role = proto::link_role::tool;
  raw.subnets = {subnet{0, 64}};
  raw.on_registered = [](raw_child& r) {
    r.send(proto::msg_type::data, data_body("mine"), 0, kTool, 1);
    r.send(proto::msg_type::data, data_body("forged"), 0, kChild, 2);
  };
  raw.start(&loop_, root->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return raw.closed; }));
  EXPECT_TRUE(raw.registered);
  ASSERT_EQ(root->got.size(), 1u);
  EXPECT_EQ(root->got[0].source, kTool);
  EXPECT_EQ(root->got[0].bytes, "mine");
  EXPECT_TRUE(error_named(*root, "source id not allowed"));
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A new child may not declare a subnet that holds a registered child's id (it could then send as
// that child): refused with duplicate_id, the subnet and the child named; the honest child stays.
TEST_F(NodeSecure, AChildDeclaringASubnetHoldingAnotherChildIsRefused) {
  constexpr bus_id kHonest = 0x10201;
  bus_node* root = make_root(kRoot, {kNet}, fast_config());
  bus_node* honest = make_child(kHonest, root);
  ASSERT_TRUE(wait([&] { return honest->ups == 1; }));
  raw_child raw(0x10200, kRoot);
  raw.subnets = {subnet{0x10200, 8}};
  raw.on_registered = [](raw_child& r) {
    r.send(proto::msg_type::data, data_body("forged"), 0, kHonest, 1);
  };
  raw.start(&loop_, root->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return raw.closed; }));
  EXPECT_FALSE(raw.registered);
  EXPECT_EQ(raw.reply_status, proto::reason::duplicate_id);
  const char* want = "child subnet 0x10200/8 holds registered child 0x10201";
  EXPECT_NE(raw.reply_message.find(want), std::string::npos) << raw.reply_message;
  EXPECT_TRUE(error_named(*root, want));
  EXPECT_TRUE(root->got.empty());
  EXPECT_EQ(test::send_str(honest, kRoot, 7, "still here"), errc::ok);
  ASSERT_TRUE(wait([&] { return root->got.size() == 1; }));
  EXPECT_EQ(root->got[0].source, kHonest);
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// A sibling relays for the subnets it declares only if it could own them: one holding our
// parent's id, overlapping our subnets or outside our parent's subnets is refused with
// out_of_subnet and the subnet named; a plausible one is accepted and relays for it.
TEST_F(NodeSecure, ASiblingDeclaringSubnetsItCannotOwnIsRefused) {
  constexpr bus_id kA = 0x20001;
  constexpr bus_id kSib = 0x30001;
  bus_node* root = make_root(kRoot, {kNet}, fast_config());
  bus_node* a = make_child(kA, root, {subnet{0x20100, 8}});
  ASSERT_TRUE(wait([&] { return a->ups == 1; }));
  struct refusal {
    subnet declared;
    const char* fault;
  };
  const refusal cases[] = {{{0x10000, 4}, "0x10000/4 holds our parent's id"},
                           {{0x20100, 4}, "0x20100/4 overlaps our subnets"},
                           {{0x1000000000000, 8}, "0x1000000000000/8 is outside our parent's"}};
  for (const refusal& c : cases) {
    raw_child raw(kSib, kA);
    raw.role = proto::link_role::sibling;
    raw.subnets = {subnet{0x30100, 8}, c.declared};
    raw.start(&loop_, a->n->listen_urls().at(0));
    ASSERT_TRUE(wait([&] { return raw.closed; })) << c.fault;
    EXPECT_FALSE(raw.registered) << c.fault;
    EXPECT_EQ(raw.reply_status, proto::reason::out_of_subnet) << c.fault;
    EXPECT_NE(raw.reply_message.find(c.fault), std::string::npos) << raw.reply_message;
    EXPECT_TRUE(error_named(*a, c.fault)) << c.fault;
    raw.ch->close();
    ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
  }
  EXPECT_EQ(a->n->counters().registrations_refused, 3u);
  raw_child raw(kSib, kA);
  raw.compress = false;
  raw.role = proto::link_role::sibling;
  raw.subnets = {subnet{0x30100, 8}};
  raw.on_registered = [](raw_child& r) {
    r.send(proto::msg_type::data, data_body("relayed"), 0, 0x30105, 1);
  };
  raw.start(&loop_, a->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return a->got.size() == 1; }));
  EXPECT_TRUE(raw.registered);
  EXPECT_EQ(a->got[0].source, 0x30105u);
  EXPECT_EQ(a->got[0].bytes, "relayed");
  EXPECT_FALSE(raw.closed);
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

TEST_F(NodeSecure, ACompressionBombClosesOnlyItsOwnLink) {
  node_config rc = fast_config();
  rc.compression = compression_codec::lz4;
  rc.message_limit = 4096;
  bus_node* root = make_root(kRoot, {kNet}, rc);
  bus_node* honest = make_child(kChild, root);
  ASSERT_TRUE(wait([&] { return honest->ups == 1; }));
  // 1 MiB of zeros in a block of about 4 KiB, far above the root's limit: refused before a byte
  // is inflated.
  std::vector<uint8_t> zeros(size_t{1} << 20, 0);
  std::vector<uint8_t> block(zeros.size());
  compressor comp;
  const size_t z =
      comp.compress(codec::lz4, 0, zeros.data(), zeros.size(), block.data(), block.size());
  ASSERT_GT(z, 0u);
  raw_child raw(kOther, kRoot);
  const std::vector<uint8_t> bomb(block.begin(), block.begin() + static_cast<std::ptrdiff_t>(z));
  raw.on_registered = [&bomb](raw_child& r) {
    r.send(proto::msg_type::data, bomb, proto::flag_compressed);
  };
  raw.start(&loop_, root->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return raw.closed; }));
  EXPECT_TRUE(raw.registered);
  EXPECT_GE(root->n->counters().protocol_errors, 1u);
  bool named = false;
  for (const std::string& e : root->error_texts)
    named =
        named || e.find("oversize") != std::string::npos || e.find("limit") != std::string::npos;
  EXPECT_TRUE(named);
  ASSERT_EQ(test::send_str(honest, kRoot, 1, "still here"), errc::ok);
  ASSERT_TRUE(wait([&] { return root->got.size() == 1; }));
  raw.ch->close();
  ASSERT_TRUE(wait([&] { return raw.ch->closed(); }));
}

// --------------------------------------------------------------------- shared-memory tags --
class NodeShmTags : public test::bus_fixture {
 protected:
  node_config shm_config(const std::string& ring) {
    node_config c = with_tokens({"secret"});
    c.enable_shm = true;
    c.shm_ring_bytes = size_t{1} << 20;
    c.listen.push_back(ring);
    return c;
  }
  void TearDown() override {
    test::bus_fixture::TearDown();
    for (const std::string& r : rings_) (void)shm_remove(r);
  }
  std::string ring(const char* what) {
    rings_.push_back("shm://" + test::unique_name(what));
    return rings_.back();
  }
  std::vector<std::string> rings_;
};

std::vector<uint8_t> data_message(bus_id source, const std::string& text, bus_id target = kRoot,
                                  uint8_t flags = 0) {
  proto::header h;
  h.type = proto::msg_type::data;
  h.flags = flags;
  h.source = source;
  h.target = target;
  // Sized once and filled: insert() into a 4-byte vector trips GCC 12's -Warray-bounds at -O2.
  std::vector<uint8_t> body(proto::kDataPrefix + text.size());
  std::memcpy(body.data() + proto::kDataPrefix, text.data(), text.size());
  return proto::build(h, body);
}

using test::enveloped;
using test::true_tag;

TEST_F(NodeShmTags, TaggedWritersAreDeliveredAndImpostorsAreCounted) {
  const std::string root_ring = ring("tags-root");
  bus_node* root = make_root(kRoot, {kNet}, shm_config(root_ring));
  bus_node* child = make_child(kChild, root, {}, shm_config(ring("tags-child")));
  ASSERT_TRUE(wait([&] { return child->ups == 1; }));
  ASSERT_TRUE(wait([&] {
    endpoint_info e;
    return root->n->peer(kChild, &e) && e.data_channel == channel_kind::shm;
  }));
  ASSERT_EQ(test::send_str(child, kRoot, 1, "honest"), errc::ok);
  ASSERT_TRUE(wait([&] { return root->got.size() == 1; }));
  EXPECT_GE(child->n->counters().data_sent_shm, 1u);

  shm_writer rogue;
  ASSERT_EQ(rogue.open(root_ring), errc::ok);
  const std::vector<uint8_t> plain = data_message(kChild, "no tag");
  const std::vector<uint8_t> wrong = enveloped(data_message(kChild, "bad tag"), kChild, 12345);
  // The child's true tag, but speaking for a node the child may not speak for.
  const std::vector<uint8_t> other =
      enveloped(data_message(kOther, "as another"), kChild, true_tag("secret", kRoot, kChild));
  for (const auto* m : {&plain, &wrong, &other}) {
    ASSERT_EQ(rogue.send(m->data(), m->size()), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return root->n->counters().shm_rejected == 3; }));
  ASSERT_EQ(test::send_str(child, kRoot, 1, "after"), errc::ok);
  ASSERT_TRUE(wait([&] { return root->got.size() == 2; }));
  EXPECT_EQ(root->got[1].bytes, "after");
  rogue.close();
}

// The compressed flag is link-local: a ring record carrying it (from a writer with the true tag)
// is refused and counted. Before, the root relayed it with the flag to a child whose link has no
// codec, which closed that innocent link, and a record for the root itself was delivered with its
// body as it was.
TEST_F(NodeShmTags, ARecordFlaggedCompressedIsRefusedAndHurtsNoLink) {
  const std::string root_ring = ring("zflag-root");
  bus_node* root = make_root(kRoot, {kNet}, shm_config(root_ring));
  bus_node* child = make_child(kChild, root, {}, shm_config(ring("zflag-child")));
  bus_node* other = make_child(kOther, root, {}, with_tokens({"secret"}));
  ASSERT_TRUE(wait([&] { return child->ups == 1 && other->ups == 1; }));
  shm_writer w;
  ASSERT_EQ(w.open(root_ring), errc::ok);
  const uint64_t tag = true_tag("secret", kRoot, kChild);
  const std::vector<uint8_t> to_root =
      data_message(kChild, "z-root", kRoot, proto::flag_compressed);
  const std::vector<uint8_t> to_other =
      data_message(kChild, "z-other", kOther, proto::flag_compressed);
  for (const std::vector<uint8_t>* m : {&to_root, &to_other}) {
    const std::vector<uint8_t> e = enveloped(*m, kChild, tag);
    ASSERT_EQ(w.send(e.data(), e.size()), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return root->n->counters().protocol_errors == 2; }));
  ASSERT_EQ(test::send_str(child, kOther, 1, "after"), errc::ok);
  ASSERT_TRUE(wait([&] { return other->got.size() == 1; }));
  EXPECT_EQ(other->got[0].bytes, "after");
  EXPECT_EQ(other->downs.size(), 0u);
  EXPECT_TRUE(root->got.empty());
  w.close();
}

}  // namespace
}  // namespace uvbus::node_secure_test
