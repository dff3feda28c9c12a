// uvbus top's per-link table: parses uvbus_peer_* samples and prints rates between two scrapes.
#include "top_links.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/utf8.h"  // uvbus::detail::printable

namespace uvbus_tool {
namespace {

std::string label(const std::string& line, const char* key) {
  const std::string k = std::string(key) + "=\"";
  const size_t at = line.find(k);
  if (at == std::string::npos) return "?";
  const size_t from = at + k.size(), to = line.find('"', from);
  return to == std::string::npos ? "?" : line.substr(from, to - from);
}

// Per second between the scrapes, or NaN (shown "-") when there is none: the family is missing
// from b, or the link or the family was missing from a (a scrape that failed, a peer that moved
// out of peer="other" into its own series): its whole counter was taken as the increase, a
// billion bytes shown as 2e10 B/s over 50 ms.
double rate(const links_map& a, const links_map& b, const std::string& link, const char* fam,
            double secs) {
  constexpr double none = std::numeric_limits<double>::quiet_NaN();
  const auto lb = b.find(link);
  const auto fb = lb->second.find(fam);
  const auto la = a.find(link);
  if (fb == lb->second.end() || secs <= 0 || la == a.end()) return none;
  const auto fa = la->second.find(fam);
  if (fa == la->second.end()) return none;
  return fb->second >= fa->second ? (fb->second - fa->second) / secs : 0;
}

// A rate in a column `width` wide, one decimal, or "-" for none.
std::string cell(double v, int width) {
  char buf[400];  // the largest double in "%.1f": 310 characters
  if (std::isnan(v)) {
    std::snprintf(buf, sizeof buf, " %*s", width, "-");
  } else {
    std::snprintf(buf, sizeof buf, " %*.1f", width, v);
  }
  return buf;
}

double level(const std::map<std::string, double>& m, const char* fam) {
  const auto it = m.find(fam);
  return it == m.end() ? 0 : it->second;
}

}  // namespace

links_map parse_links(const std::string& text) {
  links_map m;
  std::istringstream in(text);
  std::string line;
  const std::string prefix = "uvbus_peer_";
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t brace = line.find('{'), close = line.rfind('}');
    if (brace == std::string::npos || close == std::string::npos) continue;
    const std::string fam = line.substr(prefix.size(), brace - prefix.size());
    const std::string link =
        label(line, "peer") + " " + label(line, "role") + " " + label(line, "channel");
    m[link][fam] = std::strtod(line.c_str() + close + 1, nullptr);
  }
  return m;
}

std::string links_table(const links_map& a, const links_map& b, double secs) {
  char buf[400];
  std::snprintf(buf, sizeof buf, "%-28s %9s %11s %11s %9s %9s %11s %9s\n",
                "link (peer role channel)", "rtt_ms", "out B/s", "in B/s", "out f/s", "in f/s",
                "queue B", "refused/s");
  std::string o = buf;
  for (const auto& kv : b) {
    const std::string& l = kv.first;
    std::string name = uvbus::detail::printable(l);            // label values: the endpoint's text
    if (name.size() < 28) name.append(28 - name.size(), ' ');  // any length, as "%-28s" gave
    std::snprintf(buf, sizeof buf, " %9.3f", level(kv.second, "rtt_seconds") * 1000.0);
    o += name + buf;
    o += cell(rate(a, b, l, "sent_bytes_total", secs), 11);
    o += cell(rate(a, b, l, "received_bytes_total", secs), 11);
    o += cell(rate(a, b, l, "sent_frames_total", secs), 9);
    o += cell(rate(a, b, l, "received_frames_total", secs), 9);
    std::snprintf(buf, sizeof buf, " %11.0f", level(kv.second, "queue_bytes"));
    o += buf;
    o += cell(rate(a, b, l, "queue_refused_total", secs), 9) + "\n";
  }
  return o;
}

void print_links(const links_map& a, const links_map& b, double secs) {
  std::fputs(links_table(a, b, secs).c_str(), stdout);
}

}  // namespace uvbus_tool
