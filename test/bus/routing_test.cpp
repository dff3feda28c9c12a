// Routing table: next-hop choice, child, sibling and tool registration checks, sources, version
// negotiation, and the child-subnet index against a plain scan under random registrations and
// removals.
#include "bus/routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace uvbus::detail::routing_test {
namespace {

TEST(Routing, PicksSelfDirectChildSubnetParentOrNothing) {
  routing_table t(0x1000, {{0x1000, 12}});
  t.set_parent(0x1);
  t.add(0x1, peer_kind::parent);
  t.add(0x1100, peer_kind::child, {{0x1100, 8}});
  t.add(0x1110, peer_kind::child);  // a direct child inside another child's subnet? refused below
  t.add(0x2000, peer_kind::sibling);
  EXPECT_EQ(t.lookup(0x1000).kind, hop::self);
  EXPECT_EQ(t.lookup(0x1100).kind, hop::direct);
  EXPECT_EQ(t.lookup(0x1110).kind, hop::direct);
  auto r = t.lookup(0x11AB);
  EXPECT_EQ(r.kind, hop::child);
  EXPECT_EQ(r.next, 0x1100u);
  EXPECT_EQ(t.lookup(0x1234).kind, hop::none);  // ours, but no child owns it
  r = t.lookup(0x3000);
  EXPECT_EQ(r.kind, hop::parent);
  EXPECT_EQ(r.next, 0x1u);
  EXPECT_EQ(t.lookup(0x2000).kind, hop::direct);
  t.clear_parent();
  EXPECT_EQ(t.lookup(0x3000).kind, hop::none);
  ASSERT_TRUE(t.remove(0x1100));
  EXPECT_EQ(t.lookup(0x11AB).kind, hop::none);
  EXPECT_FALSE(t.remove(0x1100));
}

TEST(Routing, NarrowestChildSubnetWins) {
  routing_table t(0, {{0, 32}});
  t.add(0x100, peer_kind::child, {{0x100, 16}});
  t.add(0x200, peer_kind::child, {{0x120, 4}});
  EXPECT_EQ(t.lookup(0x125).next, 0x200u);
  EXPECT_EQ(t.lookup(0x135).next, 0x100u);
}

TEST(Routing, ChildRegistrationChecks) {
  routing_table t(0x1000, {{0x1000, 12}});
  EXPECT_EQ(t.check_child(0x1100, {{0x1100, 8}}), errc::ok);
  EXPECT_EQ(t.check_child(0x2000, {}), errc::out_of_subnet);
  EXPECT_EQ(t.check_child(0x1100, {{0x1100, 16}}), errc::out_of_subnet);  // wider than ours
  EXPECT_EQ(t.check_child(0x1100, {{0x1000, 12}}), errc::out_of_subnet);  // would cover us
  EXPECT_EQ(t.check_child(0x1000, {}), errc::duplicate_id);               // our own id
  t.add(0x1100, peer_kind::child, {{0x1100, 8}});
  EXPECT_EQ(t.check_child(0x1100, {}), errc::duplicate_id);
  EXPECT_EQ(t.check_child(0x1150, {}), errc::duplicate_id);  // inside a child's subnet
  EXPECT_EQ(t.check_child(0x1200, {{0x1100, 9}}), errc::out_of_subnet);
  EXPECT_EQ(t.check_child(0x1200, {{0x1180, 7}}), errc::duplicate_id);  // overlaps 0x1100/8
  EXPECT_EQ(t.check_child(0x1300, {{0x1300, 8}}), errc::ok);
  // A subnet that holds a registered child's id (one without subnets): the new child could send
  // as it. Refused, the child named; the same subnet is fine once that child has gone.
  t.add(0x1420, peer_kind::child);
  std::string why;
  EXPECT_EQ(t.check_child(0x1401, {{0x1400, 8}}, &why), errc::duplicate_id);
  EXPECT_EQ(why, "child subnet 0x1400/8 holds registered child 0x1420");
  EXPECT_EQ(t.check_child(0x1401, {{0x1400, 4}}), errc::ok);  // 0x1400-0x140f
  EXPECT_TRUE(t.remove(0x1420));
  EXPECT_EQ(t.check_child(0x1401, {{0x1400, 8}}), errc::ok);
  EXPECT_EQ(t.check_peer(0x1100, &why), errc::duplicate_id);
  EXPECT_EQ(why, "id 0x1100 is already registered");
  EXPECT_EQ(t.check_peer(0x1000, &why), errc::duplicate_id);
  EXPECT_EQ(why, "id 0x1000 is ours");
  EXPECT_EQ(t.check_peer(0x9999, &why), errc::ok);
  // Every refusal says why, naming the subnet and the child that holds it (an id inside another
  // child's subnet, or an overlap, was "id ... is already registered"; a subnet holding our own
  // id, inside ours, was "outside ours").
  const auto why_of = [&t](bus_id id, const std::vector<subnet>& nets) {
    std::string w;
    EXPECT_NE(t.check_child(id, nets, &w), errc::ok) << id;
    return w;
  };
  EXPECT_EQ(why_of(0x1150, {}), "id 0x1150 lies in subnet 0x1100/8 of registered child 0x1100");
  EXPECT_EQ(why_of(0x1200, {{0x1180, 7}}),
            "child subnet 0x1180/7 overlaps subnet 0x1100/8 of registered child 0x1100");
  EXPECT_EQ(why_of(0x1001, {{0x1000, 4}}), "child subnet 0x1000/4 holds our own id");
  t.add(0x1700, peer_kind::child, {{0x1580, 4}});
  EXPECT_EQ(why_of(0x1601, {{0x1500, 8}}),
            "child subnet 0x1500/8 overlaps subnet 0x1580/4 of registered child 0x1700");
  EXPECT_EQ(why_of(0x1100, {}), "id 0x1100 is already registered");
  EXPECT_EQ(why_of(0x1000, {}), "id 0x1000 is ours");
  EXPECT_EQ(why_of(0x2000, {}), "id 0x2000 is outside our subnets");
  EXPECT_EQ(why_of(0x1200, {{0x2000, 4}}), "child subnet 0x2000/4 is outside our subnets");
}

TEST(Routing, NoParentAndAFullWidthSubnet) {
  routing_table t(7, {{0, 64}});
  EXPECT_TRUE(t.owns(~uint64_t{0}));
  EXPECT_EQ(t.lookup(123).kind, hop::none);
  EXPECT_EQ(t.check_child(123, {}), errc::ok);
}

TEST(Routing, SourcesAreCheckedPerPeerKind) {
  routing_table t(0x1000, {{0x1000, 12}});
  t.add(0x1, peer_kind::parent);
  t.add(0x1100, peer_kind::child, {{0x1100, 8}});
  t.add(0x2000, peer_kind::sibling);
  EXPECT_TRUE(t.source_allowed(0x1, 0xDEAD));
  EXPECT_TRUE(t.source_allowed(0x1100, 0x1100));
  EXPECT_TRUE(t.source_allowed(0x1100, 0x11FF));
  EXPECT_FALSE(t.source_allowed(0x1100, 0x1200));
  EXPECT_TRUE(t.source_allowed(0x2000, 0x2000));
  EXPECT_FALSE(t.source_allowed(0x2000, 0x2001));
  // A sibling relays for its own descendants, but its subnet does not route.
  t.set_parent(0x1);
  t.add(0x3000, peer_kind::sibling, {{0x3000, 8}});
  EXPECT_TRUE(t.source_allowed(0x3000, 0x30AB));
  EXPECT_FALSE(t.source_allowed(0x3000, 0x31AB));
  EXPECT_EQ(t.lookup(0x30AB).kind, hop::parent);
  EXPECT_FALSE(t.source_allowed(0x5555, 0x5555));
}

// A tool speaks only as itself, whatever subnets it declared.
TEST(Routing, AToolsSubnetsAreNotHonoured) {
  routing_table t(0x1000, {{0x1000, 12}});
  t.add(0x9000, peer_kind::tool, {{0, 64}});
  EXPECT_TRUE(t.source_allowed(0x9000, 0x9000));
  EXPECT_FALSE(t.source_allowed(0x9000, 0x1100));
  EXPECT_FALSE(t.source_allowed(0x9000, 0x9001));
  ASSERT_NE(t.subnets_of(0x9000), nullptr);
  EXPECT_TRUE(t.subnets_of(0x9000)->empty());
}

// A sibling's declared subnets must be ones it could own (check_sibling(), run before add()).
TEST(Routing, ASiblingsSubnetsMustBePlausible) {
  routing_table t(0x1000, {{0x1000, 8}});
  t.set_parent(0x1);
  t.add(0x1, peer_kind::parent, {{0, 16}});
  t.add(0x1005, peer_kind::child);
  t.add(0x3000, peer_kind::sibling, {{0x3000, 8}});
  t.add(0x9000, peer_kind::tool);
  std::string why;
  // Its own subtree, and none at all: fine.
  EXPECT_EQ(t.check_sibling(0x2000, {{0x2000, 8}, {0x2400, 10}}, &why), errc::ok);
  EXPECT_EQ(t.check_sibling(0x2000, {}, &why), errc::ok);
  const std::pair<subnet, const char*> bad[] = {
      {{0, 64}, "sibling subnet 0x0/64 holds our own id"},
      {{0x1000, 4}, "sibling subnet 0x1000/4 holds our own id"},
      {{0x1080, 4}, "overlaps our subnets"},
      {{0x0, 4}, "holds our parent's id"},
      {{0x10000, 8}, "is outside our parent's subnets"},
      {{0x9000, 8}, "holds a registered peer's id"},  // the tool
      {{0x3080, 4}, "overlaps another sibling's subnets"},
      {{0x2000, 65}, "is not a valid subnet"},
  };
  for (const auto& [s, fault] : bad) {
    why.clear();
    EXPECT_EQ(t.check_sibling(0x2000, {{0x2000, 8}, s}, &why), errc::out_of_subnet) << fault;
    EXPECT_NE(why.find(fault), std::string::npos) << why;
  }
  // A sibling registering again is not its own rival; without a parent only the rest counts.
  EXPECT_EQ(t.check_sibling(0x3000, {{0x3000, 8}}, &why), errc::ok);
  t.remove(0x1);
  t.clear_parent();
  EXPECT_EQ(t.check_sibling(0x2000, {{0x10000, 8}}, &why), errc::ok);
  // The parent's id stays out of reach while its link is down: a sibling holding it could send
  // as the parent (acks, command replies) for as long as its own link stays up.
  why.clear();
  EXPECT_EQ(t.check_sibling(0x2000, {{0x0, 4}}, &why), errc::out_of_subnet);
  EXPECT_NE(why.find("holds our parent's id"), std::string::npos) << why;
}

// A sibling or tool may not take our parent's id, a tool no id the directory lists, a sibling none
// the tree lists under another parent (check_claim()); honest siblings and tools pass.
TEST(Routing, ASiblingOrToolClaimsNoIdTheDirectoryPlacesElsewhere) {
  constexpr bus_id kParent = 0x100;
  std::string why;
  const listing none;
  const listing cousin{true, true, 0x200};        // learned over the tree, another parent's child
  const listing brother{true, true, kParent};     // our parent's child
  const listing other_tree{true, false, 0x9000};  // known from etcd only
  const listing root{true, true, 0};
  for (const peer_kind k : {peer_kind::sibling, peer_kind::tool}) {
    EXPECT_EQ(check_claim(k, 0x7000, kParent, none, &why), errc::ok);
    EXPECT_EQ(check_claim(k, kParent, kParent, none, &why), errc::duplicate_id);
    EXPECT_EQ(why, "id 0x100 is our parent's");
    EXPECT_EQ(check_claim(k, 0x210, kParent, cousin, &why), errc::duplicate_id);
    EXPECT_NE(why.find("id 0x210 is registered elsewhere (our directory lists it under 0x200"),
              std::string::npos)
        << why;
    EXPECT_EQ(check_claim(k, 0x1, kParent, root, &why), errc::duplicate_id);
    EXPECT_NE(why.find("as a root"), std::string::npos) << why;
  }
  EXPECT_EQ(check_claim(peer_kind::sibling, 0x110, kParent, brother, &why), errc::ok);
  EXPECT_EQ(check_claim(peer_kind::sibling, 0x9001, kParent, other_tree, &why), errc::ok);
  EXPECT_EQ(check_claim(peer_kind::sibling, 0x9001, 0, other_tree, &why), errc::ok);
  EXPECT_EQ(check_claim(peer_kind::tool, 0x110, kParent, brother, &why), errc::duplicate_id);
  EXPECT_EQ(check_claim(peer_kind::tool, 0x9001, kParent, other_tree, &why), errc::duplicate_id);
  EXPECT_EQ(check_claim(peer_kind::sibling, 0x210, 0, cousin, &why), errc::duplicate_id);
}

TEST(Routing, VersionNegotiation) {
  EXPECT_EQ(negotiate_version(1, 3, 2, 5), 3);
  EXPECT_EQ(negotiate_version(1, 1, 1, 1), 1);
  EXPECT_EQ(negotiate_version(1, 1, 2, 2), 0);
  EXPECT_EQ(negotiate_version(0, 0, 0, 0), 0);
}

// What lookup() answers, computed by scanning every child subnet (narrowest wins, the earliest
// registered on a tie): the reference for the index.
struct scan_table {
  bus_id self;
  std::vector<bus_id> peers;
  std::vector<std::pair<subnet, bus_id>> nets;
  [[nodiscard]] route lookup(bus_id target) const {
    if (target == self) return {hop::self, self};
    if (std::find(peers.begin(), peers.end(), target) != peers.end()) return {hop::direct, target};
    const std::pair<subnet, bus_id>* best = nullptr;
    for (const auto& e : nets) {
      if (e.first.contains(target) &&
          (best == nullptr || e.first.mask_bits < best->first.mask_bits))
        best = &e;
    }
    if (best != nullptr) return {hop::child, best->second};
    return {hop::none, 0};
  }
  // check_child() by a scan, for a table whose own subnet holds every id and subnet asked about.
  [[nodiscard]] errc check_child(bus_id id, const std::vector<subnet>& subnets) const {
    for (const subnet& s : subnets) {
      if (s.contains(self)) return errc::out_of_subnet;
    }
    if (id == self || std::find(peers.begin(), peers.end(), id) != peers.end()) {
      return errc::duplicate_id;
    }
    for (const auto& e : nets) {
      if (e.first.contains(id)) return errc::duplicate_id;
      for (const subnet& s : subnets) {
        if (s.overlaps(e.first)) return errc::duplicate_id;
      }
    }
    return errc::ok;
  }
};

TEST(Routing, SubnetIndexAgreesWithAScanUnderChurn) {
  routing_table t(0, {{0, 32}});
  scan_table ref{0, {}, {}};
  uint64_t x = 0x9E3779B97F4A7C15ull;
  const auto next = [&x](uint64_t n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return (x >> 33) % n;
  };
  const uint8_t widths[] = {0, 2, 4, 8, 12};
  size_t checked = 0;
  size_t collisions = 0;
  size_t accepted = 0;
  for (int op = 0; op < 4000; ++op) {
    if (ref.peers.empty() || next(3) != 0) {
      const bus_id id = 0x10000 + next(512);
      if (std::find(ref.peers.begin(), ref.peers.end(), id) != ref.peers.end()) continue;
      std::vector<subnet> nets;
      for (uint64_t i = next(4); i > 0; --i) nets.push_back({next(0x4000), widths[next(5)]});
      t.add(id, peer_kind::child, nets);  // overlapping and equal subnets on purpose
      ref.peers.push_back(id);
      for (const subnet& s : nets) ref.nets.emplace_back(s.canonical(), id);
    } else {
      const bus_id id = ref.peers[next(ref.peers.size())];
      ASSERT_TRUE(t.remove(id));
      ref.peers.erase(std::find(ref.peers.begin(), ref.peers.end(), id));
      ref.nets.erase(std::remove_if(ref.nets.begin(), ref.nets.end(),
                                    [id](const auto& e) { return e.second == id; }),
                     ref.nets.end());
    }
    for (int q = 0; q < 16; ++q) {
      const bus_id target = next(5) == 0 ? 0x10000 + next(512) : next(0x4000);
      const route got = t.lookup(target);
      const route want = ref.lookup(target);
      ASSERT_EQ(static_cast<int>(got.kind), static_cast<int>(want.kind)) << "target " << target;
      ASSERT_EQ(got.next, want.next) << "target " << target;
      checked += got.kind == hop::child ? 1 : 0;
    }
    for (int q = 0; q < 4; ++q) {  // a registration's collision check against the scan
      // Ids and subnets half in the registered range [0, 0x4000), half above it; now and then a
      // registered child's id.
      const bus_id id =
          next(8) == 0 && !ref.peers.empty() ? ref.peers[next(ref.peers.size())] : next(0x8000);
      std::vector<subnet> nets;
      for (uint64_t i = next(3); i > 0; --i) nets.push_back({next(0x8000), widths[next(5)]});
      if (next(2) == 0 && !ref.nets.empty()) {  // one that nests in or around a registered subnet
        const subnet& r = ref.nets[next(ref.nets.size())].first;
        nets.push_back({r.prefix | next(0x1000), widths[next(5)]});
      }
      const errc want = ref.check_child(id, nets);
      ASSERT_EQ(t.check_child(id, nets), want) << "id " << id;
      collisions += want == errc::duplicate_id ? 1 : 0;
      accepted += want == errc::ok ? 1 : 0;
    }
  }
  EXPECT_GT(checked, 1000u);     // the churn really exercised step 3
  EXPECT_GT(collisions, 1000u);  // and both answers of check_child()
  EXPECT_GT(accepted, 1000u);
}

TEST(Routing, EqualSubnetsOfTwoChildrenHandOverOnRemoval) {
  routing_table t(0, {{0, 32}});
  t.add(0x100, peer_kind::child, {{0x500, 8}});
  t.add(0x200, peer_kind::child, {{0x5FF, 8}});  // the same subnet, another spelling
  EXPECT_EQ(t.lookup(0x542).next, 0x100u);       // the first claim routes
  ASSERT_TRUE(t.remove(0x100));
  EXPECT_EQ(t.lookup(0x542).next, 0x200u);
  ASSERT_TRUE(t.remove(0x200));
  EXPECT_EQ(t.lookup(0x542).kind, hop::none);  // inside our subnet, no child owns it
  // Registered again (a reconnect) with other subnets: nothing of the first registration stays.
  t.add(0x300, peer_kind::child, {{0x600, 4}});
  t.add(0x300, peer_kind::child, {{0x700, 4}});
  EXPECT_EQ(t.lookup(0x605).kind, hop::none);  // the second registration replaced the first
  EXPECT_EQ(t.lookup(0x705).next, 0x300u);
  ASSERT_TRUE(t.remove(0x300));
  EXPECT_EQ(t.lookup(0x605).kind, hop::none);
  EXPECT_EQ(t.lookup(0x705).kind, hop::none);
}

}  // namespace
}  // namespace uvbus::detail::routing_test
