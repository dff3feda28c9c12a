#include "shm/region.h"

#include "core/murmur3.h"

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
  const uint32_t pid = h->owner_pid;
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  if (check_start) {
    const uint64_t st = process_start_time(pid);
    if (st != 0 && h->owner_start_time != 0 && st != h->owner_start_time) return false;
  }
  return true;
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
  if (h->version != kVersion || h->header_size != kHeaderSize ||
      h->record_header_size != kRecordHeaderSize) {
    w = "header version, header_size or record_header_size differ from this build's (version 2, "
        "4096, 8)";
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
  return errc::ok;
}

void format_header(void* base, const shm_config& cfg, uint32_t flags, bool owned) noexcept {
  auto* h = static_cast<region_header*>(base);
  std::memset(base, 0, kHeaderSize);
  // Every head gets a value no position of this region's lifetime can match (stamp 2^40-1), so
  // memory reused from an earlier region can never pass for a current record.
  auto* heads = reinterpret_cast<head_word*>(static_cast<uint8_t*>(base) + kHeaderSize);
  for (uint64_t i = 0; i < cfg.ring_bytes / cfg.node_size; ++i) {
    heads[i].store(~uint64_t{0}, std::memory_order_relaxed);
  }
  h->version = kVersion;
  h->header_size = kHeaderSize;
  h->region_size = region_bytes(cfg.ring_bytes, cfg.node_size);
  h->ring_bytes = cfg.ring_bytes;
  h->node_size = cfg.node_size;
  h->record_header_size = kRecordHeaderSize;
  h->max_record_size = cfg.max_record_size;
  h->abandon_timeout_us = cfg.abandon_timeout_us;
  h->flags = flags;
  if (owned) {
    h->owner_pid = static_cast<uint32_t>(::getpid());
    h->owner_start_time = process_start_time(h->owner_pid);
  }
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  h->created_unix_ns =
      static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  h->reader_state.store(kReaderOpen, std::memory_order_relaxed);
  // Publication point: a writer that sees the magic (acquire) sees every field above.
  h->magic.store(kMagic, std::memory_order_release);
}

namespace {

errc map_posix_create(const address& addr, const shm_config& cfg, mapping* out) {
  const std::string name = "/" + addr.host;
  const size_t size = region_bytes(cfg.ring_bytes, cfg.node_size);
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                        static_cast<mode_t>(cfg.mode));
    if (fd < 0 && errno == EEXIST) {
      // Someone's region: refuse a live reader's (it holds the flock), replace a dead one's.
      int old = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (old < 0) {
        if (errno == ENOENT) continue;  // vanished meanwhile: try again
        return errc_from_errno(-errno);
      }
      if (::flock(old, LOCK_EX | LOCK_NB) != 0) {
        ::close(old);
        return errno == EWOULDBLOCK ? errc::busy : errc_from_errno(-errno);
      }
      struct stat st {};
      bool ours = false;
      if (::fstat(old, &st) == 0 && static_cast<size_t>(st.st_size) >= kHeaderSize) {
        void* p = ::mmap(nullptr, kHeaderSize, PROT_READ, MAP_SHARED, old, 0);
        if (p != MAP_FAILED) {
          const uint64_t m = static_cast<region_header*>(p)->magic.load(std::memory_order_acquire);
          ours = m == kMagic || m == 0;
          ::munmap(p, kHeaderSize);
        }
      } else {
        ours = true;  // shorter than a header: a creator that died before ftruncate
      }
      if (!ours) {
        ::close(old);
        return errc::bad_layout;
      }
      ::shm_unlink(name.c_str());  // stale: its reader is dead (no flock holder)
      ::close(old);
      continue;
    }
    if (fd < 0) return errc_from_errno(-errno);
    // The flock is the liveness proof for a later creator; take it before anything else.
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      const errc e = errc_from_errno(-errno);
      ::shm_unlink(name.c_str());
      ::close(fd);
      return e;
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const errc e = errc_from_errno(-errno);
      ::shm_unlink(name.c_str());
      ::close(fd);
      return e;
    }
    bool huge = false;
#ifdef MADV_HUGEPAGE
    if (cfg.huge_pages) huge = ::madvise(p, size, MADV_HUGEPAGE) == 0;
#endif
    out->kind = region_kind::posix;
    out->base = p;
    out->size = size;
    out->fd = fd;
    out->name = name;
    out->huge = huge;
    format_header(p, cfg, huge ? kFlagHugePages : 0, true);
    return errc::ok;
  }
  return errc::busy;
}

