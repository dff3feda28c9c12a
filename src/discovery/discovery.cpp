// etcd_discovery's public surface and its directory: configuration checks, applying range
// snapshots and watch events (malformed entries skipped and logged, capped size, skipped entries
// remembered), events to the user, rate-limited logging.
#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <limits>

#include "core/utf8.h"
#include "discovery/discovery_impl.h"

namespace uvbus {

using detail::etcd::kv;

// What is wrong with an etcd endpoint URL ("" when nothing): the scheme, its length, a missing
// host, a port that is not 1..65535, a space or control byte, a query or fragment (the request's
// path, /v3/..., is appended to the URL: it would land inside them). A path is kept (a proxy may
// serve etcd under one).
static std::string endpoint_problem(const std::string& u) {
  const size_t scheme = u.rfind("http://", 0) == 0 ? 7 : u.rfind("https://", 0) == 0 ? 8 : 0;
  if (scheme == 0) return "not an http:// or https:// URL";
  if (u.size() > 1024) return "longer than 1024 bytes";
  for (const char c : u) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return "a space or control byte";
  }
  if (u.find('?') != std::string::npos) return "a query ('?'): the request's path would follow it";
  if (u.find('#') != std::string::npos) {
    return "a fragment ('#'): the request's path would follow it";
  }
  std::string auth = u.substr(scheme, u.find_first_of("/?#", scheme) - scheme);
  auth = auth.substr(auth.rfind('@') == std::string::npos ? 0 : auth.rfind('@') + 1);
  const size_t close = auth[0] == '[' ? auth.find(']') : 0;  // an IPv6 literal
  if (close == std::string::npos) return "an IPv6 host without ']'";
  const size_t colon = auth.find(':', close);
  if (auth.substr(0, colon).empty() || auth == "[]") return "no host";
  if (colon == std::string::npos) return {};
  const std::string port = auth.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) == 0 ||
      std::stoul(port) > 65535) {
    return "port \"" + port + "\" is not a number from 1 to 65535";
  }
  return {};
}

// The largest watch message (or range answer) of one entry of max_entry_bytes: its key
// ("<prefix>/nodes/<16 hex digits>") and value base64-encoded, in the gateway's JSON (every field
// it sends at its longest is 497 bytes: 512). SIZE_MAX when that does not fit in a size_t.
static size_t one_entry_response_bytes(const discovery_config& cfg) {
  constexpr size_t kEnvelope = 512;
  const auto base64 = [](size_t n) { return (n / 3 + (n % 3 != 0 ? 1 : 0)) * 4; };
  if (cfg.max_entry_bytes > std::numeric_limits<size_t>::max() / 2) {
    return std::numeric_limits<size_t>::max();
  }
  return base64(cfg.max_entry_bytes) + base64(cfg.prefix.size() + 23) + kEnvelope;
}

errc validate(const discovery_config& cfg, std::string* detail) {
  const auto bad = [&](const std::string& d) {
    if (detail != nullptr) *detail = d;  // null: the code alone
    return errc::invalid_argument;
  };
  if (cfg.etcd_endpoints.empty()) return bad("etcd_endpoints: empty");
  for (size_t i = 0; i < cfg.etcd_endpoints.size(); ++i) {
    const std::string& u = cfg.etcd_endpoints[i];
    const std::string why = endpoint_problem(u);
    if (!why.empty()) {
      return bad("etcd_endpoints[" + std::to_string(i) + "] \"" + u.substr(0, 200) + "\": " + why);
    }
  }
  if (cfg.prefix.empty() || cfg.prefix.front() != '/' || cfg.prefix.back() == '/' ||
      cfg.prefix.size() > 256) {
    return bad("prefix \"" + cfg.prefix +
               "\": must start with '/', not end with '/', at most 256 bytes");
  }
  if (cfg.ttl_s < 2 || cfg.ttl_s > 3600) {
    return bad("ttl_s (" + std::to_string(cfg.ttl_s) + ") must be within 2..3600");
  }
  if (cfg.request_timeout_ms < 10) return bad("request_timeout_ms must be at least 10");
  if (cfg.retry_min_ms == 0 || cfg.retry_max_ms < cfg.retry_min_ms) {
    return bad("retry_min_ms must be > 0 and retry_max_ms >= retry_min_ms");
  }
  if (cfg.max_entries == 0) return bad("max_entries must be > 0");
  if (cfg.max_response_bytes < 4096) return bad("max_response_bytes must be at least 4096");
  if (cfg.max_entry_bytes < 256) return bad("max_entry_bytes must be at least 256");
  if (const size_t need = one_entry_response_bytes(cfg); cfg.max_response_bytes < need) {
    return bad("max_response_bytes " + std::to_string(cfg.max_response_bytes) +
               " cannot hold one watch message of an entry of max_entry_bytes " +
               std::to_string(cfg.max_entry_bytes) + ": at least " + std::to_string(need));
  }
  if (std::string why = detail::tls_problem(cfg); !why.empty()) return bad(why);
  if (cfg.etcd_username.empty() && !cfg.etcd_password.empty()) {
    return bad("etcd_password is set without etcd_username");
  }
  if (cfg.etcd_username.size() > 256 || cfg.etcd_password.size() > 1024) {
    return bad("etcd_username (at most 256 bytes) or etcd_password (at most 1024) is too long");
  }
  // JSON carries text only: anything else would reach etcd rewritten (U+FFFD), and every session
  // would fail "authentication failed" with no hint why.
  if (!detail::valid_utf8(cfg.etcd_username)) return bad("etcd_username is not valid UTF-8");
  if (!detail::valid_utf8(cfg.etcd_password)) return bad("etcd_password is not valid UTF-8");
  return errc::ok;
}

