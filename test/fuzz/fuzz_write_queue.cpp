// Fuzzes the write queue (src/core/write_queue.h) against a std::deque model.
//
// Input layout: a config (mode, ring size, byte and block limits, some of them invalid on
// purpose), then a sequence of operations, each an opcode byte and its arguments: reserve,
// pop_front, unreserve_back (only where the header allows it: after a successful reserve with no
// other successful reserve since), merge_front (then, sometimes, pop_front_n of what it merged),
// for_each_front, take_unsealed and seal_newest.
//
// Invariants checked after every operation:
//   * size(), bytes(), empty(), front() and the contents and tags of every block equal the model's
//     (each block is filled with a pattern derived from its tag, so overlapping blocks in the ring
//     show up as corrupted contents);
//   * reserve() succeeds or fails exactly as the documented limits say; in dynamic mode the outcome
//     is fully predicted; in static-ring mode a queue_full must be justified by the ring layout
//     (no contiguous room at the tail, nor at the start before the head), so space never leaks;
//   * the ring's blocks lie inside the ring and never overlap; merge_front() copies a prefix of the
//     model's blocks under the documented stop rules (exactly that prefix in dynamic mode);
//   * unsealed() counts the blocks reserved since take_unsealed() last handed them out (the model's
//     newest ones), and take_unsealed() hands out exactly those, oldest first;
//   * memory_bytes() is the ring size now plus the rings a growth retired, or the blocks plus their
//     bookkeeping in dynamic mode;
//   * a static ring is allocated by the first reserve that reaches it, at ring_initial_bytes (0:
//     the whole ring) or the power of two that holds the block, and grows only when a block does
//     not fit: to twice its size or a larger power of two (or ring_bytes) that holds every queued
//     block plus the new one, laid out from offset 0 in FIFO order; the front block read before the
//     growth stays readable (a write in flight) until release_retired();
//   * release_storage() frees a drained ring exactly when it was not allocated whole and is no
//     larger than the first allocation makes of ring_initial_bytes (rounded up to 8, at least 64),
//     or grown_too; the next reserve allocates a first ring again.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "core/write_queue.h"
#include "fuzz_util.h"

namespace {

using uvbus::errc;
using uvbus::queue_mode;
using uvbus::write_queue;
using uvbus::write_queue_config;

constexpr size_t kRingHeader = 16;
constexpr size_t align8(size_t n) {
  return (n + 7) & ~static_cast<size_t>(7);
}
constexpr size_t stride(size_t n) {
  return kRingHeader + align8(n);
}

uint8_t pattern(uint64_t tag, size_t i) {
  return static_cast<uint8_t>(tag * 0x9e3779b97f4a7c15ull >> 56) ^ static_cast<uint8_t>(i * 131);
}

struct model_block {
  uint64_t tag;
  size_t size;
  size_t off;  // static ring: header offset from the ring's start
};

// UVBUS_FUZZ_TRACE=1 prints the operations (to minimise and explain a finding).
const bool trace = std::getenv("UVBUS_FUZZ_TRACE") != nullptr;

struct harness {
  write_queue_config cfg;
  bool valid;
  size_t ring = 0;     // aligned ring size (the largest the ring may grow to)
  size_t cap = 0;      // the ring's size now (0: not allocated yet)
  size_t retired = 0;  // bytes of the rings a growth replaced, not yet released
  write_queue q;
  std::deque<model_block> m;
  size_t bytes = 0;
  const uint8_t* base = nullptr;  // ring start, learnt from the first reservation
  bool can_unreserve = false;
  uint64_t next_tag = 1;
  size_t unsealed = 0;  // the newest blocks of m not yet handed out by take_unsealed()

  explicit harness(const write_queue_config& c)
      : cfg(c), valid(write_queue::validate(c) == errc::ok), q(c) {
    ring = align8(c.ring_bytes);
  }

  bool is_static() const { return cfg.mode == queue_mode::static_ring; }

