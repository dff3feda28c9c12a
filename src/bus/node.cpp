// The bus node: the public node:: functions, config validation, start/stop and the small helpers
// every part uses (logging, deferred reports). See include/uvbus/node.h for the contracts and
// docs/bus.md for the design; node_impl.h says which file owns what.
#include "uvbus/node.h"

#include <chrono>

#include "bus/node_impl.h"

namespace uvbus {

using proto::msg_type;

const char* to_string(channel_kind k) noexcept {
  switch (k) {
    case channel_kind::none:
      return "none";
    case channel_kind::stream:
      return "stream";
    case channel_kind::shm:
      return "shm";
  }
  return "unknown";
}

const char* to_string(peer_role r) noexcept {
  switch (r) {
    case peer_role::parent:
      return "parent";
    case peer_role::child:
      return "child";
    case peer_role::sibling:
      return "sibling";
    case peer_role::tool:
      return "tool";
  }
  return "unknown";
}

// --------------------------------------------------------------------------------- helpers --
void node::impl::log(log_level lv, const char* fmt, ...) {
  if (dead || !cbs.on_log) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fire(cbs.on_log, lv, std::string(buf));
}

void node::impl::log_later(log_level lv, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  deferred_logs.emplace_back(lv, buf);
  arm_idle();
}

void node::impl::error(errc e, const std::string& what, detail::peer_log limit) {
  if (limit == detail::peer_log::none || log_allowed(limit))
    log(log_level::warn, "%s: %s", what.c_str(), to_string(e));
  fire(cbs.on_error, e, what);
}

void node::impl::arm_idle() {
  if (h != nullptr && !uv_is_active(reinterpret_cast<uv_handle_t*>(&h->idle))) {
    uv_idle_start(&h->idle, &impl::on_idle);
  }
}

endpoint_info node::impl::info_of(const peer_ep& p) const {
  endpoint_info e;
  e.id = p.id;
  e.role = role_of(p.kind);
  e.data_channel = p.shm ? channel_kind::shm : channel_kind::stream;
  e.info = p.info;
  e.rtt_ns = p.rtt_ns;
  return e;
}

proto::node_info node::impl::my_info() const {
  proto::node_info n;
  n.id = self;
  n.pid = static_cast<uint32_t>(getpid());
  n.host_id = host_id;
  n.hostname = hostname;
  n.subnets = cfg.subnets;
  n.listen = listen_urls;
  return n;
}

proto::header node::impl::make_header(msg_type t, bus_id target, uint64_t seq) const {
  proto::header hd;
  hd.type = t;
  hd.source = self;
  hd.target = target;
  hd.sequence = seq;
  hd.ttl = cfg.default_ttl;
  return hd;
}

errc node::impl::send_control(link* lk, proto::header hd, const std::vector<uint8_t>& body) {
  return send_control(lk, hd, body.data(), body.size());
}

// The header on the stack, the body a second part of the same frame: nothing allocated (a
// heartbeat goes out on every link every heartbeat_interval_ms).
errc node::impl::send_control(link* lk, proto::header hd, const uint8_t* body, size_t size) {
  uint8_t head[proto::kHeaderSize];
  hd.body_len = static_cast<uint32_t>(size);
  proto::encode_header(hd, head);
  const const_buffer parts[2] = {{head, sizeof head}, {body, size}};
  return streams->sendv(lk->conn, parts, size == 0 ? 1 : 2);
}

void node::impl::close_link(link* lk, errc why, disconnect_mode mode) {
  if (lk->state == link_state::closing) return;
  lk->state = link_state::closing;
  lk->deadline_ms = now_ms() + cfg.heartbeat_timeout_ms;  // a graceful close's limit (tick())
  if (lk->close_reason == errc::ok) lk->close_reason = why;
  (void)streams->disconnect(lk->conn, mode);
}

// ---------------------------------------------------------------------------- start / stop --
stream_config node::impl::link_stream_config() const {
  return detail::link_stream_config(cfg);
}

std::unique_ptr<stream_channel> node::impl::make_channel() {
  stream_callbacks scb;
  scb.on_accepted = [this](connection_id c) { s_accepted(c); };
  scb.on_connected = [this](connection_id c, errc status) { s_connected(c, status); };
  scb.on_disconnected = [this](connection_id c, errc reason) { s_disconnected(c, reason); };
  scb.on_received = [this](connection_id c, const uint8_t* d, size_t n) { s_received(c, d, n); };
  scb.on_written = [this](connection_id c, uint64_t through) { s_written(c, through); };
  scb.on_send_failed = [this](connection_id c, uint64_t first, uint64_t last, errc reason) {
    s_send_failed(c, first, last, reason);
  };
  scb.on_unsent = [this](connection_id c, const uint8_t* d, size_t n) { s_unsent(c, d, n); };
  scb.on_writable = [this](connection_id c) { s_writable(c); };
  scb.on_log = [this](log_level lv, const std::string& m) { log(lv, "stream: %s", m.c_str()); };
  return std::make_unique<stream_channel>(loop, link_stream_config(), std::move(scb));
}

errc node::impl::open_listeners(stream_channel* ch, std::unique_ptr<shm_reader>* rd,
                                std::vector<std::string>* urls) {
  for (size_t i = 0; i < cfg.listen.size(); ++i) {
    const std::string& u = cfg.listen[i];
    const std::string field = "node_config.listen[" + std::to_string(i) + "] \"" + u + "\": ";
    address a;
    (void)parse_address(u, &a);  // validated
    if (a.kind == scheme::shm) {
      *rd = std::make_unique<shm_reader>(shm_reader_callbacks{
          [this](const shm_record* recs, size_t count) { on_shm_records(this, recs, count); },
          [this](log_level lv, const std::string& m) { log(lv, "shm: %s", m.c_str()); }});
      const errc e = (*rd)->open(a, detail::ring_config(cfg));
      if (e != errc::ok) {
        return refuse_call(e, field + "opening the ring failed: " + (*rd)->last_error().detail);
      }
      shm_url = a.to_string();
      urls->push_back(shm_url);
      continue;
    }
    listener_id l;
    const errc e = open_stream_listener(ch, u, i, &l);
    if (e != errc::ok) return e;
    stream_listeners.emplace_back(u, l);
    urls->push_back(ch->listener_url(l));
  }
  if (*rd) {
    const errc e = (*rd)->start(loop);
    if (e != errc::ok) {
      return refuse_call(e, "node_config.listen \"" + shm_url +
                                "\": starting the ring reader failed: " + to_string(e));
    }
  }
  return errc::ok;
}

void node::impl::open_handles() {
  if (h != nullptr) return;
  h = new handles;
  h->tick.data = h->reconnect.data = h->idle.data = h->post.data = this;
  h->acks.data = h->flow.data = h->calls.data = h->ring.data = this;
  uv_check_init(loop, &h->acks);
  uv_timer_init(loop, &h->flow);
  uv_timer_init(loop, &h->calls);
  uv_timer_init(loop, &h->tick);
  uv_timer_init(loop, &h->reconnect);
  uv_idle_init(loop, &h->idle);
  uv_timer_init(loop, &h->ring);
  uv_async_init(loop, &h->post, &impl::on_post_async);
  // The mailbox's wake-up never keeps the loop alive by itself: a running node has its timers, and
  // a stopped node must let uv_run() return (close_mailbox() refs it while reports remain).
  uv_unref(reinterpret_cast<uv_handle_t*>(&h->post));
  h->open = 8;
  std::scoped_lock lock(mbox.mu);
  mbox.async = &h->post;
}

void node::impl::start_timers() {
  uint64_t period =
      std::min({cfg.heartbeat_interval_ms, cfg.heartbeat_timeout_ms, cfg.handshake_timeout_ms,
                cfg.pending_timeout_ms, cfg.response_timeout_ms}) /
      4;
  period = std::clamp<uint64_t>(period, 5, 250);
  uv_timer_start(&h->tick, &impl::on_tick, period, period);
}

errc node::impl::refuse_call(errc e, std::string detail) {
  // Callbacks never run inside a member function: the log line goes out from the loop.
  if (cbs.on_log && h != nullptr) {
    deferred_logs.emplace_back(log_level::error, detail);
    arm_idle();
  }
  return fail(e, std::move(detail));
}

errc node::impl::start() {
  if (state != run_state::idle) {
    return refuse_call(errc::wrong_state, state == run_state::running
                                              ? "node::start: already started"
                                              : "node::start: a stopped node can not start again");
  }
  // The loop's cached clock may be old (the process blocked since the loop last ran: in
  // handover_receive(), or retrying start() while the old process held the port). What start()
  // stamps — child_grace_ms's start, the inherited positions' last word — counts from now.
  uv_update_time(loop);
  // The handles first: a refusal is logged from the loop through the idle handle.
  open_handles();
  struct inherited_guard {  // the inherited sockets not adopted are closed on every return
    impl* n;
    ~inherited_guard() { n->close_inherited(); }
  } guard{this};
  std::string why;
  const errc v = node::validate(self, cfg, &why);
  if (v != errc::ok) return refuse_call(v, "node::start: " + why);
  flow_positions_import();
  if (const errc me = start_metrics(); me != errc::ok) return me;
  host_id = cfg.host_id.empty() ? detail::host_identity() : cfg.host_id;
  hostname = detail::host_name();

  std::unique_ptr<stream_channel> ch = make_channel();
  std::vector<std::string> urls;
  std::unique_ptr<shm_reader> rd;
  errc e = open_listeners(ch.get(), &rd, &urls);
  if (e == errc::ok) {
    listen_urls = std::move(urls);  // the directory entry discovery registers carries them
    start_unix_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count());
    e = disc_start();  // node_discovery.cpp: may choose parent_urls
  }
  if (e != errc::ok) {
    listen_urls.clear();
    start_unix_ms = 0;
    stop_metrics();
    stream_listeners.clear();
    ch.reset();
    // A ring reattached with a predecessor's records stays for the next attempt.
    if (rd) {
      rd->close(rd->reattached() || cfg.keep_shm_inbox ? shm_close_mode::keep
                                                       : shm_close_mode::remove);
    }
    shm_url.clear();
    return e;
  }
  streams = std::move(ch);
  reader = std::move(rd);
  start_timers();

