// uvbus top's per-link table: parses uvbus_peer_* samples and prints rates between two scrapes.
#include "top_links.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "bus/auth.h"  // uvbus::detail::printable

namespace uvbus_tool {
namespace {

std::string label(const std::string& line, const char* key) {
  const std::string k = std::string(key) + "=\"";
  const size_t at = line.find(k);
  if (at == std::string::npos) return "?";
  const size_t from = at + k.size(), to = line.find('"', from);
  return to == std::string::npos ? "?" : line.substr(from, to - from);
}

double rate(const links_map& a, const links_map& b, const std::string& link, const char* fam,
            double secs) {
  const auto lb = b.find(link);
  const auto fb = lb->second.find(fam);
  if (fb == lb->second.end() || secs <= 0) return 0;
  double before = 0;
  const auto la = a.find(link);
  if (la != a.end()) {
    const auto fa = la->second.find(fam);
    if (fa != la->second.end()) before = fa->second;
  }
  return fb->second >= before ? (fb->second - before) / secs : 0;
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

void print_links(const links_map& a, const links_map& b, double secs) {
  std::printf("%-28s %9s %11s %11s %9s %9s %11s %9s\n", "link (peer role channel)", "rtt_ms",
              "out B/s", "in B/s", "out f/s", "in f/s", "queue B", "refused/s");
  for (const auto& kv : b) {
    const std::string& l = kv.first;
    std::printf("%-28s %9.3f %11.1f %11.1f %9.1f %9.1f %11.0f %9.1f\n",
                uvbus::detail::printable(l).c_str(),  // label values: the endpoint's text
                level(kv.second, "rtt_seconds") * 1000.0, rate(a, b, l, "sent_bytes_total", secs),
                rate(a, b, l, "received_bytes_total", secs),
                rate(a, b, l, "sent_frames_total", secs),
                rate(a, b, l, "received_frames_total", secs), level(kv.second, "queue_bytes"),
                rate(a, b, l, "queue_refused_total", secs));
  }
}

}  // namespace uvbus_tool
