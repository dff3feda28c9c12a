// Persistent regions: whether an existing region can be reattached, taking the reader role of
// one, and noticing and performing the removal of its name.
#include <algorithm>
#include <cerrno>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/region.h"

namespace uvbus::shm_detail {

namespace {
std::string differs(const std::string& field, uint64_t region, uint64_t wanted) {
  return "its " + field + " is " + std::to_string(region) + ", this reader asks for " +
         std::to_string(wanted);
}
}  // namespace

std::string cursors_inconsistent(uint64_t rp, uint64_t cp, uint64_t wp, uint64_t nodes) {
  return "its cursors are inconsistent (read_pos " + std::to_string(rp) + ", consumed_pos " +
         std::to_string(cp) + ", write_pos " + std::to_string(wp) + ", " + std::to_string(nodes) +
         " nodes)";
}

uint64_t help_write_pos(const geometry& g, uint64_t upto) noexcept {
  region_header* h = g.hdr;
  uint64_t w = h->write_pos.load(std::memory_order_acquire);
  // Bounded: every step either stops or moves write_pos (ours or another writer's CAS).
  for (uint64_t step = 0; w < upto && step < g.nodes; ++step) {
    const uint64_t c = g.head(w)->load(std::memory_order_acquire);
    if (!ctl_is(c, w)) break;  // nothing claimed at w: write_pos is where it belongs
    const uint64_t n = ctl_span(c, w & g.mask, g.nodes);  // as reserve() helps
    const uint64_t rp = h->read_pos.load(std::memory_order_acquire);
    if (w + n - rp > g.nodes && rp <= w) break;  // as reserve() helps: never past a ring
    if (h->write_pos.compare_exchange_strong(w, w + n, std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
      w += n;
    }
  }
  return h->write_pos.load(std::memory_order_acquire);
}

std::string layout_mismatch(const region_header* h, uint64_t mapped, const shm_config& cfg) {
  // Any version this build reads: a reattached region keeps its own (layout_version is only for
  // regions this reader creates), so an inbox kept across an upgrade is drained as it was written.
  if (h->version < kOldestVersion || h->version > kVersion) {
    return "its layout version is " + std::to_string(h->version) + ", this build reads " +
           std::to_string(kOldestVersion) + " to " + std::to_string(kVersion);
  }
  if (h->header_size != kHeaderSize) return differs("header_size", h->header_size, kHeaderSize);
  if (h->record_header_size != kRecordHeaderSize) {
    return differs("record_header_size", h->record_header_size, kRecordHeaderSize);
  }
  if (h->node_size != cfg.node_size) {
    return differs("node_size (shm_config.node_size)", h->node_size, cfg.node_size);
  }
  if (h->ring_bytes != cfg.ring_bytes) {
    return differs("ring_bytes (shm_config.ring_bytes)", h->ring_bytes, cfg.ring_bytes);
  }
  if (h->max_record_size != cfg.max_record_size) {
    return differs("max_record_size (shm_config.max_record_size)", h->max_record_size,
                   cfg.max_record_size);
  }
  const uint64_t want = region_bytes(cfg.ring_bytes, cfg.node_size);
  if (h->region_size != want || mapped < want) {
    return differs("region_size (mapped " + std::to_string(mapped) + ")", h->region_size, want);
  }
  // The cursors, in every state this protocol leaves when a process dies at any instruction:
  //  - consumed_pos may trail read_pos: builds before the consumed-first order stored read_pos
  //    first, and a reader killed between the two stores left it so. Every record before read_pos
  //    was consumed too, so the reader resumes at max(read_pos, consumed_pos)
  //    (ring_reader::resume).
  //  - that resume position and read_pos may pass write_pos by one claim whose writer died
  //    between its claim and its write_pos advance while no other writer sent (the reader
  //    skipped it as abandoned). resume() helps write_pos past it, as writers do, and checks the
  //    cursors again against the heads.
  // All within one ring. write_pos only grows (writers may keep committing while we look), so it
  // is loaded last.
  const uint64_t rp = h->read_pos.load(std::memory_order_acquire);
  const uint64_t cp = h->consumed_pos.load(std::memory_order_acquire);
  const uint64_t wp = h->write_pos.load(std::memory_order_acquire);
  const uint64_t nodes = cfg.ring_bytes / cfg.node_size;
  const uint64_t from = std::max(rp, cp);
  const auto apart = [](uint64_t a, uint64_t b) { return a > b ? a - b : b - a; };
  if (from - rp > nodes || apart(wp, rp) > nodes || apart(wp, from) > nodes) {
    return cursors_inconsistent(rp, cp, wp, nodes);
  }
  return {};
}

void claim_region(region_header* h) noexcept {
  const auto pid = static_cast<uint32_t>(::getpid());
  h->owner_pid.store(pid, std::memory_order_relaxed);
  h->owner_start_time.store(process_start_time(pid), std::memory_order_relaxed);
  h->claim.store(own_claim(), std::memory_order_relaxed);  // SysV: already CASed to this
  h->reader_incarnation.fetch_add(1, std::memory_order_relaxed);
  // The new reader polls on start; a 1 left by the dead one would only cost writers a wake-up.
  h->reader_sleeping.store(0, std::memory_order_relaxed);
  // release: a writer or inspector that sees "open" sees the new owner.
  h->reader_state.store(kReaderOpen, std::memory_order_release);
}

bool region_removed(const mapping& m) noexcept {
  switch (m.kind) {
    case region_kind::posix: {
      struct stat st {};
      return m.fd >= 0 && ::fstat(m.fd, &st) == 0 && st.st_nlink == 0;
    }
    case region_kind::sysv: {
      shmid_ds ds{};
      if (::shmctl(m.shmid, IPC_STAT, &ds) != 0) return errno == EINVAL || errno == EIDRM;
      return (ds.shm_perm.mode & SHM_DEST) != 0;
    }
    case region_kind::mem:
      return mem_entry_removed(m);
    case region_kind::image:
    case region_kind::none:
      break;
  }
  return false;
}

namespace {
// Whether a live reader owns the mapped region. POSIX: its flock (authoritative; on success we
// keep holding it, so no reader can reattach while we remove the name). Others: the header.
bool live_reader(mapping* m, const region_header* h) {
  if (m->kind == region_kind::posix) return ::flock(m->fd, LOCK_EX | LOCK_NB) != 0;
  return reader_alive(h, m->kind, true);
}
}  // namespace

errc remove_region(const address& addr, bool force, std::string* detail) {
  mapping m;
  if (const errc e = attach_region(addr, &m); e != errc::ok) {
    *detail = "cannot open it: " + std::string(to_string(e));
    return e;
  }
  auto* h = m.size >= kHeaderSize ? static_cast<region_header*>(m.base) : nullptr;
  const bool ours = h != nullptr && h->magic.load(std::memory_order_acquire) == kMagic;
  if (!ours && !force) {
    *detail = "not a (finished) uvbus region: --force removes it anyway";
    release_region(&m, false);
    return errc::bad_layout;
  }
  if (ours && live_reader(&m, h) && !force) {
    *detail = "a live reader (pid " + std::to_string(h->owner_pid.load()) +
              ") owns it: close that reader, or --force removes the name under it";
    release_region(&m, false);
    return errc::busy;
  }
  // Writers see "closed for good" (not_connected) even before they notice the name is gone.
  if (ours) h->reader_state.store(kReaderClosed, std::memory_order_release);
  release_region(&m, true);
  *detail = "removed";
  return errc::ok;
}

}  // namespace uvbus::shm_detail
