// The shared-memory region layout: an ABI between processes that may have been built at different
// times. Every offset and size below is fixed by static_assert; changing any of them requires a
// new kVersion. docs/shm.md has the same table in prose.
//
//   [0, 4096)                       region_header (cache-line separated groups, see below)
//   [4096, 4096 + 8*N)              heads: one 64-bit ctl word per node (std::atomic<uint64_t>)
//   [4096 + 8*N, ... + N*node_size) data: N nodes of node_size bytes (N, node_size powers of two)
//
// A record starts at a node boundary and occupies nodes_for(len) consecutive nodes; its data is an
// 8-byte prefix {u32 len, u32 checksum} followed by the payload, contiguous, so the reader can hand
// out a pointer into the ring. It never wraps: a writer that would cross the end of the ring first
// claims the rest of the lap as a PAD record. Only the head of a record's first node is used.
//
// A batch (shm_writer::send_batch, state kBatch) is one reservation holding several messages: its
// prefix is {u32 body_len, u32 item_count} and its body is a sequence of items, each
// {u32 len, u32 checksum} + payload padded to a multiple of 8 bytes (so every payload the reader
// hands out stays 8-byte aligned). It is claimed, committed, abandoned and released as one unit;
// every item carries its own checksum (batch_item_checksum) and is verified on its own.
//
// The ctl words live apart from the data on purpose: writers CAS the head of the node at their
// write position, and a writer delayed for a whole lap may load or CAS (and fail) the head of a
// node that is by then in the middle of a newer record. Were heads inside the data, that access
// would race with the newer record's payload bytes; in their own array they only ever meet other
// atomic accesses.
//
// Positions (write_pos, read_pos, consumed_pos) count nodes since creation and never wrap in
// practice (2^64); a node's index is pos & (N - 1). Heads carry only a 40-bit stamp of a position
// (pos mod 2^40, which wraps every 2^40 nodes: about 3 hours at 7 GB/s in 64-byte nodes); see
// ctl_span for why the ring does not depend on stamps being unique.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/crc32c.h"
#include "core/murmur3.h"