  state = run_state::running;
  started_ms = now_ms();
  {
    std::scoped_lock lock(mbox.mu);
    mbox.st = detail::mailbox::status::open;
  }
  if (cfg.parent_urls.empty() && disc_parent_wanted) {
    // up once discovery names a parent
  } else if (cfg.parent_urls.empty()) {
    is_up = true;
    deferred_up = true;
    arm_idle();
  } else {
    // From the loop, not inside start(): a connect that fails at once reports on_registration
    // (and logs), and callbacks never run inside the node's own member functions.
    reconnect_armed = true;
    uv_timer_start(
        &h->reconnect,
        [](uv_timer_t* t) {
          auto* self = static_cast<impl*>(t->data);
          self->reconnect_armed = false;
          self->connect_parent();
        },
        0, 0);
  }
  return errc::ok;
}

void node::impl::stop() {
  if (state != run_state::running) return;
  drop_prepared();
  state = run_state::stopping;
  disc_stop();
  close_mailbox(detail::mailbox::status::stopped);
  fail_queue(&parent_pending, errc::closed);
  for (auto& [id, s] : siblings) fail_queue(&s.pending, errc::closed);
  siblings.clear();
  fail_calls_for_stop();
  detail::fan_stop(*this);
  std::vector<std::pair<uint64_t, pending_reply>> rs(replies.begin(), replies.end());
  replies.clear();
  for (auto& [seq, r] : rs) {
    if (r.cb) {
      command_cb cb = std::move(r.cb);
      deferred_cmd_fail.push_back(std::move(cb));
    } else {
      defer_report(r.report_tag, r.target, errc::closed, true);
    }
  }
  uv_timer_stop(&h->reconnect);
  // End-to-end messages not acknowledged yet get stop_flush_ms to be: the links stay open (and
  // the ring keeps being read: acknowledgements may come through it) until then. Not without a
  // registered link: no acknowledgement could come.
  if (counters.flow_unacked_now != 0 && cfg.stop_flush_ms != 0 && any_registered_link()) {
    stop_flush_until = now_ms() + cfg.stop_flush_ms;
    return;
  }
  close_links_for_stop();
}