etcd_discovery::impl::impl(uv_loop_t* l, discovery_config c, discovery_callbacks cb)
    : loop(l), cfg(std::move(c)), cbs(std::make_shared<const discovery_callbacks>(std::move(cb))) {
  if (loop == nullptr) return;  // no timers: start() refuses, so nothing else runs
  for (uv_timer_t** t : {&ka_timer, &retry_timer, &watch_timer}) {
    *t = new uv_timer_t;
    uv_timer_init(loop, *t);
    (*t)->data = this;
  }
}

etcd_discovery::impl::~impl() {
  life.reset();
  http.reset();  // cancels every request without callbacks
  for (uv_timer_t* t : {ka_timer, retry_timer, watch_timer}) {
    if (t == nullptr) continue;  // a null loop's (none made)
    uv_timer_stop(t);
    uv_close(reinterpret_cast<uv_handle_t*>(t),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
  }
}

void etcd_discovery::impl::log(log_level lv, size_t kind, const std::string& msg) {
  if (!cbs->on_log) return;  // it must not destroy us (discovery.h)
  uint64_t suppressed = 0;
  if (!limiter.allow(kind, uv_now(loop), &suppressed)) return;
  std::string line = "discovery: " + msg;
  if (suppressed > 0) line += " (" + std::to_string(suppressed) + " similar lines left out)";
  cbs->on_log(lv, line);
}

bool etcd_discovery::impl::emit(directory_event ev, const directory_entry& e) {
  if (!cbs->on_directory) return true;
  const std::weak_ptr<char> alive = life;
  const std::shared_ptr<const discovery_callbacks> keep = cbs;  // it may destroy us
  keep->on_directory(ev, e);
  // Destroyed, or stop()ped: no further event of this batch (range read, watch message).
  return !alive.expired() && ph != phase::stopped;
}

bool etcd_discovery::impl::decode(const kv& item, directory_entry* out, std::string* why) {
  bus_id id = 0;
  if (!detail::etcd::id_from_key(cfg.prefix, item.key, &id) || id == 0) {
    *why = "key is not <prefix>/nodes/<16 lowercase hex digits>";
  } else if (item.value.size() > cfg.max_entry_bytes) {
    *why = "value of " + std::to_string(item.value.size()) + " bytes above max_entry_bytes";
  } else if (detail::etcd::decode_entry(item.value, out, why)) {
    if (out->id == id) return true;
    *why = "\"id\" differs from the key's id";
  }
  return false;
}

// A mod_revision of 0 (absent) is no version: such an item counts every time it is seen.
void etcd_discovery::impl::note_malformed(const kv& item, const std::string& why,
                                          const bad_map& was, bad_map* now) {
  const size_t h = std::hash<std::string>{}(item.key);
  const auto it = was.find(h);
  const bool known = item.mod_revision != 0 && it != was.end() && it->second == item.mod_revision;
  if (now->size() < kSkipMemory || now->count(h) != 0) (*now)[h] = item.mod_revision;
  if (known) return;
  ++st.malformed;
  std::string shown = item.key.substr(0, 120);
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  log(log_level::warn, kMalformed, "malformed entry \"" + shown + "\" skipped: " + why);
}

void etcd_discovery::impl::note_full(const kv& item, directory_entry e, const full_map& was,
                                     full_map* now) {
  const auto it = was.find(e.id);
  const bool known =
      item.mod_revision != 0 && it != was.end() && it->second.first == item.mod_revision;
  if (now->size() < std::min(cfg.max_entries, kSkipMemory) || now->count(e.id) != 0) {
    const bus_id id = e.id;
    (*now)[id] = {item.mod_revision, std::move(e)};
  }
  if (known) return;
  ++st.skipped_full;
  log(log_level::warn, kFull, "max_entries reached: entry skipped");
}

bool etcd_discovery::impl::apply_snapshot(const std::vector<kv>& kvs) {
  std::map<bus_id, directory_entry> next;
  bad_map bad;  // what this read skips: anything skipped before and gone now is forgotten
  full_map full;
  for (const kv& item : kvs) {
    directory_entry e;
    std::string why;
    if (!decode(item, &e, &why)) {
      note_malformed(item, why, bad_seen, &bad);
    } else if (next.size() >= cfg.max_entries) {
      note_full(item, std::move(e), full_seen, &full);
    } else {
      next.emplace(e.id, std::move(e));
    }
  }
  bad_seen.swap(bad);
  full_seen.swap(full);
  std::vector<std::pair<directory_event, directory_entry>> events;
  for (auto& [id, e] : dir) {
    if (next.find(id) == next.end()) events.emplace_back(directory_event::removed, std::move(e));
  }
  for (const auto& [id, e] : next) {
    auto it = dir.find(id);
    if (it == dir.end()) {
      events.emplace_back(directory_event::added, e);
    } else if (it->second != e) {
      events.emplace_back(directory_event::changed, e);
    }
  }
  dir.swap(next);
  ++st.resyncs;
  for (const auto& [ev, e] : events) {
    if (!emit(ev, e)) return false;
  }
  return true;
}

bool etcd_discovery::impl::apply_put(const kv& item) {
  directory_entry e;
  std::string why;
  if (!decode(item, &e, &why)) {
    note_malformed(item, why, bad_seen, &bad_seen);
    // The key's current value is not a valid entry: whatever was there before is gone.
    return remove_key(item.key);
  }
  bad_seen.erase(std::hash<std::string>{}(item.key));
  auto it = dir.find(e.id);
  if (it == dir.end()) {
    if (dir.size() >= cfg.max_entries) {
      note_full(item, std::move(e), full_seen, &full_seen);
      return true;
    }
    it = dir.emplace(e.id, std::move(e)).first;
    return emit(directory_event::added, it->second);
  }
  if (it->second == e) return true;
  it->second = std::move(e);
  return emit(directory_event::changed, it->second);
}

bool etcd_discovery::impl::apply_delete(const std::string& key) {
  bad_seen.erase(std::hash<std::string>{}(key));
  return remove_key(key);
}

bool etcd_discovery::impl::remove_key(const std::string& key) {
  bus_id id = 0;
  if (!detail::etcd::id_from_key(cfg.prefix, key, &id)) return true;
  full_seen.erase(id);
  auto it = dir.find(id);
  if (it == dir.end()) return true;
  const directory_entry e = std::move(it->second);
  dir.erase(it);
  return emit(directory_event::removed, e) && fill_room();
}

// Room freed: entries left out for want of it come in (lowest id first, as a range read takes
// them) without waiting for the next range read. full_seen is empty while there is room.
bool etcd_discovery::impl::fill_room() {
  while (dir.size() < cfg.max_entries && !full_seen.empty()) {
    auto first = full_seen.begin();
    auto it = dir.emplace(first->first, std::move(first->second.second)).first;
    full_seen.erase(first);
    if (!emit(directory_event::added, it->second)) return false;
  }
  return true;
}

// What keeps `e` from being read back by every instance, this one included ("" when nothing): a
// field beyond the decoder's limits (etcd_codec.h), or its value above max_entry_bytes.
static std::string entry_problem(const directory_entry& e, size_t max_entry_bytes) {
  const std::string value = detail::etcd::encode_entry(e);
  if (value.size() > max_entry_bytes) {
    return "its value of " + std::to_string(value.size()) + " bytes is above max_entry_bytes (" +
           std::to_string(max_entry_bytes) + ")";
  }
  directory_entry back;
  std::string why;
  return detail::etcd::decode_entry(value, &back, &why) ? std::string() : why;
}

// ---------------------------------------------------------------------- public wrappers --
etcd_discovery::etcd_discovery(uv_loop_t* loop, discovery_config cfg, discovery_callbacks cbs)
    : impl_(std::make_unique<impl>(loop, std::move(cfg), std::move(cbs))) {}

etcd_discovery::~etcd_discovery() = default;

std::string etcd_discovery::key_of(const std::string& prefix, bus_id id) {
  return detail::etcd::node_key(prefix, id);
}

errc etcd_discovery::start(const directory_entry& self) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "etcd_discovery::start");
  impl& d = *impl_;
  if (d.ph != impl::phase::idle) {
    d.err = {errc::wrong_state, "start(): started already"};
    return errc::wrong_state;
  }
  if (d.loop == nullptr) {
    d.err = {errc::invalid_argument, "start(): the loop is null"};
    return errc::invalid_argument;
  }
  std::string why;
  if (validate(d.cfg, &why) != errc::ok) {
    d.err = {errc::invalid_argument, why};
    return errc::invalid_argument;
  }
  if (self.id != 0) why = entry_problem(self, d.cfg.max_entry_bytes);
  if (!why.empty()) {
    d.err = {errc::invalid_argument, "start(): the entry: " + why};
    return errc::invalid_argument;
  }
  d.self = self;
  d.self.parent = 0;
  d.registering = self.id != 0;
  d.nodes_prefix = d.cfg.prefix + "/nodes/";
  d.self_key = detail::etcd::node_key(d.cfg.prefix, self.id);
  d.http = std::make_unique<detail::etcd_client>(
      d.loop, d.cfg.max_response_bytes,
      detail::etcd_tls{d.cfg.tls_ca_file, d.cfg.tls_cert_file, d.cfg.tls_key_file});
  d.begin_session();
  return errc::ok;
}

