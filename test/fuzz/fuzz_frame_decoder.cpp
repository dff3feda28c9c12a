// Fuzzes the incremental stream frame decoder (src/core/frame.h).
//
// Input layout:
//   byte 0      message limit, chosen from kLimits
//   byte 1      chunking: 0 = the whole stream in one chunk, 1..127 = chunks of that many bytes,
//               128..255 = pseudo-random chunk sizes in [1, 2 * (b - 127)] seeded by bytes 2..3
//   bytes 2..3  seed for the pseudo-random chunk sizes
//   rest        the byte stream a peer sent
//
// The stream is decoded twice: once in one piece by a plain reference decoder written here from
// the format (docs/internals.md), once by frame_decoder fed chunk by chunk, each chunk in its own
// exactly-sized heap allocation (so ASan catches any read past a chunk). Invariants:
//   * both yield the same payloads in the same order and end in the same state (chunking never
//     changes the outcome); every yielded payload's MurmurHash3 matches its frame's hash field;
//   * after an error nothing more is yielded, even when more bytes are fed;
//   * buffered() never exceeds limit + kFrameMaxHeader; at a frame boundary with nothing pending
//     the retained buffer is at most kDecoderKeepBytes, and release_buffer() frees it there (and
//     keeps every byte of a partial frame anywhere else);
//   * reset() returns the decoder to its initial state.
#include <cstring>
#include <memory>
#include <vector>

#include "core/frame.h"
#include "core/murmur3.h"
#include "frame_reference.h"
#include "fuzz_util.h"

namespace {

using uvbus::frame_decoder;
using uvbus::frame_status;
using uvbus::fuzz::frame_ref;
using uvbus::fuzz::reference_decode;

constexpr size_t kLimits[] = {0, 1, 2, 5, 16, 100, 127, 128, 300, 4095, 4096, 4097, 65536};

struct chunker {
  uint8_t mode;
  uint32_t state;
  size_t next(size_t left) {
    size_t n;
    if (mode == 0) {
      n = left;
    } else if (mode < 128) {
      n = mode;
    } else {
      // xorshift32: deterministic, cheap, and state 0 is avoided by the | 1 at seeding.
      state ^= state << 13;
      state ^= state >> 17;
      state ^= state << 5;
      n = 1 + state % (2u * (mode - 127u));
    }
    return n < left ? n : left;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uvbus::fuzz::byte_reader in(data, size);
  const size_t limit = kLimits[in.u8() % (sizeof kLimits / sizeof kLimits[0])];
  chunker ch{in.u8(), 0};
  ch.state = (static_cast<uint32_t>(in.u16()) << 8) | 1u;
  const uint8_t* stream = in.data();
  const size_t stream_len = in.left();

  std::vector<frame_ref> expected;
  const frame_status expected_end = reference_decode(stream, stream_len, limit, &expected);

  frame_decoder dec(limit);
  FUZZ_CHECK(dec.max_payload() == limit);
  size_t pos = 0;
  size_t yielded = 0;
  frame_status end = frame_status::need_more;
  while (pos < stream_len && end == frame_status::need_more) {
    const size_t n = ch.next(stream_len - pos);
    std::unique_ptr<uint8_t[]> chunk(new uint8_t[n]);
    std::memcpy(chunk.get(), stream + pos, n);
    pos += n;
    dec.feed(chunk.get(), n);
    for (;;) {
      const frame_decoder::result r = dec.next();
      FUZZ_CHECK(dec.buffered() <= limit + uvbus::kFrameMaxHeaderBytes);
      if (r.status == frame_status::payload) {
        FUZZ_CHECK(yielded < expected.size());
        const frame_ref& want = expected[yielded];
        FUZZ_CHECK(r.size == want.size);
        FUZZ_CHECK(r.size <= limit);
        FUZZ_CHECK(r.size == 0 || std::memcmp(r.data, stream + want.offset, r.size) == 0);
        ++yielded;
        continue;
      }
      if (r.status == frame_status::need_more) {
        FUZZ_CHECK(!dec.failed());
        if (dec.buffered() == 0) {
          FUZZ_CHECK(dec.buffer_capacity() <= frame_decoder::kDecoderKeepBytes);
          if ((n & 1) != 0) {  // as the stream channel does after a read (every other chunk here)
            dec.release_buffer();
            FUZZ_CHECK(dec.buffer_capacity() == 0);
          }
        } else {
          const size_t held = dec.buffered();
          dec.release_buffer();  // mid-frame: must keep every byte
          FUZZ_CHECK(dec.buffered() == held);
        }
        break;
      }
      FUZZ_CHECK(dec.failed());
      end = r.status;
      break;
    }
  }
  FUZZ_CHECK(yielded == expected.size());
  FUZZ_CHECK(end == expected_end);

  if (end != frame_status::need_more) {
    // Sticky error: more bytes, even a perfectly valid frame, yield nothing.
    uint8_t good[16];
    const size_t g = uvbus::frame_encode("ok", 2, good, sizeof good);
    FUZZ_CHECK(g != 0);
    dec.feed(good, g);
    for (int i = 0; i < 3; ++i) FUZZ_CHECK(dec.next().status == end);
  } else {
    // Whatever partial frame is pending, a clean stream after reset() decodes normally.
    FUZZ_CHECK(pos == stream_len);
  }

  dec.reset();
  FUZZ_CHECK(!dec.failed());
  FUZZ_CHECK(dec.buffered() == 0);
  FUZZ_CHECK(dec.buffer_capacity() == 0);
  uint8_t good[16];
  const size_t g = uvbus::frame_encode("", 0, good, sizeof good);
  dec.feed(good, g);
  const frame_decoder::result r = dec.next();
  FUZZ_CHECK(r.status == frame_status::payload && r.size == 0);
  FUZZ_CHECK(dec.next().status == frame_status::need_more);
  return 0;
}
