// Reserving a POSIX region's pages in /dev/shm at create and reattach (region.h reserve_pages).
#include "shm/region.h"

#include "shm/test_hook.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>

namespace uvbus::shm_detail {

namespace {

// region_access::set_reserve_hook (tests only): the user word is stored before the hook (release).
std::atomic<int (*)(void*)> g_reserve_hook{nullptr};
void* g_reserve_hook_user = nullptr;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels say EINVAL
#endif

// Reserves bytes [off, off + n) of the object fd: fallocate(2), or (base: its huge-page mapping)
// MADV_POPULATE_WRITE, which faults them in writable without changing their contents. 0 or errno.
int reserve_chunk(int fd, uint8_t* base, size_t off, size_t n) {
  if (base != nullptr) return ::madvise(base + off, n, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
  return ::fallocate(fd, 0, static_cast<off_t>(off), static_cast<off_t>(n)) == 0 ? 0 : errno;
}

// Reserves [0, size) in 64 MiB chunks with every blockable signal blocked on this thread: 0 or
// the errno. Before Linux 6.10 (Debian 12 runs 6.1) tmpfs stops a fallocate with EINTR when a
// signal is pending and undoes every page that call added, so retrying the whole range under a
// periodic signal (setitimer, a profiler) never ended. Blocked signals do not interrupt it (as
// PostgreSQL's dsm_impl_posix_resize does); a chunk is retried alone, a bounded number of times.
// Not posix_fallocate: on a filesystem without fallocate glibc emulates it by writing a 0 into
// each block that reads 0, over a byte a live writer of a reattached region may just have stored.
int reserve_chunks(int fd, uint8_t* base, size_t size) {
  constexpr size_t kChunk = size_t{64} << 20;
  sigset_t all{};
  sigset_t old{};
  sigfillset(&all);
  const bool masked = ::pthread_sigmask(SIG_SETMASK, &all, &old) == 0;
  int rc = 0;
  int interrupted = 0;
  for (size_t off = 0; off < size && rc == 0;) {
    const size_t n = std::min(kChunk, size - off);
    rc = reserve_chunk(fd, base, off, n);
    if (rc == 0) {
      off += n;
      interrupted = 0;
    } else if (rc == EINTR && ++interrupted <= 100) {  // SIGSTOP/SIGCONT: this chunk again
      rc = 0;
    }
  }
  if (masked) ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

}  // namespace

// See region.h.
errc reserve_pages(int fd, uint8_t* base, size_t size, std::string* why) {
  int rc = 0;
  if (auto* hook = g_reserve_hook.load(std::memory_order_acquire)) rc = hook(g_reserve_hook_user);
  if (rc == 0) rc = reserve_chunks(fd, base, size);
  if (rc == EINVAL && base != nullptr) rc = reserve_chunks(fd, nullptr, size);  // before 5.14
  if (rc == 0 || rc == EOPNOTSUPP || rc == ENOSYS) return errc::ok;
  // A populating fault finds no room as SIGBUS (EFAULT) or an allocation failure (ENOMEM).
  const bool full = rc == ENOSPC || rc == ENOMEM || rc == EDQUOT || rc == EFAULT;
  *why = "the region needs " + std::to_string(size) + " bytes of /dev/shm and " +
         (full ? "there is no room for them (" + std::string(std::strerror(rc)) +
                     "): make /dev/shm larger (docker --shm-size) or ring_bytes smaller"
               : "reserving them failed: " + std::string(std::strerror(rc)));
  return full ? errc::no_memory : errc_from_errno(-rc);
}

void region_access::set_reserve_hook(int (*hook)(void*), void* user) noexcept {
  g_reserve_hook_user = user;
  g_reserve_hook.store(hook, std::memory_order_release);
}

}  // namespace uvbus::shm_detail
