// The uvbus tool's bus subcommands' shared command line (options and positional arguments).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "session.h"

namespace uvbus_tool {

struct bus_args {
  std::string name;  // the subcommand
  join_options join;
  bool token_given = false;  // --token, even empty (no token: UVBUS_TOKEN is not read)
  bool json = false;
  bool once = false;
  uint32_t count = 0;
  uint32_t interval_ms = 0;
  bool interval_given = false;  // --interval-ms was on the command line (top refuses 0)
  std::string metrics;          // top --metrics URL
  std::vector<std::string> pos;
};

// Options (--parent --token --id --timeout-ms --json --once --count --interval-ms --metrics) and
// positional arguments, with UVBUS_PARENT / UVBUS_TOKEN / UVBUS_TOOL_ID filled in. kExitOk or
// kExitUsage (message printed; an option given twice is one).
int parse_bus_args(int argc, char** argv, bus_args* a);

int top_main(int argc, char** argv);
// `uvbus nodes` on a joined session (nodes_cmd.cpp).
int nodes(const bus_args& a, session* s);

}  // namespace uvbus_tool
