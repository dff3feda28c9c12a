// The uvbus tool's bus subcommands: routes, counters, ping, send, call, nodes (top: top_cmd.cpp).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "bus/auth.h"  // uvbus::detail::printable: an error answer's detail
#include "bus/wire.h"  // uvbus::proto::kCallSize
#include "bus_cmd.h"
#include "common.h"
#include "session.h"

namespace uvbus_tool {
namespace {

const char* env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : dflt;
}

// What a numeric option takes, for its refusal ("bad value 'x' for --count (1..4294967295)").
const char* value_range(const std::string& option) {
  if (option == "--count") return " (1..4294967295)";
  if (option == "--timeout-ms") return " (milliseconds, 1..4294967295)";
  if (option == "--interval-ms") return " (milliseconds, 0..4294967295)";
  if (option == "--id") return " (a non-zero node id, decimal or 0x hex)";
  if (option == "--parent") return " (the parent's stream URL, not empty)";
  if (option == "--metrics") return " (http://HOST:PORT[/PATH], not empty)";
  return "";
}

// Whether subcommand cmd takes option s (one take_option knows): every one takes --parent,
// --token, --id, --timeout-ms and --json; ping --count and --interval-ms; top those and --once and
// --metrics. The others were accepted and ignored (`send ID 1 x --count 100` sent one, exit 0).
bool takes_option(const std::string& cmd, const std::string& s) {
  if (s == "--parent" || s == "--token" || s == "--id" || s == "--timeout-ms" || s == "--json") {
    return true;
  }
  if (s == "--count" || s == "--interval-ms") return cmd == "ping" || cmd == "top";
  return cmd == "top";  // --once, --metrics
}

// One option of a bus subcommand's command line; false (message printed) on a usage error.
bool take_option(bus_args* a, int argc, char** argv, int* i) {
  const std::string s = argv[*i];
  const char* v = *i + 1 < argc ? argv[*i + 1] : nullptr;
  auto need = [&](const char* what) {
    if (v == nullptr) std::fprintf(stderr, "uvbus %s: %s needs %s\n", argv[0], s.c_str(), what);
    return v != nullptr;
  };
  bool ok = true;
  const bool flag = s == "--json" || s == "--once";
  if (!flag && s != "--parent" && s != "--token" && s != "--id" && s != "--timeout-ms" &&
      s != "--count" && s != "--interval-ms" && s != "--metrics") {
    std::fprintf(stderr, "uvbus %s: unknown option '%s' (see uvbus %s --help)\n", argv[0],
                 s.c_str(), argv[0]);
    return false;
  }
  if (!takes_option(argv[0], s)) {
    std::fprintf(stderr, "uvbus %s: option %s does not apply to %s (see uvbus %s --help)\n",
                 argv[0], s.c_str(), argv[0], argv[0]);
    return false;
  }
  if (s == "--json") {
    a->json = true;
    return true;
  }
  if (s == "--once") {
    a->once = true;
    return true;
  }
  if (!need("a value")) return false;
  ++*i;
  // An empty --parent or --metrics was taken as none: UVBUS_PARENT joined instead (the option
  // wins), top dropped its link table without a word. An empty --token is no token (no proof
  // sent, UVBUS_TOKEN not read): docs/tools.md.
  if (s == "--parent") ok = !(a->join.parent = v).empty();
  if (s == "--token") {
    a->join.token = v;
    a->token_given = true;
  }
  if (s == "--metrics") ok = !(a->metrics = v).empty();
  if (s == "--id") ok = parse_id(v, &a->join.id);
  if (s == "--timeout-ms") ok = parse_u32(v, &a->join.timeout_ms) && a->join.timeout_ms > 0;
  // 0 is no count: ping sent its default 4 and top ran until interrupted. Refused instead.
  if (s == "--count") ok = parse_u32(v, &a->count) && a->count > 0;
  if (s == "--interval-ms") ok = a->interval_given = parse_u32(v, &a->interval_ms);
  if (!ok) {
    std::fprintf(stderr, "uvbus %s: bad value '%s' for %s%s\n", argv[0], v, s.c_str(),
                 value_range(s));
  }
  return ok;
}

int check_env(bus_args* a) {
  if (a->join.parent.empty()) a->join.parent = env_or("UVBUS_PARENT", "");
  if (!a->token_given) a->join.token = env_or("UVBUS_TOKEN", "");
  if (a->join.id == 0) {
    const char* e = env_or("UVBUS_TOOL_ID", nullptr);
    if (e != nullptr && !parse_id(e, &a->join.id)) {
      std::fprintf(stderr, "uvbus: bad UVBUS_TOOL_ID '%s' (a non-zero id)\n", e);
      return kExitUsage;
    }
  }
  if (a->join.parent.empty()) {
    std::fprintf(stderr, "uvbus %s: no parent: pass --parent URL or set UVBUS_PARENT\n",
                 a->name.c_str());
    return kExitUsage;
  }
  // The default: 0xfffe0000'00000000 plus the pid, outside any sane subnet and unique per host.
  if (a->join.id == 0) a->join.id = kDefaultToolIdBase | static_cast<uint64_t>(getpid());
  return kExitOk;
}

std::string lines_json(const std::string& text) {
  std::istringstream in(text);
  std::string line, o = "[";
  bool first = true;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    o += (first ? "" : ",") + json_str(line);
    first = false;
  }
  return o + "]";
}

