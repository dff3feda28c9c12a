// Link compression: the codecs (liblz4, libzstd), the compressed block format and a compressor
// that keeps the codecs' contexts for reuse. Format and measurements in docs/compression.md.
//
//   block    = codec raw_size data
//   codec    = 1 byte: 1 lz4, 2 zstd (0, none, is never a block: the raw form is sent as it is)
//   raw_size = varint (core/varint.h) of the decompressed size, 1..limit
//   data     = lz4: one LZ4 block (LZ4_compress_*, no frame); zstd: one zstd frame (its content
//              size field, if present, must equal raw_size; ours leave it out)
//
// compress() writes a block only when it saves at least compress_min_saving(n) bytes; otherwise it
// returns 0 and the caller sends its raw bytes (a message never grows). Telling a block from a raw
// message is the caller's business (a flag in its own header): a block is not self-delimiting from
// raw data.
//
// decompress() never writes or allocates beyond its limit: raw_size is checked against the limit
// before any data is touched, the codecs decode into exactly raw_size bytes of the caller's buffer
// (LZ4_decompress_safe, ZSTD_decompressDCtx bounded by the destination) and anything that would
// produce more or less than raw_size is refused. A 1 KiB block cannot make us inflate 1 GiB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/varint.h"
#include "uvbus/error.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace uvbus {

enum class codec : uint8_t { none = 0, lz4 = 1, zstd = 2 };

// "none", "lz4", "zstd"; "?" for a value outside the enum.
const char* to_string(codec c) noexcept;
// Parses "none", "lz4" or "zstd"; false (and *out unchanged) for anything else.
[[nodiscard]] bool parse_codec(std::string_view s, codec* out) noexcept;

// Levels per codec; compress() clamps a level into [min, max].
//   lz4:  0 default (LZ4_compress_fast, acceleration 1); -N acceleration N (faster, larger);
//         1..12 LZ4HC at that level (slower, smaller)
//   zstd: 0 default (ZSTD_CLEVEL_DEFAULT, 3); ZSTD_minCLevel() (negative: fast) .. ZSTD_maxCLevel()
//   none: 0 only
struct codec_levels {
  int min;
  int max;
};
[[nodiscard]] codec_levels levels_of(codec c) noexcept;

// Largest block header: codec byte + a 10-byte varint.
inline constexpr size_t kBlockMaxHeaderBytes = 1 + kVarintMaxBytes;
// Inputs shorter than this are never compressed (the header and the codecs' own framing would eat
// any saving).
inline constexpr size_t kCompressMinInput = 64;
// The threshold the issue suggests for the bus: messages (or merged batches) from this size up are
// worth compressing. compress() itself applies only kCompressMinInput; the caller applies its own.
inline constexpr size_t kCompressDefaultThreshold = 512;

// A block is written only if it is at least this much smaller than its input: 8 bytes and 1/32 of
// the input, so that a barely compressible message does not pay decompression for nothing.
[[nodiscard]] constexpr size_t compress_min_saving(size_t n) noexcept {
  return n / 32 > 8 ? n / 32 : 8;
}

struct block_header {
  codec c = codec::none;
  size_t raw_size = 0;     // the decompressed size the block announces
  size_t header_size = 0;  // bytes of codec + varint; data starts there
};

// Reads a block's header. ok, or: protocol_error (empty, truncated, codec byte not lz4/zstd,
// raw_size 0), bad_varint (a malformed raw_size). Does not check raw_size against any limit.
[[nodiscard]] errc parse_block_header(const void* in, size_t n, block_header* out) noexcept;

struct decompress_result {
  errc code = errc::ok;
  size_t size = 0;  // decompressed bytes written to out when code is ok
};

// Holds one context per codec (created on first use and kept), so that compressing or
// decompressing a message allocates nothing once warm. Not thread-safe: one per loop thread.
class compressor {
 public:
  compressor() noexcept;
  ~compressor();
  compressor(const compressor&) = delete;
  compressor& operator=(const compressor&) = delete;

  // Compresses [in, in + n) into one block in [out, out + cap). Returns the block size, or 0 when
  // the caller should keep the raw form: c is none, n < kCompressMinInput, the block would not save
  // compress_min_saving(n) bytes, it does not fit in cap, or the codec failed (last_error() then
  // says why). The returned size is always <= n - compress_min_saving(n). out must not overlap in.
  // The codecs' bounded-output modes need some slack: a cap a few bytes above the block's size
  // may still give 0; cap >= n always suffices.
  [[nodiscard]] size_t compress(codec c, int level, const void* in, size_t n, void* out,
                                size_t cap) noexcept;

  // Decompresses the block [in, in + n), which must use codec `expected` (the link's), into
  // [out, out + limit). Errors (last_error() has the detail):
  //   invalid_argument  expected is none
  //   protocol_error    malformed header, another codec, corrupt data, or data that decodes to
  //                     more or fewer bytes than raw_size
  //   bad_varint        malformed raw_size
  //   oversize          raw_size above limit (refused before any data is decoded)
  //   no_memory         the codec context could not be created (our own failure, not the
  //                     block's: the bus closes the link with no_memory, not protocol_error)
  // Nothing is written past out + min(raw_size, limit); nothing is allocated but the context.
  [[nodiscard]] decompress_result decompress(codec expected, const void* in, size_t n, void* out,
                                             size_t limit) noexcept;

  // The last failure, with a detail ("zstd frame content size 1073741824 != raw_size 65536").
  // Building it allocates; the failing call itself does not.
  [[nodiscard]] error_info last_error() const;

  // Bytes held by the codec contexts (ZSTD_sizeof_CCtx/DCtx and the LZ4 states): what a
  // compressor costs, and proof that a hostile block did not make it grow.
  [[nodiscard]] size_t memory_bytes() const noexcept;

 private:
  size_t compress_lz4(int level, const uint8_t* in, size_t n, uint8_t* out, size_t cap) noexcept;
  size_t compress_zstd(int level, const uint8_t* in, size_t n, uint8_t* out, size_t cap) noexcept;
  errc decompress_zstd(const uint8_t* in, size_t n, uint8_t* out, size_t raw_size) noexcept;
  errc fail(errc e, const char* fmt, ...) noexcept __attribute__((format(printf, 3, 4)));

  ZSTD_CCtx_s* zc_ = nullptr;
  ZSTD_DCtx_s* zd_ = nullptr;
  int zc_level_ = 0;  // the level zc_ is set to (0: not yet set)
  std::unique_ptr<uint64_t[]> lz4_state_;
  size_t lz4_state_bytes_ = 0;
  std::unique_ptr<uint64_t[]> lz4hc_state_;
  size_t lz4hc_state_bytes_ = 0;
  errc last_code_ = errc::ok;
  char detail_[160] = {};
};

namespace detail {
// Tests only: the next n zstd decompression contexts that any compressor creates fail as if memory
// had run out (decompress() then returns no_memory). Process-wide.
void fail_next_zstd_dctx(int n) noexcept;
}  // namespace detail

}  // namespace uvbus
