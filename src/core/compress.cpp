// Link compression: the block format and the lz4 / zstd compressor (see compress.h).
#include "core/compress.h"

#include <lz4.h>
#include <lz4hc.h>
#include <zstd.h>

#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <new>

#include "core/endian.h"

namespace uvbus {

namespace {

// LZ4's API takes int sizes.
constexpr size_t kLz4MaxInput = LZ4_MAX_INPUT_SIZE;
// zstd's parameters, fixed whatever the level and message size: a 128 KiB window (one zstd block;
// messages are at most a few hundred KiB), and match tables sized for it (zstd's own choice for
// inputs up to 128 KiB at levels 3 to 9). They bound a context to about 1.3 MB at every level
// (zstd's defaults for an unknown size reach 13 MB at level 9).
constexpr int kZstdWindowLog = 17;
constexpr int kZstdHashLog = 15;
constexpr int kZstdChainLog = 16;

int clamp(int v, codec_levels r) noexcept {
  return v < r.min ? r.min : (v > r.max ? r.max : v);
}

// A zeroed state of `bytes` bytes, 8-byte aligned (as LZ4 requires); null if out of memory.
std::unique_ptr<uint64_t[]> make_state(int bytes) noexcept {
  const size_t words = (static_cast<size_t>(bytes) + 7) / 8;
  return std::unique_ptr<uint64_t[]>(new (std::nothrow) uint64_t[words]());
}

// detail::fail_next_zstd_dctx (tests only): failures still to inject.
std::atomic<int> g_fail_dctx{0};

ZSTD_DCtx* create_dctx() noexcept {
  int left = g_fail_dctx.load(std::memory_order_relaxed);
  while (left > 0) {
    if (g_fail_dctx.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
      return nullptr;
    }
  }
  return ZSTD_createDCtx();
}

}  // namespace

void detail::fail_next_zstd_dctx(int n) noexcept {
  g_fail_dctx.store(n, std::memory_order_relaxed);
}

const char* to_string(codec c) noexcept {
  switch (c) {
    case codec::none:
      return "none";
    case codec::lz4:
      return "lz4";
    case codec::zstd:
      return "zstd";
  }
  return "?";
}

bool parse_codec(std::string_view s, codec* out) noexcept {
  for (codec c : {codec::none, codec::lz4, codec::zstd}) {
    if (s == to_string(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

codec_levels levels_of(codec c) noexcept {
  switch (c) {
    case codec::lz4:
      return {-65537, LZ4HC_CLEVEL_MAX};
    case codec::zstd:
      return {ZSTD_minCLevel(), ZSTD_maxCLevel()};
    case codec::none:
      break;
  }
  return {0, 0};
}

errc parse_block_header(const void* in, size_t n, block_header* out) noexcept {
  const auto* p = static_cast<const uint8_t*>(in);
  if (n < 2) return errc::protocol_error;
  if (p[0] != static_cast<uint8_t>(codec::lz4) && p[0] != static_cast<uint8_t>(codec::zstd)) {
    return errc::protocol_error;
  }
  uint64_t raw = 0;
  size_t used = 0;
  const varint_status st = varint_decode(p + 1, n - 1, &raw, &used);
  if (st == varint_status::truncated) return errc::protocol_error;
  if (st != varint_status::ok) return errc::bad_varint;
  if (raw == 0 || raw > SIZE_MAX) return errc::protocol_error;
  out->c = static_cast<codec>(p[0]);
  out->raw_size = static_cast<size_t>(raw);
  out->header_size = 1 + used;
  return errc::ok;
}

compressor::compressor() noexcept = default;

compressor::~compressor() {
  ZSTD_freeCCtx(zc_);
  ZSTD_freeDCtx(zd_);
}

errc compressor::fail(errc e, const char* fmt, ...) noexcept {
  last_code_ = e;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(detail_, sizeof detail_, fmt, ap);
  va_end(ap);
  return e;
}

error_info compressor::last_error() const {
  return error_info{last_code_, detail_};
}

size_t compressor::memory_bytes() const noexcept {
  return ZSTD_sizeof_CCtx(zc_) + ZSTD_sizeof_DCtx(zd_) + lz4_state_bytes_ + lz4hc_state_bytes_;
}

size_t compressor::compress(codec c, int level, const void* in, size_t n, void* out,
                            size_t cap) noexcept {
  if ((c != codec::lz4 && c != codec::zstd) || n < kCompressMinInput) return 0;
  // The block may use at most n - saving bytes, and at most cap.
  size_t budget = n - compress_min_saving(n);
  if (cap < budget) budget = cap;
  const size_t header = 1 + varint_size(n);
  if (budget <= header) return 0;
  auto* o = static_cast<uint8_t*>(out);
  const auto* i = static_cast<const uint8_t*>(in);
  const size_t data =
      c == codec::lz4
          ? compress_lz4(clamp(level, levels_of(c)), i, n, o + header, budget - header)
          : compress_zstd(clamp(level, levels_of(c)), i, n, o + header, budget - header);
  if (data == 0) return 0;
  o[0] = static_cast<uint8_t>(c);
  varint_encode(n, o + 1);
  return header + data;
}

// Returns the data bytes written, 0 if they did not fit in cap (or on failure).
size_t compressor::compress_lz4(int level, const uint8_t* in, size_t n, uint8_t* out,
                                size_t cap) noexcept {
  if (n > kLz4MaxInput) return 0;
  const int dst_cap = cap > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(cap);
  const auto* src = reinterpret_cast<const char*>(in);
  auto* dst = reinterpret_cast<char*>(out);
  if (level > 0) {
    if (!lz4hc_state_) {
      lz4hc_state_ = make_state(LZ4_sizeofStateHC());
      if (!lz4hc_state_) {
        fail(errc::no_memory, "lz4hc state of %d bytes", LZ4_sizeofStateHC());
        return 0;
      }
      lz4hc_state_bytes_ = static_cast<size_t>(LZ4_sizeofStateHC());
    }
    const int r = LZ4_compress_HC_extStateHC(lz4hc_state_.get(), src, dst, static_cast<int>(n),
                                             dst_cap, level);
    return r > 0 ? static_cast<size_t>(r) : 0;
  }
  if (!lz4_state_) {
    lz4_state_ = make_state(LZ4_sizeofState());
    if (!lz4_state_) {
      fail(errc::no_memory, "lz4 state of %d bytes", LZ4_sizeofState());
      return 0;
    }
    lz4_state_bytes_ = static_cast<size_t>(LZ4_sizeofState());
  }
  const int accel = level == 0 ? 1 : -level;
  const int r =
      LZ4_compress_fast_extState(lz4_state_.get(), src, dst, static_cast<int>(n), dst_cap, accel);
  return r > 0 ? static_cast<size_t>(r) : 0;
}

size_t compressor::compress_zstd(int level, const uint8_t* in, size_t n, uint8_t* out,
                                 size_t cap) noexcept {
  if (level == 0) level = ZSTD_CLEVEL_DEFAULT;
  if (zc_ == nullptr) {
    zc_ = ZSTD_createCCtx();
    if (zc_ == nullptr) {
      fail(errc::no_memory, "ZSTD_createCCtx");
      return 0;
    }
    // Fixed parameters whatever the message size, so that the context never reallocates, and the
    // frame's content size left out (raw_size in the block header says it): with a size known up
    // front zstd sizes its tables per message and reallocates them as sizes vary (measured: every
    // 40th message or so). The transport checksums already; there is no dictionary.
    ZSTD_CCtx_setParameter(zc_, ZSTD_c_windowLog, kZstdWindowLog);
    ZSTD_CCtx_setParameter(zc_, ZSTD_c_hashLog, kZstdHashLog);
    ZSTD_CCtx_setParameter(zc_, ZSTD_c_chainLog, kZstdChainLog);
    ZSTD_CCtx_setParameter(zc_, ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(zc_, ZSTD_c_dictIDFlag, 0);
  }
  if (level != zc_level_) {
    const size_t r = ZSTD_CCtx_setParameter(zc_, ZSTD_c_compressionLevel, level);
    if (ZSTD_isError(r)) {
      fail(errc::invalid_argument, "zstd level %d: %s", level, ZSTD_getErrorName(r));
      return 0;
    }
    zc_level_ = level;
  }
  // continue then end: ending in the first call would tell zstd the size (see above).
  ZSTD_inBuffer src{in, n, 0};
  ZSTD_outBuffer dst{out, cap, 0};
  size_t r = ZSTD_compressStream2(zc_, &dst, &src, ZSTD_e_continue);
  if (!ZSTD_isError(r)) r = ZSTD_compressStream2(zc_, &dst, &src, ZSTD_e_end);
  if (ZSTD_isError(r) || r != 0) {
    // r > 0: the frame does not fit in cap (the ordinary "does not save enough").
    ZSTD_CCtx_reset(zc_, ZSTD_reset_session_only);
    if (ZSTD_isError(r)) fail(errc::io_error, "ZSTD_compressStream2: %s", ZSTD_getErrorName(r));
    return 0;
  }
  return dst.pos;
}

decompress_result compressor::decompress(codec expected, const void* in, size_t n, void* out,
                                         size_t limit) noexcept {
  if (expected == codec::none) {
    return {fail(errc::invalid_argument, "decompress: the link's codec is none"), 0};
  }
  block_header h;
  const errc he = parse_block_header(in, n, &h);
  if (he != errc::ok) {
    return {fail(he, "compressed block of %zu bytes: malformed header (codec byte %d)", n,
                 n == 0 ? -1 : static_cast<const uint8_t*>(in)[0]),
            0};
  }
  if (h.c != expected) {
    return {fail(errc::protocol_error, "block codec %s on a %s link", to_string(h.c),
                 to_string(expected)),
            0};
  }
  if (h.raw_size > limit) {
    return {fail(errc::oversize, "%s block announces %zu bytes, limit %zu", to_string(h.c),
                 h.raw_size, limit),
            0};
  }
  const auto* data = static_cast<const uint8_t*>(in) + h.header_size;
  const size_t len = n - h.header_size;
  auto* dst = static_cast<uint8_t*>(out);
  if (h.c == codec::zstd) {
    const errc e = decompress_zstd(data, len, dst, h.raw_size);
    return {e, e == errc::ok ? h.raw_size : 0};
  }
  if (len > static_cast<size_t>(INT_MAX) || h.raw_size > kLz4MaxInput) {
    return {fail(errc::protocol_error, "lz4 block too large for LZ4 (%zu -> %zu bytes)", len,
                 h.raw_size),
            0};
  }
  // The capacity is raw_size: LZ4_decompress_safe fails rather than write past it.
  const int r =
      LZ4_decompress_safe(reinterpret_cast<const char*>(data), reinterpret_cast<char*>(dst),
                          static_cast<int>(len), static_cast<int>(h.raw_size));
  if (r < 0 || static_cast<size_t>(r) != h.raw_size) {
    return {fail(errc::protocol_error, "lz4 block corrupt or not %zu bytes (LZ4 returned %d)",
                 h.raw_size, r),
            0};
  }
  return {errc::ok, h.raw_size};
}

errc compressor::decompress_zstd(const uint8_t* in, size_t n, uint8_t* out,
                                 size_t raw_size) noexcept {
  // The current frame format only: libzstd may also decode the legacy formats v0.5 to v0.7 (Debian
  // builds it so), through old decoders that allocate a context of about 150 KB per call. No
  // encoder of ours writes them.
  const uint32_t magic = n < 4 ? 0 : load_le<uint32_t>(in);
  if (magic != ZSTD_MAGICNUMBER) {
    return fail(errc::protocol_error, "zstd block of %zu bytes: not a zstd frame (magic 0x%08x)", n,
                magic);
  }
  // The frame's own content size, when present, must agree with raw_size: a frame claiming more
  // is refused before decoding. One frame only (ZSTD_findFrameCompressedSize covers it all).
  const unsigned long long fcs = ZSTD_getFrameContentSize(in, n);
  if (fcs == ZSTD_CONTENTSIZE_ERROR) {
    return fail(errc::protocol_error, "zstd block of %zu bytes: not a zstd frame", n);
  }
  if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != raw_size) {
    return fail(errc::protocol_error, "zstd frame content size %llu != raw_size %zu", fcs,
                raw_size);
  }
  const size_t frame = ZSTD_findFrameCompressedSize(in, n);
  if (ZSTD_isError(frame) || frame != n) {
    return fail(errc::protocol_error, "zstd block of %zu bytes: frame is %s", n,
                ZSTD_isError(frame) ? ZSTD_getErrorName(frame) : "followed by trailing bytes");
  }
  if (zd_ == nullptr) {
    zd_ = create_dctx();
    if (zd_ == nullptr) {
      return fail(errc::no_memory, "zstd block (raw_size %zu): no memory for a ZSTD_DCtx",
                  raw_size);
    }
  }
  // Single-pass into the caller's buffer: zstd decodes straight into [out, out + raw_size) and
  // fails with dstSize_tooSmall rather than write past it; it needs no window buffer.
  const size_t r = ZSTD_decompressDCtx(zd_, out, raw_size, in, n);
  if (ZSTD_isError(r)) {
    ZSTD_DCtx_reset(zd_, ZSTD_reset_session_only);
    return fail(errc::protocol_error, "zstd block (raw_size %zu): %s", raw_size,
                ZSTD_getErrorName(r));
  }
  if (r != raw_size) {
    return fail(errc::protocol_error, "zstd frame decodes to %zu bytes, raw_size %zu", r, raw_size);
  }
  return errc::ok;
}

}  // namespace uvbus
