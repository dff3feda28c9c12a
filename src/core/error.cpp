// Error codes and log levels: their names, and the mapping from errno.
#include "uvbus/error.h"
#include "uvbus/log.h"

#include <cerrno>
#include <limits>

namespace uvbus {

namespace {
const char* tls_name(errc e) noexcept {
  return e == errc::tls_handshake_failed ? "tls_handshake_failed: the TLS handshake failed"
                                         : "peer_not_authenticated: a TLS certificate was refused";
}
}  // namespace

const char* to_string(errc e) noexcept {
  switch (e) {
    case errc::ok:
      return "ok";
    case errc::queue_full:
      return "queue_full: the queue or ring is full (back-pressure), retry later";
    case errc::not_connected:
      return "not_connected: the peer or link is not connected";
    case errc::busy:
      return "busy: the resource is held by a live owner";
    case errc::timeout:
      return "timeout: a deadline passed";
    case errc::invalid_argument:
      return "invalid_argument: a parameter is out of range";
    case errc::bad_url:
      return "bad_url: the address could not be parsed";
    case errc::unsupported_scheme:
      return "unsupported_scheme: this channel does not serve that URL scheme";
    case errc::message_too_large:
      return "message_too_large: the payload exceeds the message limit";
    case errc::buffer_too_small:
      return "buffer_too_small: the output buffer cannot hold the result";
    case errc::wrong_state:
      return "wrong_state: not allowed in the object's current state";
    case errc::wrong_thread:
      return "wrong_thread: called from a thread other than the owning loop's";
    case errc::would_block:
      return "would_block: nothing available right now";
    case errc::closed:
      return "closed: the object is closed or closing";
    case errc::bad_hash:
      return "bad_hash: checksum mismatch, the data is corrupt";
    case errc::bad_varint:
      return "bad_varint: malformed length prefix";
    case errc::oversize:
      return "oversize: the announced length exceeds the limit";
    case errc::protocol_error:
      return "protocol_error: the peer violated the protocol";
    case errc::bad_layout:
      return "bad_layout: shared region magic, version or sizes do not match";
    case errc::abandoned:
      return "abandoned: the record's writer did not commit in time";
    case errc::connection_refused:
      return "connection_refused: the peer refused the connection";
    case errc::connection_reset:
      return "connection_reset: the peer closed or reset the connection";
    case errc::resolve_failed:
      return "resolve_failed: the host name could not be resolved";
    case errc::address_in_use:
      return "address_in_use: the address is already in use";
    case errc::permission_denied:
      return "permission_denied: the system refused access";
    case errc::not_found:
      return "not_found: no such object";
    case errc::already_exists:
      return "already_exists: the object exists and may not be replaced";
    case errc::no_memory:
      return "no_memory: out of memory";
    case errc::io_error:
      return "io_error: a system call failed";
    case errc::cancelled:
      return "cancelled: the operation was cancelled because its owner closed";
    case errc::unknown_route:
      return "unknown_route: no route to the target bus id";
    case errc::ttl_expired:
      return "ttl_expired: the message exceeded its hop limit";
    case errc::access_denied:
      return "access_denied: no matching access token";
    case errc::duplicate_id:
      return "duplicate_id: the bus id is already registered";
    case errc::version_mismatch:
      return "version_mismatch: no common protocol version";
    case errc::out_of_subnet:
      return "out_of_subnet: the bus id is outside the parent's subnets";
    case errc::remote_error:
      return "remote_error: the called node's handler answered with an error";
    case errc::tls_handshake_failed:
    case errc::peer_not_authenticated:
      return tls_name(e);
  }
  return "unknown error";
}

errc errc_from_errno(int negative_errno) noexcept {
  // INT_MIN has no negation (undefined behaviour): no errno is that value.
  if (negative_errno == std::numeric_limits<int>::min()) return errc::io_error;
  switch (-negative_errno) {
    case 0:
      return errc::ok;
    case EAGAIN:
      return errc::queue_full;
    case ECONNREFUSED:
      return errc::connection_refused;
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
    case ENOTCONN:
      return errc::connection_reset;
    case ETIMEDOUT:
      return errc::timeout;
    case EADDRINUSE:
      return errc::address_in_use;
    case EACCES:
    case EPERM:
      return errc::permission_denied;
    case ENOENT:
      return errc::not_found;
    case EEXIST:
      return errc::already_exists;
    case ENOMEM:
    case ENOBUFS:
      return errc::no_memory;
    case EINVAL:
      return errc::invalid_argument;
    case ECANCELED:
      return errc::cancelled;
    case EMSGSIZE:
      return errc::message_too_large;
    default:
      return errc::io_error;
  }
}

const char* to_string(log_level l) noexcept {
  switch (l) {
    case log_level::debug:
      return "debug";
    case log_level::info:
      return "info";
    case log_level::warn:
      return "warn";
    case log_level::error:
      return "error";
  }
  return "unknown";
}

}  // namespace uvbus