errc map_sysv_create(const address& addr, const shm_config& cfg, mapping* out) {
  const size_t size = region_bytes(cfg.ring_bytes, cfg.node_size);
  const auto key = static_cast<key_t>(addr.shm_key);
  const int mode = static_cast<int>(cfg.mode & 0777);
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool huge = false;
    int id = -1;
#ifdef SHM_HUGETLB
    if (cfg.huge_pages) {
      id = ::shmget(key, size, IPC_CREAT | IPC_EXCL | SHM_HUGETLB | mode);
      huge = id >= 0;
    }
#endif
    if (id < 0) id = ::shmget(key, size, IPC_CREAT | IPC_EXCL | mode);
    if (id < 0 && errno == EEXIST) {
      const int old = ::shmget(key, 0, 0);
      if (old < 0) {
        if (errno == ENOENT) continue;
        return errc_from_errno(-errno);
      }
      shmid_ds ds{};
      if (::shmctl(old, IPC_STAT, &ds) != 0) return errc_from_errno(-errno);
      bool stale = false;
      if (ds.shm_segsz >= kHeaderSize) {
        void* p = ::shmat(old, nullptr, SHM_RDONLY);
        if (p == shmat_failed()) return errc_from_errno(-errno);
        auto* h = static_cast<region_header*>(p);
        const uint64_t m = h->magic.load(std::memory_order_acquire);
        if (m == kMagic) {
          stale = !reader_alive(h, region_kind::sysv, true);
        } else if (m == 0) {
          // A creator that died before publishing: judge by the creating pid.
          stale = ::kill(ds.shm_cpid, 0) != 0 && errno == ESRCH;
        } else {
          ::shmdt(p);
          return errc::bad_layout;
        }
        ::shmdt(p);
      } else {
        stale = ::kill(ds.shm_cpid, 0) != 0 && errno == ESRCH;
      }
      if (!stale) return errc::busy;
      ::shmctl(old, IPC_RMID, nullptr);
      continue;
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

errc map_mem_create(const address& addr, const shm_config& cfg, mapping* out) {
  const size_t size = region_bytes(cfg.ring_bytes, cfg.node_size);
  std::lock_guard<std::mutex> lock(mem_mutex());
  auto& reg = mem_registry();
  auto it = reg.find(addr.host);
  if (it != reg.end()) return errc::busy;  // the reader's close() removes its entry
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

errc create_region(const address& addr, const shm_config& cfg, mapping* out) {
  if (addr.kind == scheme::mem) return map_mem_create(addr, cfg, out);
  if (addr.kind != scheme::shm) return errc::unsupported_scheme;
  return addr.shm_numeric ? map_sysv_create(addr, cfg, out) : map_posix_create(addr, cfg, out);
}

errc attach_region(const address& addr, mapping* out) {
  if (addr.kind == scheme::mem) {
    std::lock_guard<std::mutex> lock(mem_mutex());
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
  if (size < kHeaderSize) {
    ::close(fd);
    return errc::not_connected;  // the reader has not sized it yet
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the object alive
  if (p == MAP_FAILED) return errc_from_errno(-errno);
  out->kind = region_kind::posix;
  out->base = p;
  out->size = size;
  out->name = name;
  return errc::ok;
}

void release_region(mapping* m, bool remove) noexcept {
  switch (m->kind) {
    case region_kind::posix:
      if (remove) ::shm_unlink(m->name.c_str());
      ::munmap(m->base, m->size);
      if (m->fd >= 0) ::close(m->fd);  // drops the flock
      break;
    case region_kind::sysv:
      if (remove) ::shmctl(m->shmid, IPC_RMID, nullptr);
      ::shmdt(m->base);
      break;
    case region_kind::mem:
      if (remove) {
        std::lock_guard<std::mutex> lock(mem_mutex());
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

std::string open_error_detail(const char* call, const std::string& url, errc e, const char* why) {
  std::string d = std::string(call) + "(" + url + "): ";
  if (why != nullptr) return d + why;
  switch (e) {
    case errc::bad_url:
      return d + "malformed URL";
    case errc::unsupported_scheme:
      return d + "only shm:// and mem:// URLs name shared-memory regions";
    case errc::busy:
      return d + "a live reader already owns this region";
    case errc::bad_layout:
      return d + "an object of this name exists and is not a uvbus region (left alone)";
    case errc::not_found:
      return d + "no such region (its reader has not created it)";
    case errc::not_connected:
      return d + "the region's reader has not finished creating it, has closed or is dead";
    case errc::permission_denied:
      return d + "permission denied (the region's mode)";
    case errc::wrong_state:
      return d + "already open: close() first";
    default:
      return d + to_string(e);
  }
}

}  // namespace uvbus::shm_detail
