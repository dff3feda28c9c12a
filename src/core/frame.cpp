// Stream frame codec: the header (little-endian hash + varint length) and the incremental decoder.
#include "core/frame.h"

#include <algorithm>
#include <cstring>

#include "core/endian.h"
#include "core/murmur3.h"
#include "core/murmur3_batch.h"
#include "core/try_alloc.h"

namespace uvbus {
namespace {

inline bool hash_ok(const uint8_t* frame, size_t header_len, size_t payload_len) noexcept {
  return load_le32(frame) == murmur3_x86_32(frame + header_len, payload_len, 0);
}

}  // namespace

size_t frame_write_header(uint32_t hash, size_t payload_len, uint8_t* out) noexcept {
  store_le<uint32_t>(out, hash);
  return kFrameHashBytes + varint_encode(payload_len, out + kFrameHashBytes);
}

size_t frame_encode(const void* payload, size_t len, uint8_t* out, size_t cap) noexcept {
  const size_t total = frame_size(len);
  if (cap < total) return 0;
  const size_t header = frame_write_header(murmur3_x86_32(payload, len, 0), len, out);
  if (len != 0) std::memcpy(out + header, payload, len);
  return total;
}

const char* to_string(frame_status s) noexcept {
  switch (s) {
    case frame_status::payload:
      return "payload";
    case frame_status::need_more:
      return "need_more";
    case frame_status::bad_hash:
      return "bad_hash: frame checksum mismatch";
    case frame_status::oversize:
      return "oversize: frame length above the message limit";
    case frame_status::bad_varint:
      return "bad_varint: malformed frame length";
    case frame_status::no_memory:
      return "no_memory: the partial-frame buffer could not grow";
  }
  return "unknown";
}

namespace {

// One partial-frame buffer per thread, parked between bursts: release_buffer() leaves a decoder's
// buffer here (capacity up to kDecoderKeepBytes, the largest one seen), and the next frame any
// decoder of the thread must keep in part takes it instead of a trip to malloc. So a connection at
// a frame boundary holds no receive memory, and a burst of cut frames still allocates nothing.
// `spare_gone` (trivially destructible, so readable during and after thread exit) stops use once
// the slot is destroyed.
thread_local bool spare_gone = false;

struct spare_slot {
  std::vector<uint8_t> buffer;
  spare_slot() = default;
  spare_slot(const spare_slot&) = delete;
  spare_slot& operator=(const spare_slot&) = delete;
  ~spare_slot() { spare_gone = true; }
};

std::vector<uint8_t>* thread_spare() noexcept {
  if (spare_gone) return nullptr;
  thread_local spare_slot slot;
  return &slot.buffer;
}

}  // namespace

void frame_decoder::park_buffer() noexcept {
  std::vector<uint8_t>* spare = thread_spare();
  if (spare != nullptr && partial_.capacity() <= kDecoderKeepBytes &&
      partial_.capacity() > spare->capacity()) {
    partial_.clear();
    partial_.swap(*spare);  // the smaller one, if any, is freed below
  }
  std::vector<uint8_t>().swap(partial_);
}

void frame_decoder::take_spare() noexcept {
  std::vector<uint8_t>* spare = thread_spare();
  if (partial_.capacity() == 0 && spare != nullptr) partial_.swap(*spare);
}

void frame_decoder::reset() noexcept {
  if (release_partial_) {
    std::vector<uint8_t>().swap(partial_);  // the last payload points into it: not a spare
  } else {
    park_buffer();
  }
  header_len_ = 0;
  frame_len_ = 0;
  release_partial_ = false;
  error_ = frame_status::payload;
  chunk_ = nullptr;
  chunk_left_ = 0;
  ready_pos_ = 0;
  ready_n_ = 0;
  ready_error_ = false;
  unbatched_left_ = 0;
}

bool frame_decoder::next_batch() noexcept {
  const uint8_t* data[kBatchFrames];
  size_t len[kBatchFrames];
  uint32_t want[kBatchFrames];
  size_t count = 0;
  const uint8_t* p = chunk_;
  size_t n = chunk_left_;
  while (count < kBatchFrames && n > kFrameHashBytes) {
    uint64_t plen = 0;
    size_t vn = 0;
    const uint8_t* v = p + kFrameHashBytes;
    const bool short_ok = n - kFrameHashBytes >= 2 && varint_decode_short(v, &plen, &vn);
    if ((!short_ok && varint_decode(v, n - kFrameHashBytes, &plen, &vn) != varint_status::ok) ||
        plen > max_payload_) {
      break;  // a header error or an incomplete header: the one-frame path reports or keeps it
    }
    const size_t header = kFrameHashBytes + vn;
    if (plen > n - header) break;  // incomplete payload
    const size_t total = header + static_cast<size_t>(plen);
    data[count] = p + header;
    len[count] = static_cast<size_t>(plen);
    want[count] = load_le32(p);
    ++count;
    p += total;
    n -= total;
  }
  if (count == 0) return false;
  size_t payload_bytes = 0;
  for (size_t i = 0; i < count; ++i) payload_bytes += len[i];
  if (payload_bytes / count < batch_min_mean_) {
    // Small frames: one at a time (see frame.h), these and the next ones, without parsing ahead:
    // a parse that is declined again costs a header decode per frame.
    unbatched_left_ = count * kSmallRunBatches;
    return false;
  }
  uint32_t got[kBatchFrames];
  if (count == 1) {
    got[0] = murmur3_x86_32(data[0], len[0], 0);
  } else {
    murmur3_x86_32_batch(data, len, count, 0, got);
  }
  size_t good = 0;
  while (good < count && got[good] == want[good]) {
    ready_[good] = {data[good], len[good]};
    ++good;
  }
  ready_pos_ = 0;
  ready_n_ = good;
  ready_error_ = good < count;
  chunk_ = p;
  chunk_left_ = n;
  return true;
}

void frame_decoder::release_buffer() noexcept {
  if (release_partial_ || !partial_.empty()) return;
  park_buffer();
}

frame_decoder::result frame_decoder::next() {
  if (error_ != frame_status::payload) return {error_, nullptr, 0};
  if (release_partial_) {
    // The previous payload pointed into partial_; the caller is done with it now.
    release_partial_ = false;
    if (partial_.capacity() > kDecoderKeepBytes) {
      std::vector<uint8_t>().swap(partial_);
    } else {
      partial_.clear();
    }
    header_len_ = 0;
    frame_len_ = 0;
  }
  // Whole frames are parsed ahead and verified together (next_batch) unless a recent batch's
  // payloads averaged under batch_min_mean_.
  if (ready_pos_ == ready_n_ && !ready_error_ && partial_.empty() && chunk_left_ != 0) {
    if (unbatched_left_ != 0) {
      --unbatched_left_;
    } else {
      (void)next_batch();
    }
  }
  if (ready_pos_ < ready_n_) {
    const view v = ready_[ready_pos_++];
    return {frame_status::payload, v.data, v.size};
  }
  if (ready_error_) return fail(frame_status::bad_hash);
  if (!partial_.empty()) return next_partial();
  if (chunk_left_ == 0) return {frame_status::need_more, nullptr, 0};

  // One frame: a header error, or a frame cut by the end of the chunk (kept in partial_).
  const uint8_t* p = chunk_;
  const size_t n = chunk_left_;
  if (n > kFrameHashBytes) {
    uint64_t len = 0;
    size_t vn = 0;
    const varint_status st = varint_decode(p + kFrameHashBytes, n - kFrameHashBytes, &len, &vn);
    if (st == varint_status::too_long) return fail(frame_status::bad_varint);
    if (st == varint_status::ok) {
      if (len > max_payload_) return fail(frame_status::oversize);
      const size_t header = kFrameHashBytes + vn;
      const size_t total = header + static_cast<size_t>(len);
      if (total <= n) {
        if (!hash_ok(p, header, len)) return fail(frame_status::bad_hash);
        chunk_ += total;
        chunk_left_ -= total;
        return {frame_status::payload, p + header, static_cast<size_t>(len)};
      }
      // Header known, payload incomplete: keep what arrived. The buffer grows with the bytes
      // actually received, never from the announced length: a peer that sends a 7-byte header
      // and stops must not pin a whole message-limit allocation.
      header_len_ = header;
      frame_len_ = total;
    }
  }
  // Either the header is incomplete (fewer than kFrameMaxHeader bytes left) or the payload is.
  take_spare();
  if (!append(p, n)) return fail(frame_status::no_memory);
  chunk_ += n;
  chunk_left_ = 0;
  return {frame_status::need_more, nullptr, 0};
}

frame_decoder::result frame_decoder::next_partial() {
  // Complete the header one byte at a time: it is at most 14 bytes, and taking more could swallow
  // the start of the following frame.
  while (header_len_ == 0) {
    if (chunk_left_ == 0) return {frame_status::need_more, nullptr, 0};
    if (!append(chunk_, 1)) return fail(frame_status::no_memory);
    ++chunk_;
    --chunk_left_;
    if (partial_.size() <= kFrameHashBytes) continue;
    uint64_t len = 0;
    size_t vn = 0;
    const varint_status st = varint_decode(partial_.data() + kFrameHashBytes,
                                           partial_.size() - kFrameHashBytes, &len, &vn);
    if (st == varint_status::too_long) return fail(frame_status::bad_varint);
    if (st == varint_status::ok) {
      if (len > max_payload_) return fail(frame_status::oversize);
      header_len_ = kFrameHashBytes + vn;
      frame_len_ = header_len_ + static_cast<size_t>(len);
    }
  }
  const size_t take = std::min(frame_len_ - partial_.size(), chunk_left_);
  if (!append(chunk_, take)) return fail(frame_status::no_memory);
  chunk_ += take;
  chunk_left_ -= take;
  if (partial_.size() < frame_len_) return {frame_status::need_more, nullptr, 0};
  const size_t payload_len = frame_len_ - header_len_;
  if (!hash_ok(partial_.data(), header_len_, payload_len)) return fail(frame_status::bad_hash);
  release_partial_ = true;
  return {frame_status::payload, partial_.data() + header_len_, payload_len};
}

bool frame_decoder::append(const uint8_t* p, size_t n) noexcept {
  const size_t at = partial_.size();
  if (!detail::try_resize(&partial_, at + n)) return false;
  if (n != 0) std::memcpy(partial_.data() + at, p, n);
  return true;
}

}  // namespace uvbus
