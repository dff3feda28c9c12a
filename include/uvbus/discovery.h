// Discovery on etcd: a node registers its directory entry under a key prefix with a lease and
// watches the prefix, keeping a local copy of every node's entry (docs/cluster.md).
//
// etcd_discovery talks to etcd's v3 JSON gateway (HTTP/1.1 through libcurl's multi-socket
// interface) from the loop it is given; it never blocks the loop and starts no thread. It is
// usable on its own (a tool that only watches: start() with id 0) and is what node_config::
// discovery turns on inside a node.
//
// Threading: an etcd_discovery belongs to its uv_loop_t and to the thread that runs that loop; it
// must be constructed, called and destroyed there (a member function called from another thread
// does nothing and returns errc::wrong_thread, or false / 0 / empty; a debug build aborts naming
// it). Every callback runs on that thread from inside
// uv_run(), never from inside a member function call (no re-entrancy into the caller's frame).
// on_directory and on_state may call any member function and may destroy the object (nothing of
// it is touched after the callback returns, and the callback itself lives on until it returns;
// after stop() there, no further event of the same range read or watch message is reported); on_log
// may call const members only. Destruction cancels every request without callbacks; the handles it
// owns finish closing on the loop's next iteration, so the loop must run once more before
// uv_loop_close().
//
// Errors are values: start()/update_self() return an errc and keep the detail in last_error().
// When a function which takes a callback returns an error, the callback will never be called.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "uvbus/directory.h"
#include "uvbus/error.h"
#include "uvbus/log.h"

typedef struct uv_loop_s uv_loop_t;  // NOLINT(modernize-use-using): matches libuv's declaration

namespace uvbus {

struct discovery_config {
  // etcd client URLs, "http://HOST:PORT" or "https://HOST:PORT" (the JSON gateway listens on the
  // client port), tried in order; after a failure the next one is used. Empty: discovery is off
  // (node_config). A path is kept; a query or fragment, or more than 1024 bytes, is refused.
  std::vector<std::string> etcd_endpoints;
  // TLS to etcd (docs/cluster.md, "etcd over TLS"), for https:// endpoints; with any of these set,
  // every endpoint must be https://. etcd's certificate is always verified, host name included.
  // PEM files, read when a connection is made (start() checks they can be read and parsed, and
  // that the key belongs to the certificate):
  std::string tls_ca_file;    // CA bundle etcd's certificate must chain to; empty: the system's
  std::string tls_cert_file;  // this client's certificate, for etcd's --client-cert-auth
  std::string tls_key_file;   // its private key, unencrypted; set with tls_cert_file or not at all
  // etcd's own authentication (`etcdctl auth enable`): each session first authenticates as this
  // user and every request carries the token etcd gives; a token etcd no longer accepts fails the
  // session, and the next one authenticates again. Empty: no authentication. Both must be valid
  // UTF-8. Over http:// the password travels in clear: use https:// endpoints.
  std::string etcd_username;
  std::string etcd_password;
  // Key prefix, without a trailing '/'. Entries live under <prefix>/nodes/<16 hex digits>.
  std::string prefix = "/uvbus";
  // Lease TTL in seconds (2..3600); keep-alive every ttl_s/3. A node that dies leaves every
  // directory at most about ttl_s later.
  uint32_t ttl_s = 10;
  // Deadline of one unary request (grant, put, range, keep-alive, revoke).
  uint32_t request_timeout_ms = 3000;
  // After a failure the session restarts after retry_min_ms, doubling up to retry_max_ms
  // (+-20 % jitter), on the next endpoint. The wait starts again from retry_min_ms only after a
  // session that stayed connected for retry_max_ms (etcd cancelling every watch at once, or
  // failing every session after its registration, meets a growing wait).
  uint32_t retry_min_ms = 100;
  uint32_t retry_max_ms = 3000;
  // Bounds: entries kept (others are skipped and logged; up to min(max_entries, 4096) of them
  // are kept aside, taken in as room frees), bytes of one response (a range read, one watch
  // message) and of one entry's value. max_response_bytes: at least 4096 and one watch message of
  // one entry of max_entry_bytes (4/3 x max_entry_bytes + 4/3 x (prefix + 23) + 512), else
  // start() returns errc::invalid_argument naming both and the minimum.
  size_t max_entries = 100000;
  size_t max_response_bytes = size_t{64} << 20;
  size_t max_entry_bytes = size_t{16} << 10;
};

struct discovery_callbacks {
  // An entry appeared, changed or left. `entry` is valid during the call only, and only while the
  // object lives: a callback that destroys it must copy what it needs of `entry` first. Directory
  // state (directory(), lookup()) already reflects the event when it runs.
  std::function<void(directory_event event, const directory_entry& entry)> on_directory;
  // The session state changed: true once this node is registered (if it registers) and the
  // directory is in sync with etcd, false when etcd became unreachable (the directory is kept).
  std::function<void(bool connected)> on_state;
  // Log lines (malformed entries, failures, failover), rate limited per kind (5 a second, then
  // one line with the count left out). Optional; must not destroy the object.
  log_fn on_log;
};

// Counters since construction (for tests, metrics and the scale tool).
struct discovery_stats {
  uint64_t registrations = 0;  // successful lease grant + put
  uint64_t resyncs = 0;        // range reads that replaced the directory
  uint64_t failures = 0;       // sessions that failed (unreachable, timeout, lease lost, ...)
  // The backoff the last failure waited before the next session: it doubles with every failure
  // until a session has stayed connected for retry_max_ms.
  uint64_t last_retry_delay_ms = 0;
  // Entries skipped because they did not decode / because max_entries was reached: counted and
  // logged once per key and mod_revision, not at every range read (up to 4096 keys, and at most
  // max_entries skipped for room, are remembered; others count at every read).
  uint64_t malformed = 0;
  uint64_t skipped_full = 0;
};

class etcd_discovery;
namespace detail {
// A test seam of the library (internal; see src/discovery/discovery_impl.h), not API.
int64_t discovery_rewatch_from(etcd_discovery& d, int64_t from);
}  // namespace detail

class etcd_discovery {
 public:
  etcd_discovery(uv_loop_t* loop, discovery_config cfg, discovery_callbacks cbs);
  ~etcd_discovery();
  etcd_discovery(const etcd_discovery&) = delete;
  etcd_discovery& operator=(const etcd_discovery&) = delete;

