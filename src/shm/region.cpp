// Regions: creating, reattaching, attaching, validating, releasing; liveness and the futex.
#include "shm/region.h"

#include "core/murmur3.h"
#include "shm/test_hook.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <new>

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <csignal>

namespace uvbus::shm_detail {

// An in-process region: the reader and every writer hold a reference, so memory stays valid for a
// writer that still sends after the reader closed (it then sees reader_state closed).
struct mem_block {
  void* p = nullptr;
  size_t size = 0;
  ~mem_block() { std::free(p); }
};

namespace {

// shmat()'s error value, (void*)-1.
void* shmat_failed() noexcept {
  return reinterpret_cast<void*>(-1);  // NOLINT(performance-no-int-to-ptr)
}

std::mutex& mem_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::shared_ptr<mem_block>>& mem_registry() {
  static auto* r = new std::map<std::string, std::shared_ptr<mem_block>>();  // never destroyed:
  return *r;  // writers in other threads may outlive static destruction order
}

bool is_pow2(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

uint32_t log2u(uint64_t v) {
  return static_cast<uint32_t>(63 - __builtin_clzll(v));
}

// region_access::set_claim_hook (tests only): the user word is stored before the hook (release).
std::atomic<void (*)(void*)> g_claim_hook{nullptr};
void* g_claim_hook_user = nullptr;
// region_access::set_create_hook (tests only), the same way.
std::atomic<void (*)(void*)> g_create_hook{nullptr};
void* g_create_hook_user = nullptr;

}  // namespace

uint64_t mono_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t process_start_time(uint32_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Field 2 (comm) may contain spaces and parentheses: parse after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  ++p;
  // Fields 3.. follow; starttime is field 22, i.e. the 20th after the ')'.
  for (int field = 3; field < 22 && *p != 0; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != 0) ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

bool reader_alive(const region_header* h, region_kind kind, bool check_start) noexcept {
  if (const_cast<region_header*>(h)->reader_state.load(std::memory_order_acquire) != kReaderOpen) {
    return false;
  }
  if (kind == region_kind::mem || kind == region_kind::image) return true;
  const uint32_t pid = h->owner_pid.load(std::memory_order_relaxed);
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  if (check_start) {
    const uint64_t st = process_start_time(pid);
    const uint64_t own = h->owner_start_time.load(std::memory_order_relaxed);
    if (st != 0 && own != 0 && st != own) return false;
  }
  return true;
}

uint64_t own_claim() noexcept {
  const auto pid = static_cast<uint32_t>(::getpid());
  return uint64_t{pid} << 32 | static_cast<uint32_t>(process_start_time(pid));
}

bool claim_held(uint64_t word) noexcept {
  const auto pid = static_cast<uint32_t>(word >> 32);
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  const uint64_t st = process_start_time(pid);
  return st == 0 || static_cast<uint32_t>(st) == static_cast<uint32_t>(word);
}

void detach_region(region_header* h) noexcept {
  h->claim.store(0, std::memory_order_relaxed);
  h->reader_state.store(kReaderDetached, std::memory_order_release);
}

void futex_wake(std::atomic<uint32_t>* word, int count) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) noexcept {
  timespec ts{};
  timespec* tp = nullptr;
  if (timeout_ns != 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000ull);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000ull);
    tp = &ts;
  }
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, tp, nullptr, 0);
}

bool possible_region_size(uint64_t size) noexcept {
  if (size <= kHeaderSize) return false;
  for (uint64_t ns = kMinNodeSize; ns <= kMaxNodeSize; ns *= 2) {
    const uint64_t rest = size - kHeaderSize;
    const uint64_t n = rest / (ns + sizeof(head_word));
    if (rest % (ns + sizeof(head_word)) == 0 && is_pow2(n) && n >= kMinNodes) return true;
  }
  return false;
}

