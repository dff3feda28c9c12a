// The discovery codec: base64 vectors, keys, the entry's JSON value (round trip, every malformed
// shape refused with the field named), and the gateway's responses (range, watch, lease,
// authenticate).
#include <gtest/gtest.h>

#include "discovery/discovery_harness.h"
#include "discovery/etcd_codec.h"

namespace uvbus::codec_test {
namespace {

namespace etcd = detail::etcd;

TEST(DiscoveryCodec, Base64) {
  const std::pair<const char*, const char*> v[] = {{"", ""},
                                                   {"f", "Zg=="},
                                                   {"fo", "Zm8="},
                                                   {"foo", "Zm9v"},
                                                   {"foob", "Zm9vYg=="},
                                                   {"fooba", "Zm9vYmE="},
                                                   {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, enc] : v) {
    EXPECT_EQ(etcd::base64_encode(plain), enc);
    std::string back;
    ASSERT_TRUE(etcd::base64_decode(enc, &back));
    EXPECT_EQ(back, plain);
  }
  std::string out;
  EXPECT_FALSE(etcd::base64_decode("Zg=", &out));
  EXPECT_FALSE(etcd::base64_decode("Z===", &out));
  EXPECT_FALSE(etcd::base64_decode("Zg==Zg==", &out));
  EXPECT_FALSE(etcd::base64_decode("Zm9*", &out));
  const std::string bin("\x00\xff\x10\x80", 4);
  ASSERT_TRUE(etcd::base64_decode(etcd::base64_encode(bin), &out));
  EXPECT_EQ(out, bin);
}

TEST(DiscoveryCodec, Keys) {
  EXPECT_EQ(etcd::node_key("/uvbus", 0x1234), "/uvbus/nodes/0000000000001234");
  EXPECT_EQ(etcd_discovery::key_of("/p", ~bus_id{0}), "/p/nodes/ffffffffffffffff");
  bus_id id = 0;
  EXPECT_TRUE(etcd::id_from_key("/uvbus", "/uvbus/nodes/00000000000000ab", &id));
  EXPECT_EQ(id, 0xabU);
  EXPECT_FALSE(etcd::id_from_key("/uvbus", "/uvbus/nodes/00000000000000AB", &id));
  EXPECT_FALSE(etcd::id_from_key("/uvbus", "/uvbus/nodes/0000000000000ab", &id));
  EXPECT_FALSE(etcd::id_from_key("/uvbus", "/other/nodes/00000000000000ab", &id));
  EXPECT_FALSE(etcd::id_from_key("/uvbus", "/uvbus/nodez/00000000000000ab", &id));
  EXPECT_EQ(etcd::prefix_end("/a/"), "/a0");
  EXPECT_EQ(etcd::prefix_end(std::string("a\xff", 2)), "b");
}

TEST(DiscoveryCodec, EntryRoundTripAndFieldOrder) {
  directory_entry e = test::test_entry(0x42);
  e.parent = 7;  // not written
  const std::string json = etcd::encode_entry(e);
  EXPECT_EQ(json.rfind(R"({"v":1,"id":"0000000000000042","name":"node-66","type":"logic",)", 0), 0U)
      << json;
  directory_entry back;
  std::string why;
  ASSERT_TRUE(etcd::decode_entry(json, &back, &why)) << why;
  e.parent = 0;
  EXPECT_EQ(back, e);
  // Unknown fields and a newer version are accepted (forward compatible).
  ASSERT_TRUE(etcd::decode_entry(R"({"v":2,"id":"0000000000000001","extra":[1]})", &back, &why));
  EXPECT_EQ(back.id, 1U);
}

// A value with thousands of unknown keys (forward compatible) decodes to exactly the known fields,
// its labels in their written order (the parser's objects are sorted maps; the labels' order is
// noted while parsing), an unknown object holding a "name" not taken for the entry's name.
TEST(DiscoveryCodec, EntryWithThousandsOfUnknownKeys) {
  const directory_entry e = test::test_entry(0x43);
  std::string json = etcd::encode_entry(e);
  json.pop_back();  // the closing brace
  for (int i = 0; i < 5000; ++i) json += ",\"x" + std::to_string(i) + "\":" + std::to_string(i);
  json += R"(,"zz":{"name":"not-the-name"}})";
  directory_entry back;
  std::string why;
  ASSERT_TRUE(etcd::decode_entry(json, &back, &why)) << why;
  EXPECT_EQ(back, e);
}

TEST(DiscoveryCodec, MalformedEntriesNameTheField) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "JSON"},
      {"[]", "JSON object"},
      {R"({"id":"0000000000000001"})", "\"v\""},
      {R"({"v":0,"id":"0000000000000001"})", "\"v\""},
      {R"({"v":1})", "\"id\""},
      {R"({"v":1,"id":"0000000000000000"})", "\"id\""},
      {R"({"v":1,"id":1})", "\"id\""},
      {R"({"v":1,"id":"0000000000000001","name":5})", "\"name\""},
      {R"({"v":1,"id":"0000000000000001","labels":[]})", "\"labels\""},
      {R"({"v":1,"id":"0000000000000001","labels":{"":"x"}})", "\"labels\""},
      {R"({"v":1,"id":"0000000000000001","labels":{"k":1}})", "\"labels\""},
      {R"({"v":1,"id":"0000000000000001","urls":"x"})", "\"urls\""},
      {R"({"v":1,"id":"0000000000000001","urls":[1]})", "\"urls\""},
      {R"({"v":1,"id":"0000000000000001","pid":-1})", "\"pid\""},
      {R"({"v":1,"id":"0000000000000001","pid":4294967296})", "\"pid\""},
      {R"({"v":1,"id":"0000000000000001","proto":256})", "\"proto\""},
      {R"({"v":1,"id":"0000000000000001","start":1.5})", "\"start\""},
  };
  for (const auto& [json, field] : bad) {
    directory_entry e;
    std::string why;
    EXPECT_FALSE(etcd::decode_entry(json, &e, &why)) << json;
    EXPECT_NE(why.find(field), std::string::npos) << json << " -> " << why;
  }
  directory_entry e;
  std::string why;
  EXPECT_FALSE(etcd::decode_entry(
      R"({"v":1,"id":"0000000000000001","name":")" + std::string(300, 'x') + "\"}", &e, &why));
}

