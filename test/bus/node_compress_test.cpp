// Link compression on live nodes when our own memory fails: a decompression context or a restore
// buffer that cannot be allocated is not the peer's protocol error, and the message it could not
// restore is not lost; a message that cannot be compressed goes out uncompressed.
#include <gtest/gtest.h>

#include <string>

#include "bus/bus_harness.h"
#include "core/compress.h"
#include "core/try_alloc.h"

namespace uvbus::node_compress_test {
namespace {

using test::bus_node;
using test::fast_config;

constexpr bus_id kRoot = 0x20000;
constexpr bus_id kChild = 0x20001;
const subnet kNet{0x20000, 48};

// A compressible message: a game-like record repeated with small changes.
std::string snapshot(size_t n) {
  std::string s;
  for (uint32_t i = 0; s.size() < n; ++i) {
    s += R"({"entity":)" + std::to_string(i % 97) + R"(,"x":1.25,"y":-3.5,"hp":100})";
  }
  s.resize(n);
  return s;
}

class NodeCompress : public test::bus_fixture {
 protected:
  void TearDown() override {
    detail::fail_next_zstd_dctx(0);
    detail::fail_next_try_resize(0);
    test::bus_fixture::TearDown();
  }
  // A root and a child that compress with zstd, their link up.
  void start_pair() {
    node_config rc = fast_config();
    rc.compression = compression_codec::zstd;
    node_config cc = fast_config();
    cc.compression = compression_codec::zstd;
    root = make_root(kRoot, {kNet}, rc);
    child = make_child(kChild, root, {}, cc);
    ASSERT_TRUE(wait([&] { return child->ups == 1; }));
  }
  // The root could not restore `big` for want of its own memory (the error names `why`): not the
  // peer's protocol error; the link came back and the message arrived once, acknowledged.
  void expect_no_memory_then_resent(const std::string& big, const char* why) {
    ASSERT_TRUE(wait([&] { return !root->errors.empty(); }));
    EXPECT_EQ(root->errors[0], errc::no_memory) << root->error_texts[0];
    EXPECT_NE(root->error_texts[0].find(why), std::string::npos) << root->error_texts[0];
    EXPECT_EQ(root->n->counters().protocol_errors, 0u);
    ASSERT_TRUE(wait([&] { return root->got.size() == 1 && child->ok_reports() == 1; }));
    EXPECT_EQ(root->got[0].bytes, big);
    EXPECT_EQ(child->ups, 2) << "the link came back";
    EXPECT_EQ(root->n->counters().decompressed, 1u);
  }
  bus_node* root = nullptr;
  bus_node* child = nullptr;
};

TEST_F(NodeCompress, OurOwnNoMemoryIsNotThePeersProtocolErrorAndTheMessageIsResent) {
  // The receiver cannot create its zstd context for the first compressed message. That used to
  // close the link as a protocol_error of the peer's (counted in protocol_errors, logged as the
  // peer's fault). Now the link closes with no_memory, the message is neither delivered nor
  // acknowledged, and end-to-end delivery resends it over the next link: it arrives once.
  ASSERT_NO_FATAL_FAILURE(start_pair());
  detail::fail_next_zstd_dctx(1);
  const std::string big = snapshot(8000);
  ASSERT_EQ(test::send_str(child, kRoot, 1, big), errc::ok);
  ASSERT_NO_FATAL_FAILURE(expect_no_memory_then_resent(big, "no memory for a ZSTD_DCtx"));
  ASSERT_EQ(test::send_str(child, kRoot, 1, big), errc::ok);  // and the link works on
  ASSERT_TRUE(wait([&] { return root->got.size() == 2; }));
  EXPECT_EQ(root->got[1].bytes, big);
  EXPECT_EQ(root->n->counters().protocol_errors, 0u);
}

TEST_F(NodeCompress, NoMemoryForTheRestoreBufferClosesTheLinkAndTheMessageIsResent) {
  // The restore buffer (the link's largest body, up to message_limit) is allocated at the first
  // compressed message. Its std::bad_alloc used to escape from the read callback (the process
  // terminated); now it is the same no_memory as a missing zstd context: the link closes, the
  // message is resent over the next link and arrives once.
  ASSERT_NO_FATAL_FAILURE(start_pair());
  const std::string big = snapshot(8000);
  ASSERT_EQ(test::send_str(child, kRoot, 1, big), errc::ok);  // compressed in this call
  detail::fail_next_try_resize(1);  // so the next buffer to grow is the root's restore buffer
  ASSERT_NO_FATAL_FAILURE(expect_no_memory_then_resent(big, "no memory for a restore buffer of"));
}

TEST_F(NodeCompress, NoMemoryToCompressSendsTheMessageUncompressed) {
  ASSERT_NO_FATAL_FAILURE(start_pair());
  const std::string big = snapshot(8000);
  detail::fail_next_try_resize(1);  // the child's gathered body
  ASSERT_EQ(test::send_str(child, kRoot, 1, big), errc::ok);
  ASSERT_TRUE(wait([&] { return root->got.size() == 1 && child->ok_reports() == 1; }));
  EXPECT_EQ(root->got[0].bytes, big);
  EXPECT_EQ(child->n->counters().compressed_sent, 0u);
  EXPECT_TRUE(root->errors.empty());
  ASSERT_EQ(test::send_str(child, kRoot, 1, big), errc::ok);  // the next one is compressed
  ASSERT_TRUE(wait([&] { return root->got.size() == 2; }));
  EXPECT_EQ(root->got[1].bytes, big);
  EXPECT_EQ(child->n->counters().compressed_sent, 1u);
}

}  // namespace
}  // namespace uvbus::node_compress_test
