// Shared-memory receiver benchmark (benchmark contract: docs/benchmark.md):
//
//   uvbus_bench_shm_recv URL [--min B] [--max B] [--seconds S] [--writers N] [--ring BYTES]
//                        [--spin-us US] [--poll] [--ready FILE]
//
// Creates the region (shm://name, shm://0xKEY or mem:// is meaningless across processes), then
// drains it from a libuv loop (or, with --poll, by busy-polling shm_reader::poll). Every payload
// is verified against what writer <id> sends as message <seq>, per writer, in order; the run ends
// when all N writers sent their end message (or after S + 5 seconds).
#include <uv.h>

#include <cinttypes>
#include <cstdio>
#include <vector>

#include "bench_common.h"
#include "uvbus/shm.h"

using namespace uvbus;
using namespace uvbus::bench;

namespace {

struct state {
  options opt;
  meter m{"recv"};
  std::vector<uint64_t> next;  // next expected seq per writer
  std::vector<bool> done;
  size_t writers_done = 0;
  uint64_t errors = 0;
  uint64_t end_count_mismatch = 0;
  double deadline = 0;
  shm_reader reader;
  bool finished = false;
};

void on_records(void* user, const shm_record* recs, size_t n) {
  auto* s = static_cast<state*>(user);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = recs[i].data;
    const size_t len = recs[i].size;
    // Writer w numbers its messages (w << 56) | k, so even an 8-byte payload (which holds only
    // the sequence number) tells which writer sent it.
    const uint64_t seq = get_le64(p);
    if (seq == kEndSeq) {
      const uint64_t w = len >= 24 ? get_le64(p + 8) : ~uint64_t{0};
      if (w >= s->next.size()) {
        ++s->errors;
        continue;
      }
      if (get_le64(p + 16) != s->next[w]) ++s->end_count_mismatch;
      if (!s->done[w]) {
        s->done[w] = true;
        ++s->writers_done;
      }
      continue;
    }
    const uint64_t w = seq >> 56;
    const uint64_t k = seq & ((uint64_t{1} << 56) - 1);
    if (w >= s->next.size()) {
      ++s->errors;
      continue;
    }
    if (k != s->next[w] || !verify_payload(p, len, seq, w, s->opt.min, s->opt.max)) {
      if (s->errors < 5) {
        std::fprintf(stderr,
                     "[recv] bad record: writer %" PRIu64 " seq %" PRIu64 " (expected %" PRIu64
                     ") len %zu\n",
                     w, k, s->next[w], len);
      }
      ++s->errors;
      s->next[w] = k + 1;
      continue;
    }
    ++s->next[w];
    s->m.add(len);
  }
  if (s->writers_done == s->next.size()) {
    s->finished = true;
    s->reader.stop();
  }
}

}  // namespace

int main(int argc, char** argv) {
  state s;
  s.opt = options::parse(argc, argv);
  const auto writers = static_cast<size_t>(s.opt.get_int("writers", 1));
  s.next.assign(writers, 0);
  s.done.assign(writers, false);
  shm_config cfg;
  cfg.ring_bytes = static_cast<size_t>(s.opt.get_int("ring", 8 << 20));
  cfg.spin_us = static_cast<uint32_t>(s.opt.get_int("spin-us", 50));
  cfg.max_record_size = static_cast<uint32_t>(std::max<size_t>(s.opt.max, size_t{64} * 1024));
  if (const errc e = s.reader.open(s.opt.url, cfg); e != errc::ok) {
    std::fprintf(stderr, "open %s: %s\n", s.opt.url.c_str(), to_string(e));
    return 1;
  }
  const std::string ready = s.opt.get("ready");
  if (!ready.empty()) {
    if (FILE* f = std::fopen(ready.c_str(), "w")) {
      std::fprintf(f, "%s\n", s.opt.url.c_str());
      std::fclose(f);
    }
  }
  (void)s.reader.set_callbacks(
      {[&s](const shm_record* recs, size_t n) { on_records(&s, recs, n); }});
  s.m.reset_clock();
  s.deadline = mono_now() + s.opt.seconds + 5;
  if (s.opt.flag("poll")) {
    while (!s.finished && mono_now() < s.deadline) {
      if (s.reader.poll(4096) == 0) __builtin_ia32_pause();
      s.m.tick();
    }
  } else {
    uv_loop_t loop;
    uv_loop_init(&loop);
    if (const errc e = s.reader.start(&loop); e != errc::ok) {
      std::fprintf(stderr, "start: %s\n", to_string(e));
      return 1;
    }
    uv_timer_t tick;
    uv_timer_init(&loop, &tick);
    tick.data = &s;
    uv_timer_start(
        &tick,
        [](uv_timer_t* t) {
          auto* st = static_cast<state*>(t->data);
          st->m.tick();
          if (st->finished || mono_now() > st->deadline) {
            st->reader.stop();
            uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
          }
        },
        100, 100);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  const shm_metrics mt = s.reader.metrics();
  char extra[512];
  std::snprintf(extra, sizeof extra,
                ",\"writers\":%zu,\"writers_done\":%zu,\"abandoned\":%" PRIu64
                ",\"checksum_failures\":%" PRIu64 ",\"queue_full\":%" PRIu64 ",\"wakeups\":%" PRIu64
                ",\"batches\":%" PRIu64 ",\"end_mismatch\":%" PRIu64,
                writers, s.writers_done, mt.abandoned, mt.checksum_failures, mt.queue_full,
                mt.wakeups, mt.batches, s.end_count_mismatch);
  const uint64_t errors = s.errors + mt.checksum_failures + mt.corrupt + s.end_count_mismatch +
                          (s.writers_done == writers ? 0 : 1);
  json_line("shm_recv", s.opt, s.m, errors, extra);
  s.reader.close();
  return errors == 0 ? 0 : 1;
}