TEST(DiscoveryCodec, GatewayResponses) {
  etcd::range_reply rr;
  std::string why;
  ASSERT_TRUE(etcd::parse_range(
      R"({"header":{"revision":"9"},"kvs":[{"key":"L2EvYg==","value":"eA==","mod_revision":"8"}]})",
      &rr, &why))
      << why;
  EXPECT_EQ(rr.revision, 9);
  ASSERT_EQ(rr.kvs.size(), 1U);
  EXPECT_EQ(rr.kvs[0].key, "/a/b");
  EXPECT_EQ(rr.kvs[0].value, "x");
  EXPECT_EQ(rr.kvs[0].mod_revision, 8);
  EXPECT_FALSE(etcd::parse_range(R"({"error":"boom","code":14})", &rr, &why));
  EXPECT_NE(why.find("boom"), std::string::npos);
  EXPECT_FALSE(etcd::parse_range(R"({"kvs":[{"key":"%%%"}]})", &rr, &why));
  EXPECT_FALSE(
      etcd::parse_range(R"({"header":{"revision":"9"},"kvs":[{"mod_revision":"x"}]})", &rr, &why));

  etcd::watch_reply w;
  ASSERT_TRUE(etcd::parse_watch(
      R"({"result":{"header":{"revision":"12"},"events":[{"kv":{"key":"L2E="}},{"type":"DELETE","kv":{"key":"L2I="}}]}})",
      &w, &why))
      << why;
  EXPECT_EQ(w.revision, 12);
  ASSERT_EQ(w.events.size(), 2U);
  EXPECT_FALSE(w.events[0].deleted);
  EXPECT_TRUE(w.events[1].deleted);
  ASSERT_TRUE(etcd::parse_watch(
      R"({"result":{"header":{},"canceled":true,"compact_revision":"2"}})", &w, &why));
  EXPECT_TRUE(w.canceled);
  EXPECT_EQ(w.compact_revision, 2);
  ASSERT_TRUE(etcd::parse_watch(R"({"result":{"created":"yes"}})", &w, &why));  // not a bool
  EXPECT_FALSE(w.created);
  EXPECT_FALSE(etcd::parse_watch(R"({"error":{"grpc_code":14,"message":"down"}})", &w, &why));
  EXPECT_NE(why.find("down"), std::string::npos);

  etcd::lease_reply lr;
  ASSERT_TRUE(etcd::parse_lease_grant(R"({"header":{},"ID":"4111","TTL":"2"})", &lr, &why));
  EXPECT_EQ(lr.id, 4111);
  EXPECT_EQ(lr.ttl, 2);
  EXPECT_FALSE(etcd::parse_lease_grant(R"({"header":{},"TTL":"2"})", &lr, &why));
  ASSERT_TRUE(etcd::parse_keepalive(R"({"result":{"header":{},"ID":"123"}})", &lr, &why));
  EXPECT_EQ(lr.ttl, 0);  // the lease is gone
  EXPECT_FALSE(etcd::parse_keepalive(R"({"result":{"ID":"12x"}})", &lr, &why));
}

