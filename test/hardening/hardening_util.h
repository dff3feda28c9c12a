// Helpers for the hardening tests: raw sockets that misbehave on purpose, and heap accounting.
#pragma once

#include <algorithm>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/buffer_pool.h"
#include "core/frame.h"
#include "core/murmur3.h"

// Heap accounting: with a sanitizer the allocator is the sanitizer's (mallinfo2 would see
// nothing), so ask it directly.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UVBUS_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UVBUS_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifdef UVBUS_SANITIZER_ALLOCATOR
// From <sanitizer/allocator_interface.h>, which clang ships and gcc does not; every sanitizer
// runtime with its own allocator (ASan, TSan) exports it.
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#else
#include <malloc.h>
#endif

namespace uvbus::hardening {

// Bytes currently allocated on the heap by this process (malloc/new), not RSS, less what this
// thread's buffer pools keep for reuse (bounded: they exist to hold a closed connection's ring).
inline size_t heap_bytes() {
#ifdef UVBUS_SANITIZER_ALLOCATOR
  const size_t all = __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 mi = mallinfo2();
  const size_t all = mi.uordblks + mi.hblkhd;
#endif
  return all - std::min(all, buffer_pool::thread_free_bytes());
}

// Resident set size in bytes (for reports only: too noisy to assert on).
inline size_t rss_bytes() {
  long pages = 0;
  long resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// A whole stream frame (format: docs/internals.md) around payload.
inline std::vector<uint8_t> frame_of(const void* payload, size_t n) {
  std::vector<uint8_t> out(frame_size(n));
  const size_t len = frame_encode(payload, n, out.data(), out.size());
  out.resize(len);
  return out;
}
inline std::vector<uint8_t> frame_of(const std::string& s) {
  return frame_of(s.data(), s.size());
}

// A frame header announcing `len` payload bytes (with an arbitrary hash): what a peer sends first.
inline std::vector<uint8_t> header_announcing(uint64_t len) {
  std::vector<uint8_t> out(kFrameMaxHeaderBytes);
  out[0] = 0x12;
  out[1] = 0x34;
  out[2] = 0x56;
  out[3] = 0x78;
  out.resize(kFrameHashBytes + varint_encode(len, out.data() + kFrameHashBytes));
  return out;
}

// A TCP client on a plain socket, for behaviour a well-written channel never produces.
class raw_peer {
 public:
  raw_peer() = default;
  raw_peer(const raw_peer&) = delete;
  raw_peer& operator=(const raw_peer&) = delete;
  raw_peer(raw_peer&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ~raw_peer() { close(); }

  // Blocking connect to 127.0.0.1:port, then non-blocking. Loopback connects complete in the
  // kernel (the listener's accept queue), so the loop need not run; keep batches under the backlog.
  bool connect_to(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
    return ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK) == 0;
  }

  // Writes all bytes, running the loop while the socket buffer is full so the far side can read.
  // Returns false once the far side has closed (EPIPE/ECONNRESET): that is often the point.
  bool send_all(uv_loop_t* loop, const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        uv_run(loop, UV_RUN_NOWAIT);
      } else {
        return false;
      }
    }
    return true;
  }
  bool send_all(uv_loop_t* loop, const std::vector<uint8_t>& v) {
    return send_all(loop, v.data(), v.size());
  }

  // True once the far side closed the connection (EOF or reset). Discards whatever it sent.
  bool closed_by_peer() {
    if (fd_ < 0) return true;
    uint8_t buf[4096];
    for (;;) {
      const ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (r > 0) continue;
      if (r == 0) return true;
      return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
  }

  // Closes with a FIN (orderly) ...
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // ... or with a RST (SO_LINGER 0), like a crashed or hostile host.
  void abort() {
    if (fd_ < 0) return;
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close();
  }
  [[nodiscard]] int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace uvbus::hardening
