// Connections at scale: one receiving process (a stream channel listener) and N client
// connections spread over several client processes, each connection sending 64-320 B at a fixed
// rate; reports the receiver's memory per connection, CPU, delivery latency and throughput held.
//
//   uvbus_bench_conns [--connections N] [--rate PER_CONN_PER_S | --total-rate PER_S]
//                     [--seconds S] [--procs P] [--unix] [--echo] [--min 64] [--max 320]
//                     [--loops L]
//
// --loops L: the receiver runs L loop threads, each with its own stream channel listening on the
// same TCP port (stream_config::tcp_reuse_port); the kernel spreads the connections over them.
// --echo: the receiver sends every message back on its connection (what a server replying to each
// request does; the clients read and discard the echoes), so each connection's send queue is used.
//
// Clients are raw libuv sockets writing valid stream frames (core/frame.h): the stream channel's
// connect() takes no source address, and every TCP connection here is bound to its own source
// address in 127.0.0.0/8 (127.1.x.y) before it connects, so ephemeral ports never run out. Each
// payload carries its send time (CLOCK_MONOTONIC, the same host clock at both ends) in bytes
// [0, 8); the receiver records now - that per message.
//
// Phases: all connections up (idle memory recorded; connect_s is the time from telling the clients
// where to connect to the last accept, each client process keeping at most 256 connects in
// flight), then every client sends; after one second of
// warm-up the receiver measures for S seconds (CPU from getrusage, latency, messages), tells the
// clients to stop sending, waits 1.5 s of quiet (memory recorded again: what a quiet connection
// keeps), and ends. RLIMIT_NOFILE's soft limit is raised to the hard one; N must stay below it.
// Output: progress on stderr, one JSON line on stdout.
#include <malloc.h>
#include <sys/wait.h>
#include <uv.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "conns_common.h"
#include "uvbus/stream.h"

namespace {

using namespace uvbus;
using namespace uvbus::bench;
using conns::plan;
using conns::run_client;

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

struct receiver;

// One receiving loop and its channel: the main thread's (which also runs the phases), or a loop
// thread of its own (--loops). Its counters are read by the main thread while it runs.
struct alignas(64) worker {
  receiver* r = nullptr;
  uv_loop_t* loop = nullptr;
  std::unique_ptr<stream_channel> ch;
  std::atomic<uint64_t> accepted{0}, disconnected{0}, msgs{0}, bad{0};
  std::atomic<uint64_t> last_accept_ns{0};  // mono_ns() of its latest accept
  histogram lat;  // written by the worker's thread; read once it has ended
  stream_channel_metrics m;
  // Loop threads only: their own loop, stopped through `stop`.
  uv_loop_t own{};
  uv_async_t stop{};
  std::thread thread;

  void on_message(const uint8_t* d, size_t n);
  void close_channel() {
    m = ch->metrics();
    ch->close();
  }
};

struct receiver {
  plan p;
  std::vector<std::unique_ptr<worker>> workers;  // [0] runs on the main thread
  std::vector<int> ctl;                          // write ends of the clients' control pipes
  std::atomic<phase> ph{phase::connecting};
  double t_phase = 0;
  double deadline = 0;
  cpu_counter cpu;
  double t0 = 0, wall = 0, cpu_s = 0;
  uint64_t measured = 0, msgs_at_start = 0;
  uint64_t url_sent_ns = 0;  // when the clients were told where to connect
  double connect_s = 0;      // from then until the last connection was accepted
  snapshot base, idle, active, quiet;
  std::string load;

