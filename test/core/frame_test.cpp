// Stream frames: libatbus-compatible bytes, edge lengths, limits, corrupt and oversize frames.
#include "core/frame.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/murmur3.h"
#include "core/try_alloc.h"

namespace uvbus::frame_test {
namespace {

std::vector<uint8_t> encode(const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out(frame_size(payload.size()));
  EXPECT_EQ(frame_encode(payload.data(), payload.size(), out.data(), out.size()), out.size());
  return out;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + size_t{seed} * 7) >> 1);
  return v;
}

// Feeds `stream` in the given chunk sizes (cycled) and collects payloads until an error.
struct decode_result {
  std::vector<std::vector<uint8_t>> payloads;
  frame_status error = frame_status::need_more;
};
decode_result decode_chunked(frame_decoder& d, const std::vector<uint8_t>& stream,
                             const std::vector<size_t>& chunks) {
  decode_result r;
  size_t pos = 0;
  size_t ci = 0;
  while (pos < stream.size()) {
    const size_t n = std::min(chunks[ci++ % chunks.size()], stream.size() - pos);
    d.feed(stream.data() + pos, n);
    pos += n;
    for (;;) {
      auto res = d.next();
      if (res.status == frame_status::payload) {
        r.payloads.emplace_back(res.data, res.data + res.size);
        continue;
      }
      if (res.status != frame_status::need_more) {
        r.error = res.status;
        return r;
      }
      break;
    }
  }
  return r;
}

TEST(Frame, HelloMatchesLibatbusBytes) {
  const std::string hello = "hello";
  std::vector<uint8_t> out(frame_size(hello.size()));
  ASSERT_EQ(frame_encode(hello.data(), hello.size(), out.data(), out.size()), 10u);
  EXPECT_EQ(out, (std::vector<uint8_t>{0x47, 0xfa, 0x8b, 0x24, 0x05, 'h', 'e', 'l', 'l', 'o'}));
}

TEST(Frame, EncodeRefusesSmallBuffer) {
  uint8_t out[9];
  EXPECT_EQ(frame_encode("hello", 5, out, sizeof out), 0u);
}

TEST(Frame, EdgeLengthsRoundTripWholeAndByteByByte) {
  for (size_t len : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383}, size_t{16384},
                     size_t{256} * 1024}) {
    auto payload = pattern(len, static_cast<uint32_t>(len));
    auto frame = encode(payload);
    EXPECT_EQ(frame.size(), 4 + varint_size(len) + len);
    for (size_t chunk : {frame.size(), size_t{1}, size_t{3}, size_t{7}}) {
      frame_decoder d;
      auto r = decode_chunked(d, frame, {chunk});
      ASSERT_EQ(r.error, frame_status::need_more) << len << " chunk " << chunk;
      ASSERT_EQ(r.payloads.size(), 1u) << len << " chunk " << chunk;
      EXPECT_EQ(r.payloads[0], payload);
      EXPECT_EQ(d.buffered(), 0u);
    }
  }
}

TEST(Frame, LimitPassesAndLimitPlusOneIsOversize) {
  frame_decoder d(1000);
  auto ok = decode_chunked(d, encode(pattern(1000, 1)), {4096});
  EXPECT_EQ(ok.payloads.size(), 1u);
  EXPECT_EQ(ok.error, frame_status::need_more);
  auto big = encode(pattern(1001, 1));
  for (size_t chunk : {big.size(), size_t{1}}) {
    frame_decoder d2(1000);
    auto r = decode_chunked(d2, big, {chunk});
    EXPECT_EQ(r.error, frame_status::oversize) << chunk;
    EXPECT_TRUE(r.payloads.empty());
  }
}

TEST(Frame, HugeLengthIsOversizeWithoutAllocating) {
  std::vector<uint8_t> stream = {0, 0, 0, 0};
  uint8_t v[10];
  stream.insert(stream.end(), v, v + varint_encode(uint64_t{1} << 63, v));
  frame_decoder d;
  auto r = decode_chunked(d, stream, {1});
  EXPECT_EQ(r.error, frame_status::oversize);
  EXPECT_LE(d.buffer_capacity(), frame_decoder::kDecoderKeepBytes);
}

TEST(Frame, CorruptedHashByteIsRejectedAndNothingAfterIsDelivered) {
  auto a = encode(pattern(50, 1));
  auto b = encode(pattern(60, 2));
  auto c = encode(pattern(70, 3));
  for (size_t flip = 0; flip < 4; ++flip) {
    std::vector<uint8_t> stream = a;
    auto bad = b;
    bad[flip] ^= 0x10;
    stream.insert(stream.end(), bad.begin(), bad.end());
    stream.insert(stream.end(), c.begin(), c.end());
    for (size_t chunk : {stream.size(), size_t{1}, size_t{13}}) {
      frame_decoder d;
      auto r = decode_chunked(d, stream, {chunk});
      EXPECT_EQ(r.error, frame_status::bad_hash);
      ASSERT_EQ(r.payloads.size(), 1u);
      // The decoder stays failed.
      d.feed(c.data(), c.size());
      EXPECT_EQ(d.next().status, frame_status::bad_hash);
    }
  }
}

