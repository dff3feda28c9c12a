// Layout versions: each version's records carry its own checksum (4: CRC-32C, 3: MurmurHash3, as
// every build before version 4 writes them), a reader of this build drains a version 3 inbox kept
// by an older one and keeps its version, and shm_config::layout_version is validated.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/crc32c.h"
#include "core/murmur3.h"
#include "shm/layout.h"
#include "shm_test_util.h"
#include "uvbus/shm.h"

namespace uvbus::shm_version_test {
namespace {

using test::image;
using namespace shm_detail;

using test::collected;

shm_config cfg_of(uint32_t version) {
  shm_config c;
  c.ring_bytes = 4096;
  c.max_record_size = 1024;
  c.layout_version = version;
  return c;
}

// The payload hash every build of that version computes, independently of layout.h.
uint32_t wire_hash(uint32_t version, const std::string& s) {
  return version == 3 ? murmur3_x64_128_low32(s.data(), s.size(), 0) : crc32c(s.data(), s.size());
}

record_prefix prefix_at(const image& img, uint64_t off) {
  record_prefix p;
  std::memcpy(&p, img.p + kHeaderSize + size_t{64} * 8 + off,
              sizeof p);  // 64 heads of a 4096-byte ring
  return p;
}

TEST(ShmVersion, EachVersionStoresItsOwnChecksumAndReadsBackIntact) {
  for (const uint32_t version : {3U, 4U}) {
    SCOPED_TRACE(version);
    const shm_config cfg = cfg_of(version);
    image img(shm_region_size(cfg));
    shm_writer w;
    shm_reader r;
    ASSERT_EQ(test::format_and_attach(img, cfg, w, r), errc::ok);
    EXPECT_EQ(reinterpret_cast<const region_header*>(img.p)->version, version);
    const std::string a = "a record of its own";
    const std::string b = "first of a batch";
    const std::string c = "second";
    ASSERT_EQ(w.send(a.data(), a.size()), errc::ok);  // nodes 0: prefix + 19 bytes
    const const_buffer batch[] = {{b.data(), b.size()}, {c.data(), c.size()}};
    ASSERT_EQ(w.send_batch(batch, 2), errc::ok);  // node 1 on: {body, count}, then the items
    // The bytes an older (or newer) build of the same version reads and writes.
    EXPECT_EQ(prefix_at(img, 0).len, a.size());
    EXPECT_EQ(prefix_at(img, 0).checksum, wire_hash(version, a) ^ position_mix(0));
    EXPECT_EQ(prefix_at(img, 64).checksum, 2U);  // the batch's item count
    EXPECT_EQ(prefix_at(img, 64 + 8).checksum, wire_hash(version, b) ^ item_mix(1, 0));
    EXPECT_EQ(prefix_at(img, 64 + 8 + batch_item_bytes(b.size())).checksum,
              wire_hash(version, c) ^ item_mix(1, batch_item_bytes(b.size())));
    collected got;
    EXPECT_EQ(test::poll_with(r, collected::cb, &got, 10), 3U);
    EXPECT_EQ(got.recs, (std::vector<std::string>{a, b, c}));
    EXPECT_EQ(r.metrics().checksum_failures, 0U);
  }
}

TEST(ShmVersion, AFlippedByteFailsTheChecksumInEitherVersion) {
  for (const uint32_t version : {3U, 4U}) {
    SCOPED_TRACE(version);
    const shm_config cfg = cfg_of(version);
    image img(shm_region_size(cfg));
    shm_writer w;
    shm_reader r;
    ASSERT_EQ(test::format_and_attach(img, cfg, w, r), errc::ok);
    const std::string m = "will be damaged", n = "stays intact";
    ASSERT_EQ(w.send(m.data(), m.size()), errc::ok);
    ASSERT_EQ(w.send(n.data(), n.size()), errc::ok);
    img.p[kHeaderSize + size_t{64} * 8 + kRecordHeaderSize + 2] ^= 0x01;
    collected got;
    EXPECT_EQ(test::poll_with(r, collected::cb, &got, 10), 1U);
    EXPECT_EQ(got.recs, (std::vector<std::string>{n}));
    EXPECT_EQ(r.metrics().checksum_failures, 1U);
  }
}

TEST(ShmVersion, AKeptVersion3InboxIsReattachedAndDrainedByADefaultReader) {
  const std::string name = test::unique_name("version-keep");
  const std::string url = "shm://" + name;
  test::shm_cleanup cleanup{name};
  shm_config old_cfg = cfg_of(3);
  old_cfg.ring_bytes = 65536;
  shm_writer w;
  {
    shm_reader r;
    ASSERT_EQ(r.open(url, old_cfg), errc::ok);
    ASSERT_EQ(w.open(url), errc::ok);
    r.close(shm_close_mode::keep);
  }
  for (int i = 0; i < 50; ++i) {
    const std::string m = "kept " + std::to_string(i);
    ASSERT_EQ(w.send(m.data(), m.size()), errc::ok);
  }
  shm_config now = old_cfg;
  now.layout_version = 0;  // this build's default: version 4 for a new region
  collected got;
  shm_reader r(
      shm_reader_callbacks{[&](const shm_record* rec, size_t n) { collected::cb(&got, rec, n); }});
  ASSERT_EQ(r.open(url, now), errc::ok) << r.last_error().detail;
  EXPECT_TRUE(r.reattached());
  for (int turn = 0; turn < 100 && got.recs.size() < 50; ++turn) (void)r.poll(64);
  ASSERT_EQ(got.recs.size(), 50U);
  EXPECT_EQ(got.recs.front(), "kept 0");
  EXPECT_EQ(got.recs.back(), "kept 49");
  EXPECT_EQ(r.metrics().checksum_failures, 0U);
  shm_region_info info;
  ASSERT_EQ(shm_inspect(url, &info), errc::ok);
  EXPECT_EQ(info.version, 3U);  // the region keeps the version it was created with
  ASSERT_EQ(w.send("after", 5), errc::ok);
  for (int turn = 0; turn < 100 && got.recs.size() < 51; ++turn) (void)r.poll(64);
  EXPECT_EQ(got.recs.back(), "after");
  r.close();
  EXPECT_FALSE(test::posix_exists(name));
}

TEST(ShmVersion, LayoutVersionOutsideTheSupportedRangeIsRefusedNamingIt) {
  for (const uint32_t ok : {0U, 3U, 4U}) EXPECT_EQ(shm_validate(cfg_of(ok)), errc::ok) << ok;
  for (const uint32_t bad : {1U, 2U, 5U}) {
    std::string detail;
    EXPECT_EQ(shm_validate(cfg_of(bad), &detail), errc::invalid_argument) << bad;
    EXPECT_NE(detail.find("shm_config.layout_version (" + std::to_string(bad) + ")"),
              std::string::npos)
        << detail;
  }
  shm_reader r;
  EXPECT_EQ(r.open("mem://" + test::unique_name("version-bad"), cfg_of(5)), errc::invalid_argument);
}

}  // namespace
}  // namespace uvbus::shm_version_test
