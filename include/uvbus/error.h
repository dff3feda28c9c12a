// Error codes: every uvbus call that can fail returns one of these as a value.
// Nothing in the public API throws.
//
// Contract shared by every asynchronous call in uvbus (taken word for word from libuv):
// when a function which takes a callback returns an error, the callback will never be called.
#pragma once

#include <cstdint>
#include <string>

namespace uvbus {

enum class errc : int {
  ok = 0,

  // Retriable: the operation may succeed later without any change by the caller.
  queue_full,     // back-pressure: a bounded queue or ring has no room right now
  would_block,    // nothing is available right now (a non-blocking receive or poll)
  not_connected,  // the peer or link is not (yet, or no longer) there
  busy,           // a resource is held by a live owner (a listener, a shm reader)
  timeout,        // a deadline passed (connect, handshake, heartbeat, delivery)

  // Caller errors.
  invalid_argument,    // a parameter is out of range or inconsistent
  bad_url,             // an address could not be parsed
  unsupported_scheme,  // the URL scheme is not one this channel serves
  message_too_large,   // payload above the configured message limit
  buffer_too_small,    // a caller-provided output buffer cannot hold the result
  closed,              // the object was closed or is closing
  wrong_state,         // not allowed in the object's current state (start() twice, not started)
  wrong_thread,        // called from a thread other than the owning loop's thread

  // Peer and data errors: the link that produced them is closed.
  bad_hash,        // checksum mismatch: the frame or record is corrupt
  bad_varint,      // malformed length prefix
  oversize,        // a received length exceeds the configured limit
  protocol_error,  // a well-framed message that violates the protocol
  bad_layout,      // a shared region's magic, version or sizes do not match ours
  abandoned,       // a shm record was skipped because its writer did not commit in time

  // System errors.
  connection_refused,
  connection_reset,  // the peer went away (EOF, ECONNRESET, EPIPE)
  resolve_failed,    // name resolution failed
  address_in_use,
  permission_denied,
  not_found,       // a named object (shm region, socket file) does not exist
  already_exists,  // a named object exists and may not be replaced
  no_memory,
  io_error,   // any other system error
  cancelled,  // the operation was cancelled because its owner closed

  // Bus errors.
  unknown_route,     // no route to the target bus id
  ttl_expired,       // a forwarded message hit its hop limit
  access_denied,     // registration refused (no matching access token), or a target refusing a
                     // new flow source beyond its max_flow_sources (a message's report)
  duplicate_id,      // registration refused: the bus id is already registered
  version_mismatch,  // registration refused: no common protocol version
  out_of_subnet,     // registration refused: the id is outside the parent's subnets
  remote_error,      // a call's handler answered with an error (node::reply_error: its own code)

  // Encrypted links (uvbus/tls.h) and etcd over https: the connection is closed.
  tls_handshake_failed,    // the TLS handshake failed (no common version or suite, wrong PSK, ...)
  peer_not_authenticated,  // a certificate was refused: by us (CA, expiry, name) or by the peer
};

// A short, stable, human-readable description ("queue_full: ..."). Never returns null.
const char* to_string(errc e) noexcept;

// True for the states that may clear up by themselves (queue_full, would_block, not_connected,
// busy, timeout): the caller may retry the same operation later. Everything else needs a change
// first. not_connected is retriable because a link comes back by itself; a node whose registration
// was refused for good (access_denied, out_of_subnet, version_mismatch) returns that refusal from
// send_data() instead, which is not retriable.
constexpr bool is_retriable(errc e) noexcept {
  return e == errc::queue_full || e == errc::would_block || e == errc::not_connected ||
         e == errc::busy || e == errc::timeout;
}

// The last error an object returned, with the detail that says which input was wrong
// ("heartbeat_timeout_ms (3000) must be at least twice heartbeat_interval_ms (2000): ..."). Every
// class of the API keeps one (last_error()); a call that returns ok leaves it unchanged.
struct error_info {
  errc code = errc::ok;
  std::string detail;  // empty when there is nothing more to say than to_string(code)
};

// Maps a negative errno value (or a libuv error, which on Unix is a negative errno) to an errc;
// a value no errno maps to (positive, unknown, INT_MIN) is io_error.
errc errc_from_errno(int negative_errno) noexcept;

}  // namespace uvbus
