// Tests of the link compression codecs (src/core/compress.h): round trips over the snapshot corpus
// and random data, never growing a message, bounded decompression (bombs), hostile blocks.
#include "core/compress.h"

#include <gtest/gtest.h>
#include <lz4.h>
#include <sys/resource.h>

#include <memory>
#include <random>
#include <vector>

#include "corpus.h"

namespace uvbus::compress_test {
namespace {

using bytes = std::vector<uint8_t>;
using bench::corpus_format;

struct setting {
  codec c;
  int level;
};
// Every codec at the levels worth covering: lz4 accelerated, default and HC; zstd fast to high.
const setting kSettings[] = {{codec::lz4, -8},  {codec::lz4, 0},       {codec::lz4, 3},
                             {codec::lz4, 9},   {codec::lz4, 12},      {codec::zstd, -5},
                             {codec::zstd, 1},  {codec::zstd, 3},      {codec::zstd, 6},
                             {codec::zstd, 19}, {codec::zstd, 0},      {codec::lz4, 99},
                             {codec::zstd, 99}, {codec::lz4, -1000000}};

// One compressor per (codec, level), as the bus would have one level per link: a compressor keeps
// one context per codec at the last level used, and a new zstd level re-sizes that context.
class zpool {
 public:
  compressor& operator[](setting s) {
    for (auto& e : list_) {
      if (e.first.c == s.c && e.first.level == s.level) return *e.second;
    }
    list_.emplace_back(s, std::make_unique<compressor>());
    return *list_.back().second;
  }
  [[nodiscard]] size_t memory_bytes() const {
    size_t n = 0;
    for (const auto& e : list_) n += e.second->memory_bytes();
    return n;
  }

 private:
  std::vector<std::pair<setting, std::unique_ptr<compressor>>> list_;
};

bytes random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(g());
  return b;
}

// Half repetitive text, half random: compressible, but not trivially.
bytes mixed_bytes(size_t n, uint32_t seed) {
  bytes b = random_bytes(n, seed);
  static const char kText[] = R"("position":{"x":12.5,"y":-3.25},"health":100,)";
  for (size_t i = 0; i < n; ++i) {
    if ((i / 64) % 2 == 0) b[i] = static_cast<uint8_t>(kText[i % (sizeof kText - 1)]);
  }
  return b;
}

// Compresses `in` and, when a block comes out, checks it never grew and decompresses back.
// Returns the block size (0: kept raw).
size_t round_trip(compressor& z, setting s, const bytes& in) {
  bytes block(in.size() + 64);
  const size_t n = z.compress(s.c, s.level, in.data(), in.size(), block.data(), block.size());
  if (n == 0) return 0;
  EXPECT_LE(n + compress_min_saving(in.size()), in.size());
  bytes out(in.size());  // exactly sized: ASan catches one byte more
  const decompress_result r = z.decompress(s.c, block.data(), n, out.data(), out.size());
  EXPECT_EQ(r.code, errc::ok) << z.last_error().detail;
  EXPECT_EQ(r.size, in.size());
  EXPECT_TRUE(out == in) << to_string(s.c) << " level " << s.level << " size " << in.size();
  return n;
}

TEST(Compress, CodecNamesRoundTrip) {
  for (codec c : {codec::none, codec::lz4, codec::zstd}) {
    codec back = codec::none;
    ASSERT_TRUE(parse_codec(to_string(c), &back));
    EXPECT_EQ(back, c);
  }
  codec keep = codec::lz4;
  EXPECT_FALSE(parse_codec("gzip", &keep));
  EXPECT_FALSE(parse_codec("", &keep));
  EXPECT_EQ(keep, codec::lz4);
  EXPECT_LT(levels_of(codec::zstd).min, 0);
  EXPECT_GE(levels_of(codec::zstd).max, 19);
  EXPECT_EQ(levels_of(codec::lz4).max, 12);
}

TEST(Compress, CorpusRoundTripsAndShrinks) {
  zpool zs;
  for (corpus_format f : {corpus_format::json, corpus_format::binary}) {
    for (size_t size : {64, 100, 512, 4096, 16384}) {
      const auto msgs = bench::make_corpus(7, 4, size, f);
      for (const setting& s : kSettings) {
        for (const bytes& m : msgs) {
          ASSERT_EQ(m.size(), size);
          const size_t n = round_trip(zs[s], s, m);
          // Snapshots from 512 B up always compress, at every level but accelerated lz4.
          if (size >= 512 && !(s.c == codec::lz4 && s.level < 0)) {
            EXPECT_GT(n, 0u) << to_string(f) << " " << size << " " << to_string(s.c) << " "
                             << s.level;
          }
        }
      }
    }
  }
}

TEST(Compress, CorpusIsDeterministic) {
  EXPECT_EQ(bench::make_snapshot(1, 4096, corpus_format::json),
            bench::make_snapshot(1, 4096, corpus_format::json));
  EXPECT_NE(bench::make_snapshot(1, 4096, corpus_format::json),
            bench::make_snapshot(2, 4096, corpus_format::json));
  const bytes j = bench::make_snapshot(3, 200, corpus_format::json);
  EXPECT_EQ(std::string(j.begin(), j.begin() + 8), "{\"tick\":");
}

TEST(Compress, RoundTripsEverySizeUpTo70000) {
  zpool zs;
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 1100; ++n) sizes.push_back(n);
  for (size_t n = 1101; n <= 70000; n += 997) sizes.push_back(n);
  for (size_t n : {4095, 4096, 4097, 65535, 65536, 65537, 70000}) sizes.push_back(n);
  for (size_t n : sizes) {
    const bytes in = mixed_bytes(n, static_cast<uint32_t>(n));
    for (const setting& s : {setting{codec::lz4, 0}, setting{codec::zstd, 1}}) {
      const size_t b = round_trip(zs[s], s, in);
      if (n < kCompressMinInput) {
        EXPECT_EQ(b, 0u) << n;
      }
      if (n >= 256) {
        EXPECT_GT(b, 0u) << to_string(s.c) << " " << n;
      }
    }
  }
  // The slower levels on a sparser set of sizes.
  for (size_t n = 0; n <= 70000; n += 4999) {
    const bytes in = mixed_bytes(n, static_cast<uint32_t>(n + 1));
    for (const setting& s : kSettings) round_trip(zs[s], s, in);
  }
}