int command_failed(const char* what, uint64_t target, uvbus::errc st) {
  std::fprintf(stderr, "uvbus %s: node %#" PRIx64 " did not answer: %s\n", what, target,
               uvbus::to_string(st));
  return kExitFailed;
}

// routes / counters / nodes: one command, its text or JSON.
int text_command(const bus_args& a, session* s, uint64_t target, uvbus::proto::command_id c) {
  const command_result r = run_command(s, target, c, "", a.join.timeout_ms);
  if (r.status != uvbus::errc::ok) return command_failed(a.name.c_str(), target, r.status);
  if (!a.json) {
    const std::string text = peer_text(r.text);  // the remote node's text: no escapes, no NUL cut
    std::fputs(text.c_str(), stdout);
    if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
    return kExitOk;
  }
  const bool counters = c == uvbus::proto::command_id::counters;
  std::printf("{\"node\":\"%#" PRIx64 "\",\"%s\":%s}\n", target, counters ? "counters" : "routes",
              counters ? counters_json(r.text).c_str() : lines_json(r.text).c_str());
  return kExitOk;
}

void ping_summary(const bus_args& a, uint64_t target, const std::vector<double>& rtt,
                  uint32_t sent) {
  const double mn = rtt.empty() ? 0 : *std::min_element(rtt.begin(), rtt.end());
  const double mx = rtt.empty() ? 0 : *std::max_element(rtt.begin(), rtt.end());
  double sum = 0;
  for (const double x : rtt) sum += x;
  const double avg = rtt.empty() ? 0 : sum / static_cast<double>(rtt.size());
  const double p50 = rtt.empty() ? 0 : nearest_rank(rtt, 50),
               p99 = rtt.empty() ? 0 : nearest_rank(rtt, 99);
  if (a.json) {
    std::string series;
    for (const double x : rtt) series += (series.empty() ? "" : ",") + std::to_string(x);
    std::printf("{\"node\":\"%#" PRIx64
                "\",\"sent\":%u,\"received\":%zu,\"rtt_ms\":[%s],"
                "\"min_ms\":%.3f,\"avg_ms\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
                "\"max_ms\":%.3f}\n",
                target, sent, rtt.size(), series.c_str(), mn, avg, p50, p99, mx);
    return;
  }
  std::printf("--- %#" PRIx64
              ": %u sent, %zu answered; rtt min/avg/p50/p99/max = "
              "%.3f/%.3f/%.3f/%.3f/%.3f ms\n",
              target, sent, rtt.size(), mn, avg, p50, p99, mx);
}

int ping(const bus_args& a, session* s, uint64_t target) {
  std::vector<double> rtt;
  const uint32_t count = a.count == 0 ? 4 : a.count;
  // Counted in 64 bits (round_counter): a 32-bit counter wrapped after 4294967295 and never ended.
  for (round_counter round(count); round.next();) {
    const auto seq = static_cast<uint32_t>(round.number());  // 1..count: the echo's 4 bytes
    const std::string args(reinterpret_cast<const char*>(&seq), sizeof seq);
    const auto t0 = std::chrono::steady_clock::now();
    const command_result r =
        run_command(s, target, uvbus::proto::command_id::echo, args, a.join.timeout_ms);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r.status == uvbus::errc::ok && r.text == args) {
      rtt.push_back(ms);
      if (!a.json) std::printf("echo from %#" PRIx64 ": seq=%u rtt=%.3f ms\n", target, seq, ms);
    } else if (!a.json) {
      std::printf("echo from %#" PRIx64 ": seq=%u %s\n", target, seq,
                  r.status == uvbus::errc::ok ? "wrong answer" : uvbus::to_string(r.status));
    }
    if (stdout_failed("ping")) return kExitFailed;  // the reader went: stop, not ping on
    if (seq < count && a.interval_ms > 0) s->run_until([] { return false; }, a.interval_ms);
  }
  ping_summary(a, target, rtt, count);
  return rtt.size() == count ? kExitOk : kExitFailed;
}

