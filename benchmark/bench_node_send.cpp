// Bus node sender (benchmark contract of docs/benchmark.md, at the node level):
//
//   uvbus_bench_node_send PARENT_URL [--min B] [--max B] [--seconds S] [--no-shm] [--id ID]
//                                    [--target ID] [--reports] [--next-hop] [--metrics]
//                                    [--latency] [--copy] [--window MSGS] [--link-queue BYTES]
//
// --window / --link-queue: node_config::retransmit_max_messages and link_queue_bytes (sizing
// experiments; docs/benchmark.md "What bounds the four missed targets").
// Registers node --id (default 0x1001; 0x1101 under the receiver's relay) to PARENT_URL and sends
// numbered payloads to --target (default 0x1000) for S seconds, as fast as send_data() takes them
// (until queue_full; then it waits for on_writable, which a stream link, a ring or a flow sends).
// The node picks the channel: shared memory when the parent is on this host and offers a ring,
// unless --no-shm. Then the end message, a graceful stop, and a summary line. --reports (or
// UVBUS_BENCH_REPORTS=1 in the environment) sets on_report, so every message gets its next-hop
// delivery report (counted; the summary says how many came back ok): the cost of reports.
// Delivery is end to end (the node default: flows with acknowledgements from the target) unless
// --next-hop (or UVBUS_BENCH_DELIVERY=next_hop) selects next-hop delivery.
// --metrics (UVBUS_BENCH_METRICS=1) turns the metrics endpoint on and renders the metrics text
// once a second (a scrape 15 times more often than Prometheus' default); --latency
// (UVBUS_BENCH_LATENCY=1) turns the latency histograms on and prints their percentiles.
// Payloads are built in place with prepare_data/commit_data, as the stream benchmark builds them
// with prepare_send/commit_send; --copy builds each in a buffer and send_data()s it (one more
// copy).

#include <uv.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#include "uvbus/node.h"

using namespace uvbus;
using namespace uvbus::bench;

namespace {

// One sender: its node's state and counters.
struct sender {
  options o;
  bus_id id = 0;
  bus_id target = 0;
  bool reports = false;
  bool copy = false;  // --copy: send_data() from a buffer instead of prepare_data/commit_data
  bool down = false;
  bool writable = true;
  int exit_code = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t refused = 0;
  uint64_t reports_ok = 0;
  uint64_t reports_failed = 0;
  uint64_t unacked_peak_msgs = 0;  // end to end: the retransmit buffer's high-water mark
  uint64_t unacked_peak_bytes = 0;

  node_callbacks callbacks() {
    node_callbacks cb;
    if (reports) {
      cb.on_report = [this](const delivery_report& r) {
        if (r.status == errc::ok) {
          ++reports_ok;
        } else {
          ++reports_failed;
        }
      };
    }
    cb.on_writable = [this](bus_id) { writable = true; };
    cb.on_down = [this](errc) { down = true; };
    cb.on_registration = [this](errc e, const std::string& d) {
      if (e != errc::ok) {
        std::fprintf(stderr, "send: registration: %s %s\n", to_string(e), d.c_str());
        exit_code = 1;
      }
    };
    return cb;
  }

  // Sends numbered payloads until t_end, as fast as send_data() takes them. After a queue_full it
  // waits for on_writable (a stream link or flow that drained, a ring the node polled and found at
  // most half full) rather than retrying.
  bool metrics = false;
  double next_scrape = 0;
  uint64_t scrapes = 0;
  size_t scraped_bytes = 0;

  void send_until(node& n, uv_loop_t* loop, double t_end) {
    std::vector<uint8_t> buf(o.max + 16);
    while (exit_code == 0 && mono_now() < t_end) {
      for (int k = 0; k < 4096; ++k) {
        errc e = errc::ok;
        size_t len = 0;
        if (copy) {
          len = make_payload(seq, 0, o.min, o.max, buf.data());
          e = n.send_data(target, 1, buf.data(), len);
        } else {
          len = payload_size(seq, 0, o.min, o.max);
          uint8_t* p = n.prepare_data(target, 1, len, &e);
          if (p != nullptr) {
            (void)make_payload(seq, 0, o.min, o.max, p);
            e = n.commit_data();
          }
        }
        if (e == errc::queue_full) {
          ++refused;
          writable = false;
          break;
        }
        if (e != errc::ok) {
          std::fprintf(stderr, "send: %s\n", to_string(e));
          exit_code = 1;
          break;
        }
        ++seq;
        bytes += len;
      }
      if (metrics && mono_now() >= next_scrape) {
        scraped_bytes += n.metrics_text().size();
        ++scrapes;
        next_scrape = mono_now() + 1;
      }
      const node_counters c = n.counters();
      unacked_peak_msgs = std::max(unacked_peak_msgs, c.flow_unacked_now);
      unacked_peak_bytes = std::max(unacked_peak_bytes, c.flow_unacked_bytes);
      uv_run(loop, writable ? UV_RUN_NOWAIT : UV_RUN_ONCE);
    }
  }

