// Internal interface between murmur3_batch.cpp (dispatch, scalar) and the SIMD kernels
// murmur3_avx2.cpp / murmur3_avx512.cpp, which are compiled with their own -m flags.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/murmur3_batch.h"

namespace uvbus::murmur3_batch_detail {

// Lengths at or above this go to the scalar function (the kernels keep lengths in 32-bit lanes).
inline constexpr size_t kMaxSimdLen = size_t{1} << 30;

// Continues murmur3_x86_32 of p[0, len) from the hash state h reached after the first `done`
// bytes (a multiple of 4, every one a full block) and returns the final hash. Scalar code,
// compiled without SIMD flags so that the kernels may call it on any CPU.
uint32_t finish_scalar(uint32_t h, const uint8_t* p, size_t len, size_t done) noexcept;

// The scalar kernel, for any n: frames of kTwoChainMinLen bytes or more are hashed two at a time,
// their block loops interleaved (the reference's block step is one dependency chain of about four
// cycles, which leaves the multiplier half idle), a frame's chain taken over by the next long frame
// as soon as it ends; shorter frames, and a last long one left alone, take the single-chain code.
inline constexpr size_t kTwoChainMinLen = 128;
void two_chains(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                uint32_t* out) noexcept;

// Kernels: n <= 16 buffers (AVX2 on two ymm, AVX-512 on zmm) or n <= 8 (AVX-512VL on ymm), every
// len below kMaxSimdLen.
void batch_avx2(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                uint32_t* out) noexcept;
void batch_avx512(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                  uint32_t* out) noexcept;
void batch_avx512_8(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                    uint32_t* out) noexcept;

// The automatic choice between AVX2 and the scalar hash from the fastest timings of each on the
// same mixed-size batch: AVX2 only when it takes at most nine tenths of the scalar time.
murmur3_impl pick_avx2_or_scalar(int64_t scalar_ns, int64_t avx2_ns) noexcept;

}  // namespace uvbus::murmur3_batch_detail
