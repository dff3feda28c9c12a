// Fuzzes the shared-memory reader over a hostile region image (include/uvbus/shm.h,
// shm_reader::open_image): a corrupt region, or a writer process that scribbles over it, must never
// make the reader crash, read outside the region, or loop forever.
//
// Input layout:
//   byte 0      node size: 64 << (b % 3)
//   byte 1      ring: (16 << (b % 4)) nodes; layout version 3 (MurmurHash3 checksums) when
//               b & 0x80, else the newest (CRC-32C)
//   byte 2      records a well-behaved writer sends first (b % 24), sizes from the next bytes
//   then        patches until the input ends, each [kind u8] then:
//                 kind % 4 == 0: [offset u16][length u8 % 32][bytes] over the header's first
//                                512 bytes (layout fields, cursors, counters)
//                 kind % 4 == 1: the same over the ring (record headers and payloads)
//                 kind % 4 == 2: write_pos = read_pos + a signed 16-bit delta, or any u64 when
//                                kind & 0x80 (a writer lying about how much it wrote)
//                 kind % 4 == 3: read_pos likewise (a stale or scribbled reader cursor)
//   The last patch may be cut short by the end of the input.
//
// The image is one exactly-sized 64-byte-aligned heap block, so ASan reports any access outside
// it. Invariants: open_image either refuses (bad_layout / invalid_argument) or the reader drains
// what it can: every record delivered lies inside the ring and within max_record_size, polling
// reaches "nothing ready" within a bounded number of calls, and try_receive and a writer attached
// to the same image behave likewise (a writer must not crash on a hostile region either).
#include <cstdlib>
#include <cstring>

#include "fuzz_util.h"
#include "uvbus/shm.h"

