// crc32c: the portable slicing-by-8 kernel (its tables built at compile time) and the choice of
// kernel (CPU features, UVBUS_CRC32C, crc32c_use) and of the SSE4.2 kernel's variant (timed).
#include "core/crc32c.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/endian.h"
#include "core/kernel_timing.h"

namespace uvbus {

#if defined(UVBUS_CRC32C_HW)
namespace crc32c_detail {
// The SSE4.2 kernel (crc32c_sse42.cpp): takes and returns the CRC register (the complement of the
// CRC value), as table_update below does. Two variants, which differ for inputs of 256..1791 B:
// folded with carry-less multiplies, or in three crc32 lanes.
uint32_t sse42_update(uint32_t reg, const uint8_t* p, size_t len) noexcept;
uint32_t sse42_lanes_update(uint32_t reg, const uint8_t* p, size_t len) noexcept;
}  // namespace crc32c_detail
#endif

namespace {

constexpr uint32_t kPoly = 0x82F63B78U;  // 0x1EDC6F41 bit-reversed

// tables[k][b]: the register after feeding byte b followed by k zero bytes into a zero register.
// Slicing-by-8 folds eight input bytes per step with one lookup per byte.
using crc_tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr crc_tables make_tables() noexcept {
  crc_tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int i = 0; i < 8; ++i) r = (r >> 1) ^ ((r & 1U) != 0 ? kPoly : 0U);
    t[0][b] = r;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffU];
  }
  return t;
}

constexpr crc_tables kTables = make_tables();

bool cpu_has(crc32c_impl impl) noexcept {
#if defined(UVBUS_CRC32C_HW)
  if (impl == crc32c_impl::sse42) {
    return __builtin_cpu_supports("sse4.2") != 0 && __builtin_cpu_supports("pclmul") != 0;
  }
  return true;
#else
  return impl != crc32c_impl::sse42;
#endif
}

crc32c_impl best() noexcept {
  return cpu_has(crc32c_impl::sse42) ? crc32c_impl::sse42 : crc32c_impl::table;
}

crc32c_impl from_env() noexcept {
  const char* v = std::getenv("UVBUS_CRC32C");  // NOLINT(concurrency-mt-unsafe): read once
  if (v != nullptr) {
    for (const crc32c_impl i : {crc32c_impl::table, crc32c_impl::sse42}) {
      if (std::strcmp(v, to_string(i)) == 0 && cpu_has(i)) return i;
    }
  }
  return best();
}

// The portable kernel: takes and returns the CRC register.
uint32_t table_update(uint32_t reg, const uint8_t* p, size_t len) noexcept {
  const crc_tables& t = kTables;
  while (len >= 8) {
    const uint32_t lo = load_le32(p) ^ reg;
    const uint32_t hi = load_le32(p + 4);
    reg = t[7][lo & 0xffU] ^ t[6][(lo >> 8) & 0xffU] ^ t[5][(lo >> 16) & 0xffU] ^ t[4][lo >> 24] ^
          t[3][hi & 0xffU] ^ t[2][(hi >> 8) & 0xffU] ^ t[1][(hi >> 16) & 0xffU] ^ t[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len-- != 0) reg = (reg >> 8) ^ t[0][(reg ^ *p++) & 0xffU];
  return reg;
}

using kernel_fn = uint32_t (*)(uint32_t, const uint8_t*, size_t) noexcept;

// The SSE4.2 kernel's variant: -1 until the first use times them, then 0 (fold) or 1 (lanes).
std::atomic<int> g_medium{-1};

#if defined(UVBUS_CRC32C_HW)
// The timed CRCs' results go somewhere (atomic: threads that resolve the kernel at once time it
// side by side).
std::atomic<uint32_t> g_timing_sink{0};

// 32 CRCs each of inputs of 300, 520 and 1000 B with one variant, each continuing the last (one
// dependent chain: the latency a record's checksum waits for).
void chained_crcs(kernel_fn k, const uint8_t* data) noexcept {
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    for (const size_t n : {300, 520, 1000}) r = k(r, data, n);
  }
  g_timing_sink.store(r, std::memory_order_relaxed);
}