TEST(Frame, CorruptedPayloadByteIsBadHash) {
  auto f = encode(pattern(200, 9));
  f[100] ^= 1;
  frame_decoder d;
  EXPECT_EQ(decode_chunked(d, f, {f.size()}).error, frame_status::bad_hash);
}

TEST(Frame, TruncatedVarintNeedsMoreThenCompletes) {
  auto f = encode(pattern(300, 4));  // 2-byte varint
  frame_decoder d;
  d.feed(f.data(), 5);  // hash + first varint byte
  EXPECT_EQ(d.next().status, frame_status::need_more);
  d.feed(f.data() + 5, f.size() - 5);
  auto r = d.next();
  ASSERT_EQ(r.status, frame_status::payload);
  EXPECT_EQ(r.size, 300u);
}

TEST(Frame, OverlongVarintIsBadVarint) {
  std::vector<uint8_t> stream = {1, 2, 3, 4};
  stream.insert(stream.end(), 11, 0x80);
  for (size_t chunk : {stream.size(), size_t{1}}) {
    frame_decoder d;
    EXPECT_EQ(decode_chunked(d, stream, {chunk}).error, frame_status::bad_varint) << chunk;
  }
}

TEST(Frame, WholeFramesInsideAChunkAreZeroCopy) {
  auto a = encode(pattern(10, 1));
  auto b = encode(pattern(20, 2));
  std::vector<uint8_t> stream = a;
  stream.insert(stream.end(), b.begin(), b.end());
  frame_decoder d;
  d.feed(stream.data(), stream.size());
  auto r1 = d.next();
  ASSERT_EQ(r1.status, frame_status::payload);
  EXPECT_EQ(r1.data, stream.data() + 5);
  auto r2 = d.next();
  ASSERT_EQ(r2.status, frame_status::payload);
  EXPECT_EQ(r2.data, stream.data() + a.size() + 5);
  EXPECT_EQ(d.next().status, frame_status::need_more);
  EXPECT_EQ(d.buffer_capacity(), 0u);  // nothing was copied
}

TEST(Frame, LargePartialBufferIsReleasedAfterTheFrame) {
  auto big = encode(pattern(60000, 3));
  auto small = encode(pattern(8, 3));
  std::vector<uint8_t> stream = big;
  stream.insert(stream.end(), small.begin(), small.end());
  frame_decoder d;
  auto r = decode_chunked(d, stream, {1000});
  ASSERT_EQ(r.payloads.size(), 2u);
  d.feed(nullptr, 0);
  EXPECT_EQ(d.next().status, frame_status::need_more);
  EXPECT_LE(d.buffer_capacity(), frame_decoder::kDecoderKeepBytes);
}

// Frames cut one after another (a busy connection's reads or TLS records) reuse the buffer the
// first one grew: no allocation per cut frame up to kDecoderKeepBytes. A larger one frees it once
// it completes.
TEST(Frame, CutFramesReuseTheBufferUpToTheKeepBound) {
  const auto a = encode(pattern(12000, 7));
  const auto b = encode(pattern(9000, 8));
  const auto big = encode(pattern(frame_decoder::kDecoderKeepBytes + 1000, 9));
  frame_decoder d;
  d.feed(a.data(), 5000);
  ASSERT_EQ(d.next().status, frame_status::need_more);
  // The rest of a, then the start of b in the same chunk: a completes, b is cut.
  std::vector<uint8_t> chunk(a.begin() + 5000, a.end());
  chunk.insert(chunk.end(), b.begin(), b.begin() + 3000);
  d.feed(chunk.data(), chunk.size());
  auto r = d.next();
  ASSERT_EQ(r.status, frame_status::payload);
  EXPECT_EQ(r.size, 12000u);
  const size_t grown = d.buffer_capacity();
  EXPECT_GE(grown, a.size());
  ASSERT_EQ(d.next().status, frame_status::need_more);
  EXPECT_EQ(d.buffered(), 3000u);
  EXPECT_EQ(d.buffer_capacity(), grown) << "b's part went into a's buffer";
  chunk.assign(b.begin() + 3000, b.end());
  chunk.insert(chunk.end(), big.begin(), big.begin() + 100);
  d.feed(chunk.data(), chunk.size());
  r = d.next();
  ASSERT_EQ(r.status, frame_status::payload);
  EXPECT_EQ(r.size, 9000u);
  EXPECT_EQ(r.data[8999], pattern(9000, 8)[8999]);
  ASSERT_EQ(d.next().status, frame_status::need_more);
  EXPECT_EQ(d.buffer_capacity(), grown) << "no allocation for b";
  d.feed(big.data() + 100, big.size() - 100);
  r = d.next();
  ASSERT_EQ(r.status, frame_status::payload);
  EXPECT_EQ(r.size, frame_decoder::kDecoderKeepBytes + 1000);
  EXPECT_EQ(d.next().status, frame_status::need_more);
  EXPECT_EQ(d.buffer_capacity(), 0u) << "a buffer above the bound goes once its frame completes";
}

