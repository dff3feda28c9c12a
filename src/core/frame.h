// Stream frame codec (format in docs/internals.md, byte-compatible with libatbus's io_stream
// channel):
//
//   frame = hash32 length payload
//   hash32 = murmur3_x86_32(payload, seed 0), 4 bytes little-endian
//   length = varint(payload size), most significant 7-bit group first
//
// Encoding writes into a caller's buffer. Decoding is incremental: frame_decoder accepts bytes in
// chunks of any size and yields whole payloads, pointing into the caller's chunk when a frame lies
// wholly inside it (zero copy) and copying only the frames that straddle chunks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/murmur3_batch.h"
#include "core/varint.h"

namespace uvbus {

inline constexpr size_t kFrameHashBytes = 4;
// Largest possible frame header: hash + a 10-byte varint.
inline constexpr size_t kFrameMaxHeaderBytes = kFrameHashBytes + kVarintMaxBytes;

// Header bytes for a payload of payload_len bytes.
[[nodiscard]] constexpr size_t frame_header_size(size_t payload_len) noexcept {
  return kFrameHashBytes + varint_size(payload_len);
}
// Whole frame bytes for a payload of payload_len bytes.
[[nodiscard]] constexpr size_t frame_size(size_t payload_len) noexcept {
  return frame_header_size(payload_len) + payload_len;
}

// Writes hash32 + varint(payload_len) to out, which needs frame_header_size(payload_len) bytes.
// Returns the bytes written. Used when the payload is already in place right after the header.
size_t frame_write_header(uint32_t hash, size_t payload_len, uint8_t* out) noexcept;

// Encodes a whole frame into [out, out + cap). Returns the frame size, or 0 if cap is too small
// (nothing meaningful is written then). payload may alias nothing in out.
[[nodiscard]] size_t frame_encode(const void* payload, size_t len, uint8_t* out,
                                  size_t cap) noexcept;

// Incremental decoder. Usage:
//
//   decoder.feed(chunk, n);
//   for (;;) {
//     auto r = decoder.next();
//     if (r.status == frame_status::payload) { use(r.data, r.size); continue; }
//     if (r.status == frame_status::need_more) break;   // chunk fully consumed
//     fail(r.status); break;                            // corrupt stream: stop using it
//   }
//
// Lifetimes: the chunk passed to feed() must stay valid until next() returns need_more or an error.
// A payload view is valid until the following call to next() or feed(). After an error the decoder
// yields the same error forever (it never resynchronises: a corrupt stream must be closed).
//
// Memory: between chunks the decoder keeps only the bytes of one partial frame. Its buffer grows
// with the bytes actually received (never reserved from the announced length, so a peer sending a
// header and then nothing allocates only what it sent) and is released again once a frame larger
// than kDecoderKeepBytes completes. Up to that size it is kept for the next frame a chunk cuts (a
// busy connection's frames cut by reads or TLS records reuse it instead of allocating each time),
// so a decoder between frames of a burst holds at most kDecoderKeepBytes; release_buffer() at a
// frame boundary gives even that up (the stream channel calls it after every read that ends at
// one, so a quiet connection holds no receive memory): the buffer is parked as the thread's one
// spare (the largest, up to kDecoderKeepBytes; the other is freed), and the next decoder of the
// thread that must keep part of a frame takes it, so a new burst does not allocate either.
//
// Batches: when next() finds frames lying wholly inside the chunk, it parses up to kBatchFrames of
// them at once, verifies their checksums together (murmur3_x86_32_batch: SIMD lanes), keeps the
// verified views in a fixed array and yields them one per call, in order. A bad checksum is
// reported where it was in the stream: after every frame before it, and nothing after it is
// yielded. The results are exactly those of checking one frame at a time. When the batch's
// payloads average under batch_min_mean bytes, those frames and the next ones are checked one at
// a time as they are yielded. The default is what pays with the active kernel,
// murmur3_batch_min_mean_bytes(): 0 (batch every run of whole frames) with AVX-512, 24 B with AVX2,
// 256 B with the scalar kernel (two frames' chains at a time).
enum class frame_status {
  payload,     // r.data / r.size is one whole, checksum-verified payload
  need_more,   // every byte fed so far has been consumed; feed the next chunk
  bad_hash,    // a frame's checksum did not match its payload
  oversize,    // a frame announced a length above the limit
  bad_varint,  // a frame's length prefix is malformed (over 10 bytes or above 2^64)
  no_memory,   // the partial-frame buffer could not grow: memory ran out (not the peer's fault)
};

const char* to_string(frame_status s) noexcept;

class frame_decoder {
 public:
  static constexpr size_t kDecoderKeepBytes = size_t{64} * 1024;
  // Whole frames of one chunk verified together (the batch hash kernels' lane count).
  static constexpr size_t kBatchFrames = 16;

