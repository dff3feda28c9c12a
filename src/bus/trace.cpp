// W3C trace context: validity and the traceparent text form (uvbus/trace.h).
#include "uvbus/trace.h"

#include <cstddef>

namespace uvbus {
namespace {

template <size_t N>
bool all_zero(const std::array<uint8_t, N>& a) {
  for (const uint8_t b : a) {
    if (b != 0) return false;
  }
  return true;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is not allowed in version 00
}

// Decodes 2 * n lower-case hex digits at s into out[0, n).
bool decode_hex(std::string_view s, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const int hi = hex_value(s[2 * i]);
    const int lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

void append_hex(const uint8_t* p, size_t n, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    out->push_back(kDigits[p[i] >> 4]);
    out->push_back(kDigits[p[i] & 15]);
  }
}

errc refuse(std::string* detail, const char* why) {
  if (detail != nullptr) *detail = std::string("traceparent: ") + why;
  return errc::invalid_argument;
}

}  // namespace

bool trace_context::valid() const noexcept {
  return !all_zero(trace_id) && !all_zero(span_id);
}

std::string to_traceparent(const trace_context& t) {
  std::string s = "00-";
  s.reserve(55);
  append_hex(t.trace_id.data(), t.trace_id.size(), &s);
  s.push_back('-');
  append_hex(t.span_id.data(), t.span_id.size(), &s);
  s.push_back('-');
  append_hex(&t.flags, 1, &s);
  return s;
}

errc parse_traceparent(std::string_view s, trace_context* out, std::string* detail) {
  if (out == nullptr) return refuse(detail, "out is null");
  if (s.size() != 55) return refuse(detail, "not 55 characters");
  if (s.substr(0, 3) != "00-" || s[35] != '-' || s[52] != '-') {
    return refuse(detail, "not of the form 00-<trace id>-<span id>-<flags>");
  }
  trace_context t;
  if (!decode_hex(s.substr(3, 32), t.trace_id.data(), 16)) {
    return refuse(detail, "trace id is not 32 lower-case hex digits");
  }
  if (!decode_hex(s.substr(36, 16), t.span_id.data(), 8)) {
    return refuse(detail, "span id is not 16 lower-case hex digits");
  }
  if (!decode_hex(s.substr(53, 2), &t.flags, 1))
    return refuse(detail, "flags are not 2 hex digits");
  if (all_zero(t.trace_id)) return refuse(detail, "trace id is all zero");
  if (all_zero(t.span_id)) return refuse(detail, "span id is all zero");
  *out = t;
  return errc::ok;
}

}  // namespace uvbus
