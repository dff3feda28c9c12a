// The coalesced stream ceilings (tcp-coalesced, unix-coalesced, and -hash): the sender packs
// [u32 length][u32 MurmurHash3, -hash only][payload] frames into 64 KiB buffers, one write() each;
// the receiver read()s 64 KiB at a time (as libuv does) and checks every frame in place.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/murmur3.h"
#include "raw/raw_common.h"

namespace uvbus::raw {

namespace {

constexpr size_t kBuffer = size_t{64} * 1024;

void put32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}  // little endian hosts only
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Writes the header of the frame whose n-byte payload is already in place; returns its size.
size_t put_frame(const settings& s, uint8_t* out, size_t n) {
  const size_t hdr = s.hash ? 8 : 4;
  put32(out, static_cast<uint32_t>(n));
  if (s.hash) put32(out + 4, murmur3_x86_32(out + hdr, n, 0));
  return hdr + n;
}

// Sends for s.seconds, then the end message; returns the count sent (the end not counted).
uint64_t send_frames(const settings& s, int fd) {
  std::vector<uint8_t> buf(kBuffer);
  const size_t hdr = s.hash ? 8 : 4;
  size_t used = 0;
  uint64_t seq = 0;
  const double end = bench::mono_now() + s.seconds;
  for (;; ++seq) {
    if ((seq & 255) == 0 && bench::mono_now() >= end) break;
    const size_t n = bench::payload_size(seq, 0, s.min, s.max);
    if (used + hdr + n > buf.size()) {
      if (!write_all(fd, buf.data(), used)) return seq;
      used = 0;
    }
    uint8_t* p = buf.data() + used;
    bench::make_payload(seq, 0, s.min, s.max, p + hdr);
    used += put_frame(s, p, n);
    if (seq == s.corrupt_seq) p[hdr + n - 1] ^= 0x10;  // after hashing: the receiver must notice
  }
  uint8_t* p = buf.data() + used;
  const size_t n = bench::make_end(0, seq, p + hdr);
  used += put_frame(s, p, n);
  if (!write_all(fd, buf.data(), used)) return seq;
  shutdown(fd, SHUT_WR);
  return seq;
}

// Reads and checks until the end message or the end of the stream.
recv_report recv_frames(const settings& s, int fd) {
  recv_report r;
  bench::meter m("recv");
  std::vector<uint8_t> buf(2 * kBuffer + s.max + 16);
  const size_t hdr = s.hash ? 8 : 4;
  size_t have = 0;
  uint64_t expect = 0;
  bool done = false;
  while (!done) {
    const ssize_t got = ::read(fd, buf.data() + have, kBuffer);
    if (got <= 0) break;
    have += static_cast<size_t>(got);
    size_t off = 0;
    while (!done && have - off >= hdr) {
      const size_t n = get32(buf.data() + off);
      if (n > s.max + 24) {  // a broken stream: nothing after this can be trusted
        ++r.errors;
        return r;
      }
      if (have - off < hdr + n) break;
      const uint8_t* f = buf.data() + off;
      done = check_payload(s, f + hdr, n, s.hash ? get32(f + 4) : 0, &expect, &m, &r);
      off += hdr + n;
    }
    std::memmove(buf.data(), buf.data() + off, have - off);
    have -= off;
    m.tick();
  }
  finish_report(m, done, &r);
  return r;
}

}  // namespace

int listen_for(const settings& s, bool unix_socket, const std::string& path, std::string* where) {
  if (unix_socket) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 1) != 0) {
      return -1;
    }
    *where = path;
    return fd;
  }
  const bool v6 = s.host.find(':') != std::string::npos;
  sockaddr_storage st{};
  socklen_t len = v6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&st);
    a->sin6_family = AF_INET6;
    if (inet_pton(AF_INET6, s.host.c_str(), &a->sin6_addr) != 1) return -1;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&st);
    a->sin_family = AF_INET;
    if (inet_pton(AF_INET, s.host.c_str(), &a->sin_addr) != 1) return -1;
  }
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&st), len) != 0 || listen(fd, 1) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&st), &len) != 0) {
    return -1;
  }
  *where = std::string(reinterpret_cast<const char*>(&st), len);  // the bound address, as bytes
  return fd;
}

int connect_to(const settings& s, bool unix_socket, const std::string& where) {
  (void)s;
  if (unix_socket) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", where.c_str());
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
    return fd;
  }
  const auto* a = reinterpret_cast<const sockaddr*>(where.data());
  const int fd = socket(a->sa_family, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, a, static_cast<socklen_t>(where.size())) != 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int run_stream(const settings& s, bool unix_socket) {
  char dir[] = "/tmp/uvbus-raw-XXXXXX";
  if (unix_socket && mkdtemp(dir) == nullptr) return 1;
  const std::string path = std::string(dir) + "/s.sock";
  std::string where;
  const int lfd = listen_for(s, unix_socket, path, &where);
  if (lfd < 0) {
    std::perror("raw: listen");
    return 1;
  }
  int rfd = -1;
  const int pid = fork_child(
      s,
      [&](int out) {
        const int fd = accept(lfd, nullptr, nullptr);
        if (fd < 0) return 1;
        const recv_report r = recv_frames(s, fd);
        return write_all(out, &r, sizeof r) ? 0 : 1;
      },
      &rfd);
  if (pid < 0) return 1;
  const int fd = connect_to(s, unix_socket, where);
  bench::cpu_counter cpu;
  const uint64_t sent = fd < 0 ? 0 : send_frames(s, fd);
  const double send_ns = cpu.ns_per_msg(sent);
  recv_report r;
  const bool got = read_all(rfd, &r, sizeof r);
  const bool child_ok = wait_child(pid);
  close_case({fd, lfd, rfd}, unix_socket, path, dir);
  return print_throughput(s, sent, send_ns, got ? r : recv_report{}) && child_ok ? 0 : 1;
}

}  // namespace uvbus::raw