  // max_payload is capped at SIZE_MAX - kFrameMaxHeaderBytes (a frame's length must fit a size_t).
  explicit frame_decoder(size_t max_payload = size_t{256} * 1024,
                         size_t batch_min_mean = murmur3_batch_min_mean_bytes()) noexcept
      : max_payload_(std::min(max_payload, SIZE_MAX - kFrameMaxHeaderBytes)),
        batch_min_mean_(batch_min_mean) {}

  struct result {
    frame_status status;
    const uint8_t* data;
    size_t size;
  };

  // Sets the next chunk. The previous chunk must have been fully consumed (next() returned
  // need_more); feeding before that discards its unconsumed bytes.
  void feed(const void* data, size_t len) noexcept {
    chunk_ = static_cast<const uint8_t*>(data);
    chunk_left_ = len;
    ready_pos_ = 0;
    ready_n_ = 0;
    ready_error_ = false;
    unbatched_left_ = 0;
  }

  [[nodiscard]] result next();

  // Bytes held in the partial-frame buffer right now (0 when the stream is at a frame boundary).
  [[nodiscard]] size_t buffered() const noexcept { return partial_.size(); }
  // Capacity currently allocated for partial frames.
  [[nodiscard]] size_t buffer_capacity() const noexcept { return partial_.capacity(); }
  [[nodiscard]] bool failed() const noexcept { return error_ != frame_status::payload; }
  [[nodiscard]] size_t max_payload() const noexcept { return max_payload_; }
  // Forgets any partial frame and error: the decoder is as new. A payload next() returned last is
  // invalid afterwards (its buffer is freed, never parked for another decoder).
  void reset() noexcept;
  // At a frame boundary (buffered() == 0, the last payload consumed: next() returned need_more),
  // gives the partial-frame buffer up (parked as the thread's spare, or freed); otherwise does
  // nothing.
  void release_buffer() noexcept;

 private:
  result fail(frame_status s) noexcept {
    error_ = s;
    chunk_left_ = 0;
    return {s, nullptr, 0};
  }
  result next_partial();
  // Appends [p, p + n) to partial_ without letting std::bad_alloc out: false when memory ran out
  // (the buffer grows to what the peer sent, up to the message limit).
  [[nodiscard]] bool append(const uint8_t* p, size_t n) noexcept;
  // partial_ (empty) to the thread's spare, or freed; the spare (if any) into an empty partial_.
  void park_buffer() noexcept;
  void take_spare() noexcept;
  // Parses up to kBatchFrames whole frames from the chunk and verifies them together into ready_.
  // Returns false (consuming nothing) when the chunk does not start with a whole, well-formed
  // frame; the one-frame path then handles it (partial frame, header error).
  bool next_batch() noexcept;

  size_t max_payload_;
  size_t batch_min_mean_;
  // Frames still to be checked one at a time after a batch of small frames was declined: that
  // batch and kSmallRunBatches - 1 more, so that a stream of small frames is parsed ahead only
  // once per kSmallRunBatches * kBatchFrames frames (16: with the scalar kernel's 256 B threshold
  // every 8-128 B batch is declined, and at 4 the receiver paid 4 instructions a message for it).
  static constexpr size_t kSmallRunBatches = 16;
  size_t unbatched_left_ = 0;
  const uint8_t* chunk_ = nullptr;
  size_t chunk_left_ = 0;
  // Partial frame (header and payload bytes so far). header_len_ is 0 until its header is known.
  std::vector<uint8_t> partial_;
  size_t header_len_ = 0;
  size_t frame_len_ = 0;
  bool release_partial_ = false;  // the last payload was yielded from partial_: clear on next call
  frame_status error_ = frame_status::payload;  // payload means "no error"
  // Verified payloads of the current chunk not yet yielded: ready_[ready_pos_, ready_n_). When
  // ready_error_ is set, the frame after them had a bad checksum: bad_hash follows them.
  struct view {
    const uint8_t* data;
    size_t size;
  };
  view ready_[kBatchFrames] = {};
  size_t ready_pos_ = 0;
  size_t ready_n_ = 0;
  bool ready_error_ = false;
};

}  // namespace uvbus
