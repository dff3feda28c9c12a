// The uvbus tool's bus session: joins a bus as a node under a parent, runs its loop until done;
// a remote node's text made safe for the terminal (peer_text).
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "uvbus/node.h"

namespace uvbus_tool {

// Where and as whom the tool joins (--parent / UVBUS_PARENT, --token / UVBUS_TOKEN,
// --id / UVBUS_TOOL_ID, --timeout-ms).
struct join_options {
  std::string parent;
  std::string token;
  uint64_t id = 0;
  uint32_t timeout_ms = 5000;
};

class session {
 public:
  session();
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  // Registers to the parent; `extra` holds the callbacks the subcommand needs (on_report: it can
  // not be added later). kExitOk, kExitUsage (bad URL or id: message printed) or kExitJoin
  // (refused, unreachable, timeout: message printed).
  int join(const join_options& o, uvbus::node_callbacks extra);
  // Runs the loop until done() holds or `ms` passed; false on the deadline.
  bool run_until(const std::function<bool()>& done, uint32_t ms);
  // Runs work() on libuv's thread pool and the loop meanwhile, until work() returned: a blocking
  // call (top --metrics' HTTP fetch, up to --timeout-ms) that on the loop's thread kept the node
  // from reading and pinging, so the parent dropped the tool for silence. work() must not touch
  // the node or the loop.
  void run_blocking(const std::function<void()>& work);
  uvbus::node& node() { return *node_; }
  uint64_t parent_id() const { return parent_; }

 private:
  uv_loop_t loop_{};
  uv_timer_t timer_{};
  bool fired_ = false;
  bool stopped_ = false;
  std::unique_ptr<uvbus::node> node_;
  uint64_t parent_ = 0;
  // What join() waits for, written by the node's callbacks (which outlive join()).
  bool up_ = false;
  uvbus::errc refused_ = uvbus::errc::ok;
  std::string why_;
};

// A command's outcome.
struct command_result {
  bool done = false;
  uvbus::errc status = uvbus::errc::ok;
  std::string text;
};

// A remote node's text in lines (a command's answer: routes, counters) for the terminal: each
// line through uvbus::detail::printable (control bytes, ESC and NUL among them, as \xNN, as the
// join's refusal details already are), the newlines between lines kept. A node's escape
// sequences reached the terminal, and fputs cut the text at its first NUL.
std::string peer_text(const std::string& s);

// Sends a command and waits for its answer (or the deadline: status timeout).
command_result run_command(session* s, uint64_t target, uvbus::proto::command_id c,
                           const std::string& args, uint32_t timeout_ms);

}  // namespace uvbus_tool