void node::impl::close_links_for_stop() {
  stop_flush_until = 0;
  // What was delivered here is acknowledged before the links close (stop() from on_data: flow
  // acknowledgements wait for the end of the loop turn, a next-hop one for on_data to return):
  // its sources would resend it, and report timeout for messages this node got.
  flush_acks();
  if (owed_ack != nullptr) {  // a next-hop require_response message on_data is handling
    const proto::header* hd = std::exchange(owed_ack, nullptr);
    send_ack(hd->source, hd->sequence, proto::reason::ok);
  }
  stop_metrics();
  flows_stop();
  drop_relayed_for_stop();  // while the sources' links still take a notice
  for (auto& [id, lk] : links) {
    if (lk->state == link_state::registered) {
      std::vector<uint8_t> b;
      proto::encode_bye({proto::reason::closing}, &b);
      (void)send_control(lk.get(), make_header(msg_type::bye, lk->peer->id, 0), b);
    }
    if (lk->state != link_state::closing) {
      lk->state = link_state::closing;
      lk->deadline_ms = now_ms() + cfg.heartbeat_timeout_ms;
      if (lk->close_reason == errc::ok) lk->close_reason = errc::closed;
      (void)streams->disconnect(lk->conn, disconnect_mode::graceful);
    }
  }
  // Only stop the reader here: stop() may be called from on_data inside the ring's callback,
  // where closing the ring is not allowed. finish_stop() (from the loop) closes and removes it.
  if (reader) reader->stop();
  maybe_finish_stop();
}