errc validate_header(void* base, size_t mapped, geometry* g, const char** why) noexcept {
  const char* unused = nullptr;
  const char*& w = why != nullptr ? *why : unused;
  if (base == nullptr || mapped < kHeaderSize) {
    w = "the mapping is smaller than the 4096-byte region header";
    return errc::bad_layout;
  }
  auto* h = static_cast<region_header*>(base);
  const uint64_t magic = h->magic.load(std::memory_order_acquire);
  if (magic == 0) {
    w = "the header's magic is still 0: its reader has not finished creating the region";
    return errc::not_connected;
  }
  if (magic != kMagic) {
    w = "the header's magic is not \"UVBUSSHM\": not a uvbus region";
    return errc::bad_layout;
  }
  // Everything below was written before magic was published (release), so the acquire above
  // makes it visible; it is copied into *g and never read from the region again.
  if (h->version < kOldestVersion || h->version > kVersion || h->header_size != kHeaderSize ||
      h->record_header_size != kRecordHeaderSize) {
    w = "header version, header_size or record_header_size differ from this build's (version 3 "
        "or 4, 4096, 8)";
    return errc::bad_layout;
  }
  const uint32_t ns = h->node_size;
  const uint64_t ring = h->ring_bytes;
  if (!is_pow2(ns) || ns < kMinNodeSize || ns > kMaxNodeSize) {
    w = "header node_size is not a power of two in [64, 4096]";
    return errc::bad_layout;
  }
  if (!is_pow2(ring) || ring < ns * kMinNodes || ring > (uint64_t{1} << 46)) {
    w = "header ring_bytes is not a power of two of 16 nodes to 2^46 bytes";
    return errc::bad_layout;
  }
  if (h->region_size != region_bytes(ring, ns) || h->region_size > mapped) {
    w = "header region_size does not match its ring or exceeds the mapped size";
    return errc::bad_layout;
  }
  const uint64_t nodes = ring / ns;
  const uint64_t max_nodes = (h->max_record_size + uint64_t{kRecordHeaderSize} + ns - 1) / ns;
  if (h->max_record_size == 0 || max_nodes > kMaxRecordNodes || max_nodes > nodes / 2) {
    w = "header max_record_size is 0 or does not fit in half the ring";
    return errc::bad_layout;
  }
  g->hdr = h;
  g->heads = reinterpret_cast<head_word*>(static_cast<uint8_t*>(base) + kHeaderSize);
  g->data = static_cast<uint8_t*>(base) + kHeaderSize + nodes * sizeof(head_word);
  g->nodes = nodes;
  g->mask = nodes - 1;
  g->node_size = ns;
  g->node_shift = log2u(ns);
  g->max_record = h->max_record_size;
  g->version = h->version;
  return errc::ok;
}

void format_header(void* base, const shm_config& cfg, uint32_t flags, bool owned) noexcept {
  auto* h = static_cast<region_header*>(base);
  std::memset(base, 0, kHeaderSize);
  // Every head gets kHeadFormatted, which no writer stores. Its stamp field matches the positions
  // k * 2^40 - 1 (node N - 1) only; there writers and reader step over it alike (ctl_span). Older
  // builds format heads the same way, so regions they kept reattach with the same meaning.
  auto* heads = reinterpret_cast<head_word*>(static_cast<uint8_t*>(base) + kHeaderSize);
  for (uint64_t i = 0; i < cfg.ring_bytes / cfg.node_size; ++i) {
    heads[i].store(kHeadFormatted, std::memory_order_relaxed);
  }
  h->version = cfg.layout_version != 0 ? cfg.layout_version : kVersion;
  h->header_size = kHeaderSize;
  h->region_size = region_bytes(cfg.ring_bytes, cfg.node_size);
  h->ring_bytes = cfg.ring_bytes;
  h->node_size = cfg.node_size;
  h->record_header_size = kRecordHeaderSize;
  h->max_record_size = cfg.max_record_size;
  h->abandon_timeout_us = cfg.abandon_timeout_us;
  h->flags = flags;
  if (owned) {
    const auto pid = static_cast<uint32_t>(::getpid());
    h->owner_pid.store(pid, std::memory_order_relaxed);
    h->owner_start_time.store(process_start_time(pid), std::memory_order_relaxed);
    h->claim.store(own_claim(), std::memory_order_relaxed);
  }
  h->reader_incarnation.store(1, std::memory_order_relaxed);
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  h->created_unix_ns =
      static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  h->reader_state.store(kReaderOpen, std::memory_order_relaxed);
  // Publication point: a writer that sees the magic (acquire) sees every field above.
  h->magic.store(kMagic, std::memory_order_release);
}

