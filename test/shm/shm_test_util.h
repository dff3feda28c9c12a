// Helpers for the shm tests (and the tools tests' rings): deterministic payloads, RAII removal of
// shm objects, aligned images, a small ring's config.
#pragma once

#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shm/layout.h"
#include "test_util.h"
#include "uvbus/shm.h"

namespace uvbus::test {

// A small ring: 4 KiB of 64-byte nodes, records up to 1 KiB.
inline shm_config small_ring_config() {
  shm_config c;
  c.ring_bytes = 4096;
  c.node_size = 64;
  c.max_record_size = 1024;
  return c;
}

inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Record `seq` of writer `w`: [w:4][seq:8][bytes derived from both], size in [12, 12 + spread].
inline size_t record_size(uint32_t w, uint64_t seq, size_t spread) {
  return 12 + static_cast<size_t>(mix(seq * 31 + w) % (spread + 1));
}
inline size_t make_record(uint32_t w, uint64_t seq, size_t spread, uint8_t* out) {
  const size_t n = record_size(w, seq, spread);
  std::memcpy(out, &w, 4);
  std::memcpy(out + 4, &seq, 8);
  uint64_t x = mix(seq ^ (uint64_t{w} << 40));
  for (size_t i = 12; i < n; ++i) {
    out[i] = static_cast<uint8_t>(x >> ((i & 7) * 8));
    if ((i & 7) == 7) x = mix(x);
  }
  return n;
}
// Checks a received record; fills *w and *seq from its header.
inline bool check_record(const uint8_t* p, size_t n, size_t spread, uint32_t* w, uint64_t* seq) {
  if (n < 12) return false;
  std::memcpy(w, p, 4);
  std::memcpy(seq, p + 4, 8);
  if (n != record_size(*w, *seq, spread)) return false;
  uint8_t small[2048];
  std::vector<uint8_t> big;
  uint8_t* want = small;
  if (spread + 12 > sizeof small) {
    big.resize(spread + 12);
    want = big.data();
  }
  make_record(*w, *seq, spread, want);
  return std::memcmp(want, p, n) == 0;
}

// Removes a POSIX shm name and/or a SysV key when the test ends, whatever happened.
struct shm_cleanup {
  std::string posix;  // without the leading slash
  int sysv_key = -1;
  ~shm_cleanup() {
    if (!posix.empty()) shm_unlink(("/" + posix).c_str());
    if (sysv_key >= 0) {
      const int id = shmget(sysv_key, 0, 0);
      if (id >= 0) shmctl(id, IPC_RMID, nullptr);
    }
  }
};

inline bool posix_exists(const std::string& name) {
  const int fd = shm_open(("/" + name).c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}
inline bool sysv_exists(int key) {
  return shmget(key, 0, 0) >= 0;
}

// A SysV key unique to this process and call.
inline int unique_key() {
  static int n = 0;
  return 0x55000000 | ((static_cast<int>(getpid()) & 0xfffff) << 4) | (++n & 0xf);
}

// A 64-byte aligned buffer for region images.
struct image {
  explicit image(size_t n) : size(n) {
    p = static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
    std::memset(p, 0, n);
  }
  ~image() { std::free(p); }
  image(const image&) = delete;
  image& operator=(const image&) = delete;
  uint8_t* p;
  size_t size;
};

// The tests' records sinks are function + context pairs; these route a reader's on_records to one.
using records_fn = void (*)(void* user, const shm_record* records, size_t count);
inline shm_reader_callbacks records_to(records_fn fn, void* user) {
  return shm_reader_callbacks{[fn, user](const shm_record* r, size_t n) { fn(user, r, n); }};
}
// Sets fn/user as r's records callback, then polls up to max records.
inline size_t poll_with(shm_reader& r, records_fn fn, void* user, size_t max) {
  if (r.set_callbacks(records_to(fn, user)) != errc::ok) return 0;
  return r.poll(max);
}
// Sets fn/user as r's records callback, then starts r on loop.
inline errc start_with(shm_reader& r, uv_loop_t* loop, records_fn fn, void* user) {
  if (const errc e = r.set_callbacks(records_to(fn, user)); e != errc::ok) return e;
  return r.start(loop);
}

// A records sink (records_fn) that keeps every payload as a string, in delivery order.
struct collected {
  std::vector<std::string> recs;
  static void cb(void* u, const shm_record* r, size_t n) {
    auto* self = static_cast<collected*>(u);
    for (size_t i = 0; i < n; ++i) {
      self->recs.emplace_back(reinterpret_cast<const char*>(r[i].data), r[i].size);
    }
  }
};

// Formats img as a region of cfg and attaches w and r to it; the first error, or ok.
inline errc format_and_attach(image& img, const shm_config& cfg, shm_writer& w, shm_reader& r) {
  if (const errc e = shm_format_image(img.p, img.size, cfg); e != errc::ok) return e;
  if (const errc e = w.open_image(img.p, img.size); e != errc::ok) return e;
  return r.open_image(img.p, img.size, cfg);
}

// A POSIX region mapped read-write whole, to construct the cursor and head states that a process
// killed at a given instruction leaves behind, or cursors no real run reaches in a test's time.
struct raw_region {
  void* p = MAP_FAILED;
  size_t n = 0;
  explicit raw_region(const std::string& name) {
    const int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
    struct stat st {};
    if (fd < 0) return;
    if (fstat(fd, &st) == 0) {
      n = static_cast<size_t>(st.st_size);
      p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
  }
  ~raw_region() {
    if (p != MAP_FAILED) munmap(p, n);
  }
  raw_region(const raw_region&) = delete;
  raw_region& operator=(const raw_region&) = delete;
  [[nodiscard]] shm_detail::region_header* hdr() const {
    return static_cast<shm_detail::region_header*>(p);
  }
  [[nodiscard]] shm_detail::head_word* head(uint64_t pos) const {
    auto* heads = reinterpret_cast<shm_detail::head_word*>(static_cast<uint8_t*>(p) +
                                                           shm_detail::kHeaderSize);
    return heads + (pos & (hdr()->ring_bytes / hdr()->node_size - 1));
  }
};

}  // namespace uvbus::test