errc etcd_discovery::update_self(const directory_entry& self) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "etcd_discovery::update_self");
  impl& d = *impl_;
  if (d.ph == impl::phase::idle) {
    d.err = {errc::wrong_state, "update_self(): not started"};
    return errc::wrong_state;
  }
  if (!d.registering) {
    d.err = {errc::wrong_state,
             "update_self(): started with id 0 (watch only): nothing registered"};
    return errc::wrong_state;
  }
  if (self.id != d.self.id) {
    char ids[64];
    std::snprintf(ids, sizeof ids, "0x%" PRIx64 " differs from the registered 0x%" PRIx64, self.id,
                  d.self.id);
    d.err = {errc::invalid_argument, std::string("update_self(): id ") + ids};
    return errc::invalid_argument;
  }
  if (d.ph == impl::phase::stopped) {
    d.err = {errc::closed, "update_self(): stopped"};
    return errc::closed;
  }
  if (std::string why = entry_problem(self, d.cfg.max_entry_bytes); !why.empty()) {
    d.err = {errc::invalid_argument, "update_self(): the entry: " + why};
    return errc::invalid_argument;
  }
  d.self = self;
  d.self.parent = 0;
  if (d.lease != 0 && (d.ph == impl::phase::ranging || d.ph == impl::phase::watching)) {
    d.put_self();
  } else if (d.ph == impl::phase::putting) {
    d.self_dirty = true;
  }
  return errc::ok;
}

std::vector<directory_entry> etcd_discovery::directory() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "etcd_discovery::directory", {});
  std::vector<directory_entry> out;
  out.reserve(impl_->dir.size());
  for (const auto& [id, e] : impl_->dir) out.push_back(e);
  return out;
}

bool etcd_discovery::lookup(bus_id id, directory_entry* out) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "etcd_discovery::lookup", false);
  auto it = impl_->dir.find(id);
  if (it == impl_->dir.end()) return false;
  if (out != nullptr) *out = it->second;
  return true;
}

size_t etcd_discovery::size() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "etcd_discovery::size", 0);
  return impl_->dir.size();
}
bool etcd_discovery::connected() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "etcd_discovery::connected", false);
  return impl_->is_connected;
}
discovery_stats etcd_discovery::stats() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "etcd_discovery::stats", {});
  return impl_->st;
}
const error_info& etcd_discovery::last_error() const {
  static const error_info kWrongThread{errc::wrong_thread,
                                       "last_error(): called from a thread other than the loop's"};
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "etcd_discovery::last_error", kWrongThread);
  return impl_->err;
}

}  // namespace uvbus