namespace {

// gone: the object lost its name before we locked it (the name, if any, is another's now).
enum class verdict : uint8_t { gone, stale, foreign, incompatible, reattach };

// An existing POSIX object whose flock we hold (so no live reader owns it): what to do with it.
verdict judge_posix(int fd, const shm_config& cfg, open_outcome* how) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_nlink == 0) return verdict::gone;
  if (st.st_size == 0) return verdict::stale;  // its creator died before sizing it
  // A creator sizes its object whole at once: 1..4095 bytes were never a region.
  if (static_cast<size_t>(st.st_size) < kHeaderSize) return verdict::foreign;
  void* p = ::mmap(nullptr, kHeaderSize, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return verdict::foreign;
  const auto* h = static_cast<const region_header*>(p);
  verdict v = verdict::reattach;
  const uint64_t m = h->magic.load(std::memory_order_acquire);
  if ((m == 0 && possible_region_size(static_cast<uint64_t>(st.st_size))) ||
      (m == kMagic && h->reader_state.load(std::memory_order_acquire) == kReaderClosed)) {
    v = verdict::stale;  // never published (no record can be in it), or closed for good
  } else if (m != kMagic) {
    v = verdict::foreign;
  } else {
    how->detail = layout_mismatch(h, static_cast<uint64_t>(st.st_size), cfg);
    if (!how->detail.empty()) v = verdict::incompatible;
  }
  ::munmap(p, kHeaderSize);
  return v;
}

// Maps a POSIX object of `size` bytes read-write into *out and reserves its pages (fd: ours,
// holding the flock); on an error nothing stays mapped.
errc map_posix_fd(int fd, size_t size, const shm_config& cfg, const std::string& name, mapping* out,
                  std::string* why) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errc_from_errno(-errno);
  bool huge = false;
#ifdef MADV_HUGEPAGE
  if (cfg.huge_pages) huge = ::madvise(p, size, MADV_HUGEPAGE) == 0;
#endif
  if (const errc e = reserve_pages(fd, huge ? static_cast<uint8_t*>(p) : nullptr, size, why);
      e != errc::ok) {
    ::munmap(p, size);
    return e;
  }
  out->kind = region_kind::posix;
  out->base = p;
  out->size = size;
  out->fd = fd;
  out->name = name;
  out->huge = huge;
  return errc::ok;
}

// The name exists: refuse a live reader's (it holds the flock), reattach a compatible one, remove
// a stale one (continue_out = true: create afresh).
errc posix_existing(const std::string& name, const shm_config& cfg, mapping* out, open_outcome* how,
                    bool* again) {
  *again = false;
  const int old = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (old < 0) {
    *again = errno == ENOENT && !cfg.must_exist;  // vanished meanwhile: try again
    return errc_from_errno(-errno);
  }
  if (::flock(old, LOCK_EX | LOCK_NB) != 0) {
    ::close(old);
    return errno == EWOULDBLOCK ? errc::busy : errc_from_errno(-errno);
  }
  const verdict v = judge_posix(old, cfg, how);
  if (v == verdict::gone) {  // unlinked since our shm_open: look again, never unlink the name
    ::close(old);
    *again = !cfg.must_exist;
    return errc::not_found;
  }
  if (v == verdict::reattach) {
    // Its pages may not all be backed (an older build's, or /dev/shm shrank since): reserve them
    // (map_posix_fd), and leave the region (and its records) alone if there is no room.
    const size_t size = region_bytes(cfg.ring_bytes, cfg.node_size);
    if (const errc e = map_posix_fd(old, size, cfg, name, out, &how->why); e != errc::ok) {
      ::close(old);
      return e;
    }
    claim_region(static_cast<region_header*>(out->base));
    how->reattached = true;
    return errc::ok;
  }
  if (v == verdict::stale && !cfg.must_exist) {
    // Its reader is dead (no flock holder) and it holds no records. It still had its name when
    // judged, and whoever else removes a name holds its object's flock (we do): it is this one.
    ::shm_unlink(name.c_str());
    *again = true;
  }
  ::close(old);
  if (v == verdict::stale) return errc::not_found;
  return errc::bad_layout;  // foreign (how->detail empty) or incompatible: left alone
}

// Whether the object behind fd still has its name (a POSIX shm object's only link): after its
// flock is ours, no one else can remove that name but uvbus_shm_inspect --remove --force.
bool still_named(int fd) noexcept {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_nlink > 0;
}