// A revision, lease ID or TTL of INT64_MAX or above is refused, as a string or as a number: the
// session watched from revision + 1 (signed overflow), and a number above INT64_MAX read as a
// negative ID or TTL. Before, "9223372036854775807" and 18446744073709551615 were accepted.
TEST(DiscoveryCodec, NumbersThatDoNotFitBelowInt64MaxAreRefused) {
  std::string why;
  etcd::range_reply rr;
  EXPECT_FALSE(etcd::parse_range(R"({"header":{"revision":"9223372036854775807"}})", &rr, &why));
  EXPECT_FALSE(etcd::parse_range(R"({"header":{"revision":9223372036854775807}})", &rr, &why));
  EXPECT_FALSE(etcd::parse_range(R"({"header":{"revision":"9223372036854775808"}})", &rr, &why));
  ASSERT_TRUE(etcd::parse_range(R"({"header":{"revision":"9223372036854775806"}})", &rr, &why));
  EXPECT_EQ(rr.revision, INT64_MAX - 1);
  etcd::watch_reply w;
  EXPECT_FALSE(
      etcd::parse_watch(R"({"result":{"header":{"revision":"9223372036854775807"}}})", &w, &why));
  etcd::lease_reply lr;
  EXPECT_FALSE(etcd::parse_lease_grant(R"({"ID":18446744073709551615,"TTL":2})", &lr, &why));
  EXPECT_FALSE(etcd::parse_lease_grant(R"({"ID":"9223372036854775807","TTL":2})", &lr, &why));
  EXPECT_FALSE(
      etcd::parse_keepalive(R"({"result":{"ID":"5","TTL":9223372036854775808}})", &lr, &why));
  ASSERT_TRUE(etcd::parse_lease_grant(R"({"ID":9223372036854775806,"TTL":2})", &lr, &why)) << why;
  EXPECT_EQ(lr.id, INT64_MAX - 1);
}

