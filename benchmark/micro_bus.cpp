// Microbenchmarks of the bus's per-message decisions: the routing table's next hop for a
// grandchild (a child subnet lookup, what a relay does for every message its hop cache misses),
// against the plain scan of every child subnet that the index replaced; and a child's
// registration (check_child, add, remove) among N children, against the scan check_child did.
// Run: build/uvbus_micro_bus [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "bus/routing.h"

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

BENCHMARK_MAIN();
