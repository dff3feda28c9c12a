// uvbus_bench_conns's client processes: raw libuv sockets, each bound to its own source address
// in 127.0.0.0/8, writing valid stream frames (core/frame.h) at the plan's rate.
#include <uv.h>

#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "conns_common.h"
#include "core/frame.h"
#include "core/murmur3.h"

namespace uvbus::bench::conns {
namespace {

struct client;

struct cconn {
  union {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } u{};
  uv_connect_t creq{};
  client* owner = nullptr;
  uint32_t index = 0;
  bool up = false;
};

// A write that did not go out at once: its own request and a copy of the bytes left.
struct pending_write {
  uv_write_t req{};
  std::vector<uint8_t> bytes;
};

struct client {
  plan p;
  uv_loop_t loop{};
  uv_pipe_t ctl{};
  uv_timer_t tick{};
  std::string url;
  std::string line;  // control bytes read so far (the URL line first)
  std::vector<std::unique_ptr<cconn>> conns;
  std::vector<cconn*> live;
  size_t next_connect = 0;
  size_t connecting = 0;
  size_t first = 0;  // global index of conns[0]
  bool sending = false;
  double t_go = 0;
  uint64_t sent = 0, slow_writes = 0, errors = 0;
  size_t cursor = 0;
  std::vector<uint8_t> frame;

  void connect_more();
  void on_connect(cconn* c, int status);
  void send_one(cconn* c);
  void on_tick();
  void on_control(const char* p, size_t n);
  void close_all();
};

int connect_one(client* cl, cconn* c) {
  int r = 0;
  if (cl->p.unix_sock) {
    r = uv_pipe_init(&cl->loop, &c->u.pipe, 0);
    if (r == 0) {
      uv_pipe_connect(&c->creq, &c->u.pipe, cl->url.c_str() + 7, [](uv_connect_t* q, int st) {
        auto* cc = static_cast<cconn*>(q->data);
        cc->owner->on_connect(cc, st);
      });
    }
    return r;
  }
  r = uv_tcp_init(&cl->loop, &c->u.tcp);
  if (r != 0) return r;
  const uint32_t g = static_cast<uint32_t>(cl->first) + c->index;
  const std::string src =
      "127.1." + std::to_string(g / 250 % 256) + "." + std::to_string(g % 250 + 1);
  sockaddr_in from{};
  sockaddr_in to{};
  uv_ip4_addr(src.c_str(), 0, &from);
  const size_t colon = cl->url.rfind(':');
  uv_ip4_addr("127.0.0.1", static_cast<int>(std::strtol(cl->url.c_str() + colon + 1, nullptr, 10)),
              &to);
  r = uv_tcp_bind(&c->u.tcp, reinterpret_cast<const sockaddr*>(&from), 0);
  if (r == 0) {
    r = uv_tcp_connect(&c->creq, &c->u.tcp, reinterpret_cast<const sockaddr*>(&to),
                       [](uv_connect_t* q, int st) {
                         auto* cc = static_cast<cconn*>(q->data);
                         cc->owner->on_connect(cc, st);
                       });
  }
  if (r != 0) uv_close(&c->u.h, nullptr);
  return r;
}

// Keeps at most 256 connects in flight, so the listener's backlog never overflows.
void client::connect_more() {
  while (connecting < 256 && next_connect < conns.size()) {
    cconn* c = conns[next_connect++].get();
    c->creq.data = c;
    c->u.h.data = c;
    const int r = connect_one(this, c);
    if (r != 0) {
      std::fprintf(stderr, "conns client: connect %u: %s\n", c->index, uv_strerror(r));
      ++errors;
      continue;
    }
    ++connecting;
  }
}

void client::on_connect(cconn* c, int status) {
  --connecting;
  if (status == 0) {
    c->up = true;
    live.push_back(c);
    if (p.echo) {  // echoes are read and dropped
      uv_read_start(
          &c->u.s,
          [](uv_handle_t*, size_t, uv_buf_t* b) {
            static char sink[65536];
            *b = uv_buf_init(sink, sizeof sink);
          },
          [](uv_stream_t*, ssize_t, const uv_buf_t*) {});
    }
  } else {
    if (errors++ < 5) std::fprintf(stderr, "conns client: connect: %s\n", uv_strerror(status));
    uv_close(&c->u.h, nullptr);
  }
  connect_more();
}

void client::send_one(cconn* c) {
  const uint64_t seq = sent;
  const size_t n =
      p.min + static_cast<size_t>((mix64(seq ^ c->index) >> 32) * (p.max - p.min + 1) >> 32);
  uint8_t* pl = frame.data() + kFrameMaxHeaderBytes;
  put_le64(pl, mono_ns());
  put_le64(pl + 8, first + c->index);
  fill_body(pl, n, seq);
  uint8_t head[kFrameMaxHeaderBytes];
  const size_t hn = frame_write_header(murmur3_x86_32(pl, n, 0), n, head);
  uint8_t* f = pl - hn;
  std::memcpy(f, head, hn);
  const size_t total = hn + n;
  uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(f), static_cast<unsigned>(total));
  const int r = uv_try_write(&c->u.s, &b, 1);
  if (r == static_cast<int>(total)) return;
  if (r < 0 && r != UV_EAGAIN) {
    ++errors;
    return;
  }
  // Not all of it went out now: the rest goes through a queued write, in order.
  const size_t done = r > 0 ? static_cast<size_t>(r) : 0;
  ++slow_writes;
  auto* w = new pending_write;
  w->bytes.assign(f + done, f + total);
  w->req.data = w;
  uv_buf_t rest =
      uv_buf_init(reinterpret_cast<char*>(w->bytes.data()), static_cast<unsigned>(w->bytes.size()));
  if (uv_write(&w->req, &c->u.s, &rest, 1,
               [](uv_write_t* q, int) { delete static_cast<pending_write*>(q->data); }) != 0) {
    delete w;
    ++errors;
  }
}

// Every connection sends `rate` messages a second, phases spread evenly: the messages due by now
// go out round-robin.
void client::on_tick() {
  if (!sending || live.empty()) return;
  const double due_f = (mono_now() - t_go) * p.rate * static_cast<double>(live.size());
  const auto due = static_cast<uint64_t>(due_f);
  while (sent < due) {
    send_one(live[cursor]);
    cursor = cursor + 1 == live.size() ? 0 : cursor + 1;
    ++sent;
  }
}

void client::close_all() {
  uv_timer_stop(&tick);
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&ctl), nullptr);
  for (cconn* c : live) uv_close(&c->u.h, nullptr);
  live.clear();
}

