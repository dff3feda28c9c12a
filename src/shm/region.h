// Mapping of a region (POSIX shm, SysV segment, in-process memory or a caller's image) and the
// geometry a reader or writer validated from its header. Private to the shm component.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "shm/layout.h"
#include "uvbus/address.h"
#include "uvbus/error.h"
#include "uvbus/shm.h"

namespace uvbus::shm_detail {

enum class region_kind : uint8_t { none, posix, sysv, mem, image };

struct mem_block;  // an in-process region (mem://), shared by the reader and writers

struct mapping {
  region_kind kind = region_kind::none;
  void* base = nullptr;
  size_t size = 0;
  int fd = -1;     // posix: kept open, the reader holds flock(LOCK_EX) on it for its lifetime
  int shmid = -1;  // sysv
  std::string name;
  std::shared_ptr<mem_block> mem;
  bool huge = false;
};

// Geometry copied out of a validated header. Readers and writers use only these local copies,
// never the shared fields again, so a region rewritten under them cannot push an index out of
// bounds.
struct geometry {
  region_header* hdr = nullptr;
  head_word* heads = nullptr;
  uint8_t* data = nullptr;
  uint64_t nodes = 0;  // power of two
  uint64_t mask = 0;
  uint32_t node_size = 0;
  uint32_t node_shift = 0;
  uint32_t max_record = 0;
  uint32_t version = 0;  // the region's layout version: which payload_hash its records carry