  template <class F>
  uint64_t sum(F&& field) const {
    uint64_t n = 0;
    for (const auto& w : workers) n += field(*w).load(std::memory_order_relaxed);
    return n;
  }
  [[nodiscard]] uint64_t accepted() const {
    return sum([](const worker& w) -> const std::atomic<uint64_t>& { return w.accepted; });
  }
  [[nodiscard]] uint64_t disconnected() const {
    return sum([](const worker& w) -> const std::atomic<uint64_t>& { return w.disconnected; });
  }
  [[nodiscard]] uint64_t msgs() const {
    return sum([](const worker& w) -> const std::atomic<uint64_t>& { return w.msgs; });
  }
  void tell(char c) {
    for (const int fd : ctl) {
      if (write(fd, &c, 1) != 1) std::perror("conns: control");
    }
  }
  void step();
};

void worker::on_message(const uint8_t* d, size_t n) {
  if (n < 16) {
    bad.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t now = mono_ns();
  const uint64_t ts = get_le64(d);
  if (r->ph.load(std::memory_order_relaxed) == phase::measuring) lat.add(now > ts ? now - ts : 0);
  msgs.fetch_add(1, std::memory_order_relaxed);
}

void receiver::step() {
  const double now = mono_now();
  switch (ph.load()) {
    case phase::connecting:
      if (accepted() >= p.conns) {
        uint64_t last = 0;
        for (const auto& w : workers) last = std::max(last, w->last_accept_ns.load());
        connect_s = static_cast<double>(last - std::min(last, url_sent_ns)) * 1e-9;
        idle = snapshot::take();
        std::fprintf(stderr, "conns: %" PRIu64 " connected, rss %ld KiB\n", accepted(), idle.rss);
        tell('g');
        ph = phase::warmup;
        t_phase = now;
      } else if (now > deadline) {
        std::fprintf(stderr, "conns: only %" PRIu64 " of %zu connected\n", accepted(), p.conns);
        ph = phase::quiet;
        t_phase = now;
      }
      break;
    case phase::warmup:
      if (now - t_phase < 1) break;
      msgs_at_start = msgs();
      cpu.start();
      t0 = now;
      ph = phase::measuring;
      break;
    case phase::measuring:
      if (now - t0 < p.seconds) break;
      wall = now - t0;
      cpu_s = cpu.seconds();
      measured = msgs() - msgs_at_start;
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
      if (disconnected() < accepted() && now - t_phase < 20) break;
      workers[0]->close_channel();
      for (size_t i = 1; i < workers.size(); ++i) uv_async_send(&workers[i]->stop);
      ph = phase::done;
      break;
    case phase::done:
      break;
  }
}

double kib_delta(long now, long before) {
  return static_cast<double>(now - before) * 1024.0;
}

void print_result(const plan& p, const receiver& r, int rc) {
  const auto n = static_cast<double>(p.conns);
  auto per = [&](double kib_or_bytes) { return kib_or_bytes / n; };
  const double target = p.rate * n;
  histogram lat;
  uint64_t rejected = 0;
  uint64_t bad = 0;
  for (const auto& w : r.workers) {
    std::fprintf(stderr, "conns: loop %zu: %" PRIu64 " connections, %" PRIu64 " messages\n",
                 static_cast<size_t>(&w - r.workers.data()), w->accepted.load(), w->msgs.load());
    lat.merge(w->lat);
    rejected += w->m.connections_rejected;
    bad += w->bad.load();
  }
  std::printf(
      "{\"bench\":\"conns\",\"transport\":\"%s\",\"echo\":%d,\"loops\":%d,\"connections\":%zu,"
      "\"rate_per_conn\":%.3f,"
      "\"target_msgs_per_s\":%.0f,\"msgs_per_s\":%.0f,\"held\":%.3f,\"cpu_pct\":%.1f,"
      "\"cpu_ns_per_msg\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,"
      "\"rss_idle_b_per_conn\":%.0f,\"rss_active_b_per_conn\":%.0f,\"rss_quiet_b_per_conn\":%.0f,"
      "\"heap_idle_b_per_conn\":%.0f,\"heap_active_b_per_conn\":%.0f,"
      "\"heap_quiet_b_per_conn\":%.0f,\"kernel_slab_b_per_conn\":%.0f,"
      "\"kernel_tcp_buf_kib\":%ld,\"connect_s\":%.3f,\"connects_per_s\":%.0f,"
      "\"rejected\":%" PRIu64 ",\"bad\":%" PRIu64
      ",\"rc\":%d,"
      "\"load\":\"%s\"}\n",
      p.unix_sock ? "unix" : "tcp", p.echo ? 1 : 0, p.loops, p.conns, p.rate, target,
      static_cast<double>(r.measured) / std::max(r.wall, 1e-9),
      target > 0 ? static_cast<double>(r.measured) / std::max(r.wall, 1e-9) / target : 0,
      r.cpu_s / std::max(r.wall, 1e-9) * 100,
      r.measured ? r.cpu_s * 1e9 / static_cast<double>(r.measured) : 0,
      static_cast<double>(lat.quantile(0.5)) / 1e3, static_cast<double>(lat.quantile(0.99)) / 1e3,
      static_cast<double>(lat.quantile(0.999)) / 1e3, per(kib_delta(r.idle.rss, r.base.rss)),
      per(kib_delta(r.active.rss, r.base.rss)), per(kib_delta(r.quiet.rss, r.base.rss)),
      per(static_cast<double>(r.idle.heap) - static_cast<double>(r.base.heap)),
      per(static_cast<double>(r.active.heap) - static_cast<double>(r.base.heap)),
      per(static_cast<double>(r.quiet.heap) - static_cast<double>(r.base.heap)),
      per(kib_delta(r.idle.slab, r.base.slab)), r.active.tcp_buf, r.connect_s,
      r.connect_s > 0 ? n / r.connect_s : 0, rejected, bad, rc, r.load.c_str());
  std::fflush(stdout);
}

stream_callbacks receiver_callbacks(worker* w) {
  stream_callbacks cb;
  cb.on_accepted = [w](connection_id) {
    w->accepted.fetch_add(1, std::memory_order_relaxed);
    w->last_accept_ns.store(mono_ns(), std::memory_order_relaxed);
  };
  cb.on_received = [w](connection_id c, const uint8_t* d, size_t n) {
    w->on_message(d, n);
    if (w->r->p.echo && w->ch->send(c, d, n) != errc::ok) w->bad.fetch_add(1);
  };
  cb.on_disconnected = [w](connection_id, errc) {
    w->disconnected.fetch_add(1, std::memory_order_relaxed);
  };
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

stream_config receiver_config(const plan& p) {
  stream_config cfg;
  cfg.max_connections = static_cast<uint32_t>(p.conns + 64);
  cfg.backlog = 4096;
  cfg.tcp_reuse_port = p.loops > 1;
  return cfg;
}

// Starts worker w's loop thread: its channel listens on url (the port worker 0 got) and runs until
// w->stop. False if its listen() failed (the thread has then ended).
bool start_loop_thread(worker* w, const std::string& url) {
  std::promise<bool> listening;
  std::future<bool> ok = listening.get_future();
  w->thread = std::thread([w, url, &listening] {
    uv_loop_init(&w->own);
    w->loop = &w->own;
    w->ch =
        std::make_unique<stream_channel>(w->loop, receiver_config(w->r->p), receiver_callbacks(w));
    const bool up = w->ch->listen(url) == errc::ok;
    if (!up) std::fprintf(stderr, "conns: loop thread: listen %s failed\n", url.c_str());
    w->stop.data = w;
    uv_async_init(w->loop, &w->stop, [](uv_async_t* h) {
      static_cast<worker*>(h->data)->close_channel();
      uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr);
    });
    listening.set_value(up);
    if (!up) w->close_channel();
    uv_run(w->loop, UV_RUN_DEFAULT);
    w->ch.reset();
    uv_run(w->loop, UV_RUN_DEFAULT);
    uv_loop_close(w->loop);
  });
  const bool up = ok.get();
  if (!up) {
    uv_async_send(&w->stop);
    w->thread.join();
  }
  return up;
}

// Worker 0 on the main loop, listening on `url`; the others (TCP only) on its port.
bool start_workers(receiver* r, uv_loop_t* loop, const std::string& url, std::string* bound) {
  for (int i = 0; i < r->p.loops; ++i) {
    r->workers.push_back(std::make_unique<worker>());
    r->workers.back()->r = r;
  }
  worker& w0 = *r->workers[0];
  w0.loop = loop;
  w0.ch = std::make_unique<stream_channel>(loop, receiver_config(r->p), receiver_callbacks(&w0));
  listener_id l;
  if (w0.ch->listen(url, &l) != errc::ok) {
    std::fprintf(stderr, "conns: listen %s failed\n", url.c_str());
    r->workers.resize(1);
    return false;
  }
  *bound = w0.ch->listener_url(l);
  for (size_t i = 1; i < r->workers.size(); ++i) {
    if (!start_loop_thread(r->workers[i].get(), *bound)) {
      r->workers.resize(i);
      return false;
    }
  }
  return true;
}

int run_receiver(const plan& p, const std::string& unix_path) {
  receiver r;
  r.p = p;
  r.base = snapshot::take();
  const std::vector<pid_t> kids = fork_clients(p, &r);
  uv_loop_t loop;
  uv_loop_init(&loop);
  const std::string url = p.unix_sock ? "unix://" + unix_path : "ipv4://127.0.0.1:0";
  std::string bound;
  int rc = start_workers(&r, &loop, url, &bound) ? 0 : 1;
  bound += "\n";
  r.url_sent_ns = mono_ns();
  for (const int fd : r.ctl) {
    // A failed start tells the clients nothing they can use: they end on the closed pipe.
    if (rc == 0 && write(fd, bound.data(), bound.size()) != static_cast<ssize_t>(bound.size()))
      rc = 1;
  }
  if (rc != 0) r.ph = phase::draining;
  r.deadline = mono_now() + 120;
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  t.data = &r;
  uv_timer_start(
      &t, [](uv_timer_t* h) { static_cast<receiver*>(h->data)->step(); }, 50, 50);
  while (r.ph != phase::done) uv_run(&loop, UV_RUN_ONCE);
  uv_close(reinterpret_cast<uv_handle_t*>(&t), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  for (size_t i = 1; i < r.workers.size(); ++i) r.workers[i]->thread.join();
  r.workers[0]->ch.reset();
  uv_run(&loop, UV_RUN_DEFAULT);
  if (r.measured == 0) rc = 1;
  for (const int fd : r.ctl) close(fd);
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
  print_result(p, r, rc);
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
  p.loops = static_cast<int>(std::max(1L, o.get_int("loops", 1)));
  if (p.loops > 1 && p.unix_sock) {
    std::fprintf(stderr, "conns: --loops needs TCP (unix listeners cannot share a path)\n");
    return 2;
  }
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
