// Stream channel sender (benchmark contract: docs/benchmark.md):
//
//   uvbus_bench_stream_send URL [--min B] [--max B] [--seconds S] [--no-merge]
//                               [--queue-bytes N] [--batch N] [--copy] [--tls [TOKEN]]
//
// Connects to URL and sends numbered payloads for S seconds as fast as the channel takes them:
// it sends until send() returns queue_full and resumes from on_writable (back-pressure, no
// polling). Then it sends the end message, disconnects gracefully and prints a summary with the
// channel's write metrics. --no-merge turns coalescing off (one write per packet). Payloads are
// built in place with prepare_send/commit_send; --copy uses send() from a buffer instead. --tls:
// TLS 1.3 in PSK mode, as the receiver's --tls.
#include <uv.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "uvbus/stream.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

struct sender {
  options o;
  stream_channel* ch = nullptr;
  connection_id conn;
  std::vector<uint8_t> buf;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  double t_start = 0;
  double t_end = 0;
  double c_start = 0;
  cpu_counter cpu_ru;  // getrusage CPU from the connection on, for cpu_ns/msg
  bool end_sent = false;
  bool done = false;
  int exit_code = 0;
  size_t batch = 0;   // 0: until queue_full
  bool copy = false;  // --copy: build the payload in a buffer and send() it (one more copy)
  stream_connection_metrics final_metrics{};

  // Sends until the queue is full (or the batch is done, or time is up).
  void pump() {
    if (end_sent || !conn) return;
    size_t n_sent = 0;
    for (;;) {
      if ((seq & 255) == 0 && mono_now() >= t_end) {
        finish();
        return;
      }
      // The payload is generated straight into the send queue (prepare/commit), byte for byte
      // what make_payload() writes.
      const size_t n = payload_size(seq, 0, o.min, o.max);
      errc e = errc::ok;
      uint8_t* p = copy ? nullptr : ch->prepare_send(conn, n, &e);
      if (copy) {
        make_payload(seq, 0, o.min, o.max, buf.data());
        e = ch->send(conn, buf.data(), n);
      }
      if (e == errc::queue_full) return;  // on_writable resumes
      if (e != errc::ok) {
        std::fprintf(stderr, "send: %s\n", to_string(e));
        exit_code = 1;
        return;
      }
      if (!copy) {
        put_head(p, n, seq, 0);
        fill_body(p, n, seq);
        (void)ch->commit_send(conn);
      }
      ++seq;
      bytes += n;
      if (batch != 0 && ++n_sent == batch) return;  // resumed from the idle handle
    }
  }

  void finish() {
    uint8_t end[24];
    const size_t n = make_end(0, seq, end);
    const errc e = ch->send(conn, end, n);
    if (e == errc::queue_full) return;  // retried from on_writable
    if (e != errc::ok) {
      std::fprintf(stderr, "send end: %s\n", to_string(e));
      exit_code = 1;
    }
    end_sent = true;
    const double secs = mono_now() - t_start;
    const double cpu = (cpu_now() - c_start) / secs * 100;
    (void)ch->connection_metrics(conn, &final_metrics);
    std::printf(
        "[send] msgs=%llu msgs/s=%.0f MB/s=%.1f cpu%%=%.0f cpu_ns/msg=%.1f write_calls=%llu "
        "merged=%llu refused=%llu\n",
        static_cast<unsigned long long>(seq), static_cast<double>(seq) / secs,
        static_cast<double>(bytes) / secs / 1e6, cpu, cpu_ru.ns_per_msg(seq),
        static_cast<unsigned long long>(final_metrics.write_calls),
        static_cast<unsigned long long>(final_metrics.packets_merged),
        static_cast<unsigned long long>(final_metrics.send_refused));
    std::fflush(stdout);
    (void)ch->disconnect(conn, disconnect_mode::graceful);
  }
};

}  // namespace

// The connection is up (or failed): the clocks start and the first burst goes out.
static void connected(sender* self, connection_id c, errc st) {
  if (st != errc::ok) {
    std::fprintf(stderr, "send: connect: %s\n", to_string(st));
    self->exit_code = 1;
    self->done = true;
    return;
  }
  self->conn = c;
  self->t_start = mono_now();
  self->c_start = cpu_now();
  self->cpu_ru.start();
  self->t_end = self->t_start + self->o.seconds;
  self->pump();
}

int main(int argc, char** argv) {
  sender s;
  s.o = options::parse(argc, argv);
  if (s.o.url.empty()) {
    std::fprintf(stderr,
                 "usage: %s URL [--min B] [--max B] [--seconds S] [--no-merge] [--queue-bytes N] "
                 "[--batch N] [--copy]\n",
                 argv[0]);
    return 2;
  }
  s.buf.resize(s.o.max + 16);
  s.batch = static_cast<size_t>(s.o.get_int("batch", 0));
  s.copy = s.o.flag("copy");
  uv_loop_t loop;
  uv_loop_init(&loop);

  stream_config cfg;
  cfg.message_limit = std::max<size_t>(kDefaultMessageLimit, s.o.max);
  if (s.o.flag("no-merge")) cfg.merge_threshold = 0;
  if (s.o.flag("tls")) cfg.tls = psk_tls(s.o.get("tls"));
  const long qb = s.o.get_int("queue-bytes", 0);
  if (qb > 0) {
    cfg.queue.ring_bytes = cfg.queue.max_bytes = static_cast<size_t>(qb);
    // A queue smaller than the default message limit: the largest message must still fit.
    if (static_cast<size_t>(qb) < 2 * kDefaultMessageLimit) {
      cfg.message_limit = std::max<size_t>(s.o.max, static_cast<size_t>(qb) / 2);
    }
  }
  stream_callbacks cb;
  void* const ctx = &s;
  cb.on_connected = [ctx](connection_id c, errc st) {
    connected(static_cast<sender*>(ctx), c, st);
  };
  cb.on_writable = [ctx](connection_id) {
    auto* self = static_cast<sender*>(ctx);
    if (!self->end_sent && self->seq > 0 && mono_now() >= self->t_end) {
      self->finish();
    } else {
      self->pump();
    }
  };
  cb.on_send_failed = [ctx](connection_id, uint64_t, uint64_t, errc) {
    static_cast<sender*>(ctx)->exit_code = 1;
  };
  cb.on_disconnected = [ctx](connection_id, errc reason) {
    auto* self = static_cast<sender*>(ctx);
    if (reason != errc::ok) {
      std::fprintf(stderr, "send: disconnected: %s\n", to_string(reason));
      self->exit_code = 1;
    }
    self->done = true;
  };
  stream_channel ch(&loop, cfg, cb);
  s.ch = &ch;
  const errc e = ch.connect(s.o.url);
  if (e != errc::ok) {
    std::fprintf(stderr, "send: connect %s: %s: %s\n", s.o.url.c_str(), to_string(e),
                 ch.last_error().detail.c_str());
    return 1;
  }
  // With --batch, the sender yields to the loop after each batch and resumes from an idle handle.
  uv_idle_t idle;
  uv_idle_init(&loop, &idle);
  idle.data = &s;
  if (s.batch != 0) {
    uv_idle_start(&idle, [](uv_idle_t* h) {
      auto* self = static_cast<sender*>(h->data);
      self->pump();
      if (self->end_sent || self->done) uv_idle_stop(h);
    });
  }
  while (!s.done) uv_run(&loop, UV_RUN_ONCE);
  uv_idle_stop(&idle);
  uv_close(reinterpret_cast<uv_handle_t*>(&idle), nullptr);
  ch.close();
  uv_run(&loop, UV_RUN_DEFAULT);
  return s.exit_code;
}
