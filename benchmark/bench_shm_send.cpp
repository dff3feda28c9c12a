// Shared-memory sender benchmark (benchmark contract: docs/benchmark.md):
//
//   uvbus_bench_shm_send URL [--min B] [--max B] [--seconds S] [--writers N] [--batch-bytes B]
//
// --batch-bytes B (default 4096): messages are sent with shm_writer::send_batch in batches of at
// most B bytes of ring (shm_writer::batch_bytes per message), as a sender coalescing a burst
// would; a message larger than that goes alone. 0 = one send() per message.
// --coalesce 1 (with --batch-bytes 0): one send() per message on a coalescing writer
// (shm_writer::coalesce, default 4096-byte stage) with a flush() every 256 sends, standing in for
// the end of a loop turn.
// N writer processes (forked; writer ids 0..N-1) each send verified payloads for S seconds, then
// an end message carrying their count. A full ring is retried after a pause; a record the reader
// skipped as abandoned (the writer was descheduled past the timeout) is sent again, so every
// writer's sequence reaches the receiver complete and in order.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <vector>

#include "bench_common.h"
#include "uvbus/shm.h"

using namespace uvbus;
using namespace uvbus::bench;

namespace {

// Opens w on the receiver's ring, retrying for 10 s while the receiver starts.
bool open_retry(shm_writer& w, const options& o, uint64_t id) {
  errc e = errc::not_found;
  const double give_up = mono_now() + 10;
  while ((e = w.open(o.url)) != errc::ok && mono_now() < give_up) usleep(10000);
  if (e == errc::ok) return true;
  std::fprintf(stderr, "[send %" PRIu64 "] %s\n", id, w.last_error().detail.c_str());
  return false;
}

// --coalesce 1: a coalescing writer (false if that failed).
bool start_coalescing(shm_writer& w, const options& o, uint64_t id) {
  if (o.get_int("coalesce", 0) == 0) return true;
  const errc e = w.coalesce();
  if (e != errc::ok) std::fprintf(stderr, "[send %" PRIu64 "] coalesce: %s\n", id, to_string(e));
  return e == errc::ok;
}

// The end message (retried while the ring is full), then published if the writer coalesces.
errc send_end(shm_writer& w, uint64_t id, uint64_t seq, uint8_t* buf) {
  const size_t n = make_end(id, seq, buf);
  errc e = errc::ok;
  while ((e = w.send(buf, n)) == errc::queue_full || e == errc::abandoned) usleep(100);
  while (e == errc::ok && (e = w.flush()) == errc::queue_full) usleep(100);
  return e;
}

void print_writer(uint64_t id, uint64_t seq, double dt, double ns_per_msg, uint64_t full,
                  uint64_t abandoned, uint64_t wakeups, errc e) {
  std::printf(
      "[send] writer=%" PRIu64 " msgs=%" PRIu64 " msgs/s=%.0f cpu_ns/msg=%.1f queue_full=%" PRIu64
      " abandoned=%" PRIu64 " wakeups=%" PRIu64 " end=%s\n",
      id, seq, static_cast<double>(seq) / dt, ns_per_msg, full, abandoned, wakeups, to_string(e));
}

// A send that did not go: a full ring (counted in *full; the writer yields rather than spins: when
// writers share a core, the ring is often full because another writer was preempted between
// reserve and commit, and only it can unblock the reader; a lone writer spinning instead measured
// no faster here) or a record the reader skipped as abandoned (counted in *abandoned) is retried:
// true. Any other error is printed ("[send ID] WHAT: ..."): false.
[[gnu::always_inline]] inline bool retry_send(errc e, uint64_t* full, uint64_t* abandoned,
                                              uint64_t id, const char* what) {
  if (e == errc::queue_full) {
    ++*full;
    sched_yield();
    return true;
  }
  if (e == errc::abandoned) {
    ++*abandoned;
    return true;
  }
  std::fprintf(stderr, "[send %" PRIu64 "] %s: %s\n", id, what, to_string(e));
  return false;
}

int run_writer(const options& o, uint64_t id) {
  shm_writer w;
  if (!open_retry(w, o, id)) return 1;
  errc e = errc::ok;
  std::vector<uint8_t> buf(std::max<size_t>(o.max, 24));
  uint64_t seq = 0, full = 0, abandoned = 0;
  const double t0 = mono_now();
  const cpu_counter cpu;  // this writer process's getrusage CPU from here on
  const double end = t0 + o.seconds;
  // Message k of writer id carries sequence number (id << 56) | k (see bench_shm_recv).
  const uint64_t base = id << 56;
  const size_t limit =
      std::min<size_t>(static_cast<size_t>(o.get_int("batch-bytes", 4096)), w.max_record_size());
  if (!start_coalescing(w, o, id)) return 1;
  if (limit == 0) {
    size_t n = make_payload(base | seq, id, o.min, o.max, buf.data());
    for (uint32_t k = 0;; ++k) {
      if ((k & 255) == 0) {
        (void)w.flush();  // coalescing: a "loop turn" ends (a failure stays staged)
        if (mono_now() >= end) break;
      }
      e = w.send(buf.data(), n);
      if (e == errc::ok) {
        ++seq;
        n = make_payload(base | seq, id, o.min, o.max, buf.data());
      } else if (!retry_send(e, &full, &abandoned, id, "send")) {
        return 1;
      }
    }
  } else {
    // The next messages, generated back to back in `stage`, as many as fit in `limit` bytes of
    // batch (at least one). Regenerated only after the batch was committed.
    std::vector<uint8_t> stage(std::max(limit, o.max) + o.max + 64);
    std::vector<const_buffer> spans(shm_writer::kMaxBatch);
    size_t cnt = 0;
    // Inline, like the single-send path's payload work: the modes must not differ in inlining.
    auto fill = [&]() __attribute__((always_inline)) {
      cnt = 0;
      size_t used = 0, bytes = 0;
      while (cnt < spans.size()) {
        const size_t n = make_payload(base | (seq + cnt), id, o.min, o.max, stage.data() + used);
        if (cnt > 0 && bytes + shm_writer::batch_bytes(n) > limit) break;
        spans[cnt++] = const_buffer{stage.data() + used, n};
        used += n;
        bytes += shm_writer::batch_bytes(n);
      }
    };
    fill();
    for (uint32_t k = 0;; ++k) {
      if ((k & 15) == 0 && mono_now() >= end) break;
      e = w.send_batch(spans.data(), cnt);
      if (e == errc::ok) {
        seq += cnt;
        fill();
      } else if (!retry_send(e, &full, &abandoned, id, "send_batch")) {
        return 1;
      }
    }
  }
  const double dt = mono_now() - t0;
  const double ns_per_msg = cpu.ns_per_msg(seq);
  e = send_end(w, id, seq, buf.data());
  print_writer(id, seq, dt, ns_per_msg, full, abandoned, w.metrics().wakeups, e);
  std::fflush(stdout);
  return e == errc::ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = options::parse(argc, argv);
  const auto writers = static_cast<uint64_t>(o.get_int("writers", 1));
  if (writers <= 1) return run_writer(o, 0);
  std::vector<pid_t> kids;
  for (uint64_t i = 0; i < writers; ++i) {
    const pid_t pid = fork();
    if (pid == 0) _exit(run_writer(o, i));
    if (pid < 0) return 1;
    kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
