// Channel addresses as URLs:
//
//   ipv4://127.0.0.1:16389        IPv4 literal and port (port 0: an ephemeral port on listen)
//   ipv6://[::1]:16389            IPv6 literal in brackets; the libatbus form ipv6://::1:16389 is
//                                 accepted too (the last colon separates the port)
//   dns://localhost:16389         a host name, resolved when connecting or listening
//   unix:///tmp/x.sock            a unix socket path (absolute or relative), at most
//                                 kMaxUnixPathBytes (107) bytes: what a socket address holds
//   unix://@name                  a Linux abstract unix socket (no file; reachable from any
//                                 process of the network namespace), name of 1 to 107 bytes;
//                                 a file whose name starts with '@': unix://./@name
//   shm://name  or  shm:///name   a POSIX shared-memory region (shm_open name "/name")
//   shm://0x1234  or  shm://4660  a SysV shared-memory key (hex with 0x, or decimal)
//   mem://name                    an in-process ring, for threads of one process
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "uvbus/error.h"

namespace uvbus {

enum class scheme : uint8_t { ipv4, ipv6, dns, unix_socket, shm, mem };

// The longest unix:// path: sockaddr_un's sun_path less its terminating NUL. A longer one would be
// cut by connect() and reach another socket.
inline constexpr size_t kMaxUnixPathBytes = 107;

const char* to_string(scheme s) noexcept;

struct address {
  scheme kind = scheme::ipv4;
  // ipv4/ipv6: the literal (without brackets); dns: the host name; unix: the path, or "@name";
  // shm (named) and mem: the name without leading slashes. Empty for a numeric shm key.
  std::string host;
  uint16_t port = 0;         // ipv4, ipv6, dns
  bool shm_numeric = false;  // shm with a SysV key
  uint32_t shm_key = 0;

  // The canonical URL (ipv6 in brackets, shm names as shm://name, keys in hex).
  [[nodiscard]] std::string to_string() const;
  [[nodiscard]] bool is_stream() const noexcept {
    return kind == scheme::ipv4 || kind == scheme::ipv6 || kind == scheme::dns ||
           kind == scheme::unix_socket;
  }
};

// Parses url into *out. Errors: bad_url (malformed: missing "://", empty host or path, a unix path
// or abstract name over kMaxUnixPathBytes, bad or out-of-range port, invalid IP literal, bad shm
// key),
// unsupported_scheme (unknown scheme).
// *out is only written on success.
[[nodiscard]] errc parse_address(std::string_view url, address* out);
// The same, and on an error *why (if not null) says what was wrong, naming the part ("missing
// port", "port \"65536\" is not a number from 0 to 65535", "\"300.1.2.3\" is not an IPv4
// address"); the URL itself is not repeated.
[[nodiscard]] errc parse_address(std::string_view url, address* out, std::string* why);

}  // namespace uvbus
