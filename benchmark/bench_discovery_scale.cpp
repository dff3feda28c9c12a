// Discovery at scale on one machine: starts its own etcd (test/discovery/etcd_fixture.h), then N
// etcd_discovery instances on one loop register at once; reports the time until every directory
// holds all N entries, etcd's CPU time and RSS, this process's RSS, and the time until a killed
// instance (destroyed without revoke) has left every directory.
//
//   uvbus_bench_discovery_scale [N=200] [TTL_S=5]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "discovery/etcd_fixture.h"
#include "uvbus/discovery.h"

namespace {

using clk = std::chrono::steady_clock;

// VmRSS of a process in KiB (0 if unreadable).
long rss_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

// User + system CPU time of a process in ms.
long cpu_ms(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  long ut = 0;
  long st = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) ut = std::strtol(field.c_str(), nullptr, 10);
    if (i == 15) st = std::strtol(field.c_str(), nullptr, 10);
  }
  return (ut + st) * 1000 / sysconf(_SC_CLK_TCK);
}

uvbus::directory_entry entry(uvbus::bus_id id) {
  uvbus::directory_entry e;
  e.id = id;
  e.name = "logic-" + std::to_string(id);
  e.type = "logic";
  e.labels = {{"zone", id % 2 != 0 ? "a" : "b"}, {"version", "7"}};
  e.listen = {"ipv4://10.0.0." + std::to_string(id % 250) + ":7100"};
  e.host_id = "host";
  e.hostname = "box";
  e.pid = static_cast<uint32_t>(getpid());
  e.start_time_ms = 1764000000000ULL;
  e.protocol_version = 5;
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? static_cast<size_t>(std::strtol(argv[1], nullptr, 10)) : 200;
  uv_loop_t loop;
  uv_loop_init(&loop);
  uvbus::test::etcd_cluster etcd(1);
  if (!etcd.ok() || !etcd.start() || !etcd.wait_healthy(&loop, std::chrono::seconds(30))) {
    std::fprintf(stderr, "etcd did not start\n");
    return 1;
  }
  const long etcd_cpu0 = cpu_ms(etcd.pid(0));
  const long self_rss0 = rss_kib(getpid());
  uvbus::discovery_config c;
  c.etcd_endpoints = etcd.endpoints();
  c.prefix = "/scale";
  c.ttl_s = argc > 2 ? static_cast<uint32_t>(std::strtol(argv[2], nullptr, 10)) : 5;
  std::vector<std::unique_ptr<uvbus::etcd_discovery>> ds;
  std::map<std::string, size_t> reasons;  // log lines by their first 90 bytes
  const auto t0 = clk::now();
  for (size_t i = 0; i < n; ++i) {
    uvbus::discovery_callbacks cb;
    cb.on_log = [&reasons](uvbus::log_level, const std::string& m) { ++reasons[m.substr(0, 90)]; };
    ds.push_back(std::make_unique<uvbus::etcd_discovery>(&loop, c, std::move(cb)));
    if (ds.back()->start(entry(i + 1)) != uvbus::errc::ok) return 1;
  }
  const auto complete = [&](size_t want) {
    for (const auto& d : ds) {
      if (d && d->size() != want) return false;
    }
    return true;
  };
  if (!uvbus::test::run_until(
          &loop, [&] { return complete(n); }, std::chrono::seconds(60))) {
    size_t full = 0;
    size_t up = 0;
    uint64_t fails = 0;
    for (const auto& d : ds) {
      full += d->size() == n ? 1 : 0;
      up += d->connected() ? 1 : 0;
      fails += d->stats().failures;
    }
    std::fprintf(stderr,
                 "directories did not complete: %zu of %zu full, %zu connected, %llu "
                 "session failures; last error: %s\n",
                 full, n, up, static_cast<unsigned long long>(fails),
                 ds.back()->last_error().detail.c_str());
    return 1;
  }
  const double t_all = std::chrono::duration<double>(clk::now() - t0).count();
  const long etcd_cpu = cpu_ms(etcd.pid(0)) - etcd_cpu0;
  const long etcd_rss = rss_kib(etcd.pid(0));
  const long self_rss = rss_kib(getpid()) - self_rss0;
  // Steady state: keep-alives only, for 3 s.
  const long cpu1 = cpu_ms(etcd.pid(0));
  uvbus::test::run_until(
      &loop, [] { return false; }, std::chrono::seconds(3));
  const long steady = cpu_ms(etcd.pid(0)) - cpu1;
  // One instance dies without revoking: time until the other n-1 directories drop it.
  ds[0].reset();
  const auto t1 = clk::now();
  ds.erase(ds.begin());
  if (!uvbus::test::run_until(
          &loop, [&] { return complete(n - 1); }, std::chrono::seconds(30))) {
    std::fprintf(stderr, "the dead instance did not leave\n");
    return 1;
  }
  const double t_gone = std::chrono::duration<double>(clk::now() - t1).count();
  std::printf(
      "instances %zu: all directories complete in %.3f s; etcd CPU %ld ms during it, "
      "%ld ms per s steady (keep-alives), etcd RSS %ld KiB; this process +%ld KiB "
      "(%.1f KiB per instance); a killed instance left all %zu directories in %.3f s "
      "(ttl %u s)\n",
      n, t_all, etcd_cpu, steady / 3, etcd_rss, self_rss,
      static_cast<double>(self_rss) / static_cast<double>(n), n - 1, t_gone, c.ttl_s);
  for (const auto& [r, count] : reasons) std::printf("  %6zu x %s\n", count, r.c_str());
  ds.clear();
  for (int i = 0; i < 3; ++i) uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  return 0;
}
