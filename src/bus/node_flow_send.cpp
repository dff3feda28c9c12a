// Bus node, a flow's sends: the source's retransmit buffer (tx_flow_for, flow_alloc), a
// message's first send (flow_send, as flow_reserve + flow_commit), and the in-place sends built on
// them (prepare_data, commit_data, cancel_data; outside a flow they use a buffer of the node's).
// One file so that the per-message steps inline into both callers.
#include "bus/node_impl.h"

// flow_reserve / flow_commit: inlined into flow_send, prepare_data and commit_data (called once
// per message; out of line they cost the send path about 40 instructions, benchmark/instr.sh).
#define UVBUS_FLOW_INLINE [[gnu::always_inline]] inline

namespace uvbus {

using detail::tx_entry;
using detail::tx_flow;
using proto::msg_type;

namespace {

constexpr size_t kFlowOverhead = proto::kHeaderSize + proto::kFlowPrefix;

}  // namespace

tx_flow& node::impl::tx_flow_lookup(bus_id target) {
  tx_flow& f = tx_flows[target];  // unordered_map: references stay valid across rehashing
  if (f.target == 0) {
    f.target = target;
    f.rto_ms = cfg.resend_timeout_ms;
    // Above every sequence of a flow forgotten before: its target may still hold that position.
    f.next_seq = f.next_unsent = flow_seq_floor;
    f.acked = f.high_sent = flow_seq_floor - 1;
  }
  cached_flow_target = target;
  cached_flow = &f;
  return f;
}

UVBUS_FLOW_INLINE uint8_t* node::impl::flow_alloc(tx_flow& f, size_t n, size_t* offset) {
  detail::byte_ring& r = f.store;
  const bool empty = f.entries.empty();
  if (empty) r.tail = 0;
  const size_t head = empty ? 0 : f.entries.front().offset;
  const bool wrapped = !empty && r.tail <= head;
  // Room at the tail: before the end of the buffer, or (wrapped) before the front message.
  const size_t room = wrapped ? head - r.tail : r.cap - r.tail;
  if (room >= n) {
    *offset = r.tail;
  } else if (!wrapped && !empty && head >= n) {
    *offset = 0;  // wrap: the bytes after the old tail wait until the front passes them
  } else {
    return flow_grow(f, n, offset);
  }
  r.tail = *offset + n;
  return r.buf.get() + *offset;
}

// Grows (or allocates) f's buffer and compacts its messages into the new one, in order.
uint8_t* node::impl::flow_grow(tx_flow& f, size_t n, size_t* offset) {
  detail::byte_ring& r = f.store;
  size_t cap = std::max(detail::kFlowStoreMin, r.cap * 2);
  while (cap < (f.bytes + n) * 2 && cap < cfg.retransmit_max_bytes) cap *= 2;
  cap = std::min(cap, cfg.retransmit_max_bytes);
  if (cap < f.bytes + n) return nullptr;
  std::unique_ptr<uint8_t[]> b(new uint8_t[cap]);
  size_t off = 0;
  for (size_t i = 0; i < f.entries.size(); ++i) {
    tx_entry& e = f.entries[i];
    std::memcpy(b.get() + off, r.buf.get() + e.offset, e.size);
    e.offset = off;
    off += e.size;
  }
  r.buf = std::move(b);
  r.cap = cap;
  *offset = off;
  r.tail = off + n;
  return r.buf.get() + off;
}

UVBUS_FLOW_INLINE uint8_t* node::impl::flow_reserve(tx_flow& f, uint32_t type, size_t size,
                                                    const send_options& opt, flow_slot* slot) {
  const size_t trace = opt.trace != nullptr ? proto::kTraceSize : 0;
  const size_t total = kFlowOverhead + trace + size;
  size_t off = 0;
  uint8_t* m =
      f.entries.size() < cfg.retransmit_max_messages ? flow_alloc(f, total, &off) : nullptr;
  if (m == nullptr) {
    if (!posting) f.user_blocked = true;  // on_writable(target) once acknowledgements drained it
    return nullptr;
  }
  proto::header hd = make_header(msg_type::data, f.target, f.next_seq);
  hd.flags = proto::flag_flow | send_call_flag;
  if (trace != 0) hd.flags |= proto::flag_trace;
  if (opt.ttl != 0) hd.ttl = opt.ttl;
  hd.body_len = static_cast<uint32_t>(trace + proto::kFlowPrefix + size);
  proto::encode_header(hd, m);
  if (trace != 0) proto::encode_trace(*opt.trace, m + proto::kHeaderSize);
  proto::encode_flow_prefix(type, incarnation, m + proto::kHeaderSize + trace);
  *slot = flow_slot{off, total};
  return m + kFlowOverhead + trace;
}

UVBUS_FLOW_INLINE errc node::impl::flow_commit(tx_flow& f, const flow_slot& slot,
                                               uint64_t message_id, bool* via_shm) {
  const size_t off = slot.offset;
  const size_t total = slot.size;
  uint8_t* m = f.store.buf.get() + off;
  // In order: while earlier messages wait to be (re)sent, this one waits behind them.
  if (f.next_unsent == f.next_seq) {
    // Flagged only as the flow's first unsettled message (see tx_flow::need_sync).
    const bool sync = f.need_sync && f.entries.empty();
    if (sync) m[2] |= proto::flag_sync;
    const errc e = flow_out(f.target, m, total, via_shm);
    if (e != errc::ok) {
      f.store.tail = off;  // not accepted: take the bytes back
      return e;
    }
    m[2] &= static_cast<uint8_t>(~proto::flag_sync);
    if (sync) f.need_sync = false;
    ++f.next_unsent;
  }
  if (f.entries.empty()) f.last_progress_ms = now_ms();
  f.entries.push_back(tx_entry{f.next_seq, message_id, off, static_cast<uint32_t>(total), false,
                               false, now_ms() + cfg.delivery_timeout_ms,
                               latency_sampled(f.next_seq) ? detail::mono_ns() : 0});
  const bool backlog = f.next_unsent < f.next_seq;
  ++f.next_seq;
  f.bytes += total;
  ++counters.flow_unacked_now;
  counters.flow_unacked_bytes += total;
  // Behind earlier messages that wait: try to move the line (a full queue retries on its timer).
  if (backlog && !f.blocked) flow_pump(f);
  return errc::ok;
}

errc node::impl::flow_send(bus_id target, uint32_t type, const const_buffer* spans, size_t count,
                           size_t size, const send_options& opt, uint64_t message_id,
                           bool* via_shm) {
  tx_flow& f = tx_flow_for(target);
  flow_slot slot;
  uint8_t* p = flow_reserve(f, type, size, opt, &slot);
  if (p == nullptr) return errc::queue_full;
  for (size_t i = 0; i < count; ++i) {
    if (spans[i].size != 0) std::memcpy(p, spans[i].data, spans[i].size);
    p += spans[i].size;
  }
  return flow_commit(f, slot, message_id, via_shm);
}

uint8_t* node::impl::prepare_data(bus_id target, uint32_t type, size_t size,
                                  const send_options& opt, errc* err) {
  errc e = errc::ok;
  if (state != run_state::running) {
    e = state == run_state::idle ? errc::wrong_state : errc::closed;
  } else if (prep.open) {
    e = errc::wrong_state;
  } else if (size > cfg.message_limit) {
    e = errc::message_too_large;
  } else if (target == 0 || (opt.trace != nullptr && !opt.trace->valid())) {
    e = errc::invalid_argument;  // id 0 is reserved (flow 0 would be "no flow yet")
  }
  uint8_t* p = nullptr;
  if (e == errc::ok) {
    prep.target = target;
    prep.type = type;
    prep.size = size;
    // Field by field: the caller has just written opt (often a temporary) with 1- and 8-byte
    // stores, and a 16-byte load of it would wait for them (store-to-load forwarding fails: the
    // node's sender over shm 80.8 -> 76.6 ns a message).
    static_assert(sizeof(send_options) == 16, "a new field of send_options is copied here too");
    prep.opt.require_response = opt.require_response;
    prep.opt.ttl = opt.ttl;
    prep.opt.trace = opt.trace;
    if (opt.trace != nullptr) {
      prep.trace = *opt.trace;
      prep.opt.trace = &prep.trace;
    }
    prep.flow = nullptr;
    if (target != self && cfg.delivery == delivery_mode::end_to_end) {
      detail::tx_flow& f = tx_flow_for(target);
      p = flow_reserve(f, type, size, prep.opt, &prep.slot);
      if (p != nullptr) prep.flow = &f;
      if (p == nullptr) e = errc::queue_full;
    } else {
      prep.buf.resize(std::max<size_t>(size, 1));
      p = prep.buf.data();
    }
  }
  if (p != nullptr) prep.open = true;
  if (err != nullptr) *err = e;
  return p;
}

errc node::impl::commit_data(uint64_t* message_id) {
  if (!prep.open) {
    if (state == run_state::running) {
      last_err = {errc::wrong_state, "commit_data() without an open prepare_data() reservation"};
      return errc::wrong_state;
    }
    return send_failed(state == run_state::idle ? errc::wrong_state : errc::closed, prep.target, 0);
  }
  prep.open = false;
  if (prep.flow == nullptr) {
    const const_buffer b{prep.buf.data(), prep.size};
    return send_data(prep.target, prep.type, &b, 1, prep.opt, message_id);
  }
  const uint64_t seq = take_seq();
  bool via_shm = false;
  const errc e = flow_commit(*prep.flow, prep.slot, seq, &via_shm);
  return flow_sent(e, via_shm, seq, message_id);
}

void node::impl::drop_prepared() {
  if (!prep.open) return;
  prep.open = false;
  if (prep.flow != nullptr) flow_unreserve(*prep.flow, prep.slot);
}

// ----------------------------------------------------------------------------- public API --
uint8_t* node::prepare_data(bus_id target, uint32_t type, size_t size, errc* err,
                            const send_options& opt) {
  if (!impl_->owner.here()) {
    detail::wrong_thread("node::prepare_data");
    if (err != nullptr) *err = errc::wrong_thread;
    return nullptr;
  }
  errc e = errc::ok;
  uint8_t* p = impl_->prepare_data(target, type, size, opt, &e);
  if (e != errc::ok) (void)impl_->send_failed(e, target, size, &opt);
  if (err != nullptr) *err = e;
  return p;
}

errc node::commit_data(uint64_t* message_id) {
  UVBUS_ON_OWNER_THREAD(impl_->owner, "node::commit_data");
  const bus_id target = impl_->prep.target;
  const size_t size = impl_->prep.size;
  const bool open = impl_->prep.open;
  const errc e = impl_->commit_data(message_id);
  return e == errc::ok || !open ? e : impl_->send_failed(e, target, size);
}

void node::cancel_data() {
  UVBUS_ON_OWNER_THREAD_OR(impl_->owner, "node::cancel_data", );
  impl_->drop_prepared();
}

}  // namespace uvbus
