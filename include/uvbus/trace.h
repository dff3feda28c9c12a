// W3C trace context (https://www.w3.org/TR/trace-context/) as a bus message carries it: set
// send_options::trace on a send, read node::incoming_trace() inside on_data. Relays pass it on
// unchanged; a message sent without one carries zero extra bytes (docs/protocol.md "Trace
// context").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "uvbus/error.h"

namespace uvbus {

struct trace_context {
  std::array<uint8_t, 16> trace_id{};  // all zero is invalid
  std::array<uint8_t, 8> span_id{};  // the sender's span (the receiver's parent); all zero: invalid
  uint8_t flags = 0;                 // W3C trace-flags (bit 0: sampled)

  // Both ids non-zero, as W3C requires.
  [[nodiscard]] bool valid() const noexcept;
  friend bool operator==(const trace_context& a, const trace_context& b) noexcept {
    return a.trace_id == b.trace_id && a.span_id == b.span_id && a.flags == b.flags;
  }
  friend bool operator!=(const trace_context& a, const trace_context& b) noexcept {
    return !(a == b);
  }
};

// The traceparent header value: "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>".
[[nodiscard]] std::string to_traceparent(const trace_context& t);
// Parses a version-00 traceparent value (lower-case hex, exact lengths, non-zero ids) into *out.
// Errors: invalid_argument (with *detail naming the part that is wrong, if given); *out is only
// written on success.
[[nodiscard]] errc parse_traceparent(std::string_view s, trace_context* out,
                                     std::string* detail = nullptr);

}  // namespace uvbus