  // Checks the configuration (invalid_argument naming the field) and starts the session: with
  // self.id != 0 it registers `self` (copied) under its key, then reads and watches the prefix.
  // While registered, its own entry found deleted in etcd or on another lease is written again.
  // wrong_state if started already; invalid_argument for a null loop (the constructor takes one
  // and makes nothing of it), or for a `self` no reader would accept (a field
  // beyond the value's limits, docs/cluster.md "Value", or above max_entry_bytes), naming it.
  [[nodiscard]] errc start(const directory_entry& self);
  // Replaces the registered entry (same id; listen URLs known later, labels changed). Written at
  // once when registered (after a put still under way), else at the next registration.
  // wrong_state before start() or on a watch-only instance, invalid_argument for another id or
  // an entry start() would refuse, closed after stop().
  [[nodiscard]] errc update_self(const directory_entry& self);
  // Revokes the lease (and that of a failed session which may still hold the entry: the entry
  // leaves every directory at once) and stops; `done` runs when the revokes were answered or
  // failed (never inside this call). With etcd_username set and no token etcd surely accepts
  // (authenticating, or in the backoff after a failure), it authenticates again first; a revoke
  // refused for its token authenticates and revokes once more, one that met a transport failure
  // or 5xx is sent to the next endpoint (each once), all within request_timeout_ms (twice that
  // with etcd_username), and one that finally failed is logged (warn). Destroying
  // the object without stop() leaves the entry until its lease expires, as a crash would.
  [[nodiscard]] errc stop(std::function<void()> done);

  // Every entry known, by id (this node's own included once it is seen in etcd).
  [[nodiscard]] std::vector<directory_entry> directory() const;
  [[nodiscard]] bool lookup(bus_id id, directory_entry* out) const;
  [[nodiscard]] size_t size() const;
  // Registered (if registering) and watching.
  [[nodiscard]] bool connected() const;
  [[nodiscard]] discovery_stats stats() const;
  [[nodiscard]] const error_info& last_error() const;

  // The key of node `id` under `prefix`: prefix + "/nodes/" + 16 lowercase hex digits.
  static std::string key_of(const std::string& prefix, bus_id id);

  struct impl;

 private:
  friend int64_t detail::discovery_rewatch_from(etcd_discovery& d, int64_t from);
  std::unique_ptr<impl> impl_;
};

// Checks a discovery_config: ok, or invalid_argument with *detail naming the field (detail may be
// null: the code alone).
[[nodiscard]] errc validate(const discovery_config& cfg, std::string* detail);

}  // namespace uvbus