  head_word* head(uint64_t pos) const noexcept { return heads + (pos & mask); }
  uint8_t* node(uint64_t pos) const noexcept { return data + ((pos & mask) << node_shift); }
  uint64_t nodes_for(uint64_t len) const noexcept {
    return (len + kRecordHeaderSize + node_size - 1) >> node_shift;
  }
};

// Bytes of a region with this ring: header, heads, data.
constexpr uint64_t region_bytes(uint64_t ring_bytes, uint32_t node_size) noexcept {
  return kHeaderSize + ring_bytes / node_size * sizeof(head_word) + ring_bytes;
}

// Whether an object of `size` bytes could be a region some config made (region_bytes of a
// power-of-two node size in [64, 4096] and a power-of-two count of at least 16 nodes): an object
// with a zero header is a creator's unpublished region only then, else someone else's.
bool possible_region_size(uint64_t size) noexcept;

// Checks every field of a header against the mapped size; fills *g on success.
// Errors: not_connected (magic still 0: the reader is formatting it), bad_layout. On an error
// *why (if given) points to a static text saying which field was wrong.
errc validate_header(void* base, size_t mapped, geometry* g, const char** why = nullptr) noexcept;
// ok, or bad_layout with *why naming the writer option (expect_*) the region does not meet.
errc check_writer_options(const geometry& g, const shm_writer_options& opt, const char** why);

// Formats a fresh header in [base, base+size) for cfg (magic published last, with release).
void format_header(void* base, const shm_config& cfg, uint32_t flags, bool owned) noexcept;

// What create_region did with an existing name (or why it refused it).
struct open_outcome {
  bool reattached = false;  // a compatible region left by a dead or detached reader: kept
  std::string detail;       // bad_layout: the field that differs, the region's and cfg's values
  std::string why;          // another error's own detail (no_memory: no room in /dev/shm)
};

// Backs every page of a POSIX object of `size` bytes now. On tmpfs ftruncate only records a size
// and pages are allocated on first touch: without this, a /dev/shm with less room than the region
// (Docker's default is 64 MiB) would accept it and then raise SIGBUS in whichever process first
// touches a page past the room. base: the object's mapping advised MADV_HUGEPAGE, reserved through
// it (fallocate follows no mapping's advice: on a /dev/shm mounted huge=advise it would allocate
// small pages, which the mapping's faults then find), by fallocate where the kernel cannot. ok,
// or no_memory (no room) / the errno's code, *why saying which. A filesystem without fallocate
// (EOPNOTSUPP, ENOSYS) cannot reserve: ok, its pages come on first touch (docs/shm.md).
errc reserve_pages(int fd, uint8_t* base, size_t size, std::string* why);

// Creates a region named by addr (reader), or reattaches an existing one whose reader is dead or
// detached when its layout is compatible with cfg (claim_region done: the caller owns it). See
// shm_reader::open for the error contracts. With cfg.must_exist nothing is created: not_found.
errc create_region(const address& addr, const shm_config& cfg, mapping* out, open_outcome* how);
// Attaches to an existing region (writer, inspector). The POSIX fd stays open (region_removed).
errc attach_region(const address& addr, mapping* out);
// A writer's check of an attached POSIX object (m.size: its size when attached) against the size
// its published header announces: "" if the object holds it (or it is no POSIX object, or no
// published header), else a detail naming both: another process cut the object short, and the
// first touch past its end would be a SIGBUS. A grown object is accepted (as a reader does).
std::string object_size_mismatch(const mapping& m);
// "" if the region header h (mapped bytes) can be reattached by a reader asking for cfg; else
// "its <field> is <region's>, this reader asks for <cfg's>".
std::string layout_mismatch(const region_header* h, uint64_t mapped, const shm_config& cfg);
// "its cursors are inconsistent (read_pos .., consumed_pos .., write_pos .., N nodes)".
std::string cursors_inconsistent(uint64_t rp, uint64_t cp, uint64_t wp, uint64_t nodes);
// Advances write_pos, as a writer's reserve() helps, past every record claimed at it whose writer
// has not advanced it (died between its claim and its advance), until it reaches `upto` or finds
// nothing claimed. Returns write_pos then. Safe at any time: it is the writers' own protocol.
uint64_t help_write_pos(const geometry& g, uint64_t upto) noexcept;
// Takes the reader role of a reattached region: owner pid and start time, incarnation + 1, state
// open (release).
void claim_region(region_header* h) noexcept;
// True once the region's name is gone (shm_unlink'ed, IPC_RMID'ed, mem registry entry removed),
// so a writer knows its records can never be read. One syscall (POSIX/SysV) or a mutex (mem).
bool region_removed(const mapping& m) noexcept;
bool mem_entry_removed(const mapping& m) noexcept;  // the mem:// part of region_removed
// Marks a region closed for good and removes its name (uvbus_shm_inspect --remove). Refuses
// (busy) a region with a live reader and (bad_layout) an object that is not a uvbus region,
// unless force. *detail says why.
errc remove_region(const address& addr, bool force, std::string* detail);
// An address given to open() directly (not parsed from a URL) must name what parse_address would
// give: for shm:// and mem:// a SysV key 1..0xffffffff, or a name that is not empty, has no NUL
// and no '/', is at most 200 bytes and is not "." or "..". Else bad_url, *why saying what.
errc check_address(const address& addr, std::string* why);
// last_error() detail of a failed open: "call(url): what was wrong" (why, or the code's meaning).
std::string open_error_detail(const char* call, const std::string& url, errc e, const char* why);
// Unmaps; the reader also removes the name (remove = true).
void release_region(mapping* m, bool remove) noexcept;

// Reader liveness as seen from another process: state open and owner pid alive with the same
// process start time (start time is checked only when check_start is true: it reads /proc).
bool reader_alive(const region_header* h, region_kind kind, bool check_start) noexcept;

uint64_t process_start_time(uint32_t pid) noexcept;  // 0 if unknown
// The claim word of this process (region_header::claim: pid << 32 | low 32 bits of its start
// time), and whether a word names a process that still lives (an unknown start time counts as
// alive: a reader is never taken over on a guess).
uint64_t own_claim() noexcept;
bool claim_held(uint64_t word) noexcept;
// Hands a region this reader owns to the next one (close with keep): claim cleared, then state
// detached (release), so a reader that sees "detached" finds the claim free or newly taken.
void detach_region(region_header* h) noexcept;
uint64_t mono_ns() noexcept;

// Futex on a 32-bit word that may live in shared memory (never the PRIVATE flag).
void futex_wake(std::atomic<uint32_t>* word, int count) noexcept;
// Waits while *word == expected, at most timeout_ns (0 = forever). Returns on wake, mismatch,
// timeout or signal.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) noexcept;

}  // namespace uvbus::shm_detail
