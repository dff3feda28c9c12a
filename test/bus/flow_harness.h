// Shared set-up of the end-to-end delivery tests (node_flow_test.cpp, node_flow_edge_test.cpp):
// the flow config, a root with a hand-made child (raw_peer.h) registered to it, and hand-made
// flow positions (node::flow_positions() blobs).
#pragma once

#include <cstring>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "core/endian.h"
#include "uvbus/node.h"

namespace uvbus::test {

inline node_config flow_config() {
  node_config c = fast_config();
  c.sibling_direct = false;  // everything through the parent (it is what restarts)
  c.resend_timeout_ms = 20;
  c.delivery_timeout_ms = 20000;
  return c;
}

// A node::flow_positions() blob of node `of` with `sources` positions (sources 0x1000, 0x1001,
// ..., epoch 7, through 9), starting with `magic` ("UVF2": this release's).
inline std::vector<uint8_t> positions_blob(bus_id of, uint32_t sources,
                                           const char* magic = "UVF2") {
  constexpr size_t kHead = 16, kEntry = 56;
  std::vector<uint8_t> b(kHead + sources * kEntry, 0);
  std::memcpy(b.data(), magic, 4);
  store_le<uint64_t>(b.data() + 4, of);
  store_le<uint32_t>(b.data() + 12, sources);
  for (uint32_t i = 0; i < sources; ++i) {
    uint8_t* e = b.data() + kHead + i * kEntry;
    store_le<uint64_t>(e, 0x1000 + i);
    store_le<uint64_t>(e + 8, 7);
    store_le<uint64_t>(e + 16, 9);
  }
  return b;
}

class flow_fixture : public bus_fixture {
 protected:
  // Root 0x100 (rc, owning 0x100/8) with the hand-made child `raw` (no compression) registered
  // to it.
  bus_node* root_with(raw_child* raw, node_config rc = flow_config()) {
    rc.subnets = {{0x100, 8}};
    bus_node* root = make(0x100, rc);
    raw->compress = false;
    raw->start(&loop_, root->n->listen_urls().at(0));
    EXPECT_TRUE(wait([&] { return raw->registered; }));
    return root;
  }
};

}  // namespace uvbus::test
