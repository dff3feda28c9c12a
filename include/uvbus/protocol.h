// The bus protocol's public names: the versions this build speaks, the default TTL, what a node
// tells its peers about itself (node_info, as endpoint_info reports it) and the tool commands of
// node::send_command. The wire codec itself (headers, message bodies, parsers) is internal to the
// library (src/bus/wire.h); docs/protocol.md describes every byte.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "uvbus/subnet.h"

namespace uvbus::proto {

// Protocol versions this build speaks. A link uses the highest version both sides support.
// Version 2 adds the drop notice (msg_type::dropped) and the lookup answer `other` (the id is
// routed through the parent but is not its direct child); a node never sends either to a peer whose
// link negotiated version 1. Version 3 adds flows (end-to-end sequence numbers, cumulative
// acknowledgements, resend; docs/protocol.md "Flows"): flow messages and acknowledgements only
// travel on links that negotiated version 3. Version 4 adds the optional trace context of a data
// message (docs/protocol.md "Trace context"); a node strips it from what it sends on a link that
// negotiated less. Version 5 adds request/reply (node::call, docs/protocol.md "Calls"): a call
// block at the start of the payload, marked by a header flag; a message with one never travels on
// a link that negotiated less (the send fails with version_mismatch). Version 6 adds registration
// extensions (docs/protocol.md "Registration extensions"): the acceptor's proof of an access token
// (two-way authentication), the link's compression codec, and compressed data messages.
inline constexpr uint8_t kMinVersion = 1;
inline constexpr uint8_t kMaxVersion = 6;
inline constexpr uint8_t kDefaultTtl = 16;

// What a node tells a peer about itself at registration.
struct node_info {
  bus_id id = 0;
  uint32_t pid = 0;
  std::string host_id;   // stable per machine (see host_identity()); equal => same host
  std::string hostname;  // for humans and logs only
  std::vector<subnet> subnets;
  std::vector<std::string> listen;  // URLs the node accepts connections on (shm:// included)
};

enum class command_id : uint32_t {
  routes = 1,    // reply: text, one route per line
  counters = 2,  // reply: text, "name=value" per line
  lookup = 3,    // args: u64 id; reply: the registered child's node_info (a sibling's address)
  echo = 4,      // reply: the args
};

}  // namespace uvbus::proto
