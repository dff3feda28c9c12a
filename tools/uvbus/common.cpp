// The uvbus tool's shared helpers: JSON string escaping, number parsing, nearest-rank percentiles,
// stdout's write errors and SIGPIPE.
#include "common.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <sstream>
#include <unordered_set>

#include <fcntl.h>
#include <unistd.h>

#include "core/utf8.h"  // uvbus::detail::utf8_sequence

namespace uvbus_tool {

std::string json_str(const std::string& s) {
  std::string o = "\"";
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = p[i];
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
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
    } else if (c < 0x80) {
      o += static_cast<char>(c);
    } else if (const size_t len = uvbus::detail::utf8_sequence(p + i, s.size() - i)) {
      o.append(s, i, len);  // well-formed UTF-8 passes through
      i += len - 1;
    } else {
      // A byte that is not UTF-8 (a binary reply, a peer's name): JSON text must be UTF-8, and
      // python's json refused the whole document. It reads as U+FFFD, one per byte.
      o += "\\ufffd";
    }
  }
  return o + "\"";
}

// "a=b\n..." as a JSON object of numbers (or strings for what is not a JSON number).
std::string counters_json(const std::string& text) {
  std::istringstream in(text);
  std::string line, o = "{";
  bool first = true;
  std::unordered_set<std::string> seen;  // a name given again: its first value is kept
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (!seen.insert(k).second) continue;
    // Digits, no leading zero (JSON has none: a node's "007" made the document invalid).
    const bool num = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos &&
                     (v[0] != '0' || v.size() == 1);
    o += (first ? "" : ",") + json_str(k) + ":" + (num ? v : json_str(v));
    first = false;
  }
  return o + "}";
}

namespace {

// x with three decimals ("%.3f"), whatever its length (a rate of 1e300 is 304 characters).
std::string fixed3(double x) {
  const int n = std::snprintf(nullptr, 0, "%.3f", x);
  std::string o(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::snprintf(o.data(), o.size() + 1, "%.3f", x);
  return o;
}

}  // namespace

// Built as a string: each entry went through snprintf into 64 bytes, and a counter near
// UINT64_MAX at a rate that large was cut (the line was no JSON).
std::string top_json(uint64_t target, double seconds, const std::vector<top_counter>& counters) {
  char id[24];
  std::snprintf(id, sizeof id, "%#" PRIx64, target);
  std::string o = R"({"node":")";
  o.append(id).append(R"(","seconds":)").append(fixed3(seconds)).append(R"(,"counters":{)");
  bool first = true;
  for (const top_counter& c : counters) {
    o.append(first ? "" : ",").append(json_str(c.name)).append(R"(:{"value":)");
    o.append(std::to_string(c.value)).append(R"(,"per_second":)").append(fixed3(c.per_second));
    o += '}';
    first = false;
  }
  return o + "}}";
}

const std::vector<const char*>& counters_levels() {
  static const std::vector<const char*> levels = {
      "pending_now",  "flow_unacked_now", "flow_unacked_bytes",
      "flow_targets", "flow_sources",     "flow_buffer_bytes",
      "peers"};
  return levels;
}

bool is_counters_level(const std::string& name) {
  const auto& levels = counters_levels();
  return std::any_of(levels.begin(), levels.end(), [&](const char* l) { return name == l; });
}

std::string labels_object(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string o = "{";
  std::unordered_set<std::string> seen;  // a key given again: its first value is kept
  for (const auto& [k, v] : kv) {
    if (!seen.insert(k).second) continue;
    o += (seen.size() > 1 ? "," : "") + json_str(k) + ":" + json_str(v);
  }
  return o + "}";
}

bool is_json_number(const std::string& v) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < v.size() && v[i] >= '0' && v[i] <= '9') ++i;
    return i > from;
  };
  if (i < v.size() && v[i] == '-') ++i;
  if (i < v.size() && v[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < v.size() && v[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < v.size() && (v[i] == 'e' || v[i] == 'E')) {
    ++i;
    if (i < v.size() && (v[i] == '+' || v[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == v.size();
}

namespace {

// Digits only from the first character: strtoul would also take leading blanks, '+' and '-'.
bool starts_with_digit(const char* s) {
  return s != nullptr && *s >= '0' && *s <= '9';
}

}  // namespace

bool stdout_failed(const char* what) {
  if (std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return false;
  const int e = errno;
  // A reader that went (`uvbus top | head`) too: EPIPE, said as any other failed write.
  std::fprintf(stderr, "uvbus %s: cannot write the output: %s\n", what,
               e != 0 ? std::strerror(e) : "write error");
  return true;
}

void ignore_sigpipe() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  (void)sigaction(SIGPIPE, &ignore, nullptr);
}

void hold_std_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int n = open("/dev/null", O_RDONLY);  // the lowest free number: fd itself
    if (n >= 0 && n != fd) {
      dup2(n, fd);
      close(n);
    }
  }
}

bool parse_id(const char* s, uint64_t* out) {
  if (!starts_with_digit(s)) return false;
  errno = 0;
  char* end = nullptr;
  // Base 10 unless 0x: strtoull's base 0 read a leading zero as octal ("0100" was node 64).
  const int base = s[0] == '0' && (s[1] == 'x' || s[1] == 'X') ? 16 : 10;
  const unsigned long long v = std::strtoull(s, &end, base);
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