TEST(Compress, IncompressibleInputStaysRaw) {
  zpool zs;
  for (size_t n : {0, 1, 63, 64, 65, 100, 512, 4096, 16384, 65536, 70000}) {
    const bytes in = random_bytes(n, static_cast<uint32_t>(n) + 11);
    for (const setting& s : kSettings) {
      bytes out(n + 64);
      EXPECT_EQ(zs[s].compress(s.c, s.level, in.data(), n, out.data(), out.size()), 0u)
          << to_string(s.c) << " " << s.level << " " << n;
    }
  }
  // codec none never compresses; tiny inputs neither, however repetitive.
  compressor& z3 = zs[setting{codec::zstd, 3}];
  const bytes zeros(4096, 0);
  bytes out(8192);
  EXPECT_EQ(z3.compress(codec::none, 0, zeros.data(), zeros.size(), out.data(), out.size()), 0u);
  EXPECT_EQ(z3.compress(codec::zstd, 3, zeros.data(), kCompressMinInput - 1, out.data(), 8192), 0u);
  EXPECT_GT(z3.compress(codec::zstd, 3, zeros.data(), kCompressMinInput, out.data(), 8192), 0u);
}

TEST(Compress, RespectsTheOutputCapacity) {
  zpool zs;
  const bytes in = bench::make_snapshot(5, 4096, corpus_format::json);
  for (const setting& s : kSettings) {
    bytes big(8192);
    const size_t n = zs[s].compress(s.c, s.level, in.data(), in.size(), big.data(), big.size());
    if (n == 0 && s.c == codec::lz4 && s.level < 0) continue;  // accelerated lz4 may not compress
    ASSERT_GT(n, 0u);
    bytes exact(in.size());  // cap = n always suffices, and gives the same bytes
    EXPECT_EQ(zs[s].compress(s.c, s.level, in.data(), in.size(), exact.data(), exact.size()), n);
    EXPECT_TRUE(
        std::equal(exact.begin(), exact.begin() + static_cast<std::ptrdiff_t>(n), big.begin()));
    bytes small(n - 1);  // one byte short: keep raw, and nothing written past the buffer
    EXPECT_EQ(zs[s].compress(s.c, s.level, in.data(), in.size(), small.data(), small.size()), 0u);
    EXPECT_EQ(zs[s].compress(s.c, s.level, in.data(), in.size(), big.data(), 5), 0u);
  }
}