void node::impl::maybe_finish_stop() {
  if (state != run_state::stopping || !links.empty()) return;
  // Every link is gone while flows waited for acknowledgements: none can come any more.
  if (stop_flush_until != 0) {
    close_links_for_stop();  // reports them closed and comes back here
    return;
  }
  if (disc_stopping) return;  // disc_stop()'s callback comes back here
  stop_done_pending = true;
  arm_idle();
}

void node::impl::finish_stop() {
  if (state != run_state::stopping) return;
  state = run_state::stopped;
  is_up = false;
  if (reader) reader->close(cfg.keep_shm_inbox ? shm_close_mode::keep : shm_close_mode::remove);
  for (auto& [id, p] : peers) {
    if (p->shm) p->shm->close();
  }
  streams->close();
  uv_timer_stop(&h->tick);
  uv_timer_stop(&h->flow);
  uv_check_stop(&h->acks);
  auto cmds = std::move(deferred_cmd_fail);
  deferred_cmd_fail.clear();
  for (auto& cb : cmds) fire(cb, errc::closed, nullptr, size_t{0});
  // Each accepted call and broadcast has its one outcome before on_down (run_deferred() waited
  // for them; this is for any a callback just above left).
  run_deferred_calls();
  detail::fan_run_deferred(*this);
  fire(cbs.on_down, errc::closed);
}

void node::impl::on_handle_closed(uv_handle_t* hd) {
  auto* hs = static_cast<handles*>(hd->data);
  if (--hs->open == 0) delete hs;
}

void node::impl::destroy() {
  // No thread may wake the async handle once it is closing; what was posted is dropped unreported.
  close_mailbox(detail::mailbox::status::gone);
  if (h != nullptr) {
    h->tick.data = h->reconnect.data = h->idle.data = h->post.data = h;
    h->acks.data = h->flow.data = h->calls.data = h->ring.data = h;
    uv_close(reinterpret_cast<uv_handle_t*>(&h->calls), &impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&h->acks), &impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&h->flow), &impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&h->post), &impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&h->tick), &impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&h->reconnect), &impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&h->idle), &impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&h->ring), &impl::on_handle_closed);
    h = nullptr;
  }
  if (reader) reader->close(cfg.keep_shm_inbox ? shm_close_mode::keep : shm_close_mode::remove);
  disc.reset();  // without a revoke: the entry leaves with its lease, as after a crash
  peers.clear();
  // The channel's destructor closes everything without callbacks.
  streams.reset();
  forget_link();
  links.clear();
}

void node::impl::on_idle(uv_idle_t* t) {
  auto* n = static_cast<impl*>(t->data);
  if (!n->dead) n->run_deferred();
  // Destroyed from inside a callback (this one or an earlier one): the stack has unwound to the
  // loop, outside every channel callback, so everything can be released now.
  if (n->dead) {
    n->destroy();
    delete n;
  }
}

