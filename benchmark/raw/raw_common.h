// The raw ceilings' shared pieces: settings, the receiver's report sent back to the parent over a
// pipe, socket helpers and CPU pinning. No library, no event loop (benchmark/raw/raw_ceiling.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "bench_common.h"
#include "core/murmur3.h"

namespace uvbus::raw {

// One run of one case. The sending side (or ping-pong client) is the parent process, the receiving
// side (or echo server) a forked child; each is pinned to its own core when there are two.
struct settings {
  std::string name;           // e.g. "tcp-coalesced-hash", "shm-pingpong"
  bool hash = false;          // a MurmurHash3_x86_32 of every payload, computed and checked
  size_t min = 8, max = 128;  // payload sizes (uniform), as the uvbus benchmarks
  std::string dist = "small";
  double seconds = 3;
  std::string host = "127.0.0.1";  // TCP loopback address (::1 for IPv6)
  size_t publish_bytes = 4096;     // shm ring: the writer publishes its head once per this many
  uint64_t corrupt_seq = ~uint64_t{0};  // flip one bit of this message (the self-test)
  size_t size = 64;                     // ping-pong message size
  uint64_t round_trips = 200000, warmup = 10000;
  double load_rate = 0;  // ping-pong: background messages a second on the same link (0: none)
  int send_cpu = 0, recv_cpu = 1;
  bool pin = true;
};

// What the receiving child reports to the parent: written once to a pipe as raw bytes.
struct recv_report {
  uint64_t msgs = 0;                    // payload messages received (the end message not counted)
  uint64_t announced = 0;               // the count the sender's end message announced
  uint64_t errors = 0;                  // sequence, size, content or checksum mismatches
  double msgs_per_s = 0, mb_per_s = 0;  // medians of per-second samples, first dropped
  double cpu_ns_per_msg = 0;            // receiver CPU (user + system) per message
  int ok = 0;                           // 1 when the receiver saw the end message
};

// Pins the calling process to `cpu` when pinning is on and the machine has two cores.
void pin_to(const settings& s, int cpu);

// Writes or reads exactly n bytes on a blocking descriptor; false on error or end of stream.
bool write_all(int fd, const void* p, size_t n);
bool read_all(int fd, void* p, size_t n);

// A listening socket for the case (TCP on s.host port 0, or a unix socket at `path`); -1 on error.
int listen_for(const settings& s, bool unix_socket, const std::string& path, std::string* where);
// Connects to what listen_for() returned in `where`; -1 on error.
int connect_to(const settings& s, bool unix_socket, const std::string& where);

// Anonymous shared memory (inherited across fork; no name to remove afterwards).
void* shared_map(size_t bytes);

// Forks: the child pins itself to s.recv_cpu, runs fn(pipe write end) and exits with its result
// (0 = success); the parent pins itself to s.send_cpu and gets the pid and the pipe's read end.
// Returns -1 if the fork or the pipe failed.
int fork_child(const settings& s, const std::function<int(int)>& fn, int* read_fd);
// Waits for the child; true if it exited with 0.
bool wait_child(int pid);

// The cases, each returning the process exit code after printing its JSON line.
int run_stream(const settings& s, bool unix_socket);
int run_shm_ring(const settings& s);
int run_pingpong(const settings& s, const std::string& mode);

// Checks one received payload (inline: the receivers call it per message) (and, for -hash cases,
// its MurmurHash3 `hash`): counts it in `m`, or in r->errors when wrong. Returns true for the end
// message (its announced count goes to r).
inline bool check_payload(const settings& s, const uint8_t* p, size_t n, uint32_t hash,
                          uint64_t* expect, bench::meter* m, recv_report* r) {
  const bool hash_ok = !s.hash || murmur3_x86_32(p, n, 0) == hash;
  if (hash_ok && n >= 24 && bench::get_le64(p) == bench::kEndSeq) {
    r->announced = bench::get_le64(p + 16);
    return true;
  }
  if (!hash_ok || !bench::verify_payload(p, n, *expect, 0, s.min, s.max)) ++r->errors;
  ++*expect;
  m->add(n);
  return false;
}

// Fills the receiver's report from its meter at the end of a run.
inline void finish_report(const bench::meter& m, bool done, recv_report* r) {
  r->ok = done ? 1 : 0;
  r->msgs = m.msgs();
  r->msgs_per_s = m.median_msgs();
  r->mb_per_s = m.median_mb();
  r->cpu_ns_per_msg = m.cpu_ns_per_msg();
}

// Closes the case's sockets (a descriptor < 0 is skipped) and removes its unix socket and folder.
inline void close_case(std::initializer_list<int> fds, bool unix_socket, const std::string& path,
                       const char* dir) {
  for (const int fd : fds) {
    if (fd >= 0) close(fd);
  }
  if (unix_socket) {
    unlink(path.c_str());
    rmdir(dir);
  }
}

// One throughput JSON line from the sender's count and CPU and the receiver's report; returns
// true if verified (counts agree, no error).
bool print_throughput(const settings& s, uint64_t sent, double send_cpu_ns, const recv_report& r);

}  // namespace uvbus::raw
