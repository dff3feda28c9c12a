// Who is at the other end of a hand-over socket: the owner check both sides make before trusting
// a peer with listening sockets and flow positions (handover.cpp); and a receiver's test hook.
#pragma once

#include <sys/types.h>

#include <string>

#include "uvbus/error.h"

namespace uvbus::detail {

// Whether the peer of the connected unix socket fd runs as uid `expect` (SO_PEERCRED): ok;
// permission_denied with *why naming the peer's uid and `path` if it does not; io_error if the
// credentials can not be read.
errc check_peer_owner(int fd, uid_t expect, const std::string& path, std::string* why);

// Tests only (not API): called, if set, where a receiver's set-up can be overtaken — "bound"
// (its socket bound, not yet listening), "stale" (a file at its path found stale, about to be
// replaced) — so a test can run a second receiver in that instant.
extern void (*handover_hook)(const char* where);

}  // namespace uvbus::detail