// Our object fd, just created by name with 0 bytes: lock it, then size, map and format it.
// Until locked it looks like a dead creator's to another reader opening the name, which may
// unlink it and create its own: then *again (our object lost its name: look again) or busy (that
// reader holds our object's flock while it judges). The name is removed only while it is ours.
errc posix_new(int fd, const std::string& name, const shm_config& cfg, mapping* out,
               open_outcome* how, bool* again) {
  *again = false;
  if (auto* hook = g_create_hook.load(std::memory_order_acquire)) hook(g_create_hook_user);
  // The flock is the liveness proof for a later creator; take it before anything else.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const errc e = errno == EWOULDBLOCK ? errc::busy : errc_from_errno(-errno);
    ::close(fd);
    return e;
  }
  if (!still_named(fd)) {
    ::close(fd);
    *again = true;
    return errc::busy;
  }
  // Then the mode as configured: shm_open applied the umask to it (shmget does not).
  const size_t size = region_bytes(cfg.ring_bytes, cfg.node_size);
  errc e = errc::ok;
  if (::fchmod(fd, static_cast<mode_t>(cfg.mode & 0777)) != 0 ||
      ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    e = errc_from_errno(-errno);
  } else {
    e = map_posix_fd(fd, size, cfg, name, out, &how->why);
  }
  if (e != errc::ok) {
    if (still_named(fd)) ::shm_unlink(name.c_str());
    ::close(fd);
    return e;
  }
  format_header(out->base, cfg, out->huge ? kFlagHugePages : 0, true);
  return errc::ok;
}

errc map_posix_create(const address& addr, const shm_config& cfg, mapping* out, open_outcome* how) {
  const std::string name = "/" + addr.host;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = cfg.must_exist ? -1
                                  : ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                                               static_cast<mode_t>(cfg.mode));
    if (fd < 0 && !cfg.must_exist && errno != EEXIST) return errc_from_errno(-errno);
    bool again = false;
    const errc e = fd < 0 ? posix_existing(name, cfg, out, how, &again)
                          : posix_new(fd, name, cfg, out, how, &again);
    if (!again) return e;
  }
  return errc::busy;
}

// A SysV segment that was never published (no record can be in it): stale if its creator died.
bool creator_dead(const shmid_ds& ds) noexcept {
  return ::kill(ds.shm_cpid, 0) != 0 && errno == ESRCH;
}

// The key exists: refuse a live reader's, reattach a compatible one (claimed by a CAS on its
// claim word, so of two readers racing for it one gets busy), remove a stale one (*again), and
// leave what is not a region alone (bad_layout).
errc sysv_existing(key_t key, const shm_config& cfg, mapping* out, open_outcome* how, bool* again) {
  *again = false;
  const int old = ::shmget(key, 0, 0);
  if (old < 0) {
    *again = errno == ENOENT && !cfg.must_exist;
    return errc_from_errno(-errno);
  }
  shmid_ds ds{};
  if (::shmctl(old, IPC_STAT, &ds) != 0) return errc_from_errno(-errno);
  // A segment is created whole: one under a header page, or with a zero header but no region's
  // size, was never a region (someone else's: left alone, whether its creator lives or not).
  if (ds.shm_segsz < kHeaderSize) return errc::bad_layout;
  bool stale = false;
  void* p = ::shmat(old, nullptr, 0);
  if (p == shmat_failed()) return errc_from_errno(-errno);
  auto* h = static_cast<region_header*>(p);
  const uint64_t m = h->magic.load(std::memory_order_acquire);
  errc e = errc::busy;
  if (m == 0 && possible_region_size(ds.shm_segsz)) {
    stale = creator_dead(ds);  // else busy: its creator is still formatting it
  } else if (m != kMagic) {
    e = errc::bad_layout;
  } else if (h->reader_state.load(std::memory_order_acquire) == kReaderClosed) {
    stale = true;
  } else if (!reader_alive(h, region_kind::sysv, true)) {
    how->detail = layout_mismatch(h, ds.shm_segsz, cfg);
    if (!how->detail.empty()) {
      e = errc::bad_layout;
    } else if (uint64_t w = h->claim.load(std::memory_order_acquire);
               !claim_held(w) && h->claim.compare_exchange_strong(w, own_claim())) {
      // The CAS decides between readers racing here: one that loads the word after it sees a
      // live claimant, whatever owner_pid and the state (stored by claim_region) still say.
      if (auto* hook = g_claim_hook.load(std::memory_order_acquire)) hook(g_claim_hook_user);
      claim_region(h);
      out->kind = region_kind::sysv;
      out->base = p;
      out->size = ds.shm_segsz;
      out->shmid = old;
      how->reattached = true;
      return errc::ok;
    }
  }
  ::shmdt(p);
  if (!stale) return e;
  if (cfg.must_exist) return errc::not_found;
  ::shmctl(old, IPC_RMID, nullptr);
  *again = true;
  return errc::busy;
}

