// Microbenchmarks of the bus's per-message decisions: the routing table's next hop for a
// grandchild (a child subnet lookup, what a relay does for every message its hop cache misses),
// against the plain scan of every child subnet that the index replaced; and a child's
// registration (check_child, add, remove) among N children, against the scan check_child did;
// and node::pick() (what send_any() does per message) among N registered nodes, half of the
// type asked for.
// Run: build/uvbus_micro_bus [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <uv.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bus/routing.h"
#include "uvbus/node.h"

namespace {

using uvbus::bus_id;
using uvbus::subnet;
using uvbus::detail::peer_kind;
using uvbus::detail::routing_table;

// Child i has id (i << 12) | 1 and owns the subnet (i << 12) / 8 bits; targets are its
// grandchildren, in a pseudo-random order over the children.
constexpr bus_id child_base(uint64_t i) {
  return (i + 1) << 12;
}

std::vector<bus_id> targets(uint64_t children) {
  std::vector<bus_id> t(4096);
  uint64_t x = 1;
  for (bus_id& id : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = child_base((x >> 33) % children) | (0x80 + ((x >> 20) & 0x7f));
  }
  return t;
}

void BM_RouteLookupChildSubnet(benchmark::State& state) {
  const auto children = static_cast<uint64_t>(state.range(0));
  routing_table table(0, {{0, 48}});
  for (uint64_t i = 0; i < children; ++i) {
    table.add(child_base(i) | 1, peer_kind::child, {{child_base(i), 8}});
  }
  const std::vector<bus_id> t = targets(children);
  size_t k = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(table.lookup(t[k++ & 4095]));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_RouteLookupChildSubnet)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);

// The scan lookup() did before the index (narrowest containing subnet over every child's).
void BM_RouteLookupScan(benchmark::State& state) {
  const auto children = static_cast<uint64_t>(state.range(0));
  std::vector<std::pair<subnet, bus_id>> nets;
  nets.reserve(children);
  for (uint64_t i = 0; i < children; ++i) nets.emplace_back(subnet{child_base(i), 8}, i);
  const std::vector<bus_id> t = targets(children);
  size_t k = 0;
  for (auto _ : state) {
    const bus_id target = t[k++ & 4095];
    const std::pair<subnet, bus_id>* best = nullptr;
    for (const auto& e : nets) {
      if (e.first.contains(target) &&
          (best == nullptr || e.first.mask_bits < best->first.mask_bits))
        best = &e;
    }
    benchmark::DoNotOptimize(best);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_RouteLookupScan)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);

// One child registering and leaving among N registered children: the collision check, the add
// and the remove that a reconnecting child costs its parent.
void BM_RegisterChild(benchmark::State& state) {
  const auto children = static_cast<uint64_t>(state.range(0));
  routing_table table(0, {{0, 48}});
  for (uint64_t i = 0; i < children; ++i) {
    table.add(child_base(i) | 1, peer_kind::child, {{child_base(i), 8}});
  }
  const bus_id id = child_base(children) | 1;
  const std::vector<subnet> nets = {{child_base(children), 8}};
  for (auto _ : state) {
    benchmark::DoNotOptimize(table.check_child(id, nets));
    table.add(id, peer_kind::child, nets);
    benchmark::DoNotOptimize(table.remove(id));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_RegisterChild)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000)->Arg(100000);

// The collision check check_child() did before the ordered index: every child subnet against the
// new id and each new subnet.
void BM_RegisterCheckScan(benchmark::State& state) {
  const auto children = static_cast<uint64_t>(state.range(0));
  std::vector<std::pair<subnet, bus_id>> nets;
  nets.reserve(children);
  for (uint64_t i = 0; i < children; ++i) nets.emplace_back(subnet{child_base(i), 8}, i);
  const bus_id id = child_base(children) | 1;
  const std::vector<subnet> mine = {{child_base(children), 8}};
  for (auto _ : state) {
    bool hit = false;
    for (const auto& [net, owner] : nets) {
      hit = hit || net.contains(id);
      for (const subnet& s : mine) hit = hit || s.overlaps(net);
    }
    benchmark::DoNotOptimize(hit);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_RegisterCheckScan)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000)->Arg(100000);

}  // namespace

// A root 0x10000 and n children registered to it on one loop, every other one of type "logic":
// pick("logic") round robin at the root, whose directory holds all n. Each size runs once (its
// nodes take a moment to register).
void BM_PickAmongNodesOfAType(benchmark::State& state) {
  const auto n = static_cast<uint64_t>(state.range(0));
  uv_loop_t loop;
  uv_loop_init(&loop);
  uv_timer_t tick;  // wakes the loop while the children register
  uv_timer_init(&loop, &tick);
  uv_timer_start(
      &tick, [](uv_timer_t*) {}, 10, 10);
  {
    uvbus::node_config rc;
    rc.listen = {"ipv4://127.0.0.1:0"};
    rc.enable_shm = false;
    rc.subnets = {{0x10000, 16}};
    rc.max_unregistered = static_cast<uint32_t>(n + 1);  // all register at once, from one address
    rc.max_unregistered_per_address = static_cast<uint32_t>(n + 1);
    uvbus::node root(&loop, 0x10000, rc);
    (void)root.start();
    std::vector<std::unique_ptr<uvbus::node>> kids;
    for (uint64_t i = 1; i <= n; ++i) {
      uvbus::node_config c;
      c.enable_shm = false;
      c.parent_urls = {root.listen_urls().at(0)};
      c.type = i % 2 == 0 ? "logic" : "chat";
      kids.push_back(std::make_unique<uvbus::node>(&loop, 0x10000 + i, c));
      (void)kids.back()->start();
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (root.directory().size() < n && std::chrono::steady_clock::now() < until) {
      uv_run(&loop, UV_RUN_ONCE);
    }
    if (root.directory().size() < n) state.SkipWithError("the children did not all register");
    const std::string type = "logic";
    const std::vector<uvbus::node_label> labels;
    bus_id id = 0;
    for (auto _ : state) {
      benchmark::DoNotOptimize(root.pick(type, labels, {}, &id));
      benchmark::DoNotOptimize(id);
    }
    kids.clear();
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
  while (uv_loop_alive(&loop) != 0) uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
}
BENCHMARK(BM_PickAmongNodesOfAType)->Arg(10)->Arg(100)->Arg(1000)->Iterations(100000);

BENCHMARK_MAIN();
