// Batch MurmurHash3_x86_32: hashes several independent buffers at once in SIMD lanes (AVX2: 8,
// AVX-512: 16), chosen at run time by CPU (and, for AVX2, a measurement), with a scalar fallback
// (two frames' dependency chains interleaved).
// Output is bit-identical to murmur3_x86_32 (core/murmur3.h) for every input. Algorithm and
// figures: docs/core.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace uvbus {

// out[i] = murmur3_x86_32(data[i], len[i], seed) for i in [0, n). data[i] may be null when
// len[i] == 0. No allocation; any n (processed in groups of the kernel's lane count).
void murmur3_x86_32_batch(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                          uint32_t* out) noexcept;

// The kernels. auto_ picks AVX-512 where the CPU (and OS) has it; else AVX2 where the CPU has it
// and a measurement at the first use (about 0.1 ms, once per process) finds it at least a tenth
// faster than the scalar hash on 16 frames of 8-128 B; else scalar.
enum class murmur3_impl { auto_, scalar, avx2, avx512 };

const char* to_string(murmur3_impl impl) noexcept;

// Whether this build and this CPU can run impl (auto_ and scalar always can).
[[nodiscard]] bool murmur3_batch_supported(murmur3_impl impl) noexcept;

// Forces a kernel (tests, benchmarks); auto_ returns to the CPU's choice. Returns false, changing
// nothing, when impl is not supported. Process-wide; not meant to race with hashing threads.
// Without a call, the environment variable UVBUS_MURMUR3=scalar|avx2|avx512 is honoured (an
// unsupported or unknown value means auto).
bool murmur3_batch_use(murmur3_impl impl) noexcept;

// The kernel murmur3_x86_32_batch runs now (never auto_).
[[nodiscard]] murmur3_impl murmur3_batch_active() noexcept;

// The mean payload size below which hashing frames one at a time, as they come, costs a stream
// sender or receiver less than gathering them into batches, for the kernel active now: with
// AVX-512 batches pay for every size (0); with AVX2 from a mean of 24 B on (kBatchMinMeanAvx2: the
// scalar hash of 8 or 16 B is faster than AVX2's transposes); with the scalar kernel, which hashes
// two long frames at a time, from 256 B on (kBatchMinMeanScalar: below that, frames of random
// lengths cost it a mispredicted branch or two each, more than the second chain saves). Measured
// in docs/core.md, "Frame checksums in batches".
inline constexpr size_t kBatchMinMeanAvx2 = 24;
inline constexpr size_t kBatchMinMeanScalar = 256;
[[nodiscard]] size_t murmur3_batch_min_mean_bytes() noexcept;

}  // namespace uvbus
