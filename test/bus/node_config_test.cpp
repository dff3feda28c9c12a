// Node configuration and call errors: every validate() rule refuses with a detail naming the
// field and the rule; start() and sends return the precise code and record last_error().
#include <gtest/gtest.h>
#include <uv.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/flow_harness.h"  // positions_blob
#include "bus/node_types.h"    // kMaxBusOverhead: one message's size
#include "uvbus/node.h"

namespace uvbus::node_config_test {
namespace {

using namespace std::chrono_literals;

using test::bus_node;
using test::fast_config;
using test::send_str;

struct rule {
  const char* name;
  std::function<void(node_config*)> mutate;
  errc code;
  const char* detail;  // a piece the detail must contain
};

using C = node_config;

std::vector<rule> url_rules() {
  return {
      {"listen without port", [](C* c) { c->listen = {"ipv4://127.0.0.1"}; }, errc::bad_url,
       "listen[0] \"ipv4://127.0.0.1\": missing port"},
      {"listen unknown scheme", [](C* c) { c->listen = {"tcp://127.0.0.1:1"}; },
       errc::unsupported_scheme, "listen[0]"},
      {"listen not a URL", [](C* c) { c->listen = {"nonsense"}; }, errc::bad_url,
       "missing \"://\""},
      {"listen mem", [](C* c) { c->listen = {"mem://x"}; }, errc::unsupported_scheme,
       "mem:// is an in-process ring"},
      {"two shm",
       [](C* c) {
         c->listen = {"shm://a", "shm://b"};
       },
       errc::invalid_argument, "listen[1] \"shm://b\": at most one shm://"},
      {"nine listen URLs",
       [](C* c) { c->listen = std::vector<std::string>(9, "ipv4://127.0.0.1:0"); },
       errc::invalid_argument, "listen: 9 URLs, at most 8"},
      {"long URL", [](C* c) { c->listen = {"unix:///" + std::string(300, 'x')}; },
       errc::invalid_argument, "longer than 256 bytes"},
      {"unix path too long", [](C* c) { c->parent_urls = {"unix:///" + std::string(107, 'x')}; },
       errc::bad_url, "parent_urls[0] \"unix:///xxx"},
      {"parent not a URL",
       [](C* c) {
         c->parent_urls = {"ipv4://127.0.0.1:1", "nonsense"};
       },
       errc::bad_url, "parent_urls[1] \"nonsense\""},
      {"parent shm", [](C* c) { c->parent_urls = {"shm://x"}; }, errc::unsupported_scheme,
       "parent_urls[0] \"shm://x\": a parent is reached over a stream URL"},
      {"tool without parent", [](C* c) { c->join_as_tool = true; }, errc::invalid_argument,
       "join_as_tool: a tool registers to a parent, and parent_urls is empty"},
      {"tool with subnets",
       [](C* c) {
         c->join_as_tool = true;
         c->parent_urls = {"ipv4://127.0.0.1:1"};
         c->subnets = {{0x100, 8}};
       },
       errc::invalid_argument, "join_as_tool: a tool accepts no children, and subnets has 1"},
      {"tool with discovery",
       [](C* c) {
         c->join_as_tool = true;
         c->parent_urls = {"ipv4://127.0.0.1:1"};
         c->discovery.etcd_endpoints = {"http://127.0.0.1:2379"};
       },
       errc::invalid_argument,
       "join_as_tool: a tool is never announced, and discovery.etcd_endpoints is set"},
      {"long name", [](C* c) { c->name = std::string(129, 'n'); }, errc::invalid_argument,
       "name: 129 bytes, at most 128"},
      {"empty label key",
       [](C* c) {
         c->labels = {{"zone", "a"}, {"", "x"}};
       },
       errc::invalid_argument, "labels[1]: the key is empty"},
      {"repeated label key",
       [](C* c) {
         c->labels = {{"zone", "a"}, {"zone", "b"}};
       },
       errc::invalid_argument, "labels[1]: key \"zone\" repeats labels[0]"},
      {"seventeen labels",
       [](C* c) {
         for (int i = 0; i < 17; ++i) c->labels.emplace_back("k" + std::to_string(i), "v");
       },
       errc::invalid_argument, "labels: 17 labels, at most 16"},
      {"nine parents",
       [](C* c) { c->parent_urls = std::vector<std::string>(9, "ipv4://127.0.0.1:1"); },
       errc::invalid_argument, "parent_urls: 9 URLs, at most 8"},
  };
}

std::vector<rule> size_rules() {
  return {
      {"17 subnets",
       [](C* c) {
         c->subnets = std::vector<subnet>(17, subnet{0x100, 4});
       },
       errc::invalid_argument, "subnets: 17 subnets, at most 16"},
      {"subnet 65 bits",
       [](C* c) {
         c->subnets = {{0, 65}};
       },
       errc::invalid_argument, "subnets[0].mask_bits (65) must be at most 64"},
      {"empty token",
       [](C* c) {
         c->access_tokens = {"a", ""};
       },
       errc::invalid_argument, "access_tokens[1] is empty"},
      {"long host id", [](C* c) { c->host_id = std::string(129, 'h'); }, errc::invalid_argument,
       "host_id"},
      {"protocol_min 0", [](C* c) { c->protocol_min = 0; }, errc::invalid_argument,
       "protocol_min .. protocol_max (0 .."},
      {"protocol range empty",
       [](C* c) {
         c->protocol_min = proto::kMaxVersion;
         c->protocol_max = proto::kMinVersion - 1;
       },
       errc::invalid_argument, "protocol_min .. protocol_max"},
      {"ttl 0", [](C* c) { c->default_ttl = 0; }, errc::invalid_argument, "default_ttl"},
      {"message_limit 0", [](C* c) { c->message_limit = 0; }, errc::invalid_argument,
       "message_limit (0)"},
      {"message_limit 2 GiB", [](C* c) { c->message_limit = size_t{2} << 30; },
       errc::invalid_argument, "message_limit (2147483648)"},
      {"link queue below a frame", [](C* c) { c->link_queue_bytes = 1000; }, errc::invalid_argument,
       "link_queue_bytes (1000) must hold one frame of message_limit"},
      {"link queue packets 0", [](C* c) { c->link_queue_packets = 0; }, errc::invalid_argument,
       "link_queue_packets"},
      {"post queue 0", [](C* c) { c->post_queue_messages = 0; }, errc::invalid_argument,
       "post_queue_messages"},
      {"post queue below a message", [](C* c) { c->post_queue_bytes = 1000; },
       errc::invalid_argument, "post_queue_bytes (1000) must hold one message"},
      {"outstanding 0", [](C* c) { c->max_outstanding_responses = 0; }, errc::invalid_argument,
       "max_outstanding_responses"},
      {"per-address cap above the node's", [](C* c) { c->max_unregistered_per_address = 2000; },
       errc::invalid_argument,
       "max_unregistered_per_address (2000) must not exceed max_unregistered (1024)"},
  };
}

std::vector<rule> timer_rules() {
  return {
      {"handshake 0", [](C* c) { c->handshake_timeout_ms = 0; }, errc::invalid_argument,
       "handshake_timeout_ms must not be 0"},
      {"heartbeat interval 0", [](C* c) { c->heartbeat_interval_ms = 0; }, errc::invalid_argument,
       "heartbeat_interval_ms must not be 0"},
      {"heartbeat timeout 0", [](C* c) { c->heartbeat_timeout_ms = 0; }, errc::invalid_argument,
       "heartbeat_timeout_ms must not be 0"},
      {"pending timeout 0", [](C* c) { c->pending_timeout_ms = 0; }, errc::invalid_argument,
       "pending_timeout_ms must not be 0"},
      {"response timeout 0", [](C* c) { c->response_timeout_ms = 0; }, errc::invalid_argument,
       "response_timeout_ms must not be 0"},
      {"reconnect min 0", [](C* c) { c->reconnect_min_ms = 0; }, errc::invalid_argument,
       "reconnect_min_ms must not be 0"},
      {"sibling idle 0", [](C* c) { c->sibling_idle_ms = 0; }, errc::invalid_argument,
       "sibling_idle_ms must not be 0"},
      {"heartbeat timeout equal to the interval",
       [](C* c) {
         c->heartbeat_interval_ms = 6000;
         c->heartbeat_timeout_ms = 6000;
       },
       errc::invalid_argument,
       "heartbeat_timeout_ms (6000) must be at least twice heartbeat_interval_ms (6000)"},
      {"heartbeat timeout below twice the interval",
       [](C* c) {
         c->heartbeat_interval_ms = 2000;
         c->heartbeat_timeout_ms = 3999;
       },
       errc::invalid_argument, "heartbeat_timeout_ms (3999)"},
      {"reconnect min above max",
       [](C* c) {
         c->reconnect_min_ms = 500;
         c->reconnect_max_ms = 100;
       },
       errc::invalid_argument, "reconnect_min_ms (500) must not exceed reconnect_max_ms (100)"},
      {"jitter negative", [](C* c) { c->reconnect_jitter = -0.1; }, errc::invalid_argument,
       "reconnect_jitter"},
      {"jitter above 1", [](C* c) { c->reconnect_jitter = 1.5; }, errc::invalid_argument,
       "reconnect_jitter"},
      {"jitter NaN", [](C* c) { c->reconnect_jitter = std::nan(""); }, errc::invalid_argument,
       "reconnect_jitter"},
      {"shm ring too small",
       [](C* c) {
         c->listen = {"shm://x"};
         c->shm_ring_bytes = size_t{64} * 1024;
       },
       errc::invalid_argument, "shm_ring_bytes (65536) must be a power of two"},
      {"shm ring not a power of two",
       [](C* c) {
         c->listen = {"shm://x"};
         c->shm_ring_bytes = 3 << 20;
       },
       errc::invalid_argument, "(at least "},
      {"shm abandon timeout 0",
       [](C* c) {
         c->listen = {"shm://x"};
         c->shm_abandon_timeout_us = 0;
       },
       errc::invalid_argument, "shm_abandon_timeout_us"},
  };
}

// A leaf: it dials its parent (at a port nobody needs to listen on: validate() only).
void leaf(C* c) {
  c->parent_urls = {"ipv4://127.0.0.1:1"};
}

void psk(C* c, size_t token_bytes) {
  c->tls.mode = tls_mode::psk;
  c->tls.psk_identity = "bus";
  c->tls.psk_token = std::string(token_bytes, 't');
}

// Every size a message of `limit` bytes needs, made large enough.
void big_messages(C* c, size_t limit) {
  c->message_limit = limit;
  for (size_t* s : {&c->link_queue_bytes, &c->pending_max_bytes, &c->post_queue_bytes,
                    &c->retransmit_max_bytes, &c->forward_overflow_bytes}) {
    *s = 4 * limit;
  }
}

void with_etcd(C* c) {
  c->discovery.etcd_endpoints = {"http://127.0.0.1:1"};
}

// Rules whose breach used to pass validate() and fail at run time (every dial, every relay).
std::vector<rule> run_time_rules() {
  return {
      {"psk token of 10 bytes",
       [](C* c) {
         leaf(c);
         psk(c, 10);
       },
       errc::invalid_argument, "node_config.tls: psk mode needs psk_token of at least 16 bytes"},
      {"certificate without ca_file",
       [](C* c) {
         leaf(c);
         c->tls.mode = tls_mode::certificate;
         c->tls.cert_file = "node.crt";
         c->tls.key_file = "node.key";
       },
       errc::invalid_argument, "node_config.tls: certificate mode needs cert_file, key_file"},
      {"tls handshake 0",
       [](C* c) {
         psk(c, 16);
         c->tls.handshake_timeout_ms = 0;
       },
       errc::invalid_argument, "node_config.tls: handshake_timeout_ms must be > 0"},
      {"link queue beyond SIZE_MAX / 2", [](C* c) { c->link_queue_bytes = SIZE_MAX; },
       errc::invalid_argument, "node_config.link_queue_bytes (the links' queue): queue.ring_bytes"},
      {"tokens at version 5 on a leaf",
       [](C* c) {
         leaf(c);
         c->access_tokens = {"secret"};
         c->protocol_max = 5;
       },
       errc::invalid_argument,
       "protocol_max (5) must be at least 6 with access_tokens when this node dials a parent"},
      {"tokens at version 5 choosing a parent by discovery",
       [](C* c) {
         with_etcd(c);
         c->discovery_parent_type = "relay";
         c->access_tokens = {"secret"};
         c->protocol_max = 5;
       },
       errc::invalid_argument, "protocol_max (5) must be at least 6"},
  };
}

// discovery's parent rule, the shm record, the forwarding overflow.
std::vector<rule> run_time_rules_2() {
  return {
      {"parent type without etcd", [](C* c) { c->discovery_parent_type = "relay"; },
       errc::invalid_argument,
       "discovery_parent_type is set but discovery.etcd_endpoints is empty"},
      {"parent labels without a type",
       [](C* c) {
         with_etcd(c);
         c->discovery_parent_labels = {{"zone", "a"}};
       },
       errc::invalid_argument,
       "discovery_parent_labels are set but discovery_parent_type is empty"},
      {"parent type too long",
       [](C* c) {
         with_etcd(c);
         c->discovery_parent_type = std::string(129, 't');
       },
       errc::invalid_argument, "discovery_parent_type: 129 bytes, at most 128"},
      {"parent label key empty",
       [](C* c) {
         with_etcd(c);
         c->discovery_parent_type = "relay";
         c->discovery_parent_labels = {{"", "a"}};
       },
       errc::invalid_argument, "discovery_parent_labels[0]: the key is empty"},
      {"parent label key twice",
       [](C* c) {
         with_etcd(c);
         c->discovery_parent_type = "relay";
         c->discovery_parent_labels = {{"zone", "a"}, {"zone", "b"}};
       },
       errc::invalid_argument, "discovery_parent_labels[1]: key \"zone\" repeats"},
      {"parent label value too long",
       [](C* c) {
         with_etcd(c);
         c->discovery_parent_type = "relay";
         c->discovery_parent_labels = {{"zone", std::string(129, 'v')}};
       },
       errc::invalid_argument, "discovery_parent_labels[0] \"zone\": key or value over 128"},
      {"shm message above the largest record",
       [](C* c) {
         big_messages(c, size_t{5} << 20);
         c->listen = {"shm://x"};
       },
       errc::invalid_argument,
       "message_limit (5242880) is above the largest a shm:// listen URL carries"},
      {"forward overflow 0", [](C* c) { c->forward_overflow_bytes = 0; }, errc::invalid_argument,
       "forward_overflow_bytes (0) must hold one message of message_limit"},
      {"forward overflow below a message", [](C* c) { c->forward_overflow_bytes = 60000; },
       errc::invalid_argument, "forward_overflow_bytes (60000) must hold one message"},
  };
}

// Combinations that passed validate() and could never work: a parent no dial reaches, a delivery
// mode or codec the node's versions cannot carry, a rule that would be ignored, a timer that wraps.
std::vector<rule> unusable_rules() {
  return {
      {"parent at port 0",
       [](C* c) {
         c->parent_urls = {"ipv4://127.0.0.1:1", "dns://h:0"};
       },
       errc::bad_url, "parent_urls[1] \"dns://h:0\": port 0 cannot be dialled"},
      {"parent host with a space", [](C* c) { c->parent_urls = {"dns://bad host:80"}; },
       errc::bad_url, "parent_urls[0] \"dns://bad host:80\": the host holds a space or control"},
      {"parent host with a newline", [](C* c) { c->parent_urls = {"dns://a\nb:80"}; },
       errc::bad_url, "parent_urls[0] \"dns://a\nb:80\": the host holds a space or control"},
      {"end to end at version 2", [](C* c) { c->protocol_max = 2; }, errc::invalid_argument,
       "delivery end_to_end needs protocol_max (2) of at least 3"},
      {"tokens at version 5 on a root that dials other trees",
       [](C* c) {
         with_etcd(c);
         c->access_tokens = {"secret"};
         c->protocol_max = 5;
       },
       errc::invalid_argument, "protocol_max (5) must be at least 6 with access_tokens"},
      {"message_limit above 1 GiB less the bus overhead",
       [](C* c) { big_messages(c, (size_t{1} << 30) - detail::kMaxBusOverhead + 1); },
       errc::invalid_argument, "message_limit (1073741740) must be 1 .. 1073741739"},
      {"parent type with parent_urls",
       [](C* c) {
         leaf(c);
         with_etcd(c);
         c->discovery_parent_type = "relay";
       },
       errc::invalid_argument, "discovery_parent_type is set with parent_urls"},
      {"delivery out of range", [](C* c) { c->delivery = static_cast<delivery_mode>(9); },
       errc::invalid_argument, "delivery (9) is not end_to_end or next_hop"},
      {"compression at version 5",
       [](C* c) {
         c->compression = compression_codec::lz4;
         c->protocol_max = 5;
       },
       errc::invalid_argument, "compression (lz4) needs protocol_max (5) of at least 6"},
      {"shm ring above 2^46",
       [](C* c) {
         c->listen = {"shm://x"};
         c->shm_ring_bytes = size_t{1} << 47;
       },
       errc::invalid_argument, "shm_ring_bytes (140737488355328) must be at most 2^46"},
      {"resend timeout whose backoff wraps", [](C* c) { c->resend_timeout_ms = 1u << 29; },
       errc::invalid_argument, "resend_timeout_ms (536870912) must be at most 86400000"},
      {"delivery timeout whose round trip wraps", [](C* c) { c->delivery_timeout_ms = 1u << 31; },
       errc::invalid_argument, "delivery_timeout_ms (2147483648) must be at most 86400000"},
  };
}

// The inherited flow positions, parsed as start() parses them (node 1's are taken).
std::vector<rule> positions_rules() {
  return {
      {"positions of another node",
       [](C* c) { c->inherit_flow_positions = test::positions_blob(2, 1); }, errc::invalid_argument,
       "inherit_flow_positions (72 bytes) are node 0x2's flow positions, not this node's (0x1)"},
      {"positions cut short",
       [](C* c) {
         c->inherit_flow_positions = test::positions_blob(1, 2);
         c->inherit_flow_positions.resize(100);
       },
       errc::invalid_argument,
       "inherit_flow_positions (100 bytes) is not a node::flow_positions() blob (2 positions "
       "announced: 128 bytes, not 100"},
      {"positions head cut short",
       [](C* c) { c->inherit_flow_positions = {'U', 'V', 'F', '2', 1, 0, 0}; },
       errc::invalid_argument, "inherit_flow_positions (7 bytes) is cut short: 7 bytes"},
      {"positions of a later release",
       [](C* c) { c->inherit_flow_positions = test::positions_blob(1, 1, "UVF3"); },
       errc::invalid_argument, "is a later release's flow positions (magic UVF3)"},
      {"positions not a blob",
       [](C* c) {
         c->inherit_flow_positions = {1, 2, 3};
       },
       errc::invalid_argument, "inherit_flow_positions (3 bytes) is not a node::flow_positions()"},
  };
}

std::vector<rule> rules() {
  std::vector<rule> all = url_rules();
  for (auto& r : size_rules()) all.push_back(std::move(r));
  for (auto& r : timer_rules()) all.push_back(std::move(r));
  for (auto& r : run_time_rules()) all.push_back(std::move(r));
  for (auto& r : run_time_rules_2()) all.push_back(std::move(r));
  for (auto& r : unusable_rules()) all.push_back(std::move(r));
  for (auto& r : positions_rules()) all.push_back(std::move(r));
  return all;
}

TEST(NodeConfig, DefaultsAndTheTestConfigAreValid) {
  std::string detail = "untouched";
  EXPECT_EQ(node::validate(1, node_config{}, &detail), errc::ok);
  EXPECT_EQ(detail, "untouched");
  EXPECT_EQ(node::validate(1, fast_config()), errc::ok);
  // Sizes that only matter with a ring are not checked without one.
  node_config c = fast_config();
  c.shm_ring_bytes = 1000;
  EXPECT_EQ(node::validate(1, c), errc::ok);
  // Boundaries that pass.
  c = fast_config();
  c.heartbeat_interval_ms = 2000;
  c.heartbeat_timeout_ms = 4000;
  EXPECT_EQ(node::validate(1, c), errc::ok);
  // No node-wide cap: any per-address cap; equal caps.
  c = fast_config();
  c.max_unregistered = 0;
  c.max_unregistered_per_address = 5000;
  EXPECT_EQ(node::validate(1, c), errc::ok);
  c.max_unregistered = 5000;
  EXPECT_EQ(node::validate(1, c), errc::ok);
  // A root (it only accepts) may keep tokens at version 5; a valid psk; discovery's parent rule
  // with etcd; a shm ring for the largest message it carries; messages above it without a ring.
  c = fast_config();
  c.access_tokens = {"secret"};
  c.protocol_max = 5;
  psk(&c, 16);
  EXPECT_EQ(node::validate(1, c), errc::ok);
  c = fast_config();
  with_etcd(&c);
  c.discovery_parent_type = "relay";
  c.discovery_parent_labels = {{"zone", "a"}, {"rack", ""}};
  EXPECT_EQ(node::validate(1, c), errc::ok);
  c = fast_config();
  big_messages(&c, (size_t{4} << 20) - 200);
  c.listen = {"shm://x"};
  c.shm_ring_bytes = size_t{16} << 20;
  std::string why;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c.listen.clear();
  big_messages(&c, size_t{5} << 20);
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();
  c.forward_overflow_bytes = c.message_limit + detail::kMaxBusOverhead;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();
  c.inherit_flow_positions = test::positions_blob(1, 2);  // its own, whole
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
}

// The limits of the rules above, and their neighbours that work, stay valid.
TEST(NodeConfig, TheEdgesOfTheUnusableCombinationsPass) {
  std::string why;
  node_config c = fast_config();
  c.delivery = delivery_mode::next_hop;  // flows are not needed: version 2 will do
  c.protocol_max = 2;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();
  c.protocol_max = 3;
  c.parent_urls = {"unix:///tmp/parent.sock", "dns://parent.example:7000"};
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();  // a root with discovery that never dials another tree's nodes
  with_etcd(&c);
  c.sibling_direct = false;
  c.access_tokens = {"secret"};
  c.protocol_max = 5;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();
  big_messages(&c, (size_t{1} << 30) - detail::kMaxBusOverhead);
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();
  c.compression = compression_codec::zstd;
  c.protocol_max = 6;
  c.delivery_timeout_ms = c.resend_timeout_ms = 86400000;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();
  c.listen = {"shm://x"};
  c.shm_ring_bytes = size_t{1} << 46;
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
}

TEST(NodeConfig, EveryRuleRefusesNamingTheFieldAndTheRule) {
  for (const rule& r : rules()) {
    node_config c = fast_config();
    r.mutate(&c);
    std::string detail;
    EXPECT_EQ(node::validate(1, c, &detail), r.code) << r.name;
    EXPECT_NE(detail.find(r.detail), std::string::npos)
        << r.name << ": \"" << detail << "\" lacks \"" << r.detail << "\"";
    EXPECT_EQ(node::validate(1, c), r.code) << r.name << " (without a detail pointer)";
  }
}

TEST(NodeConfig, IdZeroIsReserved) {
  std::string detail;
  EXPECT_EQ(node::validate(0, fast_config(), &detail), errc::invalid_argument);
  EXPECT_NE(detail.find("bus id 0 is reserved"), std::string::npos) << detail;
}

class NodeErrorTest : public test::bus_fixture {};

// Start refuses with validate()'s code; the detail reaches last_error() at once and on_log from
// the loop (never from inside start()).
TEST_F(NodeErrorTest, ListenWithoutPortIsABadUrlLoggedWithItsDetail) {
  node_config c = fast_config();
  c.listen = {"ipv4://127.0.0.1"};
  bus_node* t = make(0x100, c, false);
  EXPECT_EQ(t->n->start(), errc::bad_url);
  const error_info e = t->n->last_error();
  EXPECT_EQ(e.code, errc::bad_url);
  EXPECT_NE(e.detail.find("node_config.listen[0] \"ipv4://127.0.0.1\": missing port"),
            std::string::npos)
      << e.detail;
  EXPECT_TRUE(t->logs.empty()) << "on_log ran inside start()";
  ASSERT_TRUE(wait([&] { return t->logged("missing port"); }));
  EXPECT_EQ(t->logs[0].first, log_level::error);
  EXPECT_FALSE(t->n->running());
}

// A leaf whose TLS settings no link could use is refused at start(), not retried for ever with
// every dial failing.
TEST_F(NodeErrorTest, BadTlsIsRefusedByStartNamingTls) {
  node_config c = fast_config();
  leaf(&c);
  psk(&c, 10);
  bus_node* t = make(0x100, c, false);
  EXPECT_EQ(t->n->start(), errc::invalid_argument);
  EXPECT_NE(t->n->last_error().detail.find("node_config.tls: psk mode"), std::string::npos)
      << t->n->last_error().detail;
  EXPECT_FALSE(t->n->running());
}

// An own entry discovery cannot register (above max_entry_bytes) fails start() with the
// discovery's detail instead of a node running without discovery (with a parent rule: a lone
// root). Nothing is dialled: the refusal comes before etcd is asked.
TEST_F(NodeErrorTest, AnEntryDiscoveryRefusesFailsStart) {
  node_config c = fast_config();
  with_etcd(&c);
  c.discovery.max_entry_bytes = 256;
  c.discovery_parent_type = "relay";
  c.name = std::string(128, 'n');
  ASSERT_EQ(node::validate(0x100, c), errc::ok);
  bus_node* t = make(0x100, c, false);
  EXPECT_EQ(t->n->start(), errc::invalid_argument);
  const std::string d = t->n->last_error().detail;
  EXPECT_NE(d.find("node_config.discovery: "), std::string::npos) << d;
  EXPECT_NE(d.find("above max_entry_bytes (256)"), std::string::npos) << d;
  EXPECT_FALSE(t->n->running());
  EXPECT_TRUE(t->n->listen_urls().empty());
}

TEST_F(NodeErrorTest, StartTwiceOrAfterStopIsWrongState) {
  bus_node* t = make(0x100, fast_config());
  EXPECT_EQ(t->n->start(), errc::wrong_state);
  EXPECT_NE(t->n->last_error().detail.find("already started"), std::string::npos);
  t->n->stop();
  ASSERT_TRUE(wait([&] { return t->downs.size() == 1; }));
  EXPECT_EQ(t->n->start(), errc::wrong_state);
  EXPECT_NE(t->n->last_error().detail.find("can not start again"), std::string::npos);
}

TEST_F(NodeErrorTest, ListenerFailureNamesTheUrl) {
  bus_node* a = make(0x100, fast_config());
  node_config c = fast_config();
  c.listen = {a->n->listen_urls().at(0)};  // taken
  bus_node* b = make(0x200, c, false);
  EXPECT_EQ(b->n->start(), errc::address_in_use);
  EXPECT_NE(b->n->last_error().detail.find("listen[0] \"" + c.listen[0] + "\""), std::string::npos)
      << b->n->last_error().detail;
  ASSERT_TRUE(wait([&] { return b->logged("listening failed"); }));
  EXPECT_FALSE(b->n->running());
}

// A TLS file only the context build reads (validate() cannot): the stream channel's detail, which
// names it, reaches start()'s refusal and a leaf's on_registration (both named the URL only).
TEST_F(NodeErrorTest, ATlsFileThatCannotBeReadIsNamedByListenAndDial) {
  node_config c = fast_config();
  c.tls.mode = tls_mode::certificate;
  c.tls.cert_file = "/nonexistent/uvbus-cert.pem";
  c.tls.key_file = c.tls.ca_file = "/nonexistent/uvbus-key.pem";
  bus_node* b = make(0x200, c, false);
  EXPECT_EQ(b->n->start(), errc::not_found);
  EXPECT_NE(b->n->last_error().detail.find("cannot read certificate file " + c.tls.cert_file),
            std::string::npos)
      << b->n->last_error().detail;
  c.listen.clear();
  leaf(&c);
  bus_node* l = make(0x300, c);
  ASSERT_TRUE(wait([&] { return !l->registration_details.empty(); }));
  EXPECT_EQ(l->registrations[0], errc::not_found);
  EXPECT_NE(l->registration_details[0].find("cannot read certificate file " + c.tls.cert_file),
            std::string::npos)
      << l->registration_details[0];
}

TEST_F(NodeErrorTest, SendErrorsNameTheirCause) {
  bus_node* t = make(0x100, fast_config(), false);
  EXPECT_EQ(send_str(t, 0x100, 1, "x"), errc::wrong_state);
  EXPECT_EQ(t->n->last_error().detail, "the node is not started");
  ASSERT_EQ(t->n->start(), errc::ok);
  const std::string big(t->n->config().message_limit + 1, 'x');
  EXPECT_EQ(send_str(t, 0x200, 1, big), errc::message_too_large);
  EXPECT_NE(t->n->last_error().detail.find("above node_config.message_limit"), std::string::npos);
  EXPECT_EQ(send_str(t, 0x200, 1, "x"), errc::unknown_route);
  EXPECT_NE(t->n->last_error().detail.find("no route to 0x200"), std::string::npos)
      << t->n->last_error().detail;
  // ok leaves the last error alone.
  EXPECT_EQ(send_str(t, 0x100, 1, "x"), errc::ok);
  EXPECT_EQ(t->n->last_error().code, errc::unknown_route);
  t->n->stop();
  EXPECT_EQ(send_str(t, 0x100, 1, "x"), errc::closed);
  EXPECT_EQ(t->n->last_error().detail, "the node is stopped");
}

// A child refused for good (out_of_subnet) stops retrying, and its sends through the parent fail
// with the refusal, which is not retriable (not_connected would promise it comes back).
TEST_F(NodeErrorTest, RefusedForGoodSendsFailWithTheRefusal) {
  bus_node* p = make_root(0x100, {{0x100, 8}});
  node_config cc = fast_config();
  cc.parent_urls = {p->n->listen_urls().at(0)};
  bus_node* c = make(0x999, cc);  // outside 0x100/8
  ASSERT_TRUE(wait([&] { return !c->registrations.empty(); }));
  EXPECT_EQ(c->registrations[0], errc::out_of_subnet);
  EXPECT_EQ(send_str(c, 0x100, 1, "x"), errc::out_of_subnet);
  EXPECT_FALSE(is_retriable(errc::out_of_subnet));
  EXPECT_NE(c->n->last_error().detail.find("refused this node for good"), std::string::npos);
  EXPECT_TRUE(c->logged("refused"));
  run_for(200ms);
  EXPECT_EQ(c->registrations.size(), 1u);  // no retry
}

}  // namespace
}  // namespace uvbus::node_config_test
