// Request/reply: node::call() (a data message whose payload starts with a call block, flag_call),
// the handler's reply_handle and answers, call deadlines, and the delivery step that tells
// requests and answers apart from plain messages.
#include "bus/node_impl.h"

namespace uvbus {

namespace {
constexpr uint32_t kCallIndexBits = 32;
uint64_t make_call_id(uint32_t index, uint32_t gen) {
  return (uint64_t{gen} << kCallIndexBits) | index;
}
// The largest payload of a request or an answer: message_limit less the call block.
size_t payload_limit(const node_config& c) {
  return c.message_limit - std::min(c.message_limit, proto::kCallSize);
}
// message_too_large's detail: what `fn` was given, and the limit.
std::string too_large(const char* fn, size_t size, const node_config& c) {
  return std::string(fn) + ": " + std::to_string(size) + " bytes, at most message_limit - 13 (" +
         std::to_string(payload_limit(c)) + ")";
}

// The deadlines of calls that ended leave the heap only when they reach its front: behind a call
// still open (a long timeout, a handler that keeps its request) they piled up, one per call made.
// Once they outnumber the open calls the heap is rebuilt from the open ones (amortized O(1)).
void prune_call_deadlines(node::impl& n) {
  auto& d = n.call_deadlines;
  if (d.size() < 2 * n.calls_open + 64) return;
  d.erase(std::remove_if(d.begin(), d.end(),
                         [&n](const auto& e) { return n.find_call(e.second) == nullptr; }),
          d.end());
  std::make_heap(d.begin(), d.end(), std::greater<>());
}
}  // namespace

detail::call_slot* node::impl::find_call(uint64_t call_id) {
  const auto index = static_cast<uint32_t>(call_id & 0xffffffffU);
  const auto gen = static_cast<uint32_t>(call_id >> kCallIndexBits);
  if (index >= call_slots.size()) return nullptr;
  detail::call_slot& s = call_slots[index];
  return s.busy && s.gen == gen ? &s : nullptr;
}

errc node::impl::call(bus_id target, uint32_t type, const void* data, size_t size,
                      uint32_t timeout_ms, call_fn cb, const send_options& opt, uint64_t* call_id) {
  if (!cb || timeout_ms == 0 || (data == nullptr && size != 0)) {
    return fail(errc::invalid_argument, !cb               ? "node::call: the callback is empty"
                                        : timeout_ms == 0 ? "node::call: timeout_ms is 0"
                                                          : "node::call: null data, non-zero size");
  }
  if (size > payload_limit(cfg)) {
    return fail(errc::message_too_large, too_large("node::call", size, cfg));
  }
  if (state == run_state::running && calls_open >= cfg.max_outstanding_calls) {
    return fail(errc::queue_full, "node::call: max_outstanding_calls (" +
                                      std::to_string(cfg.max_outstanding_calls) + ") calls open");
  }
  // The slot this call will take (taken only once the request is accepted).
  const bool reuse = !call_free.empty();
  const uint32_t index = reuse ? call_free.back() : static_cast<uint32_t>(call_slots.size());
  // A new slot's generations start at a random point per incarnation: an answer meant for an
  // earlier process of this id (a late one, after a restart) must not match this one's call.
  // Generation 0 is skipped: slot 0's id would be 0, which the protocol refuses.
  uint32_t gen = (reuse ? call_slots[index].gen : static_cast<uint32_t>(incarnation >> 32)) + 1;
  if (gen == 0) gen = 1;
  const uint64_t id = make_call_id(index, gen);
  uint8_t block[proto::kCallSize];
  proto::encode_call({proto::call_kind::request, id, timeout_ms}, block);
  const const_buffer spans[2] = {{block, sizeof block}, {data, size}};
  send_options o = opt;
  o.require_response = true;  // next_hop mode: a refusal on the way still ends the call
  uint64_t message_id = 0;
  send_call_flag = proto::flag_call;
  const errc e = send_data(target, type, spans, 2, o, &message_id);
  send_call_flag = 0;
  if (e != errc::ok) return send_failed(e, target, size, &opt);
  if (reuse) {
    call_free.pop_back();
  } else {
    call_slots.emplace_back();
  }
  detail::call_slot& s = call_slots[index];
  s.gen = gen;
  s.busy = true;
  s.target = target;
  s.deadline_ms = now_ms() + timeout_ms;
  s.cb = std::move(cb);
  ++calls_open;
  ++counters.calls_started;
  call_by_message.set(message_id, id);
  prune_call_deadlines(*this);
  call_deadlines.emplace_back(s.deadline_ms, id);
  std::push_heap(call_deadlines.begin(), call_deadlines.end(), std::greater<>());
  arm_call_timer();
  if (call_id != nullptr) *call_id = id;
  return errc::ok;
}

errc node::impl::answer(reply_handle& h, proto::call_kind kind, uint32_t code, const void* data,
                        size_t size) {
  const char* fn = kind == proto::call_kind::reply ? "node::reply" : "node::reply_error";
  if (!h.valid()) {
    return fail(errc::invalid_argument,
                std::string(fn) + ": the handle is not a request, or it was answered already");
  }
  if (data == nullptr && size != 0) {
    return fail(errc::invalid_argument, std::string(fn) + ": null data, non-zero size");
  }
  if (size > payload_limit(cfg)) {
    return fail(errc::message_too_large, too_large(fn, size, cfg));
  }
  uint8_t block[proto::kCallSize];
  proto::encode_call({kind, h.call_id, code}, block);
  const const_buffer spans[2] = {{block, sizeof block}, {data, size}};
  send_options o;
  o.require_response = true;  // next_hop mode: the answer's report always comes (and is dropped)
  uint64_t message_id = 0;
  send_call_flag = proto::flag_call;
  const errc e = send_data(h.caller, h.type, spans, 2, o, &message_id);
  send_call_flag = 0;
  if (e != errc::ok) return send_failed(e, h.caller, size);
  // The answer has no report of its own: call_report() drops it (call id 0).
  call_by_message.set(message_id, 0);
  ++counters.answers_sent;
  h.call_id = 0;
  return e;
}

void node::impl::deliver(bus_id source, uint8_t flags, uint32_t type, const uint8_t* p, size_t n) {
  if ((flags & proto::flag_call) == 0) {
    fire(cbs.on_data, source, type, p, n);
    return;
  }
  // The callers counted it in data_received; only a request reaches on_data (an answer goes to
  // its call, a bad one nowhere).
  proto::call_block c;
  if (proto::parse_call(p, n, &c) != errc::ok) {
    --counters.data_received;
    ++counters.protocol_errors;
    if (!log_allowed(detail::peer_log::bad_call)) return;  // any peer can send these at will
    log(log_level::warn, "a call message from 0x%" PRIx64 " with a bad call block: dropped",
        source);
    return;
  }
  p += proto::kCallSize;
  n -= proto::kCallSize;
  if (c.kind == proto::call_kind::request) {
    ++counters.requests_received;
    const reply_handle h{source, c.call_id, type, c.code};
    const reply_handle* outer = incoming_req;
    incoming_req = &h;
    fire(cbs.on_data, source, type, p, n);
    incoming_req = outer;
    return;
  }
  --counters.data_received;
  const detail::call_slot* s = find_call(c.call_id);
  // Late (the call timed out), answered twice, or an answer from a node we did not call.
  if (s == nullptr || s->target != source) {
    ++counters.answers_ignored;
    return;
  }
  call_result r;
  r.status = c.kind == proto::call_kind::reply ? errc::ok : errc::remote_error;
  r.code = c.kind == proto::call_kind::reply ? 0 : c.code;
  r.data = p;
  r.size = n;
  finish_call(c.call_id, r);
}

call_fn node::impl::take_call(uint64_t call_id, errc status) {
  detail::call_slot* s = find_call(call_id);
  if (s == nullptr) return nullptr;
  call_fn cb = std::move(s->cb);
  s->busy = false;
  s->cb = nullptr;
  call_free.push_back(static_cast<uint32_t>(call_id & 0xffffffffU));
  --calls_open;
  if (status == errc::ok) {
    ++counters.calls_ok;
  } else {
    ++counters.calls_failed;
  }
  return cb;
}

void node::impl::finish_call(uint64_t call_id, const call_result& r) {
  if (!fan->any_calls.empty()) fan->any_calls.erase(call_id);  // a call_any()'s, ended here
  fire(take_call(call_id, r.status), r);                       // nothing for a call already ended
}

bool node::impl::call_report(uint64_t message_id, errc status) {
  if (call_by_message.empty()) return false;
  uint64_t id = 0;  // 0: an answer's report
  if (!call_by_message.erase(message_id, &id)) return false;
  // A request's own wait running out (timeout: response_timeout_ms next hop, delivery_timeout_ms
  // end to end) does not end its call: the call has its own deadline, and a handler that was held
  // up may still answer before it.
  if (id != 0 && status != errc::ok && status != errc::timeout && find_call(id) != nullptr) {
    // Reports are made inside the node's own loops and member functions (stop(), the flow timer's
    // walk over every flow, a pending queue being failed): the call ends now, its callback runs
    // from the loop, as on_report's do.
    deferred_call_fail.emplace_back(take_call(id, status), status);
    arm_idle();
  }
  return true;
}

void node::impl::arm_call_timer() {
  if (h == nullptr) return;
  while (!call_deadlines.empty() && find_call(call_deadlines.front().second) == nullptr) {
    std::pop_heap(call_deadlines.begin(), call_deadlines.end(), std::greater<>());
    call_deadlines.pop_back();
  }
  // The same timer ends broadcasts at their deadline (node_fanout.cpp).
  uint64_t at = detail::fan_next_deadline(*this);
  if (!call_deadlines.empty()) at = std::min(at, call_deadlines.front().first);
  if (at == UINT64_MAX) {
    uv_timer_stop(&h->calls);
    call_timer_at = 0;
    return;
  }
  if (call_timer_at == at) return;
  call_timer_at = at;
  const uint64_t now = now_ms();
  uv_timer_start(&h->calls, &impl::on_call_timer, at > now ? at - now : 0, 0);
}

void node::impl::on_call_timer(uv_timer_t* t) {
  auto* n = static_cast<impl*>(t->data);
  n->call_timer_at = 0;
  const uint64_t now = n->now_ms();
  while (!n->dead && !n->call_deadlines.empty() && n->call_deadlines.front().first <= now) {
    const uint64_t id = n->call_deadlines.front().second;
    std::pop_heap(n->call_deadlines.begin(), n->call_deadlines.end(), std::greater<>());
    n->call_deadlines.pop_back();
    if (n->find_call(id) == nullptr) continue;
    call_result r;
    r.status = errc::timeout;
    n->finish_call(id, r);  // may destroy the node: `dead` is checked before going on
  }
  if (n->dead) return;
  detail::fan_expire(*n, now);  // no callback here: the reports run from the loop
  n->arm_call_timer();
}

void node::impl::fail_calls_for_stop() {
  for (uint32_t i = 0; i < call_slots.size(); ++i) {
    detail::call_slot& s = call_slots[i];
    if (!s.busy) continue;
    deferred_call_fail.emplace_back(std::move(s.cb), errc::closed);
    s.busy = false;
    s.cb = nullptr;
    call_free.push_back(i);
    ++counters.calls_failed;
  }
  calls_open = 0;
  call_deadlines.clear();
  if (h != nullptr) uv_timer_stop(&h->calls);
  call_timer_at = 0;
  if (!deferred_call_fail.empty()) arm_idle();
}

void node::impl::run_deferred_calls() {
  if (deferred_call_fail.empty()) return;
  auto fails = std::move(deferred_call_fail);
  deferred_call_fail.clear();
  for (auto& [cb, why] : fails) {
    call_result r;
    r.status = why;
    fire(cb, r);
  }
}

// ------------------------------------------------------------------------- public wrappers --
errc node::call(bus_id target, uint32_t type, const void* data, size_t size, uint32_t timeout_ms,
                call_fn cb, const send_options& opt, uint64_t* call_id) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::call");
  return impl_->call(target, type, data, size, timeout_ms, std::move(cb), opt, call_id);
}

const reply_handle* node::incoming_request() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::incoming_request", nullptr);
  return impl_->incoming_req;
}

errc node::reply(reply_handle& h, const void* data, size_t size) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::reply");
  return impl_->answer(h, proto::call_kind::reply, 0, data, size);
}

errc node::reply_error(reply_handle& h, uint32_t code, const void* detail, size_t size) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::reply_error");
  return impl_->answer(h, proto::call_kind::error, code, detail, size);
}

}  // namespace uvbus
