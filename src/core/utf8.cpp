// utf8_sequence (the length of a well-formed UTF-8 sequence), valid_utf8 and printable (a peer's
// text escaped).
#include "core/utf8.h"

#include <cstdio>

namespace uvbus::detail {

size_t utf8_sequence(const unsigned char* p, size_t n) noexcept {
  const unsigned char c = p[0];
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (n < len || p[1] < lo || p[1] > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (p[k] < 0x80 || p[k] > 0xbf) return 0;
  }
  return len;
}

std::string printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned char u = p[i];
    size_t keep = 0;  // the bytes kept as they are from p[i]
    if (u >= 0x80) {
      keep = utf8_sequence(p + i, s.size() - i);
      if (u == 0xc2 && keep == 2 && p[i + 1] < 0xa0) keep = 0;  // U+0080..U+009F: the C1 controls
    } else if (u >= 0x20 && u != 0x7f) {
      keep = 1;
    }
    if (keep > 0) {
      out.append(s, i, keep);
      i += keep;
      continue;
    }
    // One byte at a time: the bytes after one that starts no sequence are looked at on their own.
    char esc[8];
    std::snprintf(esc, sizeof esc, "\\x%02x", static_cast<unsigned>(u));
    out += esc;
    ++i;
  }
  return out;
}

bool valid_utf8(const std::string& s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t n = p[i] < 0x80 ? 1 : utf8_sequence(p + i, s.size() - i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace uvbus::detail
