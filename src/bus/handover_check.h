// Who is at the other end of a hand-over socket: the owner check both sides make before trusting
// a peer with listening sockets and flow positions (handover.cpp).
#pragma once

#include <sys/types.h>

#include <string>

#include "uvbus/error.h"

namespace uvbus::detail {

// Whether the peer of the connected unix socket fd runs as uid `expect` (SO_PEERCRED): ok;
// permission_denied with *why naming the peer's uid and `path` if it does not; io_error if the
// credentials can not be read.
errc check_peer_owner(int fd, uid_t expect, const std::string& path, std::string* why);

}  // namespace uvbus::detail