// A frame that straddled two chunks leaves a small buffer behind (kept for the next straddle of a
// burst); release_buffer() at the boundary frees it, and does nothing while a frame is partial.
TEST(Frame, ReleaseBufferFreesOnlyAtAFrameBoundary) {
  const auto f = encode(pattern(1000, 5));
  frame_decoder d;
  d.feed(f.data(), 600);
  EXPECT_EQ(d.next().status, frame_status::need_more);
  d.release_buffer();  // mid-frame: the 600 bytes must stay
  EXPECT_EQ(d.buffered(), 600u);
  d.feed(f.data() + 600, f.size() - 600);
  const auto r = d.next();
  ASSERT_EQ(r.status, frame_status::payload);
  d.release_buffer();  // the payload still points into the buffer: nothing happens yet
  EXPECT_EQ(r.data[999], pattern(1000, 5)[999]);
  EXPECT_EQ(d.next().status, frame_status::need_more);
  EXPECT_GT(d.buffer_capacity(), 0u);  // kept: at most kDecoderKeepBytes
  d.release_buffer();
  EXPECT_EQ(d.buffer_capacity(), 0u);
  d.feed(f.data(), f.size());  // and the decoder goes on as new
  EXPECT_EQ(d.next().size, 1000u);
}

// release_buffer() parks the buffer as the thread's spare: the next decoder of the thread that
// cuts a frame takes it (its 100 bytes sit in a buffer of at least the 12 000 the first one grew),
// while a decoder on another thread starts from nothing. Both frames arrive intact.
TEST(Frame, AReleasedBufferIsTheThreadsSpareForTheNextCutFrame) {
  const auto a = encode(pattern(12000, 3));
  const auto b = encode(pattern(5000, 4));
  frame_decoder first;
  first.feed(a.data(), 6000);
  ASSERT_EQ(first.next().status, frame_status::need_more);
  first.feed(a.data() + 6000, a.size() - 6000);
  auto r = first.next();
  ASSERT_EQ(r.status, frame_status::payload);
  EXPECT_EQ(std::vector<uint8_t>(r.data, r.data + r.size), pattern(12000, 3));
  ASSERT_EQ(first.next().status, frame_status::need_more);
  first.release_buffer();
  EXPECT_EQ(first.buffer_capacity(), 0u);
  frame_decoder second;
  second.feed(b.data(), 100);
  ASSERT_EQ(second.next().status, frame_status::need_more);
  EXPECT_GE(second.buffer_capacity(), a.size()) << "the spare, not a new 100-byte buffer";
  second.feed(b.data() + 100, b.size() - 100);
  r = second.next();
  ASSERT_EQ(r.status, frame_status::payload);
  EXPECT_EQ(std::vector<uint8_t>(r.data, r.data + r.size), pattern(5000, 4));
  size_t elsewhere = 0;
  std::thread([&] {
    frame_decoder other;
    other.feed(b.data(), 100);
    (void)other.next();
    elsewhere = other.buffer_capacity();
  }).join();
  EXPECT_LT(elsewhere, a.size()) << "another thread has a spare of its own";
}

TEST(Frame, ThousandRandomFramesSplitAtRandomPoints) {
  std::mt19937_64 rng(12345);
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<uint8_t> stream;
  for (int i = 0; i < 1000; ++i) {
    std::uniform_int_distribution<size_t> len_dist(0, i % 10 == 0 ? 20000 : 300);
    std::vector<uint8_t> p(len_dist(rng));
    for (auto& byte : p) byte = static_cast<uint8_t>(rng());
    auto f = encode(p);
    stream.insert(stream.end(), f.begin(), f.end());
    payloads.push_back(std::move(p));
  }
  std::vector<std::vector<size_t>> patterns = {{1}, {2}, {3, 5, 7}, {4096}, {65536}, {1 << 20}};
  std::vector<size_t> random_splits(5000);
  for (auto& s : random_splits) s = 1 + rng() % 2000;
  patterns.push_back(random_splits);
  for (const auto& pat : patterns) {
    frame_decoder d;
    auto r = decode_chunked(d, stream, pat);
    EXPECT_EQ(r.error, frame_status::need_more);
    ASSERT_EQ(r.payloads.size(), payloads.size()) << "pattern starting " << pat[0];
    EXPECT_TRUE(r.payloads == payloads) << "pattern starting " << pat[0];
  }
}

