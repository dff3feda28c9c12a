// Smallest possible user of an installed uvbus: parses a URL and validates a node configuration
// (which links the whole library: the node, its channels, libuv and libcrypto).
#include <uvbus/uvbus.h>

#include <cstdio>

int main() {
  uvbus::address a;
  if (uvbus::parse_address("ipv4://127.0.0.1:16389", &a) != uvbus::errc::ok) return 1;
  uvbus::node_config cfg;
  cfg.listen = {a.to_string()};
  if (uvbus::node::validate(0x10001, cfg) != uvbus::errc::ok) {
    std::printf("consumer: a valid config was refused\n");
    return 1;
  }
  std::printf("consumer: uvbus %s ok (%s, %s)\n", uvbus::kVersionString, a.to_string().c_str(),
              uvbus::to_string(uvbus::errc::queue_full));
  return 0;
}