TEST(Compress, BlockHeaderFormat) {
  compressor z;
  const bytes in = bench::make_snapshot(9, 300, corpus_format::binary);
  bytes out(400);
  const size_t n = z.compress(codec::lz4, 0, in.data(), in.size(), out.data(), out.size());
  ASSERT_GT(n, 3u);
  EXPECT_EQ(out[0], 1);     // codec lz4
  EXPECT_EQ(out[1], 0x82);  // varint(300) = 82 2C, most significant group first
  EXPECT_EQ(out[2], 0x2C);
  block_header h;
  ASSERT_EQ(parse_block_header(out.data(), n, &h), errc::ok);
  EXPECT_EQ(h.c, codec::lz4);
  EXPECT_EQ(h.raw_size, 300u);
  EXPECT_EQ(h.header_size, 3u);
}

// Peak resident set, bytes.
size_t peak_rss() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

constexpr size_t kLimit = size_t{64} * 1024;
constexpr uint64_t kGiB = uint64_t{1} << 30;

bytes block_with_header(codec c, uint64_t raw_size, const bytes& data) {
  bytes b(1 + varint_size(raw_size));
  b[0] = static_cast<uint8_t>(c);
  varint_encode(raw_size, b.data() + 1);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// A hand-made zstd frame of `blocks` RLE blocks, each 128 KiB of zeros (4 bytes apiece: the best
// ratio zstd allows), with the frame content size `fcs` written as 8 bytes, or absent if fcs is 0.
bytes zstd_rle_frame(size_t blocks, uint64_t fcs, uint32_t block_size = 128 * 1024) {
  bytes f = {0x28, 0xB5, 0x2F, 0xFD};  // magic, little-endian
  f.push_back(fcs != 0 ? 0xC0
                       : 0x00);  // descriptor: FCS field 8 bytes (or none), not single segment
  f.push_back(7 << 3);           // window descriptor: 2^(10 + 7) = 128 KiB
  for (int i = 0; fcs != 0 && i < 8; ++i) f.push_back(static_cast<uint8_t>(fcs >> (8 * i)));
  for (size_t i = 0; i < blocks; ++i) {
    const uint32_t hdr = (block_size << 3) | (1u << 1) | (i + 1 == blocks ? 1u : 0u);  // RLE
    f.push_back(static_cast<uint8_t>(hdr));
    f.push_back(static_cast<uint8_t>(hdr >> 8));
    f.push_back(static_cast<uint8_t>(hdr >> 16));
    f.push_back(0);  // the byte repeated
  }
  return f;
}

TEST(Compress, HandMadeZstdFrameIsValid) {
  // Four 16 KiB RLE blocks announcing 64 KiB: decodes to 64 KiB of zeros (checks the bomb maker).
  compressor z;
  const bytes b = block_with_header(codec::zstd, kLimit, zstd_rle_frame(4, kLimit, 16 * 1024));
  bytes out(kLimit, 0xAA);
  const decompress_result r = z.decompress(codec::zstd, b.data(), b.size(), out.data(), kLimit);
  ASSERT_EQ(r.code, errc::ok) << z.last_error().detail;
  EXPECT_EQ(r.size, kLimit);
  EXPECT_EQ(out, bytes(kLimit, 0));
}

void expect_refused(compressor& z, codec c, const bytes& block, errc want) {
  bytes out(kLimit);  // exactly the limit: ASan reports any write past it
  const size_t mem = z.memory_bytes();
  const decompress_result r = z.decompress(c, block.data(), block.size(), out.data(), kLimit);
  EXPECT_EQ(r.code, want) << z.last_error().detail;
  EXPECT_EQ(r.size, 0u);
  EXPECT_FALSE(z.last_error().detail.empty());
  EXPECT_LE(z.memory_bytes(), mem == 0 ? size_t{1} << 20 : mem);  // the contexts did not grow
}

TEST(Compress, BombsAreRefusedAtTheLimit) {
  compressor z;
  const size_t rss_before = peak_rss();
  // 1. The block header claims 1 GiB: refused before the data is looked at.
  const bytes small_frame = zstd_rle_frame(8, uint64_t{8} * 128 * 1024);
  ASSERT_LT(small_frame.size(), 1024u);
  expect_refused(z, codec::zstd, block_with_header(codec::zstd, kGiB, small_frame), errc::oversize);
  // 2. The header says 64 KiB, the zstd frame says 1 GiB (8192 RLE blocks, 32 KiB of data).
  const bytes giant = zstd_rle_frame(8192, kGiB);
  ASSERT_LT(giant.size(), 33u * 1024);
  expect_refused(z, codec::zstd, block_with_header(codec::zstd, kLimit, giant),
                 errc::protocol_error);
  // 3. Same frame without a content size: decoding stops at the 64 KiB buffer's end.
  const bytes silent = zstd_rle_frame(8192, 0);
  expect_refused(z, codec::zstd, block_with_header(codec::zstd, kLimit, silent),
                 errc::protocol_error);
  // 4. A 1 KiB frame that would produce 32 MiB (250 blocks), content size absent.
  const bytes kib = zstd_rle_frame(250, 0);
  ASSERT_LE(kib.size(), 1024u);
  expect_refused(z, codec::zstd, block_with_header(codec::zstd, kLimit, kib), errc::protocol_error);
  // 5. lz4: a real block of 1 MiB of zeros (about 4 KiB) announced as 64 KiB, and as 1 GiB.
  const bytes zeros(1 << 20, 0);
  bytes lz(LZ4_COMPRESSBOUND(1 << 20));
  const int ln = LZ4_compress_default(reinterpret_cast<const char*>(zeros.data()),
                                      reinterpret_cast<char*>(lz.data()),
                                      static_cast<int>(zeros.size()), static_cast<int>(lz.size()));
  ASSERT_GT(ln, 0);
  lz.resize(static_cast<size_t>(ln));
  expect_refused(z, codec::lz4, block_with_header(codec::lz4, kLimit, lz), errc::protocol_error);
  expect_refused(z, codec::lz4, block_with_header(codec::lz4, kGiB, lz), errc::oversize);
  expect_refused(z, codec::lz4, block_with_header(codec::lz4, kLimit + 1, lz), errc::oversize);
  // Nothing near the claimed sizes was ever resident (the zstd contexts are well under 1 MiB).
  EXPECT_LT(peak_rss() - rss_before, size_t{64} << 20);
  EXPECT_LT(z.memory_bytes(), size_t{1} << 20);
}

TEST(Compress, MalformedBlocksAreRefused) {
  compressor z;
  bytes out(kLimit);
  const bytes in = bench::make_snapshot(2, 2048, corpus_format::json);
  bytes block(4096);
  block.resize(z.compress(codec::zstd, 3, in.data(), in.size(), block.data(), block.size()));
  ASSERT_FALSE(block.empty());
  auto code = [&](codec c, const bytes& b) {
    return z.decompress(c, b.data(), b.size(), out.data(), out.size()).code;
  };
  EXPECT_EQ(code(codec::none, block), errc::invalid_argument);
  EXPECT_EQ(code(codec::lz4, block), errc::protocol_error);  // not the link's codec
  EXPECT_EQ(code(codec::zstd, bytes{}), errc::protocol_error);
  EXPECT_EQ(code(codec::zstd, bytes{2}), errc::protocol_error);
  EXPECT_EQ(code(codec::zstd, bytes{0, 5, 1, 2}), errc::protocol_error);  // codec byte none
  EXPECT_EQ(code(codec::zstd, bytes{7, 5, 1, 2}), errc::protocol_error);  // unknown codec
  EXPECT_EQ(code(codec::zstd, bytes{2, 0, 1, 2}), errc::protocol_error);  // raw_size 0
  EXPECT_EQ(code(codec::zstd, bytes{2, 0x81}), errc::protocol_error);     // truncated varint
  EXPECT_EQ(
      code(codec::zstd, bytes{2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}),
      errc::bad_varint);
  // A raw_size that disagrees with the frame, either way.
  const bytes frame(block.begin() + 3, block.end());  // after codec and varint(2048) = 90 00
  ASSERT_EQ(code(codec::zstd, block_with_header(codec::zstd, 2048, frame)), errc::ok);
  EXPECT_EQ(code(codec::zstd, block_with_header(codec::zstd, 2047, frame)), errc::protocol_error);
  EXPECT_EQ(code(codec::zstd, block_with_header(codec::zstd, 2049, frame)), errc::protocol_error);
  // Trailing bytes after the frame.
  bytes trailing = block;
  trailing.push_back(0);
  EXPECT_EQ(code(codec::zstd, trailing), errc::protocol_error);
  // Still works afterwards.
  EXPECT_EQ(code(codec::zstd, block), errc::ok);
}

// libzstd also decodes the legacy frame formats v0.5 to v0.7 (Debian builds it with legacy
// support), each through an old decoder that allocates a context of about 150 KB per call (and
// frees it): a peer's 100-byte block would cost an allocation per message. None of our encoders
// writes them, so a zstd block must hold a frame of the current format (magic FD2FB528).
TEST(Compress, LegacyZstdFramesAreRefused) {
  compressor z;
  bytes out(kLimit);
  const std::string text(200, 'L');
  for (const uint8_t v : {5, 6, 7}) {
    SCOPED_TRACE("zstd v0." + std::to_string(v));
    bytes f = {static_cast<uint8_t>(0x20 + v), 0xB5, 0x2F, 0xFD, 0x00};    // magic, descriptor
    if (v == 7) f.push_back(0x00);                                         // window descriptor
    f.insert(f.end(), {1 << 6, 0x00, static_cast<uint8_t>(text.size())});  // one raw block
    f.insert(f.end(), text.begin(), text.end());
    f.insert(f.end(), {0xC0, 0x00, 0x00});  // end of frame
    const bytes b = block_with_header(codec::zstd, text.size(), f);
    const decompress_result r =
        z.decompress(codec::zstd, b.data(), b.size(), out.data(), out.size());
    EXPECT_EQ(r.code, errc::protocol_error) << r.size << " bytes decoded";
    EXPECT_NE(z.last_error().detail.find("not a zstd frame"), std::string::npos)
        << z.last_error().detail;
  }
  // The current format still decodes.
  const bytes b = block_with_header(codec::zstd, kLimit, zstd_rle_frame(4, kLimit, 16 * 1024));
  EXPECT_EQ(z.decompress(codec::zstd, b.data(), b.size(), out.data(), out.size()).code, errc::ok)
      << z.last_error().detail;
}

// Every strict prefix of a block fails; corrupting any byte never crashes and never yields a size
// other than raw_size; garbage after a valid header never crashes.
TEST(Compress, TruncatedCorruptAndGarbageInputs) {
  zpool zs;
  std::mt19937 g(42);
  for (const setting& s :
       {setting{codec::lz4, 0}, setting{codec::lz4, 9}, setting{codec::zstd, 3}}) {
    const bytes in = bench::make_snapshot(4, 1500, corpus_format::binary);
    bytes block(2048);
    block.resize(zs[s].compress(s.c, s.level, in.data(), in.size(), block.data(), block.size()));
    ASSERT_FALSE(block.empty());
    for (size_t len = 0; len < block.size(); ++len) {
      bytes prefix(block.begin(), block.begin() + static_cast<std::ptrdiff_t>(len));
      bytes out(in.size());
      EXPECT_NE(zs[s].decompress(s.c, prefix.data(), len, out.data(), out.size()).code, errc::ok)
          << to_string(s.c) << " prefix " << len;
    }
    for (size_t i = 0; i < block.size(); ++i) {
      for (int k = 0; k < 4; ++k) {
        bytes bad = block;
        bad[i] = static_cast<uint8_t>(bad[i] ^ (1u << (g() % 8)));
        bytes out(in.size());
        const decompress_result r =
            zs[s].decompress(s.c, bad.data(), bad.size(), out.data(), out.size());
        if (r.code == errc::ok) {
          EXPECT_EQ(r.size, in.size());
        }
      }
    }
    for (int k = 0; k < 2000; ++k) {
      bytes junk = random_bytes(1 + g() % 300, g());
      bytes hdr = block_with_header(s.c, 1 + g() % 4096, junk);
      bytes out(4096);
      const decompress_result r =
          zs[s].decompress(s.c, hdr.data(), hdr.size(), out.data(), out.size());
      if (r.code == errc::ok) {
        EXPECT_LE(r.size, out.size());
      }
    }
  }
}

// Once warm, the contexts keep their size whatever the message sizes: no per-message allocation.
TEST(Compress, AContextThatCannotBeCreatedIsNoMemoryAndTheNextCallRecovers) {
  // Our own allocation failing is no_memory, named, not the block's fault (protocol_error): the
  // bus closes the link with it instead of blaming the peer (NodeCompress.*).
  compressor z;
  const auto m = bench::make_snapshot(1, 4096, corpus_format::json);
  bytes block(4096);
  bytes out(4096);
  const size_t n = z.compress(codec::zstd, 3, m.data(), m.size(), block.data(), block.size());
  ASSERT_GT(n, 0u);
  detail::fail_next_zstd_dctx(1);
  const decompress_result r = z.decompress(codec::zstd, block.data(), n, out.data(), out.size());
  EXPECT_EQ(r.code, errc::no_memory);
  EXPECT_EQ(z.last_error().code, errc::no_memory);
  EXPECT_NE(z.last_error().detail.find("no memory for a ZSTD_DCtx"), std::string::npos)
      << z.last_error().detail;
  const decompress_result again =
      z.decompress(codec::zstd, block.data(), n, out.data(), out.size());
  ASSERT_EQ(again.code, errc::ok);
  EXPECT_EQ(bytes(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(again.size)),
            bytes(m.begin(), m.end()));
}

TEST(Compress, ContextsAreReused) {
  zpool zs;
  EXPECT_EQ(zs.memory_bytes(), 0u);
  const auto big = bench::make_snapshot(1, 65536, corpus_format::json);
  bytes block(70000);
  bytes out(65536);
  for (const setting& s :
       {setting{codec::lz4, 0}, setting{codec::lz4, 9}, setting{codec::zstd, 3}}) {
    const size_t n =
        zs[s].compress(s.c, s.level, big.data(), big.size(), block.data(), block.size());
    ASSERT_GT(n, 0u);
    ASSERT_EQ(zs[s].decompress(s.c, block.data(), n, out.data(), out.size()).code, errc::ok);
  }
  const size_t warm = zs.memory_bytes();
  EXPECT_GT(warm, 0u);
  std::mt19937 g(1);
  for (int i = 0; i < 600; ++i) {
    const size_t size = 64 + g() % 65000;
    const bytes m = bench::make_snapshot(static_cast<uint64_t>(i), size, corpus_format::binary);
    for (const setting& s :
         {setting{codec::lz4, 0}, setting{codec::lz4, 9}, setting{codec::zstd, 3}}) {
      round_trip(zs[s], s, m);
    }
  }
  EXPECT_EQ(zs.memory_bytes(), warm);
}

// zstd's parameters are fixed (compress.cpp): a compressor stays small at every level.
TEST(Compress, MemoryIsBoundedAtEveryLevel) {
  const bytes m = bench::make_snapshot(3, 65536, corpus_format::json);
  bytes block(m.size());
  for (const setting& s : kSettings) {
    compressor z;
    const size_t n = z.compress(s.c, s.level, m.data(), m.size(), block.data(), block.size());
    EXPECT_TRUE(n > 0 || s.level < 0);  // accelerated lz4 may keep it raw
    EXPECT_LT(z.memory_bytes(), size_t{3} << 20) << to_string(s.c) << " " << s.level;
  }
}

}  // namespace
}  // namespace uvbus::compress_test
