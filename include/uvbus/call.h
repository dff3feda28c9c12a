// Request/reply value types: what node::call() hands its callback, and the handle a request's
// handler replies through (node::incoming_request(), node::reply(), node::reply_error()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "uvbus/error.h"
#include "uvbus/subnet.h"

namespace uvbus {

// The one outcome of a node::call().
struct call_result {
  // ok: the handler replied, [data, data + size) is the reply. remote_error: the handler answered
  // with node::reply_error(): `code` is its code and [data, data + size) its detail text. Anything
  // else says why no answer came: timeout (the call's own deadline passed: the request may or may
  // not have been handled; never before it, even when the request's acknowledgement takes longer
  // than response_timeout_ms or delivery_timeout_ms), unknown_route / ttl_expired /
  // message_too_large (a relay or the target refused the request: it was not handled),
  // version_mismatch (a link of the path speaks a protocol below version 5), access_denied (the
  // target keeps max_flow_sources flows and refused ours), queue_full / not_connected (under
  // next-hop delivery a relay acknowledges the request with its refusal: its queue towards the
  // target was full, or its link there was down — the request was not handled, call again;
  // likewise connection_reset / protocol_error / queue_full when this node's own link to the next
  // hop closed while the request waited in its queue: delivery_report's next-hop reasons),
  // not_connected also for call_any() (the node picked left the directory or restarted before
  // answering: it may have been handled), closed (the calling node stopped first).
  errc status = errc::ok;
  uint32_t code = 0;
  const uint8_t* data = nullptr;  // valid only during the callback: copy what you keep
  size_t size = 0;
};
// Runs exactly once per accepted call, on the loop thread, as a callback of the calling node
// (node_callbacks' rules: it may call any node function and may destroy the node); never inside
// node::call() itself, and not at all once the node is destroyed.
using call_fn = std::function<void(const call_result& result)>;

// A request being handled. node::incoming_request() gives it inside on_data; copy it to answer
// later (after on_data returned, from a later callback, or on a later loop turn). It names the
// caller and its call; it holds no resource, so dropping it without a reply is allowed (the caller
// times out). node::reply() / reply_error() clear it (call_id = 0), so one handle answers once; a
// second answer through another copy is ignored by the caller.
struct reply_handle {
  bus_id caller = 0;
  uint64_t call_id = 0;     // 0: not a request, or answered already
  uint32_t type = 0;        // the request's user type
  uint32_t timeout_ms = 0;  // the caller's timeout: an answer after it is no longer awaited
  [[nodiscard]] bool valid() const noexcept { return call_id != 0 && caller != 0; }
};

}  // namespace uvbus
