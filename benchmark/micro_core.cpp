// Microbenchmarks of the core hot pieces: MurmurHash3 (one buffer, and batches by each kernel),
// CRC-32C (each kernel), frame encode+decode, write-queue push+pop and the merge step.
// Run: build/uvbus_micro_core [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/crc32c.h"
#include "core/frame.h"
#include "core/murmur3.h"
#include "core/murmur3_batch.h"
#include "core/write_queue.h"

namespace {

void BM_Murmur3_x86_32(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> buf(n + 1, 0x5a);
  for (auto _ : state) {
    benchmark::DoNotOptimize(uvbus::murmur3_x86_32(buf.data() + 1, n, 0));  // unaligned input
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_Murmur3_x86_32)->Arg(16)->Arg(128)->Arg(4096)->Arg(65536);

void BM_Murmur3_x64_128(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> buf(n, 0x5a);
  uint64_t out[2];
  for (auto _ : state) {
    uvbus::murmur3_x64_128(buf.data(), n, 0, out);
    benchmark::DoNotOptimize(out);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_Murmur3_x64_128)->Arg(16)->Arg(128)->Arg(4096)->Arg(65536);

// Forces CRC-32C kernel k: 0 = table, 1 = sse42 folding inputs of 256..1791 B, 2 = sse42 taking
// them in three crc32 lanes (the variant the dispatch times: docs/core.md). False: not on this CPU.
bool use_crc32c_kernel(int64_t k) {
  if (k == 0) return uvbus::crc32c_use(uvbus::crc32c_impl::table);
  return uvbus::crc32c_use(uvbus::crc32c_impl::sse42) &&
         uvbus::crc32c_detail::sse42_medium_use(k == 1 ? 0 : 1);
}

// CRC-32C of one buffer: args size, kernel (use_crc32c_kernel; skipped where the CPU lacks it).
// Each call depends on the one before (its result seeds the next), so this is the latency of one
// record's checksum, not the throughput of independent ones.
void BM_Crc32c(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  if (!use_crc32c_kernel(state.range(1))) {
    state.SkipWithError("kernel not supported on this CPU");
    return;
  }
  std::vector<uint8_t> buf(n + 1, 0x5a);
  uint32_t crc = 0;
  for (auto _ : state) {
    crc = uvbus::crc32c(buf.data() + 1, n, crc);  // unaligned input
    benchmark::DoNotOptimize(crc);
  }
  (void)uvbus::crc32c_detail::sse42_medium_use(-1);
  (void)uvbus::crc32c_use(uvbus::crc32c_impl::auto_);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_Crc32c)->ArgsProduct({{16, 71, 128, 256, 512, 1024, 4096, 8192, 65536}, {0, 1, 2}});

// CRC-32C of independent records of uniform random lengths (each started afresh, as the shm
// ring's record checksums are): args kernel (use_crc32c_kernel), shortest and longest length
// (8..128 B: small messages; 52..172 B: the same with a bus node's header; 8..1024 B). The
// lengths come from a sequence of 2^16 that the iterations walk through, so the branch predictor
// cannot learn them.
void BM_Crc32cMixed(benchmark::State& state) {
  if (!use_crc32c_kernel(state.range(0))) {
    state.SkipWithError("kernel not supported on this CPU");
    return;
  }
  const auto lo = static_cast<uint32_t>(state.range(1));
  const auto hi = static_cast<uint32_t>(state.range(2));
  constexpr size_t kLengths = size_t{1} << 16;
  std::mt19937 rng(1);
  std::vector<uint32_t> lens(kLengths);
  for (auto& l : lens) l = lo + rng() % (hi - lo + 1);
  std::vector<uint8_t> buf(hi + 1, 0x5a);
  size_t i = 0;
  int64_t bytes = 0;
  for (auto _ : state) {
    const uint32_t len = lens[i++ & (kLengths - 1)];
    benchmark::DoNotOptimize(uvbus::crc32c(buf.data() + 1, len));
    bytes += len;
  }
  (void)uvbus::crc32c_detail::sse42_medium_use(-1);
  (void)uvbus::crc32c_use(uvbus::crc32c_impl::auto_);
  state.SetBytesProcessed(bytes);
}
BENCHMARK(BM_Crc32cMixed)
    ->Args({0, 8, 128})
    ->Args({1, 8, 128})
    ->Args({1, 52, 172})
    ->Args({1, 8, 1024})
    ->Args({2, 8, 1024});

// Frames' payloads hashed: args size (0 = uniform random 8..128 B, 1 = uniform random 8..16384 B),
// kernel (0 = murmur3_x86_32 one at a time, 1 = batch scalar, 2 = batch AVX2, 3 = batch AVX-512),
// batch (frames per call). The payloads lie in one buffer, 5 bytes apart (frame headers) as in a
// read buffer; the large random ones overlap in a 256 KiB buffer, which stays in the cache as a
// just-received read does. Random lengths
// come from a sequence of 2^18 that each iteration continues: a short sequence repeated every
// iteration lets the branch predictor learn it, which flattered branchy kernels by 2x (a real
// stream's lengths are not predictable: docs/core.md, "Frame checksums in batches").
void BM_Murmur3Batch(benchmark::State& state) {
  const auto size = static_cast<size_t>(state.range(0));
  const auto kernel = state.range(1);
  const auto batch = static_cast<size_t>(state.range(2));
  constexpr uvbus::murmur3_impl kImpl[] = {uvbus::murmur3_impl::scalar, uvbus::murmur3_impl::scalar,
                                           uvbus::murmur3_impl::avx2, uvbus::murmur3_impl::avx512};
  if (!uvbus::murmur3_batch_use(kImpl[kernel])) {
    state.SkipWithError("kernel not supported by this CPU");
    return;
  }
  constexpr size_t kFrames = 8192;              // per iteration; a multiple of every batch size
  constexpr size_t kLengths = size_t{1} << 18;  // the random sequence, a multiple of kFrames
  constexpr size_t kSlot = 128 + 5;
  constexpr size_t kLarge = 16384;
  constexpr size_t kLargeWindow = size_t{256} * 1024;
  std::mt19937 rng(1);
  std::vector<size_t> lens(kLengths);
  // size 0: random 8-128 B; size 1: random 8-16384 B; otherwise every frame `size` bytes.
  const auto next_length = [&]() -> size_t {
    if (size == 0) return 8 + rng() % 121;
    if (size == 1) return 8 + rng() % (kLarge - 7);
    return size;
  };
  for (auto& l : lens) l = next_length();
  const size_t slot = std::max(kSlot, size + 5);
  std::vector<uint8_t> wire(size == 1 ? kLargeWindow + kLarge : kFrames * slot);
  for (auto& b : wire) b = static_cast<uint8_t>(rng());
  std::vector<const uint8_t*> ptr(kLengths);
  size_t at = 0;
  for (size_t i = 0; i < kLengths; ++i) {
    if (size == 1) {
      ptr[i] = wire.data() + at;
      at = (at + lens[i] + 5) % kLargeWindow;
    } else {
      ptr[i] = wire.data() + (i % kFrames) * slot + 5;
    }
  }
  std::vector<uint32_t> out(kFrames);
  size_t base = 0;
  for (auto _ : state) {
    const uint8_t* const* p = &ptr[base];
    const size_t* len = &lens[base];
    if (kernel == 0) {
      for (size_t i = 0; i < kFrames; ++i) out[i] = uvbus::murmur3_x86_32(p[i], len[i], 0);
    } else {
      for (size_t i = 0; i < kFrames; i += batch) {
        uvbus::murmur3_x86_32_batch(&p[i], &len[i], batch, 0, &out[i]);
      }
    }
    base = (base + kFrames) % kLengths;
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  uvbus::murmur3_batch_use(uvbus::murmur3_impl::auto_);
  state.SetLabel(kernel == 0 ? "one_by_one" : uvbus::to_string(kImpl[kernel]));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kFrames));
}
BENCHMARK(BM_Murmur3Batch)
    ->ArgNames({"size", "kernel", "batch"})
    ->ArgsProduct({{0, 1, 8, 16, 32, 64, 128, 1024}, {0}, {1}})
    ->ArgsProduct({{0, 1, 8, 16, 32, 64, 128, 1024}, {1, 2, 3}, {8, 16}});

// Encode one frame into a buffer, then decode it: frames/s.
void BM_FrameEncodeDecode(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> payload(n, 0x33);
  std::vector<uint8_t> wire(uvbus::frame_size(n));
  uvbus::frame_decoder dec;
  for (auto _ : state) {
    const size_t len = uvbus::frame_encode(payload.data(), n, wire.data(), wire.size());
    dec.feed(wire.data(), len);
    auto r = dec.next();
    benchmark::DoNotOptimize(r.data);
    if (r.status != uvbus::frame_status::payload) state.SkipWithError("decode failed");
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_FrameEncodeDecode)->Arg(64)->Arg(4096);

// Feeds one read to the decoder and takes every whole frame out of it: the decode benchmarks' timed
// step (always inline, so the timed loop is what it was written out).
[[gnu::always_inline]] inline void decode_read(uvbus::frame_decoder& dec,
                                               const std::vector<uint8_t>& wire) {
  dec.feed(wire.data(), wire.size());
  for (;;) {
    auto r = dec.next();
    if (r.status != uvbus::frame_status::payload) break;
    benchmark::DoNotOptimize(r.data);
  }
}

// Decoding a 64 KiB read full of 64 B frames, as the stream channel's read path does.
void BM_FrameDecodeBatch64(benchmark::State& state) {
  std::vector<uint8_t> payload(64, 0x44);
  std::vector<uint8_t> wire;
  size_t frames = 0;
  while (wire.size() + uvbus::frame_size(64) <= 65536) {
    const size_t at = wire.size();
    wire.resize(at + uvbus::frame_size(64));
    (void)uvbus::frame_encode(payload.data(), 64, wire.data() + at, wire.size() - at);
    ++frames;
  }
  uvbus::frame_decoder dec;
  for (auto _ : state) decode_read(dec, wire);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * frames));
}
BENCHMARK(BM_FrameDecodeBatch64);

// Decoding reads of frames with uniform random payload sizes in [min, max] (the stream
// benchmark's 8-128 and 8-16384 B mixes): frames/s of the receiver's parse + checksum step. Eight
// different 64 KiB reads in turn (512 KiB: in L2, and too many random sizes for the branch
// predictor to learn, as with real traffic). The frame cut by a read's end is left out, so every
// frame lies wholly inside its read. Third argument: the decoder's batch_min_mean (0: every run of
// whole frames is verified as a batch; 256: the default, small frames one at a time).
void BM_FrameDecodeRead(benchmark::State& state) {
  const auto lo = static_cast<size_t>(state.range(0));
  const auto hi = static_cast<size_t>(state.range(1));
  const auto min_mean = static_cast<size_t>(state.range(2));
  constexpr size_t kReads = 8;
  constexpr size_t kReadBytes = size_t{64} * 1024;
  std::mt19937 rng(2);
  std::vector<uint8_t> payload(hi);
  for (auto& b : payload) b = static_cast<uint8_t>(rng());
  std::vector<std::vector<uint8_t>> reads(kReads);
  size_t frames = 0;
  size_t bytes = 0;
  for (auto& wire : reads) {
    for (;;) {
      const size_t n = lo + rng() % (hi - lo + 1);
      if (wire.size() + uvbus::frame_size(n) > kReadBytes) break;
      const size_t at = wire.size();
      wire.resize(at + uvbus::frame_size(n));
      (void)uvbus::frame_encode(payload.data() + (hi - n), n, wire.data() + at, wire.size() - at);
      ++frames;
    }
    bytes += wire.size();
  }
  uvbus::frame_decoder dec(size_t{256} * 1024, min_mean);
  for (auto _ : state) {
    for (const auto& wire : reads) decode_read(dec, wire);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * frames));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_FrameDecodeRead)
    ->Args({8, 128, 0})
    ->Args({8, 128, 256})
    ->Args({8, 16384, 256})
    ->Args({64, 64, 0});

