// The uvbus tool's shared helpers: JSON string escaping, number parsing, nearest-rank percentiles.
#include "common.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace uvbus_tool {

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += ch;
    } else if (c == '\n') {
      o += "\\n";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c == '\r') {
      o += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += ch;  // UTF-8 passes through; other bytes >= 0x80 too (the caller's text)
    }
  }
  return o + "\"";
}

namespace {

// Digits only from the first character: strtoul would also take leading blanks, '+' and '-'.
bool starts_with_digit(const char* s) {
  return s != nullptr && *s >= '0' && *s <= '9';
}

}  // namespace

bool parse_id(const char* s, uint64_t* out) {
  if (!starts_with_digit(s)) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 0);
  if (errno != 0 || *end != '\0' || v == 0) return false;
  *out = v;
  return true;
}

bool parse_u32(const char* s, uint32_t* out) {
  if (!starts_with_digit(s)) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long v = std::strtoul(s, &end, 10);
  if (errno != 0 || *end != '\0' || v > 0xffffffffUL) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

double nearest_rank(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // p * size / 100 within a few ulps of an integer is that integer (99 * 100 / 100 is 99, not a
  // hair above it, which would be the next rank).
  double x = p * static_cast<double>(v.size()) / 100.0;
  const double whole = std::round(x);
  if (std::fabs(x - whole) <= 4 * std::numeric_limits<double>::epsilon() * x) x = whole;
  const double rank = std::ceil(x);
  if (!(rank >= 1)) return v.front();
  return rank >= static_cast<double>(v.size()) ? v.back() : v[static_cast<size_t>(rank) - 1];
}

}  // namespace uvbus_tool