  void check_block(const write_queue::block& b, const model_block& want, bool where = true) const {
    FUZZ_CHECK(b.size == want.size);
    FUZZ_CHECK(b.tag == want.tag);
    for (size_t i = 0; i < b.size; ++i) FUZZ_CHECK(b.data[i] == pattern(want.tag, i));
    if (where && is_static() && base != nullptr) {
      FUZZ_CHECK(b.data == base + want.off + kRingHeader);
    }
  }

  void check_all() const {
    FUZZ_CHECK(q.size() == m.size());
    FUZZ_CHECK(q.unsealed() == unsealed);
    FUZZ_CHECK(q.empty() == m.empty());
    FUZZ_CHECK(q.bytes() == bytes);
    if (!m.empty()) check_block(q.front(), m.front());
    if (is_static()) {
      FUZZ_CHECK(q.memory_bytes() == cap + retired);
      FUZZ_CHECK(cap <= ring);
      // Blocks stay inside the ring, are disjoint, and follow the FIFO layout: increasing
      // offsets, with at most one wrap back to 0.
      size_t wraps = 0;
      for (size_t i = 0; i < m.size(); ++i) {
        FUZZ_CHECK(m[i].off + stride(m[i].size) <= cap);
        if (i > 0) {
          const size_t prev_end = m[i - 1].off + stride(m[i - 1].size);
          if (m[i].off < prev_end) {
            FUZZ_CHECK(m[i].off == 0);
            ++wraps;
          }
        }
      }
      FUZZ_CHECK(wraps <= 1);
      if (wraps == 1) FUZZ_CHECK(m.back().off + stride(m.back().size) <= m.front().off);
    } else {
      FUZZ_CHECK(q.memory_bytes() >= bytes);
    }
  }

  size_t used() const {
    size_t u = 0;
    for (const model_block& b : m) u += stride(b.size);
    return u;
  }

  // A successful reserve that changed memory_bytes() grew the ring: check the new size, then lay
  // the model's blocks out again from offset 0 and learn the new ring's start.
  void grown(const uint8_t* p, size_t n, const write_queue::block* old_front) {
    const size_t old_cap = cap;
    const size_t now = q.memory_bytes() - retired - (m.empty() ? 0 : old_cap);
    FUZZ_CHECK(now > old_cap && now <= ring);
    const size_t u = used();
    FUZZ_CHECK(now >= u + stride(n));
    const size_t first = align8(cfg.ring_initial_bytes);
    FUZZ_CHECK(now == ring || (now & (now - 1)) == 0 || (old_cap == 0 && now == first) ||
               now == 2 * old_cap);  // doubled from a first ring that was no power of two
    if (!m.empty()) retired += old_cap;
    cap = now;
    size_t off = 0;
    for (model_block& b : m) {
      b.off = off;
      off += stride(b.size);
    }
    base = p - kRingHeader - u;
    // The block a write in flight would be reading is still there, in the retired ring.
    if (old_front != nullptr) check_block(*old_front, m.front(), false);
  }

