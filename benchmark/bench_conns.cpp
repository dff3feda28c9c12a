// Connections at scale: one receiving process (a stream channel listener) and N client
// connections spread over several client processes, each connection sending 64-320 B at a fixed
// rate; reports the receiver's memory per connection, CPU, delivery latency and throughput held.
//
//   uvbus_bench_conns [--connections N] [--rate PER_CONN_PER_S | --total-rate PER_S]
//                     [--seconds S] [--procs P] [--unix] [--echo] [--min 64] [--max 320]
//
// --echo: the receiver sends every message back on its connection (what a server replying to each
// request does; the clients read and discard the echoes), so each connection's send queue is used.
//
// Clients are raw libuv sockets writing valid stream frames (core/frame.h): the stream channel's
// connect() takes no source address, and every TCP connection here is bound to its own source
// address in 127.0.0.0/8 (127.1.x.y) before it connects, so ephemeral ports never run out. Each
// payload carries its send time (CLOCK_MONOTONIC, the same host clock at both ends) in bytes
// [0, 8); the receiver records now - that per message.
//
// Phases: all connections up (idle memory recorded), then every client sends; after one second of
// warm-up the receiver measures for S seconds (CPU from getrusage, latency, messages), tells the
// clients to stop sending, waits 1.5 s of quiet (memory recorded again: what a quiet connection
// keeps), and ends. RLIMIT_NOFILE's soft limit is raised to the hard one; N must stay below it.
// Output: progress on stderr, one JSON line on stdout.
#include <malloc.h>
#include <sys/wait.h>
#include <uv.h>

#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/frame.h"
#include "core/murmur3.h"
#include "uvbus/stream.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;

struct plan {
  size_t conns = 1000;
  double rate = 1;  // messages per second per connection
  double seconds = 10;
  int procs = 4;
  bool unix_sock = false;
  bool echo = false;
  size_t min = 64;
  size_t max = 320;
};

// ---------------------------------------------------------------- client side

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

// ---------------------------------------------------------------- receiver side

// Heap bytes in use (malloc's view: what the process asked for, whatever RSS the allocator keeps).
size_t heap_in_use() {
  return mallinfo2().uordblks;
}

// A /proc/meminfo field in KiB (Slab: the kernel's slab caches, socket structures included).
long meminfo_kib(const char* key) {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char row[256];
  long out = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(row, sizeof row, f) != nullptr) {
    if (std::strncmp(row, key, n) == 0 && row[n] == ':')
      out = std::strtol(row + n + 1, nullptr, 10);
  }
  std::fclose(f);
  return out;
}

// TCP socket buffer memory, system-wide (both ends), KiB, from /proc/net/sockstat.
long tcp_buffer_kib() {
  FILE* f = std::fopen("/proc/net/sockstat", "r");
  if (f == nullptr) return 0;
  char row[256];
  long mem = 0;
  while (std::fgets(row, sizeof row, f) != nullptr) {
    const char* m = std::strstr(row, " mem ");
    if (std::strncmp(row, "TCP:", 4) == 0 && m != nullptr) mem = std::strtol(m + 5, nullptr, 10);
  }
  std::fclose(f);
  return mem * 4;
}

struct snapshot {
  long rss = 0;
  size_t heap = 0;
  long slab = 0;
  long tcp_buf = 0;
  static snapshot take() {
    return {rss_kib(), heap_in_use(), meminfo_kib("Slab"), tcp_buffer_kib()};
  }
};

enum class phase { connecting, warmup, measuring, quiet, draining, done };

struct receiver {
  plan p;
  uv_loop_t* loop = nullptr;
  stream_channel* ch = nullptr;
  std::vector<int> ctl;  // write ends of the clients' control pipes
  phase ph = phase::connecting;
  double t_phase = 0;
  double deadline = 0;
  uint64_t accepted = 0, disconnected = 0, msgs = 0, bytes = 0, bad = 0;
  histogram lat;
  cpu_counter cpu;
  double t0 = 0, wall = 0, cpu_s = 0;
  uint64_t measured = 0;
  snapshot base, idle, active, quiet;
  std::string load;

  void tell(char c) {
    for (const int fd : ctl) {
      if (write(fd, &c, 1) != 1) std::perror("conns: control");
    }
  }
  void on_message(const uint8_t* d, size_t n) {
    if (n < 16) {
      ++bad;
      return;
    }
    const uint64_t now = mono_ns();
    const uint64_t ts = get_le64(d);
    if (ph == phase::measuring) lat.add(now > ts ? now - ts : 0);
    ++msgs;
    bytes += n;
  }
  void step();
};

