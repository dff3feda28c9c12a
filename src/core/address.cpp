// Channel URLs: parsing every scheme into an address, and the canonical form back.
#include "uvbus/address.h"

#include <arpa/inet.h>
#include <sys/un.h>

#include <cstdio>
#include <string>
#include <utility>

namespace uvbus {

static_assert(kMaxUnixPathBytes + 1 == sizeof(sockaddr_un{}.sun_path), "sun_path size");

namespace {

bool parse_port(std::string_view s, uint16_t* port) {
  if (s.empty() || s.size() > 5) return false;
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (v > 65535) return false;
  *port = static_cast<uint16_t>(v);
  return true;
}

bool parse_key(std::string_view s, uint32_t* key) {
  uint64_t v = 0;
  if (s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    if (s.size() > 8) return false;
    for (char c : s) {
      int d = 0;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        return false;
      }
      v = v * 16 + static_cast<uint64_t>(d);
    }
  } else {
    if (s.empty() || s.size() > 10) return false;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
  }
  if (v == 0 || v > UINT32_MAX) return false;  // key 0 is IPC_PRIVATE, never a shared name
  *key = static_cast<uint32_t>(v);
  return true;
}

bool is_all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

const char* to_string(scheme s) noexcept {
  switch (s) {
    case scheme::ipv4:
      return "ipv4";
    case scheme::ipv6:
      return "ipv6";
    case scheme::dns:
      return "dns";
    case scheme::unix_socket:
      return "unix";
    case scheme::shm:
      return "shm";
    case scheme::mem:
      return "mem";
  }
  return "?";
}

namespace {

// *why = text (when asked for); returns e.
errc refuse(std::string* why, errc e, std::string text) {
  if (why != nullptr) *why = std::move(text);
  return e;
}

std::string quoted(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

// A shm:// or mem:// name (leading slashes dropped), or a SysV key for a numeric shm:// name.
errc parse_name(std::string_view rest, address* a, std::string* why) {
  while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
  if (rest.empty()) return refuse(why, errc::bad_url, "no name");
  if (rest.find('/') != std::string_view::npos) {
    return refuse(why, errc::bad_url, quoted(rest) + ": a name holds no '/'");
  }
  if (rest.size() > 200) return refuse(why, errc::bad_url, "the name is longer than 200 bytes");
  const bool hex = rest.size() >= 2 && rest[0] == '0' && (rest[1] == 'x' || rest[1] == 'X');
  if (a->kind == scheme::shm && (hex || is_all_digits(rest))) {
    if (!parse_key(rest, &a->shm_key)) {
      return refuse(why, errc::bad_url,
                    quoted(rest) + " is not a SysV key from 1 to 0xffffffff (4294967295)");
    }
    a->shm_numeric = true;
  } else if (a->kind == scheme::shm && (rest == "." || rest == "..")) {
    // shm_open("/.") or ("/..") would name the shared-memory directory or its parent.
    return refuse(why, errc::bad_url,
                  quoted(rest) + R"(: "." and ".." name directories, not shared-memory regions)");
  } else {
    a->host = std::string(rest);
  }
  return errc::ok;
}

// host:port or [IPv6 literal]:port of an ipv4, ipv6 or dns URL.
errc parse_host_port(std::string_view rest, address* a, std::string* why) {
  std::string_view host;
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return refuse(why, errc::bad_url, quoted(rest) + " is not [IPv6 address]:port");
    }
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return refuse(why, errc::bad_url, "missing port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return refuse(why, errc::bad_url, "no host");
  if (!parse_port(port, &a->port)) {
    return refuse(why, errc::bad_url, "port " + quoted(port) + " is not a number from 0 to 65535");
  }
  // No literal, and no host name, contains brackets; allowing "[[x]" would yield a host
  // whose canonical URL ("dns://[x:1") no longer parses.
  if (host.find_first_of("[]") != std::string_view::npos) {
    return refuse(why, errc::bad_url, quoted(host) + ": a host holds no brackets");
  }
  a->host = std::string(host);
  unsigned char buf[16];
  if (a->kind == scheme::ipv4 && inet_pton(AF_INET, a->host.c_str(), buf) != 1) {
    return refuse(why, errc::bad_url, quoted(host) + " is not an IPv4 address");
  }
  if (a->kind == scheme::ipv6 && inet_pton(AF_INET6, a->host.c_str(), buf) != 1) {
    // ipv6://::1 is an address without its port, not the address ":" with port 1.
    const std::string whole(rest);
    if (rest.front() != '[' && inet_pton(AF_INET6, whole.c_str(), buf) == 1) {
      return refuse(why, errc::bad_url,
                    "missing port (bracket the address: ipv6://[" + whole + "]:port)");
    }
    return refuse(why, errc::bad_url,
                  host.find('%') != std::string_view::npos
                      ? quoted(host) + ": IPv6 scope ids (%zone) are not supported"
                      : quoted(host) + " is not an IPv6 address");
  }
  return errc::ok;
}

}  // namespace

errc parse_address(std::string_view url, address* out) {
  return parse_address(url, out, nullptr);
}

errc parse_address(std::string_view url, address* out, std::string* why) {
  // A NUL would let inet_pton, getaddrinfo, shm_open or bind see a shorter name than the one
  // stored (e.g. "ipv4://127.0.0.1\0junk:80" would validate as 127.0.0.1 and keep the junk).
  if (url.find('\0') != std::string_view::npos) {
    return refuse(why, errc::bad_url, "holds a NUL byte");
  }
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos || sep == 0) {
    return refuse(why, errc::bad_url,
                  "no scheme: not a URL (missing \"://\"; ipv4, ipv6, dns, unix, shm or mem)");
  }
  const std::string_view name = url.substr(0, sep);
  const std::string_view rest = url.substr(sep + 3);
  address a;
  if (name == "ipv4") {
    a.kind = scheme::ipv4;
  } else if (name == "ipv6") {
    a.kind = scheme::ipv6;
  } else if (name == "dns") {
    a.kind = scheme::dns;
  } else if (name == "unix") {
    a.kind = scheme::unix_socket;
  } else if (name == "shm") {
    a.kind = scheme::shm;
  } else if (name == "mem") {
    a.kind = scheme::mem;
  } else {
    return refuse(why, errc::unsupported_scheme, "unknown scheme " + quoted(name));
  }
  errc e = errc::ok;
  if (a.kind == scheme::unix_socket) {
    if (rest.empty()) return refuse(why, errc::bad_url, "no path");
    if (rest.front() == '@') {  // a Linux abstract socket: the name fills sun_path after a NUL
      if (rest.size() == 1) return refuse(why, errc::bad_url, "no abstract socket name after '@'");
      if (rest.size() - 1 > kMaxUnixPathBytes) {
        return refuse(why, errc::bad_url,
                      "the abstract socket name is longer than " +
                          std::to_string(kMaxUnixPathBytes) +
                          " bytes (a socket address holds no more)");
      }
    } else if (rest.size() > kMaxUnixPathBytes) {
      return refuse(why, errc::bad_url,
                    "the path is longer than " + std::to_string(kMaxUnixPathBytes) +
                        " bytes (a socket address holds no more)");
    }
    a.host = std::string(rest);
  } else if (a.kind == scheme::shm || a.kind == scheme::mem) {
    e = parse_name(rest, &a, why);
  } else {
    e = parse_host_port(rest, &a, why);
  }
  if (e != errc::ok) return e;
  *out = std::move(a);
  return errc::ok;
}

std::string address::to_string() const {
  switch (kind) {
    case scheme::ipv4:
    case scheme::dns:
      return std::string(uvbus::to_string(kind)) + "://" + host + ":" + std::to_string(port);
    case scheme::ipv6:
      return "ipv6://[" + host + "]:" + std::to_string(port);
    case scheme::unix_socket:
      return "unix://" + host;
    case scheme::shm:
      if (shm_numeric) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "shm://0x%x", shm_key);
        return buf;
      }
      return "shm://" + host;
    case scheme::mem:
      return "mem://" + host;
  }
  return {};
}

}  // namespace uvbus
