#include "bus/routing.h"

#include <gtest/gtest.h>

namespace uvbus::detail {
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
  EXPECT_EQ(t.check_peer(0x1100), errc::duplicate_id);
  EXPECT_EQ(t.check_peer(0x9999), errc::ok);
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

TEST(Routing, VersionNegotiation) {
  EXPECT_EQ(negotiate_version(1, 3, 2, 5), 3);
  EXPECT_EQ(negotiate_version(1, 1, 1, 1), 1);
  EXPECT_EQ(negotiate_version(1, 1, 2, 2), 0);
  EXPECT_EQ(negotiate_version(0, 0, 0, 0), 0);
}

}  // namespace
}  // namespace uvbus::detail
