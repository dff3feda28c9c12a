// Smallest possible user of an installed uvbus: encodes a frame and decodes it again.
#include <uvbus/uvbus.h>

#include <cstdio>
#include <cstring>

int main() {
  const char msg[] = "hello";
  uint8_t wire[32];
  const size_t n = uvbus::frame_encode(msg, 5, wire, sizeof wire);
  uvbus::frame_decoder dec;
  dec.feed(wire, n);
  const auto r = dec.next();
  if (r.status != uvbus::frame_status::payload || r.size != 5 || std::memcmp(r.data, msg, 5) != 0) {
    std::printf("consumer: decode failed\n");
    return 1;
  }
  uvbus::address a;
  if (uvbus::parse_address("ipv4://127.0.0.1:16389", &a) != uvbus::errc::ok) return 1;
  std::printf("consumer: uvbus %s ok (%s, %s)\n", uvbus::kVersionString, a.to_string().c_str(),
              uvbus::to_string(uvbus::errc::queue_full));
  return 0;
}
