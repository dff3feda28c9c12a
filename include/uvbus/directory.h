// The bus directory: what a node knows about every node of its bus (not only its direct links),
// as node::directory() and node_callbacks::on_directory give it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "uvbus/subnet.h"

namespace uvbus {

using node_label = std::pair<std::string, std::string>;  // key, value

// One node of the bus, as it describes itself (node_config::name, type, labels) plus what the
// bus knows of it. Filled from registrations propagated up and down the tree (docs/bus.md
// "Directory").
struct directory_entry {
  bus_id id = 0;
  bus_id parent = 0;  // the node it is registered to; 0 for a root (or not registered yet)
  std::string name;   // node_config::name ("" if not set)
  std::string type;   // node_config::type ("gateway", "logic", ...; "" if not set)
  std::vector<node_label> labels;   // node_config::labels, in config order
  std::vector<std::string> listen;  // the URLs it accepts connections on (port 0 resolved)
  std::string host_id;              // equal host_id: same machine
  std::string hostname;
  uint32_t pid = 0;
  uint64_t start_time_ms = 0;    // when the node started, Unix time in ms
  uint8_t protocol_version = 0;  // the highest bus protocol version it speaks
  // The value of label `key`, or nullptr.
  [[nodiscard]] const std::string* label_value(const std::string& key) const {
    for (const auto& [k, v] : labels) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  // True when every pair of `want` is among the labels.
  [[nodiscard]] bool has_labels(const std::vector<node_label>& want) const {
    for (const auto& [k, v] : want) {
      const std::string* have = label_value(k);
      if (have == nullptr || *have != v) return false;
    }
    return true;
  }
  bool operator==(const directory_entry& o) const {
    return id == o.id && parent == o.parent && name == o.name && type == o.type &&
           labels == o.labels && listen == o.listen && host_id == o.host_id &&
           hostname == o.hostname && pid == o.pid && start_time_ms == o.start_time_ms &&
           protocol_version == o.protocol_version;
  }
  bool operator!=(const directory_entry& o) const { return !(*this == o); }
};

enum class directory_event : uint8_t {
  added,    // a node appeared (registered somewhere in the tree, or its subtree joined ours)
  changed,  // a known node re-registered with other fields (a restart: new pid, start time)
  removed,  // a node left (its link, or the link to its part of the tree, was lost)
};
const char* to_string(directory_event e) noexcept;

}  // namespace uvbus
