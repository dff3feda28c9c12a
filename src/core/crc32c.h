// CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected, initial value and final xor ~0: the CRC
// of iSCSI, ext4 and SCTP), the shared-memory ring's record checksum from layout version 4 on.
// Two kernels, chosen at run time by CPU: the SSE4.2 crc32 instruction beside carry-less multiply
// folding (PCLMULQDQ), the two units working on separate parts of a long input at once, and a
// portable slicing-by-8 table. Both give the same value for every input. Figures and the
// reasons: docs/core.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace uvbus {

// The CRC of data[0, len) continued from `crc`, the CRC of what came before it (0 for nothing):
// crc32c(b, m, crc32c(a, n)) is the CRC of a's n bytes followed by b's m bytes. data may be null
// when len == 0. Thread-safe; no allocation. The first call in a process on a CPU with the sse42
// kernel takes about 0.25 ms more: it times the kernel's two variants (crc32c_detail below).
[[nodiscard]] uint32_t crc32c(const void* data, size_t len, uint32_t crc = 0) noexcept;

// The kernels. auto_ picks the fastest this CPU supports.
enum class crc32c_impl { auto_, table, sse42 };

const char* to_string(crc32c_impl impl) noexcept;

// Whether this build and this CPU can run impl (auto_ and table always can).
[[nodiscard]] bool crc32c_supported(crc32c_impl impl) noexcept;

// Forces a kernel (tests, benchmarks); auto_ returns to the CPU's choice. Returns false, changing
// nothing, when impl is not supported. Process-wide; not meant to race with hashing threads.
// Without a call, the environment variable UVBUS_CRC32C=table|sse42 is honoured (an unsupported
// or unknown value means auto).
bool crc32c_use(crc32c_impl impl) noexcept;

// The kernel crc32c runs now (never auto_).
[[nodiscard]] crc32c_impl crc32c_active() noexcept;

namespace crc32c_detail {
// The sse42 kernel takes inputs of 256..1791 B in one of two ways: folded with carry-less
// multiplies (0) or in three crc32 lanes (1), whichever its first use timed faster on this CPU
// (docs/core.md). Tests and benchmarks force one; -1 times them again. Returns false, changing
// nothing, without the sse42 kernel or for another value. Not meant to race with hashing threads.
bool sse42_medium_use(int variant) noexcept;
// The variant in use (0 or 1; -1 without the sse42 kernel).
[[nodiscard]] int sse42_medium_active() noexcept;
}  // namespace crc32c_detail

}  // namespace uvbus