// The largest payload subcommand cmd (send or call) can send: the tool node's message_limit; a
// call's less its call block (node.h, node::call: message_too_large above message_limit - 13).
// node.h names no constant for the block: its size is the wire's, proto::kCallSize. A 65 530-byte
// call was checked against message_limit, joined, and was refused only then (exit 1).
struct payload_limit {
  size_t bytes;
  const char* what;  // for the refusal
};
payload_limit payload_limit_of(const std::string& cmd) {
  const size_t limit = uvbus::node_config{}.message_limit;
  if (cmd != "call") return {limit, "the tool node's message_limit"};
  return {limit - uvbus::proto::kCallSize, "the tool node's message_limit less the call block"};
}

// PAYLOAD, or FILE's bytes for @FILE: false with *why (the file and what was wrong) when FILE
// cannot be read or holds more than `limit` bytes. At most limit + 1 bytes are read: `@/dev/zero`
// read for ever, and a 256 MiB file was read whole (575 MB resident) only to be refused later.
bool read_payload(const char* arg, payload_limit lim, std::string* out, std::string* why) {
  const size_t limit = lim.bytes;
  if (arg[0] != '@') {
    *out = arg;
    return true;
  }
  const std::string file = arg + 1;
  // A read error is an error (a directory opens, then fails to read: not an empty payload).
  FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) {
    *why = "cannot read payload file '" + file + "': " + std::strerror(errno);
    return false;
  }
  std::string body;
  char buf[65536];
  size_t n = 0;
  while (body.size() <= limit &&
         (n = std::fread(buf, 1, std::min(sizeof buf, limit + 1 - body.size()), f)) > 0) {
    body.append(buf, n);
  }
  const int err = std::ferror(f) != 0 ? errno : 0;
  std::fclose(f);
  if (err != 0) {
    *why = "cannot read payload file '" + file + "': " + std::strerror(err);
    return false;
  }
  if (body.size() > limit) {
    *why = "payload file '" + file + "' is larger than " + std::to_string(limit) + " bytes (" +
           lim.what + ")";
    return false;
  }
  *out = std::move(body);
  return true;
}

// The one delivery report of `uvbus send`.
struct report_state {
  bool done = false;
  uvbus::errc status = uvbus::errc::ok;
};

int send(const bus_args& a, session* s, uint64_t target, uint32_t type, const std::string& body,
         report_state* rs) {
  bool& done = rs->done;
  uvbus::errc& status = rs->status;
  const uvbus::errc e = s->node().send_data(target, type, body.data(), body.size());
  if (e != uvbus::errc::ok) {
    done = true;
    status = e;
  }
  if (!s->run_until([&done] { return done; }, answer_wait_ms(a.join.timeout_ms))) {
    status = uvbus::errc::timeout;
  }
  if (a.json) {
    std::printf("{\"node\":\"%#" PRIx64 "\",\"type\":%u,\"bytes\":%zu,\"status\":%s}\n", target,
                type, body.size(), json_str(uvbus::to_string(status)).c_str());
  } else if (status == uvbus::errc::ok) {
    std::printf("delivered %zu bytes of type %u to %#" PRIx64 "\n", body.size(), type, target);
  } else {
    std::fprintf(stderr, "uvbus send: %zu bytes to %#" PRIx64 " failed: %s\n", body.size(), target,
                 uvbus::to_string(status));
  }
  return status == uvbus::errc::ok ? kExitOk : kExitFailed;
}

// `uvbus call`'s one outcome.
struct call_state {
  bool done = false;
  uvbus::errc status = uvbus::errc::ok;
  uint32_t code = 0;
  std::string reply;
};

// `uvbus call`: one request, its one outcome. The reply goes to stdout as it is (text mode).
int call(const bus_args& a, session* s, uint64_t target, uint32_t type, const std::string& body) {
  // On the heap, held by the callback: if the wait below ends first, the node still calls back
  // when the session stops it, and wrote into this returned frame (ASan: stack-use-after-scope).
  const auto st = std::make_shared<call_state>();
  const uvbus::errc e = s->node().call(
      target, type, body.data(), body.size(), a.join.timeout_ms, [st](const uvbus::call_result& r) {
        st->done = true;
        st->status = r.status;
        st->code = r.code;
        st->reply.assign(reinterpret_cast<const char*>(r.data), r.size);
      });
  if (e != uvbus::errc::ok) {
    st->done = true;
    st->status = e;
  }
  if (!s->run_until([&st] { return st->done; }, answer_wait_ms(a.join.timeout_ms))) {
    st->status = uvbus::errc::timeout;
  }
  const uvbus::errc status = st->status;
  const uint32_t code = st->code;
  const std::string& reply = st->reply;
  if (a.json) {
    std::printf("{\"node\":\"%#" PRIx64 "\",\"type\":%u,\"status\":%s,\"code\":%u,\"reply\":%s}\n",
                target, type, json_str(uvbus::to_string(status)).c_str(), code,
                json_str(reply).c_str());
  } else if (status == uvbus::errc::ok) {
    std::fwrite(reply.data(), 1, reply.size(), stdout);
    if (!reply.empty() && reply.back() != '\n') std::fputc('\n', stdout);
  } else if (status == uvbus::errc::remote_error) {
    std::fprintf(stderr, "uvbus call: %#" PRIx64 " answered error %u: %s\n", target, code,
                 uvbus::detail::printable(reply).c_str());
  } else {
    std::fprintf(stderr, "uvbus call: no answer from %#" PRIx64 ": %s\n", target,
                 uvbus::to_string(status));
  }
  return status == uvbus::errc::ok ? kExitOk : kExitFailed;
}

}  // namespace