errc node::impl::send_failed(errc e, bus_id target, size_t size, const send_options* opt) {
  char id[24];
  std::snprintf(id, sizeof id, "0x%" PRIx64, target);
  last_err.code = e;
  switch (e) {
    case errc::message_too_large:
      last_err.detail = std::to_string(size) + " bytes is above node_config.message_limit (" +
                        std::to_string(cfg.message_limit) + ")";
      break;
    case errc::unknown_route:
      last_err.detail = std::string("no route to ") + id +
                        (table.owns(target) ? ": inside our subnets, no such child registered"
                                            : ": outside our subnets and this node has no parent");
      break;
    case errc::wrong_state:
      last_err.detail = prep.open ? "a prepare_data() reservation is open: commit_data() or "
                                    "cancel_data() first"
                                  : "the node is not started";
      break;
    case errc::closed:
      last_err.detail = "the node is stopped";
      break;
    case errc::access_denied:
    case errc::out_of_subnet:
    case errc::version_mismatch:
      // A link below the version the message needs refuses it too (node_delivery.cpp).
      last_err.detail =
          parent_failed && e == parent_refusal
              ? std::string("the parent refused this node for good: ") + to_string(e)
              : std::string("the link toward ") + id +
                    " negotiated a protocol version below what this message needs (end-to-end "
                    "flows: 3, calls: 5)";
      break;
    case errc::invalid_argument:
      last_err.detail = target == 0 ? "bus id 0 is reserved: it is no node's id, not a target"
                        : opt != nullptr && opt->trace != nullptr && !opt->trace->valid()
                            ? "send_options::trace: a zero trace id or span id (W3C: invalid)"
                            : "a null buffer with a non-zero size, or more than 64 buffers";
      break;
    default:
      last_err.detail.clear();  // retriable states: no allocation on a back-pressure path
      break;
  }
  return e;
}

errc node::impl::fail(errc e, std::string detail) {
  last_err.code = e;
  last_err.detail = std::move(detail);
  return e;
}

// ------------------------------------------------------------------------------------ node --
node::node(uv_loop_t* loop, bus_id id, node_config cfg, node_callbacks cbs)
    : impl_(new impl(loop, id, std::move(cfg), std::move(cbs))) {}

node::~node() {
  // Destroying from another thread is a caller bug that cannot be refused: debug builds abort.
  if (!impl_->owner.here()) detail::wrong_thread("node::~node");
  if (impl_->cb_depth > 0) {
    impl_->dead = true;
    impl_->arm_idle();
    return;
  }
  impl_->destroy();
  delete impl_;
}

errc node::start() {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::start");
  // Nothing is opened on a null loop (no handle, no log line: the refusal is last_error() only),
  // and the inherited sockets, which start() owns from its call on, are closed.
  if (impl_->loop == nullptr && impl_->state == impl::run_state::idle) {
    impl_->close_inherited();
    return impl_->fail(errc::invalid_argument, "node::start: the loop is null");
  }
  return impl_->start();
}

void node::stop() {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::stop", );
  impl_->stop();
}

bool node::running() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::running", false);
  return impl_->state == impl::run_state::running;
}

bool node::up() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::up", false);
  return impl_->is_up;
}

errc node::set_callbacks(node_callbacks cbs) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::set_callbacks");
  if (impl_->state == impl::run_state::running &&
      static_cast<bool>(cbs.on_report) != static_cast<bool>(impl_->cbs.on_report)) {
    return impl_->fail(errc::wrong_state,
                       "node::set_callbacks: on_report can not be set or cleared while running");
  }
  if (impl_->cb_depth > 0) {
    impl_->next_cbs = std::make_unique<node_callbacks>(std::move(cbs));
  } else {
    impl_->cbs = std::move(cbs);
  }
  return errc::ok;
}

errc node::send_data(bus_id target, uint32_t type, const void* data, size_t size,
                     const send_options& opt, uint64_t* message_id) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::send_data");
  if (data == nullptr && size != 0) return impl_->send_failed(errc::invalid_argument, target, 0);
  const const_buffer b{data, size};
  const errc e = impl_->send_data(target, type, &b, 1, opt, message_id);
  return e == errc::ok ? e : impl_->send_failed(e, target, size, &opt);
}

