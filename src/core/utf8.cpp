// utf8_sequence: the length of a well-formed UTF-8 sequence.
#include "core/utf8.h"

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

}  // namespace uvbus::detail
