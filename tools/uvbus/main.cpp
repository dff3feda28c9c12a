// uvbus: the command-line tool's entry point — subcommand dispatch and every help text.
#include <cstdio>
#include <cstring>
#include <string>

#include "bus_cmd.h"
#include "common.h"

namespace {

const char kMain[] =
    "usage: uvbus SUBCOMMAND [ARGS] [--json]      (uvbus SUBCOMMAND --help for details)\n"
    "  routes ID              the routes node ID knows (the routes command)\n"
    "  counters ID            node ID's counters (the counters command)\n"
    "  ping ID                round-trip times of echo commands: a series and a summary\n"
    "  send ID TYPE PAYLOAD   send one message (PAYLOAD text, or @FILE) and wait for its report\n"
    "  nodes                  the bus directory: every node, its name, type, parent, labels\n"
    "  top ID                 a refreshing table of node ID's counters and rates\n"
    "  metrics URL            fetch a node's metrics endpoint (Prometheus text, or --json)\n"
    "  shm inspect|drain|remove URL   a local shared-memory region (uvbus_shm_inspect)\n"
    "  call ID TYPE PAYLOAD   a request (node::call): prints the reply, or the error answer\n"
    "Bus subcommands join the bus as a node under a parent:\n"
    "  --parent URL (or UVBUS_PARENT)   the parent's stream URL, e.g. ipv4://127.0.0.1:17000\n"
    "  --token T (or UVBUS_TOKEN)       the bus's access token (none: no proof sent)\n"
    "  --id ID (or UVBUS_TOOL_ID)       the tool's own node id, outside the parent's subnets\n"
    "                                   (default 0xfffe000000000000 + pid; it joins as a tool)\n"
    "  --timeout-ms MS                  join and per-answer deadline (default 5000)\n"
    "  --json                           one JSON document on stdout, for scripts\n"
    "  --                               the end of the options: a PAYLOAD that starts with '-'\n"
    "                                   goes after it (options have two dashes)\n"
    "exit status: 0 ok, 1 the operation failed (timeout, unknown route, failed report),\n"
    "2 usage (bad option, URL or id, an option given twice), 3 could not join the bus /\n"
    "connect.\n"
    "uvbus shm keeps uvbus_shm_inspect's exit status (see uvbus shm --help).\n";

const char kCommon[] =
    "options: --parent URL, --token T, --id ID, --timeout-ms MS, --json (see uvbus --help)\n"
    "exit status: 0 ok, 1 the operation failed, 2 usage, 3 could not join the bus\n";

struct sub_help {
  const char* name;
  const char* text;
};

const sub_help kHelp[] = {
    {"routes",
     "usage: uvbus routes ID [options]\n  print the routes node ID knows, one per line"
     " (--json: {\"node\", \"routes\": [lines]})\n"},
    {"counters",
     "usage: uvbus counters ID [options]\n  print node ID's counters, name=value"
     " (--json: {\"node\", \"counters\": {name: value}})\n"},
    {"ping",
     "usage: uvbus ping ID [--count N] [--interval-ms M] [options]\n"
     "  N echo commands (default 4), M ms apart (default 0), one line each, then\n"
     "  min/avg/p50/p99/max; exit 1 unless every echo came back\n"},
    {"send",
     "usage: uvbus send ID TYPE PAYLOAD|@FILE [options]\n"
     "  send one message of user type TYPE and wait for its delivery report: exit 0\n"
     "  only if it is ok, else print the status (unknown_route, timeout, ...), exit 1\n"},
    {"call",
     "usage: uvbus call ID TYPE PAYLOAD|@FILE [options]\n"
     "  a request of user type TYPE to node ID (node::call), waiting --timeout-ms for\n"
     "  the answer: the reply goes to stdout, exit 0; an error answer (its code and\n"
     "  detail), a timeout or a refusal (unknown_route, ...) to stderr, exit 1.\n"
     "  --json: {node, type, status, code, reply}\n"},
    {"nodes",
     "usage: uvbus nodes [options]\n"
     "  the bus directory: every node of the bus (id, name, type, parent, host, pid,\n"
     "  labels) as the parent knows it. --json: {nodes: [{id, parent, name, type, host,\n"
     "  pid, start_time_ms, version, labels, listen}]}\n"},
    {"top",
     "usage: uvbus top ID [--once] [--interval-ms M] [--count N] [--metrics URL] [options]\n"
     "  node ID's counters with per-second rates between two polls M ms apart\n"
     "  (default 1000), and its routes. Refreshes in place in a terminal; on a pipe\n"
     "  (no ANSI) each table follows the last. --once: one table; --count N: N\n"
     "  tables; default: until interrupted. --json: one object per table, one per\n"
     "  line. --metrics URL: node ID's metrics endpoint (http:// or https://): a\n"
     "  per-link table of rates follows the counters (not with --json).\n"
     "  Levels (gauges) show their value only, every other counter its rate:\n"},
};

// top's levels (uvbus_tool::counters_levels(), the names top shows without a rate), wrapped.
void print_levels() {
  std::string line = "   ";
  for (const char* l : uvbus_tool::counters_levels()) {
    if (line.size() + std::strlen(l) + 2 > 78) {
      std::printf("%s\n", line.c_str());
      line = "   ";
    }
    line += ' ';
    line += l;
  }
  std::printf("%s\n", line.c_str());
}

int help_for(const char* cmd) {
  for (const auto& h : kHelp) {
    if (std::strcmp(h.name, cmd) == 0) {
      std::fputs(h.text, stdout);
      if (std::strcmp(cmd, "top") == 0) print_levels();
      std::fputs(kCommon, stdout);
      return uvbus_tool::kExitOk;
    }
  }
  return -1;
}

bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {  // "--": a payload follows
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  }
  return false;
}

// A subcommand other than shm (argv[0] its name): its exit status.
int run(const std::string& cmd, int argc, char** argv) {
  if (cmd == "metrics") return uvbus_tool::metrics_main(argc, argv);
  if (wants_help(argc, argv)) {
    const int rc = help_for(cmd.c_str());
    if (rc >= 0) return rc;
  }
  if (cmd == "top") return uvbus_tool::top_main(argc, argv);
  if (cmd == "routes" || cmd == "counters" || cmd == "ping" || cmd == "send" || cmd == "call" ||
      cmd == "nodes") {
    return uvbus_tool::bus_main(argc, argv);
  }
  std::fprintf(stderr, "uvbus: unknown subcommand '%s' (see uvbus --help)\n", cmd.c_str());
  return uvbus_tool::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  uvbus_tool::ignore_sigpipe();  // a closed pipe is a write error for every subcommand
  uvbus_tool::hold_std_fds();
  if (argc < 2) {
    std::fputs(kMain, stderr);
    return uvbus_tool::kExitUsage;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kMain, stdout);
    return uvbus_tool::stdout_failed("--help") ? uvbus_tool::kExitFailed : uvbus_tool::kExitOk;
  }
  if (cmd == "shm") return uvbus_tool::shm_main(argc - 1, argv + 1);
  int rc = run(cmd, argc - 1, argv + 1);
  // An answer that could not be written (stdout on a full disk, a closed pipe) is not a success:
  // it exited 0 with the output lost.
  if (rc == uvbus_tool::kExitOk && uvbus_tool::stdout_failed(cmd.c_str())) {
    rc = uvbus_tool::kExitFailed;
  }
  return rc;
}