void receiver::step() {
  const double now = mono_now();
  switch (ph) {
    case phase::connecting:
      if (accepted >= p.conns) {
        idle = snapshot::take();
        std::fprintf(stderr, "conns: %" PRIu64 " connected, rss %ld KiB\n", accepted, idle.rss);
        tell('g');
        ph = phase::warmup;
        t_phase = now;
      } else if (now > deadline) {
        std::fprintf(stderr, "conns: only %" PRIu64 " of %zu connected\n", accepted, p.conns);
        ph = phase::quiet;
        t_phase = now;
      }
      break;
    case phase::warmup:
      if (now - t_phase < 1) break;
      msgs = 0;
      cpu.start();
      t0 = now;
      ph = phase::measuring;
      break;
    case phase::measuring:
      if (now - t0 < p.seconds) break;
      wall = now - t0;
      cpu_s = cpu.seconds();
      measured = msgs;
      active = snapshot::take();
      tell('q');
      ph = phase::quiet;
      t_phase = now;
      break;
    case phase::quiet:
      if (now - t_phase < 1.5) break;
      quiet = snapshot::take();
      for (const int fd : ctl) close(fd);
      ctl.clear();
      ph = phase::draining;
      t_phase = now;
      break;
    case phase::draining:
      if (disconnected < accepted && now - t_phase < 20) break;
      ch->close();
      ph = phase::done;
      break;
    case phase::done:
      break;
  }
}

double kib_delta(long now, long before) {
  return static_cast<double>(now - before) * 1024.0;
}

void print_result(const plan& p, const receiver& r, const stream_channel_metrics& m, int rc) {
  const auto n = static_cast<double>(p.conns);
  auto per = [&](double kib_or_bytes) { return kib_or_bytes / n; };
  const double target = p.rate * n;
  std::printf(
      "{\"bench\":\"conns\",\"transport\":\"%s\",\"echo\":%d,\"connections\":%zu,\"rate_per_conn\":"
      "%.3f,"
      "\"target_msgs_per_s\":%.0f,\"msgs_per_s\":%.0f,\"held\":%.3f,\"cpu_pct\":%.1f,"
      "\"cpu_ns_per_msg\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,"
      "\"rss_idle_b_per_conn\":%.0f,\"rss_active_b_per_conn\":%.0f,\"rss_quiet_b_per_conn\":%.0f,"
      "\"heap_idle_b_per_conn\":%.0f,\"heap_active_b_per_conn\":%.0f,"
      "\"heap_quiet_b_per_conn\":%.0f,\"kernel_slab_b_per_conn\":%.0f,"
      "\"kernel_tcp_buf_kib\":%ld,\"rejected\":%" PRIu64 ",\"bad\":%" PRIu64
      ",\"rc\":%d,"
      "\"load\":\"%s\"}\n",
      p.unix_sock ? "unix" : "tcp", p.echo ? 1 : 0, p.conns, p.rate, target,
      static_cast<double>(r.measured) / std::max(r.wall, 1e-9),
      target > 0 ? static_cast<double>(r.measured) / std::max(r.wall, 1e-9) / target : 0,
      r.cpu_s / std::max(r.wall, 1e-9) * 100,
      r.measured ? r.cpu_s * 1e9 / static_cast<double>(r.measured) : 0,
      static_cast<double>(r.lat.quantile(0.5)) / 1e3,
      static_cast<double>(r.lat.quantile(0.99)) / 1e3,
      static_cast<double>(r.lat.quantile(0.999)) / 1e3, per(kib_delta(r.idle.rss, r.base.rss)),
      per(kib_delta(r.active.rss, r.base.rss)), per(kib_delta(r.quiet.rss, r.base.rss)),
      per(static_cast<double>(r.idle.heap) - static_cast<double>(r.base.heap)),
      per(static_cast<double>(r.active.heap) - static_cast<double>(r.base.heap)),
      per(static_cast<double>(r.quiet.heap) - static_cast<double>(r.base.heap)),
      per(kib_delta(r.idle.slab, r.base.slab)), r.active.tcp_buf, m.connections_rejected, r.bad, rc,
      r.load.c_str());
  std::fflush(stdout);
}

stream_callbacks receiver_callbacks(receiver* r) {
  stream_callbacks cb;
  cb.on_accepted = [r](connection_id) { ++r->accepted; };
  cb.on_received = [r](connection_id c, const uint8_t* d, size_t n) {
    r->on_message(d, n);
    if (r->p.echo && r->ch->send(c, d, n) != errc::ok) ++r->bad;
  };
  cb.on_disconnected = [r](connection_id, errc) { ++r->disconnected; };
  cb.on_log = [](log_level, const std::string& text) {
    std::fprintf(stderr, "conns: channel: %s\n", text.c_str());
  };
  return cb;
}

