// The shared-memory ceiling (shm-ring, shm-ring-hash): one writer process, one busy-polling
// reader process, a 64 MiB ring in memory shared across fork; the writer publishes its head once
// per --publish-bytes (4096) of records.
#include <sys/mman.h>

#include <cstdio>

#include "core/murmur3.h"
#include "raw/raw_common.h"
#include "raw/raw_ring.h"

namespace uvbus::raw {

namespace {

constexpr size_t kRing = 64u << 20;

uint64_t shm_send(const settings& s, ring_writer& w) {
  uint64_t seq = 0;
  const double end = bench::mono_now() + s.seconds;
  for (;; ++seq) {
    if ((seq & 255) == 0 && bench::mono_now() >= end) break;
    const size_t n = bench::payload_size(seq, 0, s.min, s.max);
    uint8_t* r = w.reserve(n);
    bench::make_payload(seq, 0, s.min, s.max, r + 8);
    const uint32_t h = s.hash ? murmur3_x86_32(r + 8, n, 0) : 0;
    std::memcpy(r + 4, &h, 4);
    if (seq == s.corrupt_seq) r[8 + n - 1] ^= 0x10;
    w.commit(n);
  }
  uint8_t* r = w.reserve(24);
  const size_t n = bench::make_end(0, seq, r + 8);
  const uint32_t h = s.hash ? murmur3_x86_32(r + 8, n, 0) : 0;
  std::memcpy(r + 4, &h, 4);
  w.commit(n);
  w.publish();
  return seq;
}

recv_report shm_recv(const settings& s, ring_reader& rd) {
  recv_report r;
  bench::meter m("recv");
  uint64_t expect = 0;
  bool done = false;
  auto check = [&](const uint8_t* rec, size_t n) {
    uint32_t h;
    std::memcpy(&h, rec + 4, 4);
    done = check_payload(s, rec + 8, n, h, &expect, &m, &r);
    return !done;
  };
  const double give_up = bench::mono_now() + s.seconds + 60;
  uint64_t idle = 0;
  while (!done) {
    if (rd.poll(check) == 0) {
      cpu_relax();
      if ((++idle & 0xFFFF) != 0) continue;
      if (bench::mono_now() > give_up) break;  // the writer died: report what arrived
    }
    m.tick();
  }
  finish_report(m, done, &r);
  return r;
}

}  // namespace

void* shared_map(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

int run_shm_ring(const settings& s) {
  void* mem = shared_map(sizeof(ring_header) + kRing);
  if (mem == nullptr) {
    std::perror("raw: mmap");
    return 1;
  }
  auto* hdr = new (mem) ring_header();
  auto* data = static_cast<uint8_t*>(mem) + sizeof(ring_header);
  int rfd = -1;
  const int pid = fork_child(
      s,
      [&](int out) {
        ring_reader rd(hdr, data, kRing);
        const recv_report r = shm_recv(s, rd);
        return write_all(out, &r, sizeof r) ? 0 : 1;
      },
      &rfd);
  if (pid < 0) return 1;
  ring_writer w(hdr, data, kRing, s.publish_bytes);
  bench::cpu_counter cpu;
  const uint64_t sent = shm_send(s, w);
  const double send_ns = cpu.ns_per_msg(sent);
  recv_report r;
  const bool got = read_all(rfd, &r, sizeof r);
  const bool child_ok = wait_child(pid);
  close(rfd);
  munmap(mem, sizeof(ring_header) + kRing);
  return print_throughput(s, sent, send_ns, got ? r : recv_report{}) && child_ok ? 0 : 1;
}

}  // namespace uvbus::raw
