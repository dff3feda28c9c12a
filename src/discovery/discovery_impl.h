// etcd_discovery's state: the session with etcd (lease, registration, range read, watch,
// keep-alive, retry across endpoints) and the directory it keeps (discovery.cpp,
// discovery_session.cpp).
#pragma once

#include <uv.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/log_limiter.h"
#include "core/thread_check.h"
#include "discovery/etcd_client.h"
#include "discovery/etcd_codec.h"
#include "uvbus/discovery.h"

namespace uvbus {

namespace detail {
// What is wrong with cfg's TLS settings ("" when nothing): a plain http:// endpoint beside them, a
// certificate without its key, a file that cannot be read or parsed, a key of another certificate
// (etcd_tls.cpp).
std::string tls_problem(const discovery_config& cfg);
}  // namespace detail

struct etcd_discovery::impl {
  enum class phase : uint8_t {
    idle,
    authenticating,
    granting,
    putting,
    ranging,
    watching,
    backoff,
    stopped
  };
  enum log_kind : size_t { kMalformed, kFailure, kFull, kInfo };

  uv_loop_t* loop;
  detail::owner_thread owner;  // every public call checks it (docs/core.md, "Threads")
  discovery_config cfg;
  // Shared: a callback runs from a reference of its own (emit(), set_connected()), so one that
  // destroys the object does not destroy the std::function it runs from.
  std::shared_ptr<const discovery_callbacks> cbs;
  std::unique_ptr<detail::etcd_client> http;
  uv_timer_t* ka_timer = nullptr;     // keep-alive ticks (heap: freed by its close callback)
  uv_timer_t* retry_timer = nullptr;  // backoff, and stop()'s deferred done
  uv_timer_t* watch_timer = nullptr;  // the deadline for the watch's `created`
  phase ph = phase::idle;
  directory_entry self;
  bool registering = false;
  bool self_dirty = false;   // update_self() while a put of self is under way: put again after it
  bool self_lost = false;    // the own entry found deleted or not ours in etcd: put it again
  uint64_t reput_ms = 0;     // loop time of the last put for self_lost (they are rate limited)
  std::string nodes_prefix;  // <prefix>/nodes/
  std::string self_key;      // <prefix>/nodes/<self.id>
  size_t ep = 0;             // the endpoint in use
  // Failures since the last good session: one that stayed connected (watch created) for
  // retry_max_ms. A session that fails sooner (etcd cancelling every watch) keeps backing off.
  uint32_t attempt = 0;
  uint64_t up_ms = 0;  // loop time the current session's watch was created (0: not yet)
  int64_t lease = 0;
  // Leases of failed sessions that may still hold the own key (a put etcd took, or applies late):
  // revoked once the next session's put landed, or by stop(). At most kOldLeases (older ones
  // expire unrenewed within ttl_s).
  std::vector<int64_t> old_leases;
  static constexpr size_t kOldLeases = 16;
  // stop()'s revokes, in rounds: a lease whose revoke met a transport failure or 5xx is revoked
  // again on the next endpoint (each tried once), one refused for its token after authenticating
  // again (once an endpoint), all within `deadline_ms`; one that finally failed is logged.
  struct stop_state {
    uint64_t deadline_ms = 0;    // loop time
    size_t left = 0;             // this round's revokes not yet answered
    size_t endpoints_tried = 0;  // including the current one
    bool reauthed = false;       // authenticated on the current endpoint since stop()
    bool unreachable = false;    // this round: a transport failure or 5xx
    bool token_refused = false;  // this round: 401 / "invalid auth token"
    std::vector<int64_t> retry;  // leases to revoke again
    std::string why;             // the last failure
  } stopping;
  int64_t revision = 0;  // the last revision seen (range header, watch header)
  uint64_t req = 0;      // the unary request of the current step
  uint64_t watch_req = 0;
  uint64_t ka_req = 0;
  uint64_t upd_req = 0;    // update_self()'s put
  uint64_t ka_ok_ms = 0;   // loop time of the last renewal (or grant)
  uint64_t resync_ms = 0;  // loop time of the last resync after a compaction cancel (0: none)
  bool is_connected = false;
  std::function<void()> stop_done;
  std::map<bus_id, directory_entry> dir;
  // Entries skipped as of the last range read and the watch since, remembered so that each is
  // counted and logged once per (key, mod_revision): malformed ones by a hash of their key (at
  // most kSkipMemory), those left out for want of room whole (at most min(max_entries,
  // kSkipMemory), each at most max_entry_bytes), taken in as room frees (fill_room()).
  using bad_map = std::unordered_map<size_t, int64_t>;  // key hash -> mod_revision
  using full_map = std::map<bus_id, std::pair<int64_t, directory_entry>>;
  static constexpr size_t kSkipMemory = 4096;
  bad_map bad_seen;
  full_map full_seen;
  discovery_stats st;
  error_info err;
  detail::log_limiter limiter;
  std::mt19937 rng{std::random_device{}()};
  std::shared_ptr<char> life = std::make_shared<char>(0);  // expires at destruction