errc node::send_datav(bus_id target, uint32_t type, const const_buffer* bufs, size_t count,
                      const send_options& opt, uint64_t* message_id) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::send_datav");
  const errc e = impl_->send_data(target, type, bufs, count, opt, message_id);
  if (e == errc::ok) return e;
  size_t size = 0;
  for (size_t i = 0; bufs != nullptr && i < count && i < detail::kMaxSpans; ++i) {
    size += bufs[i].size;
  }
  return impl_->send_failed(e, target, size, &opt);
}

errc node::post(bus_id target, uint32_t type, const void* data, size_t size,
                const send_options& opt, uint64_t* message_id) {
  // Any thread: no owner check. Bus id 0 is reserved (refused here, not later on the loop).
  if (target == 0 || (data == nullptr && size != 0)) return errc::invalid_argument;
  if (opt.trace != nullptr && !opt.trace->valid()) return errc::invalid_argument;
  return impl_->post_message(target, type, data, size, opt, message_id);
}

errc node::post(std::function<void()> task) {
  if (!task) return errc::invalid_argument;
  return impl_->post_task(std::move(task));
}

errc node::send_command(bus_id target, proto::command_id command, const void* args, size_t size,
                        command_cb cb) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::send_command");
  if (!cb) return impl_->fail(errc::invalid_argument, "node::send_command: the callback is empty");
  if (args == nullptr && size != 0) {
    return impl_->fail(errc::invalid_argument, "node::send_command: null args, non-zero size");
  }
  // A prepare_data() reservation is open: nothing else is sent (send_failed() names it).
  if (impl_->prep.open) return impl_->send_failed(errc::wrong_state, target, size);
  const errc e = impl_->send_command(target, command, args, size, std::move(cb));
  return e == errc::ok ? e : impl_->send_failed(e, target, size);
}

// id() and config() return what never changes after construction; they are checked like the
// rest (a foreign-thread call is a bug elsewhere too) but return the value in release builds.
bus_id node::id() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::id", impl_->self);
  return impl_->self;
}

std::vector<std::string> node::listen_urls() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::listen_urls", {});
  return impl_->listen_urls;
}

std::vector<endpoint_info> node::peers() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::peers", {});
  std::vector<endpoint_info> v;
  v.reserve(impl_->peers.size());
  for (const auto& [id, p] : impl_->peers) v.push_back(impl_->info_of(*p));
  return v;
}

bool node::peer(bus_id id, endpoint_info* out) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::peer", false);
  auto it = impl_->peers.find(id);
  if (it == impl_->peers.end()) return false;
  if (out != nullptr) *out = impl_->info_of(*it->second);  // null: only whether it is there
  return true;
}

node_counters node::counters() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::counters", {});
  return impl_->counters_now();
}

std::string node::routes_text() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::routes_text", {});
  return impl_->routes();
}

const node_config& node::config() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::config", impl_->cfg);
  return impl_->cfg;
}

errc node::detach_listeners(std::vector<inherited_listener>* out) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::detach_listeners");
  return impl_->detach_listeners(out);
}

std::string node::metrics_text() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::metrics_text", {});
  return impl_->metrics_text();
}

bool node::latency_to(bus_id target, latency_percentiles* out) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::latency_to", false);
  return out != nullptr && impl_->latency_to(target, out);
}

bool node::latency_of_type(uint32_t type, latency_percentiles* out) const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::latency_of_type", false);
  return out != nullptr && impl_->latency_of_type(type, out);
}

std::string node::metrics_url() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::metrics_url", {});
  return impl_->metrics_http ? impl_->metrics_http->url() : std::string();
}

const trace_context* node::incoming_trace() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::incoming_trace", nullptr);
  return impl_->incoming;
}

std::vector<uint8_t> node::flow_positions() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::flow_positions", {});
  return impl_->flow_positions_export();
}

error_info node::last_error() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::last_error", (error_info{errc::wrong_thread, {}}));
  return impl_->last_err;
}

}  // namespace uvbus