// nlohmann builds a whole document before it can refuse it, at up to ~75 bytes per input byte: a
// hostile answer of 16 MB of '[' took 1.2 GB. A text nested deeper than 64 levels or holding more
// than 4 Mi elements is refused before it is parsed, naming the limit, in a watch message, a range
// answer and an entry's value; nesting at the limit, and brackets inside strings, are accepted.
TEST(DiscoveryCodec, DeepOrHugeJsonIsRefusedBeforeItIsBuilt) {
  std::string why;
  etcd::watch_reply w;
  EXPECT_FALSE(etcd::parse_watch(std::string(size_t{1} << 20, '['), &w, &why));
  EXPECT_EQ(why, "JSON nested deeper than 64 levels");
  const auto nested = [](size_t depth) {  // 2 levels + depth arrays under an unknown field
    return R"({"result":{"header":{"revision":"3"},"x":)" + std::string(depth, '[') +
           std::string(depth, ']') + "}}";
  };
  why.clear();
  ASSERT_TRUE(etcd::parse_watch(nested(62), &w, &why)) << why;
  EXPECT_FALSE(etcd::parse_watch(nested(63), &w, &why));
  EXPECT_EQ(why, "JSON nested deeper than 64 levels");
  ASSERT_TRUE(etcd::parse_watch(R"({"result":{"header":{"revision":"3"},"cancel_reason":")" +
                                    std::string(1000, '[') + "\\\"[\"}}",
                                &w, &why))
      << why;
  EXPECT_EQ(w.error, std::string(1000, '[') + "\"[");

  std::string flat = R"({"header":{"revision":"9"},"x":[0)";
  for (size_t i = 0; i < etcd::kMaxJsonElements; ++i) flat += ",0";
  flat += "]}";
  etcd::range_reply rr;
  EXPECT_FALSE(etcd::parse_range(flat, &rr, &why));
  EXPECT_EQ(why, "more than 4194304 JSON elements");

  directory_entry e;
  EXPECT_FALSE(etcd::decode_entry(
      R"({"v":1,"id":"0000000000000001","x":)" + std::string(70, '[') + std::string(70, ']') + "}",
      &e, &why));
  EXPECT_EQ(why, "JSON nested deeper than 64 levels");
}

// A kv's lease is read: the own entry found on another lease is written again.
TEST(DiscoveryCodec, AKvsLeaseIsRead) {
  std::string why;
  etcd::range_reply rr;
  ASSERT_TRUE(etcd::parse_range(
      R"({"header":{"revision":"9"},"kvs":[{"key":"L2E=","value":"eA==","lease":"77"}]})", &rr,
      &why))
      << why;
  ASSERT_EQ(rr.kvs.size(), 1U);
  EXPECT_EQ(rr.kvs[0].lease, 77);
}

TEST(DiscoveryCodec, AuthenticateRequestAndAnswer) {
  EXPECT_EQ(etcd::authenticate_request("uvbus", "p\"w"), R"({"name":"uvbus","password":"p\"w"})");
  std::string token;
  std::string why;
  ASSERT_TRUE(etcd::parse_authenticate(R"({"header":{},"token":"abc.42"})", &token, &why)) << why;
  EXPECT_EQ(token, "abc.42");
  const auto refused = [](const std::string& body) {
    std::string t = "kept";
    std::string w;
    const bool ok = etcd::parse_authenticate(body, &t, &w);
    EXPECT_EQ(t, "kept") << body;  // untouched on failure
    return ok ? std::string("accepted") : w;
  };
  EXPECT_EQ(refused(R"({"header":{}})"), "no token in the answer");
  EXPECT_EQ(refused(R"({"token":""})"), "no token in the answer");
  EXPECT_EQ(refused(R"({"token":7})"), "no token in the answer");
  EXPECT_EQ(refused(R"({"token":"a b"})"), "a token with a byte that cannot go into a header");
  EXPECT_EQ(refused(R"({"token":"a\r\nX-Evil: 1"})"),
            "a token with a byte that cannot go into a header");
  EXPECT_EQ(refused(R"({"token":")" + std::string(4097, 'a') + R"("})"),
            "a token of 4097 bytes (at most 4096)");
  EXPECT_EQ(refused(R"({"error":"etcdserver: authentication failed","code":3})"),
            "etcd: etcdserver: authentication failed");
  EXPECT_EQ(refused("[1]"), "not a JSON object");
}

}  // namespace
}  // namespace uvbus::codec_test
