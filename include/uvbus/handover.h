// Planned hand-over of a node to its next process: the listening sockets and the flow positions,
// passed over a unix socket (the sockets as SCM_RIGHTS, so they stay open and listening
// throughout and no peer's connection attempt is refused). docs/bus.md "Planned restart".
//
//   old process                                   new process (same id, same config)
//   ------------------------------------------    ------------------------------------------
//                                                 handover_receive(path, ...)   waits
//   n.detach_listeners(&st.listeners); n.stop();
//   on_down(closed): st.flow_positions =
//     n.flow_positions(); handover_send(path, st)  -> st
//   close st's fds, exit                          cfg.inherit_listeners = st.listeners;
//                                                 cfg.inherit_flow_positions = st.flow_positions;
//                                                 node n2(...); n2.start();
//
// Both calls block the calling thread (with a deadline): call them outside a running loop — the
// old process after its node stopped, the new one before its node starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "uvbus/error.h"
#include "uvbus/node.h"

namespace uvbus {

struct handover_state {
  std::vector<inherited_listener> listeners;  // at most 8 (node_config's listen limit)
  std::vector<uint8_t> flow_positions;        // node::flow_positions() at on_down(closed)
};

// The new process: creates a unix socket at `path` (mode 0600; bound and listening under a
// temporary name in path's directory, ".uvbh-PID-N", then hard-linked into place, so a file at
// `path` always has a listening receiver behind it: the directory must allow hard links, and
// /proc/net/unix and ss show the temporary name; a stale file is replaced, a path another live
// receiver listens on gives address_in_use, a file that is no socket already_exists), waits up to
// timeout_ms for one sender of its own user (SO_PEERCRED; a sender of another user is ignored,
// and named in the timeout's detail; a connection that ends before sending a byte, as another
// receiver's check whether this one is live does, is no sender either: the wait goes on),
// receives its state (the fds become this process's and *out owns them; memory for the body
// grows as its bytes come, not as announced) and acknowledges; the socket file is removed before
// returning (if it is still this receiver's). Errors (detail, if given, says what was wrong):
// invalid_argument (path too long, out null), timeout (no sender in time, or it sent nothing or
// stopped mid-way), protocol_error (not a hand-over message, another version's, more or fewer
// sockets than announced, oversize: the detail names the field), io_error (accepting failed
// other than transiently, e.g. out of fds: at once, not at the deadline), and the system's errors.
[[nodiscard]] errc handover_receive(const std::string& path, int timeout_ms, handover_state* out,
                                    std::string* detail = nullptr);

// The old process: connects to the receiver at `path` (retrying until it is there or timeout_ms
// passes), checks that the receiver runs as this process's effective user (SO_PEERCRED: another
// user who made the path first gets nothing), sends the state and waits for the receiver's
// acknowledgement. The fds stay the caller's (the receiver has its own copies from then on: close
// them after a success). Errors: invalid_argument (path too long, more than 8 sockets, a negative
// fd), timeout (no receiver, or no acknowledgement in time), permission_denied (the receiver
// runs as another user: the detail names its uid and the path), protocol_error (the receiver
// refused the message), and the system's errors. A timeout or io_error after the message went
// out (no acknowledgement came) leaves it open whether the receiver took the sockets: it may own
// copies of them, so the caller must not go on accepting on its own.
[[nodiscard]] errc handover_send(const std::string& path, const handover_state& state,
                                 int timeout_ms, std::string* detail = nullptr);

}  // namespace uvbus
