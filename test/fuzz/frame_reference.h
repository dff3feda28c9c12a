// A one-shot reference decoder for the stream frame format, written from the format in
// docs/internals.md and kept deliberately simple: the fuzz targets compare the real (incremental)
// decoders against it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/frame.h"
#include "core/murmur3.h"
#include "core/varint.h"

namespace uvbus::fuzz {

struct frame_ref {
  size_t offset;  // payload offset in the stream
  size_t size;
};

// Reference decoder over the whole stream at once. Returns the final state: need_more when the
// stream ends at or inside a frame that is still plausible, or the error that stops it.
inline uvbus::frame_status reference_decode(const uint8_t* s, size_t n, size_t limit,
                                            std::vector<frame_ref>* out) {
  size_t pos = 0;
  for (;;) {
    if (n - pos <= uvbus::kFrameHashBytes) return uvbus::frame_status::need_more;
    uint64_t len = 0;
    size_t vn = 0;
    switch (uvbus::varint_decode(s + pos + 4, n - pos - 4, &len, &vn)) {
      case uvbus::varint_status::too_long:
        return uvbus::frame_status::bad_varint;
      case uvbus::varint_status::truncated:
        return uvbus::frame_status::need_more;
      case uvbus::varint_status::ok:
        break;
    }
    if (len > limit) return uvbus::frame_status::oversize;
    const size_t header = 4 + vn;
    if (n - pos - header < len) return uvbus::frame_status::need_more;
    const uint32_t want = static_cast<uint32_t>(s[pos]) | static_cast<uint32_t>(s[pos + 1]) << 8 |
                          static_cast<uint32_t>(s[pos + 2]) << 16 |
                          static_cast<uint32_t>(s[pos + 3]) << 24;
    if (uvbus::murmur3_x86_32(s + pos + header, len, 0) != want)
      return uvbus::frame_status::bad_hash;
    out->push_back({pos + header, static_cast<size_t>(len)});
    pos += header + len;
  }
}

}  // namespace uvbus::fuzz
