// Shared set-up of the end-to-end delivery tests (node_flow_test.cpp, node_flow_edge_test.cpp):
// the flow config and a root with a hand-made child (raw_peer.h) registered to it.
#pragma once

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"
#include "uvbus/node.h"

namespace uvbus::test {

inline node_config flow_config() {
  node_config c = fast_config();
  c.sibling_direct = false;  // everything through the parent (it is what restarts)
  c.resend_timeout_ms = 20;
  c.delivery_timeout_ms = 20000;
  return c;
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
