// uvbus top: a refreshing table of a node's counters with per-second rates between two polls.
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bus/auth.h"  // uvbus::detail::printable
#include "bus_cmd.h"
#include "common.h"
#include "session.h"
#include "top_links.h"

namespace uvbus_tool {
namespace {

using counter_map = std::map<std::string, uint64_t>;

counter_map parse_counters(const std::string& text) {
  counter_map m;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    m[line.substr(0, eq)] = std::strtoull(line.c_str() + eq + 1, nullptr, 10);
  }
  return m;
}

struct poll_result {
  uvbus::errc status = uvbus::errc::ok;
  counter_map counters;
  std::string routes;
  links_map links;  // with --metrics
  std::string metrics_error;
  std::chrono::steady_clock::time_point at;
};

poll_result poll(session* s, uint64_t target, uint32_t timeout_ms, const std::string& metrics) {
  poll_result p;
  if (!metrics.empty()) {
    // Off the loop's thread: the fetch blocks up to timeout_ms (a stalled endpoint: all of it).
    std::string body;
    int rc = kExitFailed;
    s->run_blocking([&] { rc = http_get(metrics, timeout_ms, &body, &p.metrics_error); });
    if (rc == kExitOk) p.links = parse_links(body);
  }
  const command_result c =
      run_command(s, target, uvbus::proto::command_id::counters, "", timeout_ms);
  p.at = std::chrono::steady_clock::now();
  p.status = c.status;
  if (c.status != uvbus::errc::ok) return p;
  p.counters = parse_counters(c.text);
  const command_result r = run_command(s, target, uvbus::proto::command_id::routes, "", timeout_ms);
  p.status = r.status;
  p.routes = r.text;
  return p;
}

void print_table(uint64_t target, const poll_result& a, const poll_result& b, uint64_t refresh,
                 bool tty) {
  const double secs = std::chrono::duration<double>(b.at - a.at).count();
  if (tty) std::fputs("\x1b[H\x1b[2J", stdout);
  std::printf("uvbus top: node %#" PRIx64 "  refresh %" PRIu64 "  (rates over %.2f s)\n", target,
              refresh, secs);
  std::printf("%-24s %20s %14s\n", "counter", "value", "per second");
  for (const auto& kv : b.counters) {
    const auto it = a.counters.find(kv.first);
    const uint64_t before = it == a.counters.end() ? 0 : it->second;
    const std::string name = uvbus::detail::printable(kv.first);  // the node's text
    if (is_counters_level(kv.first)) {
      std::printf("%-24s %20" PRIu64 " %14s\n", name.c_str(), kv.second, "(level)");
    } else {
      const double rate =
          secs > 0 && kv.second >= before ? static_cast<double>(kv.second - before) / secs : 0;
      std::printf("%-24s %20" PRIu64 " %14.1f\n", name.c_str(), kv.second, rate);
    }
  }
  if (!b.metrics_error.empty()) std::printf("links: %s\n", b.metrics_error.c_str());
  if (!b.links.empty()) print_links(a.links, b.links, secs);
  const std::string routes = peer_text(b.routes);
  std::printf("routes:\n%s", routes.c_str());
  if (!routes.empty() && routes.back() != '\n') std::fputc('\n', stdout);
  if (!tty) std::fputc('\n', stdout);
  std::fflush(stdout);
}

void print_json(uint64_t target, const poll_result& a, const poll_result& b) {
  const double secs = std::chrono::duration<double>(b.at - a.at).count();
  std::vector<top_counter> counters;
  counters.reserve(b.counters.size());
  for (const auto& kv : b.counters) {
    const auto it = a.counters.find(kv.first);
    const uint64_t before = it == a.counters.end() ? 0 : it->second;
    const double rate =
        secs > 0 && kv.second >= before ? static_cast<double>(kv.second - before) / secs : 0;
    counters.push_back({kv.first, kv.second, is_counters_level(kv.first) ? 0.0 : rate});
  }
  std::printf("%s\n", top_json(target, secs, counters).c_str());
  std::fflush(stdout);
}

}  // namespace

// uvbus top ID [--once] [--interval-ms M] [--count N] [--json]
int top_main(int argc, char** argv) {
  bus_args a;
  int rc = parse_bus_args(argc, argv, &a);
  if (rc != kExitOk) return rc;
  uint64_t target = 0;
  if (a.pos.size() != 1 || !parse_id(a.pos[0].c_str(), &target)) {
    std::fprintf(stderr, "uvbus top: expected one node id (decimal or 0x hex, non-zero)\n");
    return kExitUsage;
  }
  // docs/tools.md: a bad metrics URL is a usage error (exit 2), as for `uvbus metrics`.
  if (!a.metrics.empty() && a.metrics.rfind("http://", 0) != 0 &&
      a.metrics.rfind("https://", 0) != 0) {
    std::fprintf(stderr, "uvbus top: bad URL '%s' for --metrics (http://HOST:PORT[/PATH])\n",
                 a.metrics.c_str());
    return kExitUsage;
  }
  // The JSON tables have no place for the links (nor for a failed scrape): every poll fetched
  // the page, waited up to --timeout-ms for it, and threw the answer or the error away.
  if (!a.metrics.empty() && a.json) {
    std::fprintf(stderr, "uvbus top: options --metrics and --json cannot be given together\n");
    return kExitUsage;
  }
  // 0 would poll without pause (it silently meant the default before): refused, as --count 0.
  if (a.interval_given && a.interval_ms == 0) {
    std::fprintf(stderr, "uvbus top: bad value '0' for --interval-ms (at least 1; default 1000)\n");
    return kExitUsage;
  }
  const uint32_t interval = a.interval_given ? a.interval_ms : 1000;
  const bool tty = isatty(STDOUT_FILENO) != 0 && !a.json;
  // A terminal gets each frame in one flush: line buffering would show a half-drawn screen.
  static char frame_buffer[1 << 16];
  if (tty) std::setvbuf(stdout, frame_buffer, _IOFBF, sizeof frame_buffer);
  session s;
  rc = s.join(a.join, {});
  if (rc != kExitOk) return rc;
  poll_result prev = poll(&s, target, a.join.timeout_ms, a.metrics);
  // --count N: N tables, counted in 64 bits (a 32-bit counter never ended at 4294967295); none:
  // until interrupted.
  for (round_counter round(a.once ? 1 : a.count); round.next();) {
    if (prev.status != uvbus::errc::ok) break;
    s.run_until([] { return false; }, interval);
    poll_result cur = poll(&s, target, a.join.timeout_ms, a.metrics);
    if (cur.status != uvbus::errc::ok) {
      prev = cur;
      break;
    }
    if (a.json) {
      print_json(target, prev, cur);
    } else {
      print_table(target, prev, cur, round.number(), tty);
    }
    // `uvbus top | head`: SIGPIPE is ignored, so the writes failed and top polled on for ever.
    if (stdout_failed("top")) return kExitFailed;
    prev = cur;
  }
  if (prev.status != uvbus::errc::ok) {
    std::fprintf(stderr, "uvbus top: node %#" PRIx64 " did not answer: %s\n", target,
                 uvbus::to_string(prev.status));
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace uvbus_tool
