// Microbenchmarks of the bus's per-message decisions: the routing table's next hop for a
// grandchild (a child subnet lookup, what a relay does for every message its hop cache misses),
// against the plain scan of every child subnet that the index replaced.
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

}  // namespace

BENCHMARK_MAIN();