errc map_sysv_create(const address& addr, const shm_config& cfg, mapping* out, open_outcome* how) {
  const size_t size = region_bytes(cfg.ring_bytes, cfg.node_size);
  const auto key = static_cast<key_t>(addr.shm_key);
  const int mode = static_cast<int>(cfg.mode & 0777);
  for (int attempt = 0; attempt < 3; ++attempt) {
    bool huge = false;
    int id = -1;
    if (!cfg.must_exist) {
#ifdef SHM_HUGETLB
      if (cfg.huge_pages) {
        id = ::shmget(key, size, IPC_CREAT | IPC_EXCL | SHM_HUGETLB | mode);
        huge = id >= 0;
      }
#endif
      if (id < 0) id = ::shmget(key, size, IPC_CREAT | IPC_EXCL | mode);
    }
    if (id < 0 && (cfg.must_exist || errno == EEXIST)) {
      bool again = false;
      const errc e = sysv_existing(key, cfg, out, how, &again);
      if (again) continue;
      return e;
    }
    if (id < 0) return errc_from_errno(-errno);
    void* p = ::shmat(id, nullptr, 0);
    if (p == shmat_failed()) {
      const errc e = errc_from_errno(-errno);
      ::shmctl(id, IPC_RMID, nullptr);
      return e;
    }
    out->kind = region_kind::sysv;
    out->base = p;
    out->size = size;
    out->shmid = id;
    out->huge = huge;
    format_header(p, cfg, kFlagSysV | (huge ? kFlagHugePages : 0), true);
    return errc::ok;
  }
  return errc::busy;
}

errc map_mem_create(const address& addr, const shm_config& cfg, mapping* out, open_outcome* how) {
  const size_t size = region_bytes(cfg.ring_bytes, cfg.node_size);
  std::scoped_lock lock(mem_mutex());
  auto& reg = mem_registry();
  auto it = reg.find(addr.host);
  if (it != reg.end()) {  // close(remove) erases the entry; close(keep) leaves it detached
    auto* h = static_cast<region_header*>(it->second->p);
    if (h->reader_state.load(std::memory_order_acquire) != kReaderDetached) return errc::busy;
    how->detail = layout_mismatch(h, it->second->size, cfg);
    if (!how->detail.empty()) return errc::bad_layout;
    claim_region(h);  // under the registry's mutex: two readers never both reattach
    out->kind = region_kind::mem;
    out->base = it->second->p;
    out->size = it->second->size;
    out->name = addr.host;
    out->mem = it->second;
    how->reattached = true;
    return errc::ok;
  }
  if (cfg.must_exist) return errc::not_found;
  auto blk = std::make_shared<mem_block>();
  // aligned_alloc wants a multiple of the alignment: a small ring's region (e.g. 4096 + 512 +
  // 4096 bytes) is not one.
  blk->p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (blk->p == nullptr) return errc::no_memory;
  blk->size = size;
  bool huge = false;
#ifdef MADV_HUGEPAGE
  if (cfg.huge_pages) huge = ::madvise(blk->p, size, MADV_HUGEPAGE) == 0;
#endif
  format_header(blk->p, cfg, kFlagMem | (huge ? kFlagHugePages : 0), true);
  reg.emplace(addr.host, blk);
  out->kind = region_kind::mem;
  out->base = blk->p;
  out->size = size;
  out->name = addr.host;
  out->mem = std::move(blk);
  out->huge = huge;
  return errc::ok;
}

}  // namespace

