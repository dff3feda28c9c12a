// uvbus top's per-link table: the uvbus_peer_* families of a node's metrics endpoint.
#pragma once

#include <map>
#include <string>

namespace uvbus_tool {

// Per link ("peer role channel"), per family name (uvbus_peer_ stripped): the sample's value.
using links_map = std::map<std::string, std::map<std::string, double>>;

links_map parse_links(const std::string& metrics_text);
// One line per link: rtt, bytes and frames per second each way (between a and b, secs apart),
// send queue depth, refusals per second.
void print_links(const links_map& a, const links_map& b, double secs);

}  // namespace uvbus_tool