  void reserve(size_t n) {
    const uint64_t tag = next_tag++;
    errc err = errc::ok;
    const size_t mem_before = q.memory_bytes();
    write_queue::block front{};
    if (!m.empty()) front = q.front();
    uint8_t* p = q.reserve(n, tag, &err);
    if (p != nullptr && is_static() && q.memory_bytes() != mem_before) {
      grown(p, n, m.empty() ? nullptr : &front);
    }
    if (trace) {
      std::fprintf(stderr, "reserve %zu (stride %zu) -> %s off %td\n", n, stride(n),
                   p != nullptr ? "ok" : uvbus::to_string(err),
                   p != nullptr && base != nullptr ? p - base - 16 : -1);
    }
    // What the header promises, in the order the limits are documented.
    errc want = errc::ok;
    if (!valid) {
      want = errc::invalid_argument;
    } else if (cfg.max_bytes != 0 && n > cfg.max_bytes) {
      want = errc::message_too_large;
    } else if ((cfg.max_bytes != 0 && bytes + n > cfg.max_bytes) ||
               (cfg.max_blocks != 0 && m.size() >= cfg.max_blocks)) {
      want = errc::queue_full;
    } else if (is_static() && stride(n) > ring) {
      want = errc::message_too_large;
    }
    if (want != errc::ok) {
      FUZZ_CHECK(p == nullptr && err == want);
      return;
    }
    if (!is_static()) {
      FUZZ_CHECK(p != nullptr);
    } else if (p == nullptr) {
      // Only a full ring may refuse now: justify it with the layout.
      FUZZ_CHECK(err == errc::queue_full);
      if (cap < ring) {
        FUZZ_CHECK(used() + stride(n) > ring);  // a growth would not have helped
        return;
      }
      FUZZ_CHECK(!m.empty());
      const size_t head = m.front().off;
      const size_t tail = m.back().off + stride(m.back().size);
      const bool wrapped = m.back().off < head || (m.size() > 1 && m.back().off == 0 && head != 0);
      if (wrapped) {
        FUZZ_CHECK(tail + stride(n) > head);
      } else {
        FUZZ_CHECK(tail + stride(n) > ring && stride(n) > head);
      }
      return;
    }
    FUZZ_CHECK(p != nullptr);
    size_t off = 0;
    if (is_static()) {
      if (m.empty()) {
        // An empty ring always starts over at offset 0.
        if (base == nullptr) base = p - kRingHeader;
        FUZZ_CHECK(p == base + kRingHeader);
      }
      FUZZ_CHECK(p >= base + kRingHeader);
      off = static_cast<size_t>(p - base) - kRingHeader;
      FUZZ_CHECK(off % 8 == 0);
    }
    for (size_t i = 0; i < n; ++i) p[i] = pattern(tag, i);
    m.push_back({tag, n, off});
    bytes += n;
    ++unsealed;
    can_unreserve = true;
  }

  void release() {
    q.release_retired();
    retired = 0;
  }

  // What release_storage(grown_too) must do now (the rule in the header), then the model after.
  void release_storage(bool grown_too) {
    const size_t initial = align8(std::min(std::max<size_t>(cfg.ring_initial_bytes, 64), ring));
    const bool whole = cfg.ring_initial_bytes == 0 || initial >= ring;  // the first ring is all
    const bool want =
        is_static() && m.empty() && cap != 0 && !whole && (grown_too || cap <= initial);
    if (trace) std::fprintf(stderr, "release_storage %d -> %d\n", grown_too ? 1 : 0, want ? 1 : 0);
    FUZZ_CHECK(q.release_storage(grown_too) == want);
    if (!want) return;
    cap = 0;
    retired = 0;
  }

  void pop() {
    if (trace) std::fprintf(stderr, "pop\n");
    if (m.empty()) {
      q.pop_front();  // documented as harmless on an empty queue (it returns at once)
      return;
    }
    check_block(q.front(), m.front());
    q.pop_front();
    bytes -= m.front().size;
    m.pop_front();
    unsealed = std::min(unsealed, m.size());
    if (m.empty()) can_unreserve = false;
  }

  void seal(size_t max) {
    if (trace) std::fprintf(stderr, "seal %zu\n", max);
    write_queue::block got[16];
    max %= 17;
    const size_t n = q.take_unsealed(got, max);
    FUZZ_CHECK(n == std::min(max, unsealed));
    for (size_t i = 0; i < n; ++i) check_block(got[i], m[m.size() - unsealed + i]);
    unsealed -= n;
  }

  void seal_newest() {
    q.seal_newest();
    if (unsealed == 1) unsealed = 0;
  }

  void unreserve() {
    if (!can_unreserve || m.empty()) return;
    if (trace) std::fprintf(stderr, "unreserve\n");
    q.unreserve_back();
    bytes -= m.back().size;
    m.pop_back();
    if (unsealed != 0) --unsealed;
    can_unreserve = false;
  }

