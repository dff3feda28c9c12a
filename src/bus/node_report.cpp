// Bus node, delivery reports: the one report of each accepted send, deferred to the loop
// (defer_report, which sets delivery_report::end_to_end), and a stream channel's outcome for a
// message turned into it (channel_outcome; a require_response one waits for its acknowledgement).
#include "bus/node_impl.h"

namespace uvbus {

void node::impl::defer_report(uint64_t tag, bus_id target, errc status, bool e2e) {
  if (tag == 0) return;
  if (call_report(tag & ~kTagE2e, status)) return;  // a call's or an answer's: not on_report's
  if (status == errc::ok) {
    ++counters.reports_ok;
  } else {
    ++counters.reports_failed;
  }
  if (!cbs.on_report) return;
  // delivery_report::end_to_end (node.h): every report of a message sent under end-to-end delivery
  // or with require_response (kTagE2e), whatever path reports it (a send post() handed the loop
  // and the loop refused, a require_response message its link failed).
  e2e = e2e || (tag & kTagE2e) != 0 || cfg.delivery == delivery_mode::end_to_end;
  deferred_reports.push_back({tag & ~kTagE2e, target, status, e2e});
  arm_idle();
}

void node::impl::channel_outcome(uint64_t tag, bus_id target, errc status) {
  if (tag == 0) return;
  if ((tag & kTagE2e) == 0) {
    defer_report(tag, target, status, false);
    return;
  }
  // require_response: success waits for the ack; a failure is the report unless the message was
  // reported already (response timeout, stop).
  if (status == errc::ok) return;
  auto it = replies.find(tag & ~kTagE2e);
  if (it == replies.end() || it->second.cb) return;
  replies.erase(it);
  defer_report(tag, target, status, false);
}

bool node::impl::still_owed(uint64_t tag) const {
  return (tag & kTagE2e) == 0 || replies.count(tag & ~kTagE2e) != 0;
}

}  // namespace uvbus
