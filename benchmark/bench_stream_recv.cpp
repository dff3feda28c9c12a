// Stream channel receiver (benchmark contract: docs/benchmark.md):
//
//   uvbus_bench_stream_recv URL [--min B] [--max B] [--seconds S] [--ready FILE]
//                           [--tls [TOKEN]]
//
// Listens on URL (port 0 allowed), verifies every payload and sequence number of the one sender,
// prints one line per second and a final JSON line, and exits after the sender's end message (or
// S + 5 seconds after the first connection). --ready FILE: once listening, the bound URL is
// written to FILE (atomically, by rename), so a script can start the sender on an ephemeral port.
// --tls: the listener requires TLS 1.3 in PSK mode, the key derived from TOKEN (give the sender the
// same), a fixed benchmark token when none is given.
#include <uv.h>

#include <cstdio>
#include <string>

#include "bench_common.h"
#include "uvbus/stream.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

struct receiver {
  options o;
  uv_loop_t* loop = nullptr;
  stream_channel* ch = nullptr;
  seq_receiver in;
  double deadline = 0;
  stream_connection_metrics conn_metrics{};

  stream_callbacks callbacks() {
    stream_callbacks cb;
    cb.on_accepted = [this](connection_id) {
      if (deadline == 0) deadline = mono_now() + o.seconds + 5;
    };
    cb.on_received = [this](connection_id c, const uint8_t* p, size_t n) {
      (void)in.take(p, n, o.min, o.max);
      if (in.got_end) {
        (void)ch->connection_metrics(c, &conn_metrics);
        ch->close();
      }
    };
    cb.on_disconnected = [this](connection_id c, errc reason) {
      if (!in.got_end) {
        std::fprintf(stderr, "recv: connection ended before the end message: %s\n",
                     to_string(reason));
        (void)ch->connection_metrics(c, &conn_metrics);
        ++in.errors;
        ch->close();
      }
    };
    return cb;
  }
};

}  // namespace

int main(int argc, char** argv) {
  receiver r;
  r.o = options::parse(argc, argv);
  if (r.o.url.empty()) {
    std::fprintf(stderr, "usage: %s URL [--min B] [--max B] [--seconds S] [--ready FILE]\n",
                 argv[0]);
    return 2;
  }
  uv_loop_t loop;
  uv_loop_init(&loop);
  r.loop = &loop;

  stream_config cfg;
  cfg.message_limit = std::max<size_t>(kDefaultMessageLimit, r.o.max);
  if (r.o.flag("tls")) cfg.tls = psk_tls(r.o.get("tls"));
  stream_channel ch(&loop, cfg, r.callbacks());
  r.ch = &ch;
  listener_id l;
  const errc e = ch.listen(r.o.url, &l);
  if (e != errc::ok) {
    std::fprintf(stderr, "recv: listen %s: %s\n", r.o.url.c_str(), to_string(e));
    return 1;
  }
  std::printf("[recv] listening on %s\n", ch.listener_url(l).c_str());
  std::fflush(stdout);
  if (!write_ready(r.o.get("ready"), ch.listener_url(l))) return 1;
  const double hard_deadline = mono_now() + r.o.seconds + 60;

  // Per-second lines and the deadline, from a 100 ms timer.
  uv_timer_t tick;
  uv_timer_init(&loop, &tick);
  tick.data = &r;
  uv_timer_start(
      &tick,
      [](uv_timer_t* t) {
        auto* self = static_cast<receiver*>(t->data);
        if (self->in.started) self->in.m.tick();
        if (self->ch->closed() || (self->deadline != 0 && mono_now() > self->deadline)) {
          if (!self->ch->closed()) {
            std::fprintf(stderr, "recv: deadline passed without the end message\n");
            ++self->in.errors;
            self->ch->close();
          }
          uv_timer_stop(t);
        }
      },
      100, 100);
  while (!ch.closed() && mono_now() < hard_deadline) uv_run(&loop, UV_RUN_ONCE);
  if (!ch.closed()) {
    std::fprintf(stderr, "recv: no sender\n");
    ++r.in.errors;
    ch.close();
  }
  uv_timer_stop(&tick);
  if (!r.in.got_end) ++r.in.errors;
  r.in.m.tick();
  char extra[256];
  std::snprintf(extra, sizeof extra, R"(,"read_calls":%llu,"end_count":%llu)",
                static_cast<unsigned long long>(r.conn_metrics.read_calls),
                static_cast<unsigned long long>(r.in.end_count));
  json_line("stream_recv", r.o, r.in.m, r.in.errors, extra);
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  return r.in.errors == 0 ? 0 : 1;
}