// Control: the URL line, then 'g' (start sending), 'q' (stop sending); EOF: disconnect and exit.
void client::on_control(const char* p_, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const char ch = p_[i];
    if (url.empty()) {
      if (ch == '\n') {
        url = line;
        connect_more();
      } else {
        line += ch;
      }
    } else if (ch == 'g') {
      sending = true;
      t_go = mono_now();
    } else if (ch == 'q') {
      sending = false;
    }
  }
}

}  // namespace

int run_client(const plan& p, size_t first, size_t count, int ctl_fd) {
  client cl;
  cl.p = p;
  cl.first = first;
  cl.frame.resize(p.max + 2 * kFrameMaxHeaderBytes);
  for (size_t i = 0; i < count; ++i) {
    cl.conns.push_back(std::make_unique<cconn>());
    cl.conns.back()->owner = &cl;
    cl.conns.back()->index = static_cast<uint32_t>(i);
  }
  uv_loop_init(&cl.loop);
  uv_pipe_init(&cl.loop, &cl.ctl, 0);
  uv_pipe_open(&cl.ctl, ctl_fd);
  cl.ctl.data = &cl;
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&cl.ctl),
      [](uv_handle_t*, size_t, uv_buf_t* b) {
        static char buf[256];
        *b = uv_buf_init(buf, sizeof buf);
      },
      [](uv_stream_t* s, ssize_t nr, const uv_buf_t* b) {
        auto* self = static_cast<client*>(s->data);
        if (nr > 0) self->on_control(b->base, static_cast<size_t>(nr));
        if (nr < 0) self->close_all();
      });
  uv_timer_init(&cl.loop, &cl.tick);
  cl.tick.data = &cl;
  uv_timer_start(
      &cl.tick, [](uv_timer_t* t) { static_cast<client*>(t->data)->on_tick(); }, 1, 1);
  uv_run(&cl.loop, UV_RUN_DEFAULT);
  std::fprintf(stderr,
               "conns client: %zu connections, sent %" PRIu64 ", queued writes %" PRIu64
               ", errors %" PRIu64 "\n",
               count, cl.sent, cl.slow_writes, cl.errors);
  return cl.errors == 0 ? 0 : 1;
}

}  // namespace uvbus::bench::conns
