// Fuzzes murmur3_x86_32_batch (src/core/murmur3_batch.h) against murmur3_x86_32.
//
// Input: bytes 0-3 a seed; then per buffer (up to 40) a length byte pair, an alignment byte and
// that many content bytes from the input (fewer at its end). Length: the low byte alone (0..255)
// when the pair's high bit is clear, else the pair's low 14 bits (0..16383), so short buffers and
// long lanes that leave the SIMD loop early both come up often.
// Invariants, for every kernel this CPU has (forced in turn with murmur3_batch_use):
//   * out[i] == murmur3_x86_32(data[i], len[i], seed) for every i, for the whole batch and for
//     every batch suffix (every lane position);
//   * nothing is read outside the buffers: each one lives in its own exactly-sized allocation
//     after its alignment bytes, so ASan reports a read past its end;
//   * nothing is written past out[n - 1].
#include <cstring>
#include <memory>
#include <vector>

#include "core/murmur3.h"
#include "core/murmur3_batch.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uvbus::fuzz::byte_reader in(data, size);
  const uint32_t seed = in.u32();
  std::vector<std::unique_ptr<uint8_t[]>> storage;
  std::vector<const uint8_t*> ptr;
  std::vector<size_t> len;
  while (!in.empty() && ptr.size() < 40) {
    const uint16_t l = in.u16();
    const size_t n = (l & 0x8000) != 0 ? (l & 0x3fff) : (l & 0xff);
    const size_t align = in.u8() & 63;
    const uint8_t* src = nullptr;
    const size_t got = in.take(n, &src);
    storage.emplace_back(new uint8_t[align + n + (align + n == 0 ? 1 : 0)]);
    uint8_t* buf = storage.back().get() + align;
    if (got != 0) std::memcpy(buf, src, got);
    for (size_t i = got; i < n; ++i) buf[i] = static_cast<uint8_t>(i * 31);
    ptr.push_back(buf);
    len.push_back(n);
  }
  const size_t count = ptr.size();
  std::vector<uint32_t> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = uvbus::murmur3_x86_32(ptr[i], len[i], seed);
  std::vector<uint32_t> out(count + 1);
  for (const uvbus::murmur3_impl k :
       {uvbus::murmur3_impl::scalar, uvbus::murmur3_impl::avx2, uvbus::murmur3_impl::avx512}) {
    if (!uvbus::murmur3_batch_use(k)) continue;
    for (size_t first = 0; first <= count; ++first) {
      out[count - first] = 0x5a5a5a5aU;
      uvbus::murmur3_x86_32_batch(ptr.data() + first, len.data() + first, count - first, seed,
                                  out.data());
      for (size_t i = 0; i < count - first; ++i) FUZZ_CHECK(out[i] == want[first + i]);
      FUZZ_CHECK(out[count - first] == 0x5a5a5a5aU);
    }
  }
  uvbus::murmur3_batch_use(uvbus::murmur3_impl::auto_);
  return 0;
}