namespace uvbus::shm_detail {

inline constexpr uint64_t kMagic = 0x4d48535355425655ull;  // "UVBUSSHM" in little-endian bytes
// 2: kBatch records; 3: persistent consumed cursor; 4: CRC-32C record checksums (payload_hash).
// New regions are kVersion unless shm_config::layout_version asks for an older one; regions of
// every version from kOldestVersion on are attached, read and written, each with its own checksum.
inline constexpr uint32_t kVersion = 4;
inline constexpr uint32_t kOldestVersion = 3;
inline constexpr uint32_t kHeaderSize = 4096;
inline constexpr uint32_t kRecordHeaderSize = 8;  // the {len, checksum} prefix in the data
inline constexpr uint32_t kMinNodeSize = 64;
inline constexpr uint32_t kMaxNodeSize = 4096;
inline constexpr uint64_t kMinNodes = 16;
inline constexpr uint64_t kMaxRecordNodes = 0xffff;  // the ctl word's 16-bit node count

// reader_state values. A region whose reader is gone but whose state still says kReaderOpen has a
// dead reader (its flock / owner pid is gone); both it and kReaderDetached are reattached by the
// next reader with a compatible config, and writers keep committing into them meanwhile.
inline constexpr uint32_t kReaderInit = 0;
inline constexpr uint32_t kReaderOpen = 1;
inline constexpr uint32_t kReaderClosed = 2;    // closed for good: the name is being removed
inline constexpr uint32_t kReaderDetached = 3;  // closed with shm_close_mode::keep: will come back

// header flags
inline constexpr uint32_t kFlagHugePages = 1;
inline constexpr uint32_t kFlagSysV = 2;
inline constexpr uint32_t kFlagMem = 4;

struct region_header {
  // ---- line 0: immutable once `magic` is published (release) by the creating reader.
  std::atomic<uint64_t> magic;  // kMagic; 0 while the reader is still formatting the region
  uint32_t version;             // kVersion
  uint32_t header_size;         // kHeaderSize
  uint64_t region_size;         // header_size + 8 * node_count + ring_bytes
  uint64_t ring_bytes;          // node_count * node_size
  uint32_t node_size;
  uint32_t record_header_size;  // kRecordHeaderSize (the data prefix)
  uint32_t max_record_size;
  uint32_t abandon_timeout_us;      // the reader's, for tools
  std::atomic<uint32_t> owner_pid;  // the reader's process (rewritten by a reattaching reader)
  uint32_t flags;
  std::atomic<uint64_t> owner_start_time;  // /proc/<pid>/stat starttime: guards pid reuse
  // ---- line 1: reader liveness and the persistent delivery cursor, written by the reader only.
  std::atomic<uint32_t> reader_state;        // kReaderOpen / kReaderClosed / kReaderDetached
  std::atomic<uint32_t> reader_incarnation;  // 1 at creation, +1 at every reattach
  uint64_t created_unix_ns;
  // Who holds the region or is taking it: pid << 32 | the low 32 bits of its start time; 0 when
  // free (a reader that closes with keep clears it). A SysV reattach wins only by CASing it from a
  // word whose process is gone, so the claim and what it is judged by are one word (see
  // region.cpp, sysv_existing). In what was padding (zero in regions of builds before it, which
  // neither write nor read it): no version change.
  std::atomic<uint64_t> claim;
  uint8_t pad1[40];
  // ---- line 2: the reservation cursor, CASed by writers (and advanced by helping writers).
  std::atomic<uint64_t> write_pos;
  uint8_t pad2[56];
  // ---- line 3: the release cursor, stored by the reader only; writers load it only when their
  // cached copy says the ring is full.
  std::atomic<uint64_t> read_pos;
  uint8_t pad3[56];
  // ---- line 4: the futex word (1 = the reader is asleep or about to be). Writers load it after
  // every commit, so it must not share a line with anything written often.
  std::atomic<uint32_t> reader_sleeping;
  uint8_t pad4[60];
  // ---- line 5: writer-side counters, added to in batches (every 1024 sends and at close).
  std::atomic<uint64_t> records_written;
  std::atomic<uint64_t> bytes_written;
  std::atomic<uint64_t> queue_full;
  std::atomic<uint64_t> writer_abandoned;
  std::atomic<uint64_t> wakeups;
  // Messages a coalescing writer's send() accepted (ok) that never reached the ring: the region
  // was removed, or close() (or the destructor) could not publish the stage. In what was padding
  // (zero in every region; builds before it neither write nor show it): no version change.
  std::atomic<uint64_t> staged_dropped;
  uint8_t pad5[16];
  // ---- line 6: reader-side counters, stored by the reader after each drain.
  std::atomic<uint64_t> records_read;
  std::atomic<uint64_t> bytes_read;
  std::atomic<uint64_t> abandoned;
  std::atomic<uint64_t> checksum_failures;
  std::atomic<uint64_t> corrupt;
  std::atomic<uint64_t> batches;
  uint8_t pad6[16];
  // ---- line 7: the consumed cursor, stored by the reader after every callback batch (its own
  // line: writers load reader_state on every send and must not miss on it because of this).
  // Every record before consumed_pos was handed to a records callback that returned; if
  // consumed_batch_pos == consumed_pos, so were the items of the batch at consumed_pos whose body
  // offset is below consumed_batch_off. Stored before read_pos (line 3), which may trail it
  // (records held after a skip). A reattaching reader resumes from max(consumed_pos, read_pos):
  // builds before that order could leave it behind read_pos, and every record before read_pos was
  // consumed too.
  std::atomic<uint64_t> consumed_pos;
  std::atomic<uint64_t> consumed_batch_pos;
  std::atomic<uint64_t> consumed_batch_off;
  uint8_t pad7[40];
  // ---- rest of the page: reserved (zero).
  uint8_t reserved[kHeaderSize - 512];
};

// The prefix at the start of a record's first data node (plain memory: written by the writer
// before its commit CAS (release), read by the reader after its acquire load of the head).
//   len      payload bytes
//   checksum record_checksum(version, payload, len, position): payload_hash ^ mix(pos)
struct record_prefix {
  uint32_t len;
  uint32_t checksum;
};

// The head (ctl word) of a node:
//   bits 0-7 state, bits 8-23 node count, bits 24-63 stamp = position mod 2^40.
// One word so that claiming a node (stale value -> WRITING of this position), committing
// (WRITING -> COMMITTED) and skipping (WRITING -> ABANDONED) are single CASes. A stale head from
// an earlier lap carries another stamp, unless no record started at its node for exactly a
// multiple of 2^40 positions (see ctl_span: writers and reader then agree to step over it).
using head_word = std::atomic<uint64_t>;

// What format_header stores in every head (all versions, all builds). It is not a value any
// writer stores (state 0xff), but its stamp field reads as 2^40 - 1: at every position
// k * 2^40 - 1, whose index is N - 1 (N divides 2^40), a head never claimed since the region was
// formatted matches the position. ctl_span steps over it by one node on both sides.
inline constexpr uint64_t kHeadFormatted = ~uint64_t{0};

enum rec_state : uint32_t {
  kWriting = 1,       // claimed by a writer, payload being copied
  kCommitted = 2,     // complete, checksum stored
  kPad = 3,           // filler to the end of the lap (node count field unused)
  kAbandoned = 4,     // skipped by the reader (the writer did not commit in time)
  kAbandonedAck = 5,  // the writer saw kAbandoned at commit and no longer touches the nodes
  kBatch = 6,         // complete batch of several messages (see the batch layout above)
};

// Bytes one message of `len` bytes takes in a batch body: its {len, checksum} prefix and the
// payload padded to 8.
constexpr uint64_t batch_item_bytes(uint64_t len) noexcept {
  return kRecordHeaderSize + ((len + 7) & ~uint64_t{7});
}

inline constexpr uint64_t kStampBits = 40;
inline constexpr uint64_t kStampMask = (uint64_t{1} << kStampBits) - 1;

constexpr uint64_t make_ctl(uint64_t pos, uint64_t nodes, uint32_t state) noexcept {
  return ((pos & kStampMask) << 24) | ((nodes & 0xffff) << 8) | state;
}
constexpr uint32_t ctl_state(uint64_t c) noexcept {
  return static_cast<uint32_t>(c & 0xff);
}
constexpr uint64_t ctl_nodes(uint64_t c) noexcept {
  return (c >> 8) & 0xffff;
}
constexpr bool ctl_is(uint64_t c, uint64_t pos) noexcept {
  return (c >> 24) == (pos & kStampMask);
}

// The nodes a head c stamped with the position of node `idx` covers: how far the reader steps
// over it (read_head) and how far writers help write_pos over it (reserve, help_write_pos). PAD:
// the rest of the lap; otherwise its node count, bounded as the reader bounds it: 0 steps one
// node, a count past the end of the lap steps to the lap's end. Always in [1, nodes - idx].
//
// Why both sides must use this one function: a stamp is only 40 bits, so a head that matches the
// position is not always a claim of this lap. It may be kHeadFormatted at a position
// k * 2^40 - 1, or a record's head left from exactly k * 2^40 positions ago (no record started at
// that node since). Writers cannot tell either from a claim whose writer has not advanced
// write_pos yet, so they help write_pos over it; the reader treats it as a record (its checksum
// is mixed with the full 64-bit position, so an old record never verifies: position_mix(p) and
// position_mix(p + k * 2^40) always differ). Neither harms the ring as long as writers and reader
// step over exactly the same nodes: no writer claims a position whose head matches it, nobody
// writes into the nodes stepped over, and the next record starts at the same position for both.
// Builds before this function helped by the raw node count (0xffff for kHeadFormatted) while the
// reader stepped one node: write_pos ran 65535 nodes ahead of a reader that then waited for ever.
constexpr uint64_t ctl_span(uint64_t c, uint64_t idx, uint64_t nodes) noexcept {
  const uint64_t n = (c >> 8) & 0xffff;
  if ((c & 0xff) == kPad || idx + n > nodes) return nodes - idx;
  return n == 0 ? 1 : n;
}

inline uint32_t record_seed(uint64_t pos) noexcept {
  return static_cast<uint32_t>(pos);
}

// The record checksum: a hash of the payload, xor a mix of the record's position, so that a stale
// record of an earlier lap never verifies at a new position. The payload hash depends on the
// region's layout version:
//   4: CRC-32C (core/crc32c.h). With the SSE4.2 kernel about 2.2x the speed of version 3's hash
//      on 8 KiB records (18 against 8 GB/s), and even on 128 B; for a 32-bit check a CRC is also
//      the better code (every burst of up to 32 flipped bits is caught).
//   3: the low 32 bits of MurmurHash3_x64_128(payload, len, seed 0): what every earlier build
//      writes and checks, kept for regions created by them (an inbox kept across a hot upgrade).
// The payload part does not depend on the position, so a writer can hash its source buffer
// before it reserves nodes, which keeps the reserve-to-commit window (the window in which a
// preempted writer holds up the reader) down to a memcpy.
inline uint32_t payload_hash(uint32_t version, const void* payload, size_t len) noexcept {
  if (version >= 4) return crc32c(payload, len);
  return murmur3_x64_128_low32(payload, len, 0);  // inline: see core/murmur3.h
}
constexpr uint32_t position_mix(uint64_t pos) noexcept {
  return static_cast<uint32_t>((pos * 0x9E3779B97F4A7C15ull) >> 32);
}
inline uint32_t record_checksum(uint32_t version, const void* payload, size_t len,
                                uint64_t pos) noexcept {
  return payload_hash(version, payload, len) ^ position_mix(pos);
}
// An item of a batch at byte offset `off` of the body of the batch at position `pos`: the same
// payload hash, mixed with both, so an item moved to another offset never verifies either.
constexpr uint32_t item_mix(uint64_t pos, uint64_t off) noexcept {
  return position_mix(pos) ^ static_cast<uint32_t>((off + 1) * 0x85EBCA77u);
}
inline uint32_t batch_item_checksum(uint32_t version, const void* payload, size_t len, uint64_t pos,
                                    uint64_t off) noexcept {
  return payload_hash(version, payload, len) ^ item_mix(pos, off);
}

// ABI checks: these are the offsets documented in docs/shm.md.
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && alignof(std::atomic<uint64_t>) == 8, "");
static_assert(sizeof(std::atomic<uint32_t>) == 4 && alignof(std::atomic<uint32_t>) == 4, "");
static_assert(std::is_standard_layout<region_header>::value, "");
static_assert(sizeof(region_header) == kHeaderSize, "header is one page");
static_assert(offsetof(region_header, magic) == 0, "");
static_assert(offsetof(region_header, version) == 8, "");
static_assert(offsetof(region_header, header_size) == 12, "");
static_assert(offsetof(region_header, region_size) == 16, "");
static_assert(offsetof(region_header, ring_bytes) == 24, "");
static_assert(offsetof(region_header, node_size) == 32, "");
static_assert(offsetof(region_header, record_header_size) == 36, "");
static_assert(offsetof(region_header, max_record_size) == 40, "");
static_assert(offsetof(region_header, abandon_timeout_us) == 44, "");
static_assert(offsetof(region_header, owner_pid) == 48, "");
static_assert(offsetof(region_header, flags) == 52, "");
static_assert(offsetof(region_header, owner_start_time) == 56, "");
static_assert(offsetof(region_header, reader_state) == 64, "");
static_assert(offsetof(region_header, reader_incarnation) == 68, "");
static_assert(offsetof(region_header, created_unix_ns) == 72, "");
static_assert(offsetof(region_header, claim) == 80, "");