TEST(Frame, StatusNames) {
  EXPECT_STREQ(to_string(frame_status::need_more), "need_more");
  EXPECT_NE(std::string(to_string(frame_status::bad_hash)).find("checksum"), std::string::npos);
}

}  // namespace
}  // namespace uvbus::frame_test

namespace uvbus::frame_test {
namespace {

// Memory that runs out while a cut frame's buffer grows (the buffer is sized by what the peer
// sent, up to the message limit) ends the stream with no_memory instead of std::bad_alloc through
// the read callback. On a thread of its own: no parked spare to grow into.
TEST(FrameMemory, ABufferThatCannotGrowEndsTheStreamWithNoMemory) {
  std::thread([] {
    const auto f = encode(pattern(200000, 6));
    frame_decoder d(size_t{1} << 20);
    detail::fail_next_try_resize(1);
    d.feed(f.data(), 100000);
    EXPECT_EQ(d.next().status, frame_status::no_memory);
    EXPECT_TRUE(d.failed());
    d.feed(f.data() + 100000, f.size() - 100000);
    EXPECT_EQ(d.next().status, frame_status::no_memory);  // sticky, as every error
    // The header's own bytes (a header cut after 5 bytes) take the same way.
    frame_decoder h(size_t{1} << 20);
    h.feed(f.data(), 5);
    ASSERT_EQ(h.next().status, frame_status::need_more);
    detail::fail_next_try_resize(1);
    h.feed(f.data() + 5, f.size() - 5);
    EXPECT_EQ(h.next().status, frame_status::no_memory);
    detail::fail_next_try_resize(0);
  }).join();
}

// A payload that reset() left behind is freed with its buffer, never parked as the thread's spare
// for another decoder to fill while it may still be read. (The payload is invalid after reset();
// what is checked is that a second decoder's cut frame does not land in that buffer.)
TEST(FrameMemory, ResetDoesNotParkTheBufferOfTheLastPayload) {
  std::thread([] {
    const auto a = encode(pattern(1000, 7));
    frame_decoder d;
    d.feed(a.data(), 500);
    ASSERT_EQ(d.next().status, frame_status::need_more);
    d.feed(a.data() + 500, a.size() - 500);
    const auto r = d.next();
    ASSERT_EQ(r.status, frame_status::payload);
    const size_t cap = d.buffer_capacity();
    d.reset();
    EXPECT_EQ(d.buffer_capacity(), 0u);
    frame_decoder other;
    other.feed(a.data(), 100);
    ASSERT_EQ(other.next().status, frame_status::need_more);
    EXPECT_LT(other.buffer_capacity(), cap) << "the reset decoder's buffer became the spare";
  }).join();
}

// A limit near SIZE_MAX: the header plus the announced length must not wrap around to a small
// frame (a 14-byte header announcing 2^64 - 1 bytes once passed as a 13-byte frame and the
// checksum read past the end).
TEST(FrameMemory, ALengthNearSizeMaxIsOversizeNotAWrappedFrame) {
  // A 4-byte checksum, then 2^64 - 1 as the 10-byte varint (7 bits a byte, the highest first).
  const uint8_t bytes[] = {0, 0, 0, 0, 0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  frame_decoder d(SIZE_MAX);
  d.feed(bytes, sizeof bytes);
  EXPECT_EQ(d.next().status, frame_status::oversize);
  frame_decoder cut(SIZE_MAX);  // the same header arriving in two reads
  cut.feed(bytes, 6);
  ASSERT_EQ(cut.next().status, frame_status::need_more);
  cut.feed(bytes + 6, sizeof bytes - 6);
  EXPECT_EQ(cut.next().status, frame_status::oversize);
}

TEST(FrameMemory, AnnouncedLengthDoesNotReserveMemoryBeforeTheBytesArrive) {
  // A header announcing a 60 000-byte payload, then 10 bytes of it: the decoder holds about what
  // arrived, not the announced size. On a thread of its own: a spare buffer parked by an earlier
  // test of this thread would be taken (reused, not reserved from the length) and hold more.
  std::thread([] {
    auto f = encode(pattern(60000, 5));
    frame_decoder d;
    d.feed(f.data(), 7 + 10);
    EXPECT_EQ(d.next().status, frame_status::need_more);
    EXPECT_EQ(d.buffered(), 17u);
    EXPECT_LT(d.buffer_capacity(), 1024u);
    // The rest still completes the frame.
    d.feed(f.data() + 17, f.size() - 17);
    auto r = d.next();
    ASSERT_EQ(r.status, frame_status::payload);
    EXPECT_EQ(r.size, 60000u);
  }).join();
}

}  // namespace
}  // namespace uvbus::frame_test