  // The end message, retried while the queue is full.
  void send_end(node& n, uv_loop_t* loop) {
    uint8_t end[24];
    const size_t elen = make_end(0, seq, end);
    for (;;) {
      const errc e = n.send_data(target, 1, end, elen);
      if (e == errc::ok) return;
      if (e != errc::queue_full) {
        std::fprintf(stderr, "send end: %s\n", to_string(e));
        exit_code = 1;
        return;
      }
      uv_run(loop, UV_RUN_NOWAIT);
    }
  }
};

// The latency line (latency_histograms on): send to end-to-end acknowledgement, in microseconds.
void print_latency(const node& n, bus_id target) {
  latency_percentiles lp;
  if (!n.latency_to(target, &lp)) return;
  const auto us = [](uint64_t ns) { return static_cast<double>(ns) / 1e3; };
  std::printf(
      "[send] latency (send to end-to-end ack): n=%llu p50=%.1fus p90=%.1fus p99=%.1fus "
      "p99.9=%.1fus max=%.1fus\n",
      static_cast<unsigned long long>(lp.count), us(lp.p50), us(lp.p90), us(lp.p99), us(lp.p999),
      us(lp.max));
}

// The sender node's configuration from the command line and the environment; sets s's options.
node_config make_config(sender* s, bool* next_hop) {
  node_config c;
  c.parent_urls = {s->o.url};
  c.enable_shm = !s->o.flag("no-shm");
  c.heartbeat_interval_ms = 1000;
  c.heartbeat_timeout_ms = 10000;
  c.sibling_direct = false;
  const char* env_delivery = std::getenv("UVBUS_BENCH_DELIVERY");
  *next_hop =
      s->o.flag("next-hop") || (env_delivery != nullptr && std::string(env_delivery) == "next_hop");
  c.delivery = *next_hop ? delivery_mode::next_hop : delivery_mode::end_to_end;
  const auto env_on = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && v[0] == '1';
  };
  s->metrics = s->o.flag("metrics") || env_on("UVBUS_BENCH_METRICS");
  s->copy = s->o.flag("copy") || env_on("UVBUS_BENCH_COPY");
  if (s->metrics) c.metrics_url = "http://127.0.0.1:0/metrics";
  c.latency_histograms = s->o.flag("latency") || env_on("UVBUS_BENCH_LATENCY");
  // Sizing experiments: the flow's retransmit window (messages) and the link's send queue (bytes).
  c.retransmit_max_messages =
      static_cast<size_t>(s->o.get_int("window", static_cast<long>(c.retransmit_max_messages)));
  c.link_queue_bytes =
      static_cast<size_t>(s->o.get_int("link-queue", static_cast<long>(c.link_queue_bytes)));
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  sender s;
  s.o = options::parse(argc, argv);
  if (s.o.url.empty()) {
    std::fprintf(stderr,
                 "usage: %s PARENT_URL [--min B] [--max B] [--seconds S] [--no-shm] [--id ID] "
                 "[--target ID] [--reports] [--next-hop] [--metrics] [--latency] [--copy] "
                 "[--window MSGS] [--link-queue BYTES]\n",
                 argv[0]);
    return 2;
  }
  s.id = std::strtoull(s.o.get("id", "0x1001").c_str(), nullptr, 0);
  s.target = std::strtoull(s.o.get("target", "0x1000").c_str(), nullptr, 0);
  const char* env_reports = std::getenv("UVBUS_BENCH_REPORTS");
  s.reports = s.o.flag("reports") || (env_reports != nullptr && env_reports[0] == '1');
  uv_loop_t loop;
  uv_loop_init(&loop);
  bool next_hop = false;
  const node_config c = make_config(&s, &next_hop);
  node n(&loop, s.id, c, s.callbacks());
  if (const errc e = n.start(); e != errc::ok) {
    std::fprintf(stderr, "send: start: %s\n", to_string(e));
    return 1;
  }
  const double give_up = mono_now() + 10;
  while (!n.up() && s.exit_code == 0 && mono_now() < give_up) uv_run(&loop, UV_RUN_ONCE);
  if (!n.up()) {
    std::fprintf(stderr, "send: never registered\n");
    return 1;
  }
  const auto peers = n.peers();
  const char* channel = peers.empty() ? "?" : to_string(peers[0].data_channel);
  const double t0 = mono_now();
  const double c0 = cpu_now();
  const cpu_counter ru;
  s.send_until(n, &loop, t0 + s.o.seconds);
  const double secs = mono_now() - t0;
  const double cpu = (cpu_now() - c0) / secs * 100;
  const double ns_per_msg = ru.ns_per_msg(s.seq);
  s.send_end(n, &loop);
  std::printf(
      "[send] node 0x%llx via %s: msgs=%llu msgs/s=%.0f MB/s=%.1f cpu%%=%.0f cpu_ns/msg=%.1f "
      "refused=%llu "
      "reports=%s delivery=%s ok=%llu failed=%llu unacked_peak=%llu/%lluKiB rss_kib=%ld\n",
      static_cast<unsigned long long>(s.id), channel, static_cast<unsigned long long>(s.seq),
      static_cast<double>(s.seq) / secs, static_cast<double>(s.bytes) / secs / 1e6, cpu, ns_per_msg,
      static_cast<unsigned long long>(s.refused), s.reports ? "on" : "off",
      next_hop ? "next_hop" : "end_to_end", static_cast<unsigned long long>(s.reports_ok),
      static_cast<unsigned long long>(s.reports_failed),
      static_cast<unsigned long long>(s.unacked_peak_msgs),
      static_cast<unsigned long long>(s.unacked_peak_bytes / 1024), rss_kib());
  print_latency(n, s.target);
  if (s.metrics) {
    std::printf("[send] metrics: %llu renders, %zu bytes each\n",
                static_cast<unsigned long long>(s.scrapes),
                s.scrapes == 0 ? size_t{0} : s.scraped_bytes / s.scrapes);
  }
  std::fflush(stdout);
  n.stop();
  const double stop_by = mono_now() + 10;
  while (!s.down && mono_now() < stop_by) uv_run(&loop, UV_RUN_ONCE);
  return s.exit_code;
}
