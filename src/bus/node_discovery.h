// node_discovery.cpp's whole-directory reads of etcd_discovery (each a copy of every entry etcd
// lists), counted as a test seam: a node reads it when its parent rule may choose anew and when
// room frees for entries it left out, never per etcd event.
#pragma once

#include <cstdint>
#include <vector>

#include "uvbus/directory.h"

namespace uvbus {
class etcd_discovery;
}  // namespace uvbus

namespace uvbus::detail {

// d.directory(), counting the entries copied.
[[nodiscard]] std::vector<directory_entry> disc_directory(const etcd_discovery& d);
// The entries copied by disc_directory since the process started, by every node (tests).
[[nodiscard]] uint64_t disc_entries_copied() noexcept;

}  // namespace uvbus::detail
