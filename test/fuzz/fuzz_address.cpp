// Fuzzes the channel URL parser (include/uvbus/address.h).
//
// Invariants: parse_address never crashes on any bytes; on error *out is untouched; on success
// the parsed fields are sane (stream schemes have a non-empty host, shm/mem names carry no '/',
// a numeric shm key is non-zero) and the canonical URL from to_string() parses back to the same
// fields and is itself a fixed point of parse + to_string.
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "uvbus/address.h"

namespace {

bool same(const uvbus::address& a, const uvbus::address& b) {
  return a.kind == b.kind && a.host == b.host && a.port == b.port &&
         a.shm_numeric == b.shm_numeric && a.shm_key == b.shm_key;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy so the parser sees an exactly-sized buffer (string_view over the fuzzer's data is fine
  // too, but a std::string keeps the allocation ASan-visible).
  const std::string url(reinterpret_cast<const char*>(data), size);
  uvbus::address a;
  a.host = "untouched";
  a.port = 7;
  const uvbus::errc e = uvbus::parse_address(url, &a);
  if (e != uvbus::errc::ok) {
    FUZZ_CHECK(e == uvbus::errc::bad_url || e == uvbus::errc::unsupported_scheme);
    FUZZ_CHECK(a.host == "untouched" && a.port == 7);
    return 0;
  }
  switch (a.kind) {
    case uvbus::scheme::ipv4:
    case uvbus::scheme::ipv6:
    case uvbus::scheme::dns:
      FUZZ_CHECK(!a.host.empty() && !a.shm_numeric);
      FUZZ_CHECK(a.is_stream());
      break;
    case uvbus::scheme::unix_socket:
      FUZZ_CHECK(!a.host.empty() && a.host.find('\0') == std::string::npos);
      FUZZ_CHECK(a.is_stream());
      break;
    case uvbus::scheme::shm:
    case uvbus::scheme::mem:
      FUZZ_CHECK(!a.is_stream());
      FUZZ_CHECK(a.host.find('/') == std::string::npos);
      if (a.shm_numeric) {
        FUZZ_CHECK(a.kind == uvbus::scheme::shm && a.shm_key != 0 && a.host.empty());
      } else {
        FUZZ_CHECK(!a.host.empty());
      }
      break;
  }
  const std::string canon = a.to_string();
  uvbus::address b;
  const uvbus::errc e2 = uvbus::parse_address(canon, &b);
  if (e2 != uvbus::errc::ok || !same(a, b)) {
    std::fprintf(stderr, "round trip: '%s' -> '%s' -> %s\n", url.c_str(), canon.c_str(),
                 uvbus::to_string(e2));
  }
  FUZZ_CHECK(e2 == uvbus::errc::ok);
  FUZZ_CHECK(same(a, b));
  FUZZ_CHECK(b.to_string() == canon);
  return 0;
}
