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

// Checks every field of a header against the mapped size; fills *g on success.
// Errors: not_connected (magic still 0: the reader is formatting it), bad_layout. On an error
// *why (if given) points to a static text saying which field was wrong.
errc validate_header(void* base, size_t mapped, geometry* g, const char** why = nullptr) noexcept;

// Formats a fresh header in [base, base+size) for cfg (magic published last, with release).
void format_header(void* base, const shm_config& cfg, uint32_t flags, bool owned) noexcept;

// Creates (reader) or attaches (writer) a region named by addr. See shm_reader::open /
// shm_writer::open for the error contracts.
errc create_region(const address& addr, const shm_config& cfg, mapping* out);
errc attach_region(const address& addr, mapping* out);
// last_error() detail of a failed open: "call(url): what was wrong" (why, or the code's meaning).
std::string open_error_detail(const char* call, const std::string& url, errc e, const char* why);
// Unmaps; the reader also removes the name (remove = true).
void release_region(mapping* m, bool remove) noexcept;

// Reader liveness as seen from another process: state open and owner pid alive with the same
// process start time (start time is checked only when check_start is true: it reads /proc).
bool reader_alive(const region_header* h, region_kind kind, bool check_start) noexcept;

uint64_t process_start_time(uint32_t pid) noexcept;  // 0 if unknown
uint64_t mono_ns() noexcept;

// Futex on a 32-bit word that may live in shared memory (never the PRIVATE flag).
void futex_wake(std::atomic<uint32_t>* word, int count) noexcept;
// Waits while *word == expected, at most timeout_ns (0 = forever). Returns on wake, mismatch,
// timeout or signal.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) noexcept;

}  // namespace uvbus::shm_detail