// Forks the client processes (before any loop exists); r->ctl gets their control pipes.
std::vector<pid_t> fork_clients(const plan& p, receiver* r) {
  std::vector<pid_t> kids;
  const size_t per = (p.conns + static_cast<size_t>(p.procs) - 1) / static_cast<size_t>(p.procs);
  for (size_t first = 0; first < p.conns; first += per) {
    int fds[2];
    if (pipe(fds) != 0) break;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      for (const int fd : r->ctl) close(fd);
      _exit(run_client(p, first, std::min(per, p.conns - first), fds[0]));
    }
    close(fds[0]);
    if (pid < 0) {
      close(fds[1]);
      break;
    }
    r->ctl.push_back(fds[1]);
    kids.push_back(pid);
  }
  return kids;
}

int run_receiver(const plan& p, const std::string& unix_path) {
  receiver r;
  r.p = p;
  r.base = snapshot::take();
  const std::vector<pid_t> kids = fork_clients(p, &r);
  uv_loop_t loop;
  uv_loop_init(&loop);
  r.loop = &loop;
  stream_config cfg;
  cfg.max_connections = static_cast<uint32_t>(p.conns + 64);
  cfg.backlog = 4096;
  stream_channel ch(&loop, cfg, receiver_callbacks(&r));
  r.ch = &ch;
  listener_id l;
  const std::string url = p.unix_sock ? "unix://" + unix_path : "ipv4://127.0.0.1:0";
  if (ch.listen(url, &l) != errc::ok) {
    std::fprintf(stderr, "conns: listen %s failed\n", url.c_str());
    return 1;
  }
  const std::string bound = ch.listener_url(l) + "\n";
  for (const int fd : r.ctl) {
    if (write(fd, bound.data(), bound.size()) != static_cast<ssize_t>(bound.size())) return 1;
  }
  r.deadline = mono_now() + 120;
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  t.data = &r;
  uv_timer_start(
      &t, [](uv_timer_t* h) { static_cast<receiver*>(h->data)->step(); }, 50, 50);
  while (r.ph != phase::done) uv_run(&loop, UV_RUN_ONCE);
  const stream_channel_metrics m = ch.metrics();
  uv_close(reinterpret_cast<uv_handle_t*>(&t), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  int rc = r.measured == 0 ? 1 : 0;
  for (const pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  FILE* la = std::fopen("/proc/loadavg", "r");
  char load[64] = {};
  if (la != nullptr) {
    if (std::fgets(load, 15, la) == nullptr) load[0] = 0;
    std::fclose(la);
  }
  r.load = load;
  while (!r.load.empty() && (r.load.back() == '\n' || r.load.back() == ' ')) r.load.pop_back();
  print_result(p, r, m, rc);
  return rc;
}

bool given(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return true;
  }
  return false;
}

// Raises the descriptor soft limit to the hard one; returns the limit now in force.
rlim_t raise_nofile() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) std::perror("setrlimit");
  }
  (void)getrlimit(RLIMIT_NOFILE, &rl);
  return rl.rlim_cur;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = options::parse(argc, argv);
  plan p;
  p.conns = static_cast<size_t>(o.get_int("connections", 1000));
  p.seconds = o.seconds;
  p.procs = static_cast<int>(std::max(1L, o.get_int("procs", 4)));
  p.unix_sock = o.flag("unix");
  p.echo = o.flag("echo");
  // 64-320 B unless --min / --max say otherwise (the shared parser's defaults are 8-128 B).
  p.min = given(argc, argv, "--min") ? std::max<size_t>(o.min, 16) : 64;
  p.max = given(argc, argv, "--max") ? std::max(o.max, p.min) : std::max<size_t>(320, p.min);
  const std::string total = o.get("total-rate");
  p.rate = total.empty() ? std::strtod(o.get("rate", "1").c_str(), nullptr)
                         : std::strtod(total.c_str(), nullptr) / static_cast<double>(p.conns);
  const rlim_t lim = raise_nofile();
  // The receiver holds one descriptor per connection plus its loop, listener and pipes.
  if (p.conns + 64 > lim) {
    std::fprintf(stderr, "conns: %zu connections need more than the descriptor limit %llu\n",
                 p.conns, static_cast<unsigned long long>(lim));
    return 2;
  }
  const std::string path = "/tmp/uvbus-conns-" + std::to_string(getpid()) + ".sock";
  const int rc = run_receiver(p, path);
  if (p.unix_sock) unlink(path.c_str());
  return rc;
}