// Fold where the CPU's crc32 is slow (AMD Zen 1 starts one step every 3 cycles: the fold was 1.8x
// faster at 256 B there), lanes where it starts one a cycle and the fold's reduction is the longer
// path. The lanes must win by a twentieth: closer than that either is fine. About 0.25 ms, once.
int time_medium() noexcept {
  alignas(64) uint8_t data[1024];
  for (size_t i = 0; i < sizeof data; ++i) data[i] = static_cast<uint8_t>(i * 131U + 7U);
  const detail::kernel_times t =
      detail::time_alternately([&] { chained_crcs(crc32c_detail::sse42_update, data); },
                               [&] { chained_crcs(crc32c_detail::sse42_lanes_update, data); });
  return t.b * 20 <= t.a * 19 ? 1 : 0;
}
#endif

kernel_fn kernel_of(crc32c_impl impl) noexcept {
#if defined(UVBUS_CRC32C_HW)
  if (impl == crc32c_impl::sse42) {
    int v = g_medium.load(std::memory_order_relaxed);
    if (v < 0) {
      v = time_medium();
      g_medium.store(v, std::memory_order_relaxed);
    }
    return v == 1 ? crc32c_detail::sse42_lanes_update : crc32c_detail::sse42_update;
  }
#endif
  (void)impl;
  return table_update;
}

// The kernel in use and its name; null / auto_ until the first call resolves them.
std::atomic<kernel_fn> g_kernel{nullptr};
std::atomic<crc32c_impl> g_active{crc32c_impl::auto_};

kernel_fn resolve() noexcept {
  crc32c_impl a = g_active.load(std::memory_order_relaxed);
  if (a == crc32c_impl::auto_) {
    a = from_env();
    crc32c_impl expected = crc32c_impl::auto_;
    if (!g_active.compare_exchange_strong(expected, a, std::memory_order_relaxed)) a = expected;
  }
  kernel_fn k = kernel_of(a);
  g_kernel.store(k, std::memory_order_relaxed);
  return k;
}

}  // namespace

uint32_t crc32c(const void* data, size_t len, uint32_t crc) noexcept {
  kernel_fn k = g_kernel.load(std::memory_order_relaxed);
  if (k == nullptr) k = resolve();
  return ~k(~crc, static_cast<const uint8_t*>(data), len);
}

const char* to_string(crc32c_impl impl) noexcept {
  switch (impl) {
    case crc32c_impl::auto_:
      return "auto";
    case crc32c_impl::table:
      return "table";
    case crc32c_impl::sse42:
      return "sse42";
  }
  return "unknown";
}

bool crc32c_supported(crc32c_impl impl) noexcept {
  return cpu_has(impl);
}

bool crc32c_use(crc32c_impl impl) noexcept {
  if (!cpu_has(impl)) return false;
  const crc32c_impl a = impl == crc32c_impl::auto_ ? best() : impl;
  g_active.store(a, std::memory_order_relaxed);
  g_kernel.store(kernel_of(a), std::memory_order_relaxed);
  return true;
}

crc32c_impl crc32c_active() noexcept {
  if (g_kernel.load(std::memory_order_relaxed) == nullptr) (void)resolve();
  return g_active.load(std::memory_order_relaxed);
}

namespace crc32c_detail {

bool sse42_medium_use(int variant) noexcept {
#if defined(UVBUS_CRC32C_HW)
  if (!cpu_has(crc32c_impl::sse42) || variant < -1 || variant > 1) return false;
  g_medium.store(variant == -1 ? time_medium() : variant, std::memory_order_relaxed);
  if (g_active.load(std::memory_order_relaxed) == crc32c_impl::sse42) {
    g_kernel.store(kernel_of(crc32c_impl::sse42), std::memory_order_relaxed);
  }
  return true;
#else
  (void)variant;
  return false;
#endif
}

int sse42_medium_active() noexcept {
  if (!cpu_has(crc32c_impl::sse42)) return -1;
  (void)kernel_of(crc32c_impl::sse42);  // resolves the timed choice
  return g_medium.load(std::memory_order_relaxed);
}

}  // namespace crc32c_detail

}  // namespace uvbus
