// murmur3_x86_32_batch: kernel dispatch (CPU features, a measurement where AVX2 may not pay,
// UVBUS_MURMUR3, murmur3_batch_use), the scalar path (two frames' chains interleaved) and the
// scalar continuation the SIMD kernels finish long buffers with.
#include "core/murmur3_batch.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "core/endian.h"
#include "core/kernel_timing.h"
#include "core/murmur3.h"
#include "core/murmur3_batch_impl.h"

namespace uvbus {

namespace murmur3_batch_detail {

namespace {

constexpr uint32_t c1 = 0xcc9e2d51U;
constexpr uint32_t c2 = 0x1b873593U;

// The reference's block step: the 4-byte block at p mixed into h.
inline uint32_t block(uint32_t h, const uint8_t* p) noexcept {
  uint32_t k = load_le32(p);
  k *= c1;
  k = (k << 15) | (k >> 17);
  k *= c2;
  h ^= k;
  h = (h << 13) | (h >> 19);
  return h * 5 + 0xe6546b64U;
}

}  // namespace

uint32_t finish_scalar(uint32_t h, const uint8_t* p, size_t len, size_t done) noexcept {
  const size_t nblocks = len / 4;
  for (size_t i = done / 4; i < nblocks; ++i) h = block(h, p + i * 4);
  const size_t t = len & 3;
  if (t != 0) {
    const uint8_t* tail = p + nblocks * 4;
    uint32_t k = tail[0];
    if (t > 1) k |= static_cast<uint32_t>(tail[1]) << 8;
    if (t > 2) k |= static_cast<uint32_t>(tail[2]) << 16;
    k *= c1;
    k = (k << 15) | (k >> 17);
    k *= c2;
    h ^= k;
  }
  h ^= static_cast<uint32_t>(len);
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  h ^= h >> 16;
  return h;
}

void two_chains(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                uint32_t* out) noexcept {
  struct chain {
    size_t i;  // the frame
    const uint8_t* p;
    size_t blocks;  // whole blocks left
    uint32_t h;
  };
  size_t next = 0;
  // The next frame long enough for a chain into c; shorter ones are hashed on the way.
  const auto take = [&](chain& c) noexcept {
    for (; next < n; ++next) {
      if (len[next] >= kTwoChainMinLen) {
        c = chain{next, data[next], len[next] / 4, seed};
        ++next;
        return true;
      }
      out[next] = murmur3_x86_32(data[next], len[next], seed);
    }
    return false;
  };
  const auto finish = [&](const chain& c) noexcept {
    out[c.i] = finish_scalar(c.h, data[c.i], len[c.i], (len[c.i] / 4 - c.blocks) * 4);
  };
  chain a{};
  chain b{};
  bool has_a = take(a);
  bool has_b = has_a && take(b);
  while (has_a && has_b) {
    const size_t m = a.blocks < b.blocks ? a.blocks : b.blocks;
    uint32_t ha = a.h;
    uint32_t hb = b.h;
    for (size_t j = 0; j < m; ++j) {
      ha = block(ha, a.p + j * 4);
      hb = block(hb, b.p + j * 4);
    }
    a = chain{a.i, a.p + m * 4, a.blocks - m, ha};
    b = chain{b.i, b.p + m * 4, b.blocks - m, hb};
    if (a.blocks == 0) {
      finish(a);
      has_a = take(a);
    }
    if (b.blocks == 0) {
      finish(b);
      has_b = take(b);
    }
  }
  if (has_a) finish(a);
  if (has_b) finish(b);
}

murmur3_impl pick_avx2_or_scalar(int64_t scalar_ns, int64_t avx2_ns) noexcept {
  // AVX2 must win by a tenth: closer than that, timing noise could pick either.
  return avx2_ns * 10 <= scalar_ns * 9 ? murmur3_impl::avx2 : murmur3_impl::scalar;
}

}  // namespace murmur3_batch_detail

namespace {

bool cpu_has(murmur3_impl impl) noexcept {
#if defined(UVBUS_MURMUR3_SIMD)
  switch (impl) {
    case murmur3_impl::avx2:
      return __builtin_cpu_supports("avx2") != 0;
    case murmur3_impl::avx512:
      return __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512bw") != 0 &&
             __builtin_cpu_supports("avx512vl") != 0 && __builtin_cpu_supports("bmi2") != 0;
    default:
      return true;
  }
#else
  return impl == murmur3_impl::auto_ || impl == murmur3_impl::scalar;
#endif
}

#if defined(UVBUS_MURMUR3_SIMD)
// AVX2 against the scalar hash on 16 frames of mixed sizes (8-128 B, as small messages come): on
// some CPUs (measured: a 2-vCPU AMD EPYC VM) the AVX2 kernel's masked loads make it slower than
// one frame at a time. About 0.1 ms, once per process.
murmur3_impl measure_avx2() noexcept {
  constexpr size_t n = 16;
  constexpr size_t sizes[n] = {8, 120, 40, 96, 16, 128, 64, 24, 112, 32, 80, 56, 104, 72, 48, 88};
  alignas(64) uint8_t bytes[n * 128];
  for (size_t i = 0; i < sizeof bytes; ++i) bytes[i] = static_cast<uint8_t>(i * 131U + 7U);
  const uint8_t* data[n];
  size_t len[n];
  for (size_t i = 0; i < n; ++i) {
    data[i] = bytes + i * 128;
    len[i] = sizes[i];
  }
  uint32_t out[n];
  // 16 hashes of the batch with one kernel (seeds 0..15).
  const auto reps = [&](auto kernel) {
    for (uint32_t r = 0; r < 16; ++r) kernel(data, len, n, r, out);
  };
  const detail::kernel_times t =
      detail::time_alternately([&] { reps(murmur3_batch_detail::two_chains); },
                               [&] { reps(murmur3_batch_detail::batch_avx2); });
  return murmur3_batch_detail::pick_avx2_or_scalar(t.a, t.b);
}
#endif

// The widest kernel the CPU has; AVX2 only where it measures faster than the scalar hash. Once.
murmur3_impl best() noexcept {
  if (cpu_has(murmur3_impl::avx512)) return murmur3_impl::avx512;
#if defined(UVBUS_MURMUR3_SIMD)
  if (cpu_has(murmur3_impl::avx2)) {
    static const murmur3_impl measured = measure_avx2();
    return measured;
  }
#endif
  return murmur3_impl::scalar;
}

murmur3_impl from_env() noexcept {
  const char* v = std::getenv("UVBUS_MURMUR3");  // NOLINT(concurrency-mt-unsafe): read once
  if (v != nullptr) {
    for (const murmur3_impl i : {murmur3_impl::scalar, murmur3_impl::avx2, murmur3_impl::avx512}) {
      if (std::strcmp(v, to_string(i)) == 0 && cpu_has(i)) return i;
    }
  }
  return best();
}

// The chosen kernel; auto_ until the first use resolves it.
std::atomic<murmur3_impl> g_active{murmur3_impl::auto_};

#if defined(UVBUS_MURMUR3_SIMD)
bool all_short(const size_t* len, size_t n) noexcept {
  for (size_t i = 0; i < n; ++i) {
    if (len[i] >= murmur3_batch_detail::kMaxSimdLen) return false;
  }
  return true;
}
#endif

}  // namespace

const char* to_string(murmur3_impl impl) noexcept {
  switch (impl) {
    case murmur3_impl::auto_:
      return "auto";
    case murmur3_impl::scalar:
      return "scalar";
    case murmur3_impl::avx2:
      return "avx2";
    case murmur3_impl::avx512:
      return "avx512";
  }
  return "unknown";
}

bool murmur3_batch_supported(murmur3_impl impl) noexcept {
  return cpu_has(impl);
}

bool murmur3_batch_use(murmur3_impl impl) noexcept {
  if (!cpu_has(impl)) return false;
  g_active.store(impl == murmur3_impl::auto_ ? best() : impl, std::memory_order_relaxed);
  return true;
}

murmur3_impl murmur3_batch_active() noexcept {
  murmur3_impl a = g_active.load(std::memory_order_relaxed);
  if (a == murmur3_impl::auto_) {
    a = from_env();
    murmur3_impl expected = murmur3_impl::auto_;
    if (!g_active.compare_exchange_strong(expected, a, std::memory_order_relaxed)) a = expected;
  }
  return a;
}

size_t murmur3_batch_min_mean_bytes() noexcept {
  switch (murmur3_batch_active()) {
    case murmur3_impl::avx512:
      return 0;
    case murmur3_impl::avx2:
      return kBatchMinMeanAvx2;
    default:
      return kBatchMinMeanScalar;
  }
}

void murmur3_x86_32_batch(const uint8_t* const* data, const size_t* len, size_t n, uint32_t seed,
                          uint32_t* out) noexcept {
  const murmur3_impl impl = murmur3_batch_active();
  if (impl == murmur3_impl::scalar) {
    murmur3_batch_detail::two_chains(data, len, n, seed, out);
    return;
  }
#if defined(UVBUS_MURMUR3_SIMD)
  constexpr size_t lanes = 16;
  for (size_t i = 0; i < n;) {
    const size_t m = n - i < lanes ? n - i : lanes;
    if (m == 1 || !all_short(len + i, m)) {
      murmur3_batch_detail::two_chains(data + i, len + i, m, seed, out + i);
    } else if (impl == murmur3_impl::avx2) {
      murmur3_batch_detail::batch_avx2(data + i, len + i, m, seed, out + i);
    } else if (m <= 8) {
      // Eight lanes or fewer: ymm registers, half the transposes of the zmm kernel.
      murmur3_batch_detail::batch_avx512_8(data + i, len + i, m, seed, out + i);
    } else {
      murmur3_batch_detail::batch_avx512(data + i, len + i, m, seed, out + i);
    }
    i += m;
  }
#else
  murmur3_batch_detail::two_chains(data, len, n, seed, out);
#endif
}

}  // namespace uvbus