errc create_region(const address& addr, const shm_config& cfg, mapping* out, open_outcome* how) {
  if (addr.kind == scheme::mem) return map_mem_create(addr, cfg, out, how);
  if (addr.kind != scheme::shm) return errc::unsupported_scheme;
  return addr.shm_numeric ? map_sysv_create(addr, cfg, out, how)
                          : map_posix_create(addr, cfg, out, how);
}

errc attach_region(const address& addr, mapping* out) {
  if (addr.kind == scheme::mem) {
    std::scoped_lock lock(mem_mutex());
    auto it = mem_registry().find(addr.host);
    if (it == mem_registry().end()) return errc::not_found;
    out->kind = region_kind::mem;
    out->mem = it->second;
    out->base = it->second->p;
    out->size = it->second->size;
    out->name = addr.host;
    return errc::ok;
  }
  if (addr.kind != scheme::shm) return errc::unsupported_scheme;
  if (addr.shm_numeric) {
    const int id = ::shmget(static_cast<key_t>(addr.shm_key), 0, 0);
    if (id < 0) return errno == ENOENT ? errc::not_found : errc_from_errno(-errno);
    shmid_ds ds{};
    if (::shmctl(id, IPC_STAT, &ds) != 0) return errc_from_errno(-errno);
    void* p = ::shmat(id, nullptr, 0);
    if (p == shmat_failed()) return errc_from_errno(-errno);
    out->kind = region_kind::sysv;
    out->base = p;
    out->size = ds.shm_segsz;
    out->shmid = id;
    return errc::ok;
  }
  const std::string name = "/" + addr.host;
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return errno == ENOENT ? errc::not_found : errc_from_errno(-errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const errc e = errc_from_errno(-errno);
    ::close(fd);
    return e;
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {  // 1..4095 bytes: mapped, and refused by validate_header (not a region)
    ::close(fd);
    return errc::not_connected;  // the reader has not sized it yet
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const errc e = errc_from_errno(-errno);
    ::close(fd);
    return e;
  }
  out->kind = region_kind::posix;
  out->base = p;
  out->size = size;
  out->fd = fd;  // kept: fstat tells a writer when the name was removed (region_removed)
  out->name = name;
  return errc::ok;
}

std::string object_size_mismatch(const mapping& m) {
  if (m.kind != region_kind::posix || m.size < kHeaderSize) return {};
  const auto* h = static_cast<const region_header*>(m.base);
  if (h->magic.load(std::memory_order_acquire) != kMagic) return {};
  const uint64_t announced = h->region_size;
  if (m.size >= announced) return {};  // grown: the region is still whole (its reader reattaches)
  return "the object is " + std::to_string(m.size) + " bytes, its header announces region_size " +
         std::to_string(announced) +
         ": cut short by another process (a writer would fault past its end)";
}

bool mem_entry_removed(const mapping& m) noexcept {
  std::scoped_lock lock(mem_mutex());
  auto it = mem_registry().find(m.name);
  return it == mem_registry().end() || it->second != m.mem;
}

void release_region(mapping* m, bool remove) noexcept {
  switch (m->kind) {
    case region_kind::posix:
      // Only our own name: if our object was unlinked already (uvbus_shm_inspect --remove
      // --force), the name may now belong to a newer region.
      if (remove && !region_removed(*m)) ::shm_unlink(m->name.c_str());
      ::munmap(m->base, m->size);
      if (m->fd >= 0) ::close(m->fd);  // drops the reader's flock
      break;
    case region_kind::sysv:
      if (remove) ::shmctl(m->shmid, IPC_RMID, nullptr);
      ::shmdt(m->base);
      break;
    case region_kind::mem:
      if (remove) {
        std::scoped_lock lock(mem_mutex());
        auto it = mem_registry().find(m->name);
        if (it != mem_registry().end() && it->second == m->mem) mem_registry().erase(it);
      }
      m->mem.reset();
      break;
    case region_kind::image:
    case region_kind::none:
      break;
  }
  *m = mapping{};
}

}  // namespace uvbus::shm_detail

namespace uvbus::shm_detail {

void region_access::set_claim_hook(void (*hook)(void*), void* user) noexcept {
  g_claim_hook_user = user;
  g_claim_hook.store(hook, std::memory_order_release);
}

void region_access::set_create_hook(void (*hook)(void*), void* user) noexcept {
  g_create_hook_user = user;
  g_create_hook.store(hook, std::memory_order_release);
}

}  // namespace uvbus::shm_detail