namespace {

struct bounds {
  const uint8_t* lo;
  const uint8_t* hi;
  size_t max_record;
  size_t delivered = 0;
};

void on_records(bounds* b, const uvbus::shm_record* records, size_t count) {
  FUZZ_CHECK(count >= 1);
  for (size_t i = 0; i < count; ++i) {
    const uvbus::shm_record& r = records[i];
    FUZZ_CHECK(r.size <= b->max_record);
    if (r.size == 0) continue;
    FUZZ_CHECK(r.data >= b->lo && r.data + r.size <= b->hi);
    // Touch every byte: ASan (and the bounds above) must agree the view is real memory.
    volatile uint8_t sink = 0;
    for (size_t j = 0; j < r.size; ++j) sink ^= r.data[j];
    (void)sink;
  }
  b->delivered += count;
}

struct aligned_free {
  void operator()(void* p) const { std::free(p); }
};

// The region config from the input's first two bytes.
uvbus::shm_config config_from(uvbus::fuzz::byte_reader& in) {
  uvbus::shm_config cfg;
  cfg.node_size = 64u << (in.u8() % 3);
  const uint8_t ring = in.u8();
  cfg.ring_bytes = static_cast<size_t>(cfg.node_size) * (16u << (ring % 4));
  cfg.layout_version = (ring & 0x80) != 0 ? 3 : 0;
  cfg.max_record_size = static_cast<uint32_t>(cfg.ring_bytes / 2 - 64);
  // Tiny timeouts: a record that looks stuck is skipped at once instead of after 4 ms, so the
  // drain loop below terminates quickly; the skip path is what we want exercised anyway.
  cfg.abandon_timeout_us = 1;
  cfg.reclaim_timeout_us = 1;
  cfg.spin_us = 0;
  cfg.batch_max = 7;
  return cfg;
}

// A well-behaved writer fills part of the ring first, so patches land on real records.
void write_records(uvbus::fuzz::byte_reader& in, uint8_t* mem, size_t region) {
  uvbus::shm_writer w;
  FUZZ_CHECK(w.open_image(mem, region) == uvbus::errc::ok);
  const unsigned records = in.u8() % 24;
  uint8_t payload[1024];
  for (unsigned i = 0; i < records; ++i) {
    const size_t len = (static_cast<size_t>(in.u8()) * 4) % sizeof payload;
    for (size_t j = 0; j < len; ++j) payload[j] = static_cast<uint8_t>(i * 31 + j);
    const uvbus::errc e = w.send(payload, len);
    FUZZ_CHECK(e == uvbus::errc::ok || e == uvbus::errc::queue_full ||
               e == uvbus::errc::message_too_large);
  }
  w.close();
}

// Applies the input's patches to the image until the input ends.
void apply_patches(uvbus::fuzz::byte_reader& in, uint8_t* mem, size_t region) {
  constexpr size_t kHeaderBytes = 4096;  // the region header precedes the ring
  constexpr size_t kWritePos = 128;      // offsets of the cursors in the header (layout.h)
  constexpr size_t kReadPos = 192;
  while (!in.empty()) {
    const uint8_t kind = in.u8();
    if (kind % 4 < 2) {
      const size_t area = kind % 4 == 0 ? 512 : region - kHeaderBytes;
      const size_t off = (kind % 4 == 0 ? 0 : kHeaderBytes) + in.u16() % area;
      const uint8_t* bytes = nullptr;
      size_t n = in.take(in.u8() % 32, &bytes);
      if (off + n > region) n = region - off;
      std::memcpy(mem + off, bytes, n);
    } else {
      uint64_t read_pos = 0;
      std::memcpy(&read_pos, mem + kReadPos, 8);
      const uint64_t v = (kind & 0x80) != 0
                             ? in.u64()
                             : read_pos + static_cast<uint64_t>(static_cast<int16_t>(in.u16()));
      std::memcpy(mem + (kind % 4 == 2 ? kWritePos : kReadPos), &v, 8);
    }
  }
}

// Reads the hostile image: bounded, in bounds, never crashing; then a writer attaches to it.
void read_image(uint8_t* mem, size_t region, const uvbus::shm_config& cfg) {
  bounds b{mem, mem + region, 0};
  uvbus::shm_reader r({[&b](const uvbus::shm_record* recs, size_t n) { on_records(&b, recs, n); }});
  const uvbus::errc e = r.open_image(mem, region, cfg);
  if (e != uvbus::errc::ok) {
    // not_connected: the magic is 0, i.e. a region whose creator has not finished formatting it.
    FUZZ_CHECK(e == uvbus::errc::bad_layout || e == uvbus::errc::invalid_argument ||
               e == uvbus::errc::not_connected);
    FUZZ_CHECK(!r.is_open() && r.last_error().code == e && !r.last_error().detail.empty());
    return;
  }
  b.max_record = r.max_record_size();
  FUZZ_CHECK(b.max_record <= cfg.ring_bytes);
  // The ring holds at most ring_bytes / node_size records, so a reader that keeps delivering or
  // keeps finding work for much longer than that is looping on a corrupt cursor.
  const size_t most = cfg.ring_bytes / cfg.node_size;
  size_t quiet = 0;
  size_t rounds = 0;
  while (quiet < 3) {
    FUZZ_CHECK(++rounds < 4 * most + 64);
    const size_t got = r.poll(most);
    FUZZ_CHECK(got <= most);
    quiet = got == 0 ? quiet + 1 : 0;
  }
  FUZZ_CHECK(b.delivered <= 2 * most);
  uint8_t buf[64];
  size_t len = 0;
  const uvbus::errc te = r.try_receive(buf, sizeof buf, &len);
  FUZZ_CHECK(te == uvbus::errc::would_block || te == uvbus::errc::buffer_too_small ||
             te == uvbus::errc::ok);

  // A writer attaching to the hostile image must refuse or send without crashing.
  uvbus::shm_writer w;
  if (w.open_image(mem, region) == uvbus::errc::ok) {
    for (int i = 0; i < 4; ++i) (void)w.send(buf, sizeof buf);
    w.close();
  }
  (void)r.poll(most);
  r.close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uvbus::fuzz::byte_reader in(data, size);
  const uvbus::shm_config cfg = config_from(in);
  if (uvbus::shm_validate(cfg) != uvbus::errc::ok) return 0;
  const size_t region = uvbus::shm_region_size(cfg);
  FUZZ_CHECK(region != 0 && region % 64 == 0);
  std::unique_ptr<uint8_t, aligned_free> mem(static_cast<uint8_t*>(std::aligned_alloc(64, region)));
  FUZZ_CHECK(mem != nullptr);
  std::memset(mem.get(), 0, region);
  FUZZ_CHECK(uvbus::shm_format_image(mem.get(), region, cfg) == uvbus::errc::ok);
  write_records(in, mem.get(), region);
  apply_patches(in, mem.get(), region);
  read_image(mem.get(), region, cfg);
  return 0;
}
