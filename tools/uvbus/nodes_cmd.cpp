// `uvbus nodes`: the bus directory as the parent sends it to the tool (every node of the bus with
// its name, type, parent, host, pid and labels), as a table or JSON.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "bus/auth.h"  // uvbus::detail::printable: a peer's words, one line each
#include "bus_cmd.h"
#include "common.h"

namespace uvbus_tool {

namespace {

std::string labels_text(const uvbus::directory_entry& e) {
  std::string s;
  for (const auto& [k, v] : e.labels) {
    if (!s.empty()) s += ',';
    s += uvbus::detail::printable(k);
    s += '=';
    s += uvbus::detail::printable(v);
  }
  return s.empty() ? "-" : s;
}

std::string entry_json(const uvbus::directory_entry& e) {
  char head[160];
  std::snprintf(head, sizeof head, "{\"id\":\"%#" PRIx64 "\",\"parent\":\"%#" PRIx64 "\",", e.id,
                e.parent);
  std::string o = head;
  o += "\"name\":" + json_str(e.name) + ",\"type\":" + json_str(e.type) +
       ",\"host\":" + json_str(e.hostname) + ",\"pid\":" + std::to_string(e.pid) +
       ",\"start_time_ms\":" + std::to_string(e.start_time_ms) +
       ",\"version\":" + std::to_string(e.protocol_version) +
       ",\"labels\":" + labels_object(e.labels);  // a key the node repeats: its first value
  o += ",\"listen\":[";
  for (size_t i = 0; i < e.listen.size(); ++i) o += (i ? "," : "") + json_str(e.listen[i]);
  return o + "]}";
}

}  // namespace

int nodes(const bus_args& a, session* s) {
  uvbus::directory_entry parent;
  // The parent sends its directory right after accepting the tool, itself first.
  if (!s->run_until([&] { return s->node().lookup(s->parent_id(), &parent); }, a.join.timeout_ms)) {
    std::fprintf(stderr,
                 "uvbus nodes: parent %#" PRIx64
                 " sent no directory (it speaks a protocol version below 5?)\n",
                 s->parent_id());
    return kExitFailed;
  }
  // The rest of the snapshot follows on the same connection: give it a moment to arrive (there is
  // no end marker; a large bus sends it in ~24 KiB messages back to back).
  s->run_until([] { return false; }, 100);
  const std::vector<uvbus::directory_entry> all = s->node().directory();
  if (a.json) {
    std::string o = "{\"nodes\":[";
    bool first = true;
    for (const auto& e : all) {
      if (e.id == s->node().id()) continue;  // the tool itself
      o += (first ? "" : ",") + entry_json(e);
      first = false;
    }
    std::printf("%s]}\n", o.c_str());
    return kExitOk;
  }
  std::printf("%-20s %-16s %-10s %-20s %-12s %-8s %s\n", "id", "name", "type", "parent", "host",
              "pid", "labels");
  for (const auto& e : all) {
    if (e.id == s->node().id()) continue;
    char id[24];
    char par[24];
    std::snprintf(id, sizeof id, "%#" PRIx64, e.id);
    std::snprintf(par, sizeof par, e.parent ? "%#" PRIx64 : "-", e.parent);
    // Each node's own words (name, type, host, labels): escaped, as every peer's text on stdout.
    const std::string name = uvbus::detail::printable(e.name),
                      type = uvbus::detail::printable(e.type);
    std::printf("%-20s %-16s %-10s %-20s %-12s %-8u %s\n", id, name.empty() ? "-" : name.c_str(),
                type.empty() ? "-" : type.c_str(), par,
                uvbus::detail::printable(e.hostname).c_str(), e.pid, labels_text(e).c_str());
  }
  return kExitOk;
}

}  // namespace uvbus_tool
