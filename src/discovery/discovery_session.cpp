// etcd_discovery's session with etcd: lease grant, put of the own entry, range read of the
// prefix, watch from the range revision + 1, keep-alive every ttl_s/3, and on any failure the
// next endpoint after a backoff with a new lease (the old one revoked once the new put landed); the
// own entry found deleted or not ours is put again; stop() revokes the leases (authenticating
// first when the session holds no token etcd surely accepts).
#include <algorithm>

#include "discovery/discovery_impl.h"

namespace uvbus {

namespace etcd = detail::etcd;
using detail::http_result;

std::string etcd_discovery::impl::url(const char* path) const {
  std::string u = cfg.etcd_endpoints[ep % cfg.etcd_endpoints.size()];
  while (!u.empty() && u.back() == '/') u.pop_back();
  return u + path;
}

void etcd_discovery::impl::cancel_all() {
  for (uint64_t* id : {&req, &watch_req, &ka_req, &upd_req}) {
    if (*id != 0) http->cancel(*id);
    *id = 0;
  }
  uv_timer_stop(ka_timer);
  uv_timer_stop(retry_timer);
  uv_timer_stop(watch_timer);
}

void etcd_discovery::impl::set_connected(bool c) {
  if (c == is_connected) return;
  is_connected = c;
  if (!cbs->on_state) return;
  const std::shared_ptr<const discovery_callbacks> keep = cbs;  // it may destroy us
  keep->on_state(c);
}

// A unary request's outcome as text: empty when a 200 response with a body arrived.
static std::string failure_of(const http_result& r) {
  if (r.code != errc::ok) return std::string(to_string(r.code)) + " (" + r.detail + ")";
  if (r.status != 200) {
    return "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 200);
  }
  return {};
}

void etcd_discovery::impl::fail(const std::string& why) {
  ++st.failures;
  cancel_all();
  if (lease != 0) {  // it may hold the key: revoked when the next session's put landed
    if (old_leases.size() >= kOldLeases) old_leases.erase(old_leases.begin());
    old_leases.push_back(lease);
  }
  lease = 0;           // the next session registers with a new lease
  self_dirty = false;  // its put writes the newest self
  self_lost = false;
  resync_ms = 0;
  err = {errc::not_connected, why};
  log(log_level::warn, kFailure,
      "etcd " + cfg.etcd_endpoints[ep % cfg.etcd_endpoints.size()] + ": " + why);
  ep = (ep + 1) % cfg.etcd_endpoints.size();
  if (up_ms != 0 && uv_now(loop) - up_ms >= cfg.retry_max_ms) attempt = 0;
  up_ms = 0;
  uint64_t delay = cfg.retry_min_ms;
  for (uint32_t i = 0; i < attempt && delay < cfg.retry_max_ms; ++i) delay *= 2;
  delay = std::min<uint64_t>(delay, cfg.retry_max_ms);
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  delay = static_cast<uint64_t>(static_cast<double>(delay) * jitter(rng));
  st.last_retry_delay_ms = delay;
  ++attempt;
  ph = phase::backoff;
  uv_timer_start(
      retry_timer, [](uv_timer_t* t) { static_cast<impl*>(t->data)->begin_session(); }, delay, 0);
  set_connected(false);  // may destroy us: nothing after it
}

void etcd_discovery::impl::begin_session() {
  if (!cfg.etcd_username.empty()) return authenticate();
  after_auth();
}

void etcd_discovery::impl::after_auth() {
  if (registering) {
    grant();
  } else {
    range();
  }
}

// A new token for every session: one etcd stopped accepting (expired, or auth re-enabled) failed
// the session that used it.
void etcd_discovery::impl::authenticate() {
  ph = phase::authenticating;
  http->set_token({});
  const std::string what = "authenticate as \"" + cfg.etcd_username + "\": ";
  req = http->post(url("/v3/auth/authenticate"),
                   etcd::authenticate_request(cfg.etcd_username, cfg.etcd_password),
                   cfg.request_timeout_ms, [this, what](http_result& r) {
                     req = 0;
                     std::string why = failure_of(r);
                     std::string token;
                     if (why.empty() && !etcd::parse_authenticate(r.body, &token, &why)) {
                       why = "bad body: " + why;
                     }
                     if (!why.empty()) return fail(what + why);
                     http->set_token(std::move(token));
                     after_auth();
                   });
  if (req == 0) fail(what + "the HTTP client refused the request");
}

void etcd_discovery::impl::grant() {
  ph = phase::granting;
  req = http->post(url("/v3/lease/grant"), etcd::grant_request(cfg.ttl_s), cfg.request_timeout_ms,
                   [this](http_result& r) {
                     req = 0;
                     std::string why = failure_of(r);
                     etcd::lease_reply lr;
                     if (why.empty() && !etcd::parse_lease_grant(r.body, &lr, &why)) {
                       why = "bad body: " + why;
                     }
                     if (!why.empty()) return fail("lease grant: " + why);
                     lease = lr.id;
                     ph = phase::putting;
                     put_self();
                   });
  if (req == 0) fail("lease grant: the HTTP client refused the request");
}

// One put of self at a time: a newer one waits for the answer to the one under way (a cancelled
// put etcd already took could be applied after the newer one, leaving the older value).
void etcd_discovery::impl::put_self() {
  const bool first = ph == phase::putting;
  if (!first && upd_req != 0) {
    self_dirty = true;
    return;
  }
  self_lost = false;
  uint64_t& slot = first ? req : upd_req;
  const uint64_t id =
      http->post(url("/v3/kv/put"), etcd::put_request(self_key, etcd::encode_entry(self), lease),
                 cfg.request_timeout_ms, [this, first](http_result& r) {
                   (first ? req : upd_req) = 0;
                   std::string why = failure_of(r);
                   if (why.empty()) (void)etcd::parse_ok(r.body, &why);  // sets why when it fails
                   if (!why.empty()) return fail("put: " + why);
                   if (first) {
                     ++st.registrations;
                     ka_ok_ms = uv_now(loop);  // the lease was granted just before
                     arm_keepalive();
                     revoke_old_leases();
                     range();
                   }
                   // update_self() (or self_lost) while this put was under way.
                   if (self_dirty && (ph == phase::ranging || ph == phase::watching)) {
                     self_dirty = false;
                     put_self();
                   }
                 });
  if (id == 0) return fail("put: the HTTP client refused the request");
  slot = id;
}

// Our key is on `lease` now: a lease of a failed session can only hold it again through a late
// put, which revoking it deletes (the watch then sees the own entry deleted: self_seen()).
void etcd_discovery::impl::revoke_old_leases() {
  for (const int64_t old : old_leases) {
    if (old == lease) continue;
    (void)http->post(url("/v3/lease/revoke"), etcd::lease_id_request(old), cfg.request_timeout_ms,
                     [](http_result&) {});  // failed or not: it expires unrenewed
  }
  old_leases.clear();
}

void etcd_discovery::impl::self_seen(const etcd::kv* item) {
  if (!registering || lease == 0) return;
  const bool put_under_way = upd_req != 0 || self_dirty;  // its value may differ: ours, older
  if (item != nullptr && item->lease == lease &&
      (put_under_way || item->value == etcd::encode_entry(self))) {
    return;
  }
  if (!self_lost) {
    const std::string how = item == nullptr        ? "absent or deleted"
                            : item->lease != lease ? "on lease " + std::to_string(item->lease) +
                                                         ", not " + std::to_string(lease)
                                                   : "with another value";
    log(log_level::warn, kFailure, "own entry " + how + " in etcd: written again");
  }
  self_lost = true;
  reput();
}

// Rate limited (two instances registering the same id would otherwise overwrite each other as
// fast as etcd goes): at once if the last such put is half a keep-alive period old, else at a
// keep-alive tick.
void etcd_discovery::impl::reput() {
  if (!self_lost || upd_req != 0 || lease == 0 || (ph != phase::ranging && ph != phase::watching)) {
    return;
  }
  const uint64_t now = uv_now(loop);
  const uint64_t gap = std::max<uint64_t>(uint64_t{cfg.ttl_s} * 1000 / 6, 50);
  if (reput_ms != 0 && now - reput_ms < gap) return;
  reput_ms = now;
  put_self();
}

void etcd_discovery::impl::range() {
  ph = phase::ranging;
  req = http->post(url("/v3/kv/range"), etcd::range_request(nodes_prefix), cfg.request_timeout_ms,
                   [this](http_result& r) {
                     req = 0;
                     std::string why = failure_of(r);
                     etcd::range_reply rr;
                     if (why.empty() && !etcd::parse_range(r.body, &rr, &why)) {
                       why = "bad body: " + why;
                     }
                     if (!why.empty()) return fail("range: " + why);
                     revision = rr.revision;
                     const std::weak_ptr<char> alive = life;
                     watch(revision + 1);  // first: the events below may destroy us
                     if (alive.expired() || !apply_snapshot(rr.kvs)) return;
                     const etcd::kv* mine = nullptr;
                     for (const etcd::kv& item : rr.kvs) mine = item.key == self_key ? &item : mine;
                     self_seen(mine);
                   });
  if (req == 0) fail("range: the HTTP client refused the request");
}

// A stream that never says `created` (a buffering proxy, a stuck gateway) fails the session after
// request_timeout_ms. A watch-only instance's probe runs from here on, `created` or not.
void etcd_discovery::impl::watch(int64_t from) {
  ph = phase::watching;
  watch_req = http->stream(
      url("/v3/watch"), etcd::watch_request(nodes_prefix, from), cfg.request_timeout_ms,
      [this](std::string_view line) { on_watch_line(line); },
      [this](http_result& r) {
        watch_req = 0;
        std::string why = failure_of(r);
        fail("watch stream ended" + (why.empty() ? std::string() : ": " + why));
      });
  if (watch_req == 0) return fail("watch: the HTTP client refused the request");
  if (!registering) arm_keepalive();  // the probe that notices a silent or partitioned member
  uv_timer_start(
      watch_timer,
      [](uv_timer_t* t) {
        auto* d = static_cast<impl*>(t->data);
        d->fail("watch: not created within " + std::to_string(d->cfg.request_timeout_ms) + " ms");
      },
      cfg.request_timeout_ms, 0);
}

// etcd answers a watch from a compacted revision with `created`, then `canceled` +
// compact_revision and no cancel_reason, and keeps the stream open: the stream is dropped and
// everything read again (range, then a watch from there). Any other cancel (a cancel_reason, no
// compact_revision), or a second compaction cancel within request_timeout_ms of the last resync,
// is not a gap a resync fixes: it fails the session (backoff, next endpoint).
void etcd_discovery::impl::on_watch_cancel(const etcd::watch_reply& w) {
  const std::string what = "watch cancelled (compact_revision " +
                           std::to_string(w.compact_revision) +
                           (w.error.empty() ? std::string() : ", " + w.error) + ")";
  const uint64_t now = uv_now(loop);
  if (w.compact_revision == 0) {
    return fail(what + (w.error.empty() ? ": no cancel_reason" : std::string()));
  }
  if (resync_ms != 0 && now - resync_ms < cfg.request_timeout_ms) {
    return fail(what + ": again within " + std::to_string(cfg.request_timeout_ms) +
                " ms of a resync");
  }
  resync_ms = now;
  log(log_level::info, kInfo, what + ": resync");
  http->cancel(watch_req);
  watch_req = 0;
  uv_timer_stop(watch_timer);
  range();
}

void etcd_discovery::impl::on_watch_line(std::string_view line) {
  etcd::watch_reply w;
  std::string why;
  if (!etcd::parse_watch(line, &w, &why)) return fail("watch: " + why);
  if (w.canceled || w.compact_revision != 0) return on_watch_cancel(w);
  if (w.revision > revision) revision = w.revision;
  if (w.created) {
    uv_timer_stop(watch_timer);
    if (up_ms == 0) up_ms = uv_now(loop);
    const std::weak_ptr<char> alive = life;
    set_connected(true);
    if (alive.expired() || ph == phase::stopped) return;
  }
  for (const etcd::watch_event& ev : w.events) {
    const bool alive = ev.deleted ? apply_delete(ev.item.key) : apply_put(ev.item);
    if (!alive) return;
    if (ev.item.key != self_key) continue;
    const std::weak_ptr<char> alive_now = life;
    self_seen(ev.deleted ? nullptr : &ev.item);
    if (alive_now.expired() || ph != phase::watching) return;  // the put was refused: failed
  }
}

void etcd_discovery::impl::arm_keepalive() {
  const uint64_t every = std::max<uint64_t>(uint64_t{cfg.ttl_s} * 1000 / 3, 100);
  uv_timer_start(
      ka_timer, [](uv_timer_t* t) { static_cast<impl*>(t->data)->keepalive(); }, every, every);
}

// A watch-only instance probes with a linearizable count instead: a member that lost its
// cluster (or hangs) fails it, and the session moves to the next endpoint.
void etcd_discovery::impl::probe(uint32_t timeout) {
  ka_req = http->post(url("/v3/kv/range"), etcd::count_request(nodes_prefix), timeout,
                      [this](http_result& r) {
                        ka_req = 0;
                        std::string why = failure_of(r);
                        if (why.empty()) (void)etcd::parse_ok(r.body, &why);
                        if (!why.empty()) fail("probe: " + why);
                      });
  if (ka_req == 0) fail("probe: the HTTP client refused the request");
}

void etcd_discovery::impl::keepalive() {
  const std::weak_ptr<char> alive = life;
  reput();
  if (alive.expired() || ph == phase::backoff) return;  // its put was refused: failed
  if (ka_req != 0) return;                              // the previous one is still under way
  const uint32_t timeout =
      std::min<uint32_t>(cfg.request_timeout_ms, std::max<uint32_t>(cfg.ttl_s * 1000 / 2, 100));
  if (!registering) return probe(timeout);
  if (lease == 0) return;
  ka_req = http->post(url("/v3/lease/keepalive"), etcd::lease_id_request(lease), timeout,
                      [this](http_result& r) { on_keepalive(r); });
  if (ka_req == 0) fail("keep-alive: the HTTP client refused the request");
}

// A lease found gone, or an endpoint that refuses connections, ends the session at once. A slow
// answer (a busy etcd or host) is retried at the next tick while the lease surely lives (less
// than 2/3 of the TTL since the last renewal): restarting every session of a busy cluster with
// new leases would only add to its load.
void etcd_discovery::impl::on_keepalive(http_result& r) {
  ka_req = 0;
  std::string why = failure_of(r);
  etcd::lease_reply lr;
  if (why.empty() && !etcd::parse_keepalive(r.body, &lr, &why)) why = "bad body: " + why;
  if (why.empty() && lr.ttl <= 0) {
    lease = 0;  // gone, and the key with it: nothing to revoke
    return fail("keep-alive: the lease expired");
  }
  if (why.empty()) {
    ka_ok_ms = uv_now(loop);
    return;
  }
  const bool slow = r.code == errc::timeout || (r.code == errc::ok && r.status >= 500);
  if (slow && uv_now(loop) - ka_ok_ms < uint64_t{cfg.ttl_s} * 1000 * 2 / 3) {
    log(log_level::info, kFailure, "keep-alive: " + why + ": retried at the next tick");
    return;
  }
  fail("keep-alive: " + why);
}

void etcd_discovery::impl::finish_stop() {
  std::function<void()> cb = std::move(stop_done);
  if (cb) cb();
}

int64_t etcd_discovery::impl::rewatch_from(int64_t from) {
  if (ph != phase::watching) return 0;
  if (watch_req != 0) http->cancel(watch_req);
  watch_req = 0;
  uv_timer_stop(watch_timer);
  if (from > 0) watch(from);
  return revision;
}

int64_t detail::discovery_rewatch_from(etcd_discovery& d, int64_t from) {
  return d.impl_->rewatch_from(from);
}

// With etcd authentication, revoking a lease that holds keys takes a token allowed to write them:
// a stop() while authenticating (no token) or in the backoff (the token may be the one etcd
// refused, or another member's: simple tokens are per member) authenticates first, and so does a
// revoke refused for its token (a simple token lapsed idle, a JWT expired: a watching instance
// sends only keep-alives, which etcd does not check the token of). Failed or not, the revokes
// follow.
void etcd_discovery::impl::stop_authenticate(const std::vector<int64_t>& leases) {
  const std::string what = "stop(): authenticate as \"" + cfg.etcd_username + "\": ";
  stopping.reauthed = true;
  req = http->post(url("/v3/auth/authenticate"),
                   etcd::authenticate_request(cfg.etcd_username, cfg.etcd_password), stop_timeout(),
                   [this, what, leases](http_result& r) {
                     req = 0;
                     std::string why = failure_of(r);
                     std::string token;
                     if (why.empty() && etcd::parse_authenticate(r.body, &token, &why)) {
                       http->set_token(std::move(token));
                     } else {
                       log(log_level::warn, kFailure, what + why);
                     }
                     revoke_for_stop(leases);
                   });
  if (req == 0) revoke_for_stop(leases);
}

uint32_t etcd_discovery::impl::stop_timeout() const {
  const uint64_t now = uv_now(loop);
  const uint64_t left = stopping.deadline_ms > now ? stopping.deadline_ms - now : 1;
  return static_cast<uint32_t>(std::min<uint64_t>(left, cfg.request_timeout_ms));
}

// `done` runs once every revoke was answered or failed, from the loop (never inside stop()).
void etcd_discovery::impl::revoke_for_stop(const std::vector<int64_t>& leases) {
  stopping.left = 0;
  stopping.unreachable = stopping.token_refused = false;
  stopping.retry.clear();
  for (const int64_t l : leases) {
    const uint64_t id =
        http->post(url("/v3/lease/revoke"), etcd::lease_id_request(l), stop_timeout(),
                   [this, l](http_result& r) { on_stop_revoke(l, r); });
    stopping.left += id != 0 ? 1 : 0;
  }
  if (stopping.left == 0) {
    uv_timer_start(
        retry_timer, [](uv_timer_t* t) { static_cast<impl*>(t->data)->finish_stop(); }, 0, 0);
  }
}

// Revoked, or the lease is gone (404: it expired, and its keys with it): done. A transport
// failure or 5xx is retried on the next endpoint, a refused token after authenticating again; any
// other refusal is final.
void etcd_discovery::impl::on_stop_revoke(int64_t lease_id, const http_result& r) {
  const std::string why = failure_of(r);
  const bool gone = r.code == errc::ok && r.status == 404;
  if (!why.empty() && !gone) {
    const std::string what = "revoke of lease " + std::to_string(lease_id) + ": " + why;
    const bool unreachable = r.code != errc::ok || r.status >= 500;
    const bool token =
        !unreachable && (r.status == 401 || r.body.find("auth token") != std::string::npos);
    if (unreachable || token) {
      stopping.retry.push_back(lease_id);
      stopping.unreachable |= unreachable;
      stopping.token_refused |= token;
      stopping.why = what;
    } else {
      log(log_level::warn, kFailure,
          "stop(): " + what + ": the entry stays until the lease expires");
    }
  }
  if (--stopping.left == 0) stop_round_done();
}

void etcd_discovery::impl::stop_round_done() {
  stop_state& s = stopping;
  if (s.retry.empty()) return finish_stop();
  const std::vector<int64_t> again = std::move(s.retry);
  s.retry.clear();
  const bool time_left = uv_now(loop) < s.deadline_ms;
  const bool auth = !cfg.etcd_username.empty();
  if (time_left && s.unreachable && s.endpoints_tried < cfg.etcd_endpoints.size()) {
    ep = (ep + 1) % cfg.etcd_endpoints.size();
    ++s.endpoints_tried;
    s.reauthed = false;
    if (auth) return stop_authenticate(again);  // simple tokens are per member
    return revoke_for_stop(again);
  }
  if (time_left && s.token_refused && !s.unreachable && auth && !s.reauthed) {
    return stop_authenticate(again);
  }
  log(log_level::warn, kFailure,
      "stop(): " + s.why + (time_left ? "" : " (out of time)") +
          ": the entry stays until the lease expires");
  finish_stop();
}

errc etcd_discovery::stop(std::function<void()> done) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "etcd_discovery::stop");
  impl& d = *impl_;
  if (d.ph == impl::phase::idle || d.ph == impl::phase::stopped) {
    d.err = {errc::wrong_state, "stop(): not started, or stopped already"};
    return errc::wrong_state;
  }
  const bool no_good_token = !d.cfg.etcd_username.empty() &&
                             (d.ph == impl::phase::authenticating || d.ph == impl::phase::backoff);
  d.cancel_all();
  d.ph = impl::phase::stopped;
  d.stop_done = std::move(done);
  d.is_connected = false;
  // The session's lease and those of failed sessions that may still hold the key.
  std::vector<int64_t> leases = std::move(d.old_leases);
  d.old_leases.clear();
  if (d.lease != 0 && std::find(leases.begin(), leases.end(), d.lease) == leases.end()) {
    leases.push_back(d.lease);
  }
  d.lease = 0;
  d.stopping = {};
  d.stopping.endpoints_tried = 1;
  d.stopping.deadline_ms =
      uv_now(d.loop) + uint64_t{d.cfg.request_timeout_ms} * (d.cfg.etcd_username.empty() ? 1 : 2);
  if (no_good_token && !leases.empty()) {
    d.stop_authenticate(leases);
  } else {
    d.revoke_for_stop(leases);
  }
  return errc::ok;
}

}  // namespace uvbus