  impl(uv_loop_t* l, discovery_config c, discovery_callbacks cb);
  ~impl();

  // ------------------------------------------------------------ discovery_session.cpp --
  [[nodiscard]] std::string url(const char* path) const;
  void begin_session();
  void authenticate();  // etcd_username set: the session's first request
  void after_auth();    // grant (registering) or range (watch only)
  void grant();
  void put_self();  // after a put still under way (self_dirty), never beside it
  // The own entry as etcd has it (nullptr: absent or deleted), from a range read or the watch:
  // deleted, on another lease, or (no put of ours under way) another value sets self_lost.
  void self_seen(const detail::etcd::kv* item);
  void reput();  // self_lost: puts self again now, or at a later keep-alive tick (rate limit)
  void revoke_old_leases();
  void range();
  void watch(int64_t from);  // the prefix, from revision `from`
  void on_watch_line(std::string_view line);
  // A watch cancel: a resync (range read, then a new watch) or fail().
  void on_watch_cancel(const detail::etcd::watch_reply& w);
  void keepalive();
  void on_keepalive(detail::http_result& r);
  void probe(uint32_t timeout);
  void arm_keepalive();
  void fail(const std::string& why);
  void set_connected(bool c);
  void cancel_all();
  void finish_stop();
  // stop()'s steps: authenticate first when the session has no token etcd surely accepts, then
  // revoke `leases`; finish_stop() once every revoke was answered or failed.
  void stop_authenticate(const std::vector<int64_t>& leases);
  void revoke_for_stop(const std::vector<int64_t>& leases);
  void on_stop_revoke(int64_t lease, const detail::http_result& r);
  void stop_round_done();
  uint32_t stop_timeout() const;  // what is left of the deadline, at most request_timeout_ms
  // Test seam (detail::discovery_rewatch_from), not used by the library: see there.
  int64_t rewatch_from(int64_t from);

  // ---------------------------------------------------------------------- discovery.cpp --
  // Each returns false when a callback destroyed or stop()ped the object (stop touching it).
  bool apply_snapshot(const std::vector<detail::etcd::kv>& kvs);
  bool apply_put(const detail::etcd::kv& item);
  bool apply_delete(const std::string& key);
  // Takes `key`'s entry out of the directory and of full_seen, then fills the room it left.
  bool remove_key(const std::string& key);
  bool fill_room();
  // false with *why when `item` is no valid entry (counted by note_malformed()).
  bool decode(const detail::etcd::kv& item, directory_entry* out, std::string* why);
  // Count and log a skipped item unless `was` holds its (key, mod_revision); remember it in *now.
  void note_malformed(const detail::etcd::kv& item, const std::string& why, const bad_map& was,
                      bad_map* now);
  void note_full(const detail::etcd::kv& item, directory_entry e, const full_map& was,
                 full_map* now);
  bool emit(directory_event ev, const directory_entry& e);
  void log(log_level lv, size_t kind, const std::string& msg);
};

namespace detail {
// Test seam for the watch-gap test (not API; the public class befriends it): cancels d's watch
// request and returns the last revision d had seen. With from > 0 it then watches the prefix
// again from revision `from` (one etcd has compacted already forces the gap path: etcd cancels
// the watch with compact_revision set); with from == 0 it leaves d without a watch, so d misses
// every change until the next call. Nothing happens (returns 0) unless d is watching.
int64_t discovery_rewatch_from(etcd_discovery& d, int64_t from);
}  // namespace detail

}  // namespace uvbus