  void merge(size_t cap, size_t max_block, bool pop) {
    std::unique_ptr<uint8_t[]> dst(new uint8_t[cap == 0 ? 1 : cap]);
    size_t blocks = 12345;
    size_t span = 0;
    const size_t copied = q.merge_front(dst.get(), cap, max_block, &blocks, &span);
    // The longest prefix the stop rules allow, ignoring the ring's wrap point.
    size_t most = 0;
    size_t most_bytes = 0;
    while (most < m.size() && m[most].size < max_block && most_bytes + m[most].size <= cap) {
      most_bytes += m[most].size;
      ++most;
    }
    FUZZ_CHECK(blocks <= most);
    if (!is_static()) FUZZ_CHECK(blocks == most);
    if (most > 0) FUZZ_CHECK(blocks >= 1);
    size_t at = 0;
    for (size_t i = 0; i < blocks; ++i) {
      for (size_t j = 0; j < m[i].size; ++j) FUZZ_CHECK(dst[at + j] == pattern(m[i].tag, j));
      at += m[i].size;
    }
    FUZZ_CHECK(copied == at);
    if (is_static() && blocks < most) {
      // Stopped early: only allowed at the wrap point.
      FUZZ_CHECK(m[blocks].off == 0 && m[blocks - 1].off != 0);
    }
    if (!pop) return;
    // The merge went out whole: pop it at once.
    q.pop_front_n(blocks, copied, span);
    m.erase(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(blocks));
    bytes -= copied;
    unsealed = std::min(unsealed, m.size());
    if (m.empty()) can_unreserve = false;
  }

  void visit(size_t n) {
    if (n > m.size()) n = m.size();
    size_t i = 0;
    q.for_each_front(n, [&](const write_queue::block& b) {
      FUZZ_CHECK(i < n);
      check_block(b, m[i]);
      ++i;
    });
    FUZZ_CHECK(i == n);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uvbus::fuzz::byte_reader in(data, size);
  write_queue_config cfg;
  const uint8_t flags = in.u8();
  cfg.mode = (flags & 1) != 0 ? queue_mode::dynamic : queue_mode::static_ring;
  cfg.ring_bytes = in.u16() % 4200;  // below 64 is invalid on purpose
  cfg.max_bytes = (flags & 2) != 0 ? 0 : in.u16() % 5000;
  cfg.max_blocks = (flags & 4) != 0 ? 0 : in.u8() % 48;
  // Bit 3: a ring that starts at 64 .. 8192 bytes and grows; else the whole ring at once. Bit 7:
  // any initial size instead (not a multiple of 8, below 64, above the ring).
  cfg.ring_initial_bytes = (flags & 8) != 0 ? size_t{64} << ((flags >> 4) & 7) : 0;
  if ((flags & 0x80) != 0) cfg.ring_initial_bytes = in.u16() % 5000;
  harness h(cfg);
  h.check_all();

  size_t ops = 0;
  while (!in.empty() && ops++ < 4096) {
    const uint8_t op = in.u8();
    switch (op % 8) {
      case 0:
      case 1:
      case 2: {
        const uint8_t s = in.u8();
        const size_t n = (s & 0x80) != 0 ? in.u16() % 6000 : s % 72;
        h.reserve(n);
        break;
      }
      case 3:
      case 4:
        h.pop();
        if ((op & 0x80) != 0) h.release();                          // no write in flight any more
        if ((op & 0x40) != 0) h.release_storage((op & 0x20) != 0);  // as the channel does
        break;
      case 5:
        h.unreserve();
        break;
      case 6:
        h.merge(in.u16() % 5000, (op & 0x80) != 0 ? SIZE_MAX : in.u16() % 3100, (op & 0x40) != 0);
        break;
      case 7:
        if ((op & 0xC0) == 0x80) {
          h.seal(in.u8());
        } else if ((op & 0xC0) == 0x40) {
          h.seal_newest();
        } else {
          h.visit(in.u8());
        }
        break;
    }
    h.check_all();
  }
  while (!h.m.empty()) {
    h.pop();
    h.check_all();
  }
  return 0;
}
