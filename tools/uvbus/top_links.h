// uvbus top's per-link table: the uvbus_peer_* families of a node's metrics endpoint.
#pragma once

#include <map>
#include <string>

namespace uvbus_tool {

// Per link ("peer role channel"), per family name (uvbus_peer_ stripped): the sample's value.
using links_map = std::map<std::string, std::map<std::string, double>>;

links_map parse_links(const std::string& metrics_text);
// The header and one line per link of b: rtt, bytes and frames per second each way (between a and
// b, secs apart), send queue depth, refusals per second; a rate is "-" when a has no value for
// that link and family to take it from (the previous scrape failed, or the link was not in it).
std::string links_table(const links_map& a, const links_map& b, double secs);
// links_table on stdout.
void print_links(const links_map& a, const links_map& b, double secs);

}  // namespace uvbus_tool