// Parses the options and the positional arguments of a bus subcommand.
int parse_bus_args(int argc, char** argv, bus_args* a) {
  a->name = argv[0];
  bool options = true;  // until "--": what follows it is positional, a payload "-x" too
  std::set<std::string> given;
  for (int i = 1; i < argc; ++i) {
    const char* s = argv[i];
    if (options && std::strcmp(s, "--") == 0) {
      options = false;
    } else if (options && s[0] == '-' && s[1] == '-') {
      // `--count 3 --count 5` took the last value without a word: which one was meant is unknown.
      if (!given.insert(s).second) {
        std::fprintf(stderr, "uvbus %s: option %s given twice\n", argv[0], s);
        return kExitUsage;
      }
      if (!take_option(a, argc, argv, &i)) return kExitUsage;
    } else if (options && s[0] == '-' && s[1] != '\0') {
      // `-json`, `-x`: no option has one dash (no argument is a negative number). It was taken
      // as a positional argument: `send ID TYPE -json` sent the text "-json".
      std::fprintf(stderr,
                   "uvbus %s: unknown option '%s' (options have two dashes; an argument that "
                   "starts with '-' goes after \"--\")\n",
                   argv[0], s);
      return kExitUsage;
    } else {
      a->pos.emplace_back(s);
    }
  }
  // `top --once --count 5` drew one table: which was meant is unknown.
  if (a->once && a->count != 0) {
    std::fprintf(stderr, "uvbus %s: options --once and --count cannot be given together\n",
                 argv[0]);
    return kExitUsage;
  }
  return check_env(a);
}

// routes, counters, ping, send, call, nodes: parse, join, run.
int bus_main(int argc, char** argv) {
  bus_args a;
  const std::string cmd = argv[0];
  const bool with_body = cmd == "send" || cmd == "call";
  const size_t want = with_body ? 3 : cmd == "nodes" ? 0 : 1;
  int rc = parse_bus_args(argc, argv, &a);
  if (rc != kExitOk) return rc;
  uint64_t target = 0;
  uint32_t type = 0;
  std::string body;
  if (a.pos.size() != want) {
    std::fprintf(stderr, "uvbus %s: expected %zu argument(s), got %zu (see uvbus %s --help)\n",
                 argv[0], want, a.pos.size(), argv[0]);
    return kExitUsage;
  }
  if (want > 0 && !parse_id(a.pos[0].c_str(), &target)) {
    std::fprintf(stderr, "uvbus %s: bad node id '%s' (decimal or 0x hex, non-zero)\n", argv[0],
                 a.pos[0].c_str());
    return kExitUsage;
  }
  if (with_body && !parse_u32(a.pos[1].c_str(), &type)) {
    std::fprintf(stderr, "uvbus %s: bad type '%s' (0..4294967295)\n", argv[0], a.pos[1].c_str());
    return kExitUsage;
  }
  std::string why;
  if (with_body && !read_payload(a.pos[2].c_str(), payload_limit_of(cmd), &body, &why)) {
    std::fprintf(stderr, "uvbus %s: %s\n", argv[0], why.c_str());
    return kExitUsage;
  }
  report_state rs;  // outlives the session: a report may still come while it stops
  session s;
  uvbus::node_callbacks cb;
  if (cmd == "send") {
    cb.on_report = [&rs](const uvbus::delivery_report& r) {
      rs.done = true;
      rs.status = r.status;
    };
  }
  rc = s.join(a.join, cb);
  if (rc != kExitOk) return rc;
  if (cmd == "routes") return text_command(a, &s, target, uvbus::proto::command_id::routes);
  if (cmd == "counters") return text_command(a, &s, target, uvbus::proto::command_id::counters);
  if (cmd == "nodes") return nodes(a, &s);
  if (cmd == "ping") return ping(a, &s, target);
  if (cmd == "call") return call(a, &s, target, type, body);
  return send(a, &s, target, type, body, &rs);
}

}  // namespace uvbus_tool