static_assert(offsetof(region_header, write_pos) == 128, "own cache line");
static_assert(offsetof(region_header, read_pos) == 192, "own cache line");
static_assert(offsetof(region_header, reader_sleeping) == 256, "own cache line");
static_assert(offsetof(region_header, records_written) == 320, "");
static_assert(offsetof(region_header, wakeups) == 352, "");
static_assert(offsetof(region_header, staged_dropped) == 360, "");
static_assert(offsetof(region_header, records_read) == 384, "");
static_assert(offsetof(region_header, batches) == 424, "");
static_assert(offsetof(region_header, consumed_pos) == 448, "own cache line");
static_assert(offsetof(region_header, consumed_batch_pos) == 456, "");
static_assert(offsetof(region_header, consumed_batch_off) == 464, "");
static_assert(offsetof(region_header, reserved) == 512, "");
static_assert(sizeof(record_prefix) == kRecordHeaderSize, "");
static_assert(sizeof(head_word) == 8, "");
static_assert(kBatch == 6 && batch_item_bytes(0) == 8 && batch_item_bytes(1) == 16, "ABI");
static_assert(ctl_is(kHeadFormatted, kStampMask) && !ctl_is(kHeadFormatted, kStampMask + 1), "");
static_assert(ctl_span(kHeadFormatted, 15, 16) == 1 &&
                  ctl_span(make_ctl(3, 0, kPad), 3, 16) == 13 &&
                  ctl_span(make_ctl(3, 0, kCommitted), 3, 16) == 1 &&
                  ctl_span(make_ctl(3, 14, kWriting), 3, 16) == 13 &&
                  ctl_span(make_ctl(3, 13, kBatch), 3, 16) == 13,
              "the reader's bounds");

}  // namespace uvbus::shm_detail