void BM_QueuePushPop64(benchmark::State& state) {
  uvbus::write_queue_config cfg;
  cfg.mode = state.range(0) == 0 ? uvbus::queue_mode::static_ring : uvbus::queue_mode::dynamic;
  uvbus::write_queue q(cfg);
  uint8_t payload[64] = {1};
  for (auto _ : state) {
    uint8_t* p = q.reserve(sizeof payload, 1);
    std::memcpy(p, payload, sizeof payload);
    benchmark::DoNotOptimize(q.front().data);
    q.pop_front();
  }
  state.SetLabel(state.range(0) == 0 ? "static_ring" : "dynamic");
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_QueuePushPop64)->Arg(0)->Arg(1);

// Queue 256 blocks of 64 B, merge them into one buffer, pop them: the coalescing step.
void BM_QueueMerge256x64(benchmark::State& state) {
  uvbus::write_queue q;
  std::vector<uint8_t> merge(size_t{64} * 1024);
  uint8_t payload[64] = {2};
  for (auto _ : state) {
    for (int i = 0; i < 256; ++i) std::memcpy(q.reserve(sizeof payload, 1), payload, 64);
    size_t n = 0;
    benchmark::DoNotOptimize(q.merge_front(merge.data(), merge.size(), 3072, &n));
    for (size_t i = 0; i < n; ++i) q.pop_front();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * 256));
}
BENCHMARK(BM_QueueMerge256x64);

}  // namespace

BENCHMARK_MAIN();
