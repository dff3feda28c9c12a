// The uvbus tool's shared pieces: exit codes, a JSON string escaper, id and option parsing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace uvbus_tool {

// Exit codes of every bus subcommand (docs/tools.md). `uvbus shm` keeps uvbus_shm_inspect's.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // the operation failed: timeout, unknown route, failed report
constexpr int kExitUsage = 2;   // bad arguments: unknown option, bad URL, bad id
constexpr int kExitJoin = 3;    // could not join the bus / connect
// A tool's default id: this plus its pid (node_config::join_as_tool: outside the parent's subnets).
constexpr uint64_t kDefaultToolIdBase = 0xfffe000000000000ULL;

// `s` as a JSON string literal, quotes included; a byte that is not well-formed UTF-8 is U+FFFD.
std::string json_str(const std::string& s);
// A counters answer ("name=value" lines, a remote node's text) as a JSON object: a value that is a
// JSON integer as a number, anything else as a string. A name the text gives again keeps its first
// value (a node that repeats names would otherwise give an object with duplicate keys, which JSON
// readers resolve differently).
std::string counters_json(const std::string& text);
// One `uvbus top --json` table, without its newline:
// {"node":"0x..","seconds":S,"counters":{name:{"value":V,"per_second":R}}} (S and R to 0.001).
struct top_counter {
  std::string name;
  uint64_t value = 0;
  double per_second = 0;
};
std::string top_json(uint64_t target, double seconds, const std::vector<top_counter>& counters);
// Whether a name of the counters answer (node::impl::counters_text) is a level now (a gauge:
// pending_now, flow_unacked_now/_bytes, flow_targets, flow_sources, flow_buffer_bytes, peers),
// which `top` shows without a rate. Any other name is a counter (compressed_raw_bytes too).
bool is_counters_level(const std::string& name);
// Those names, in order (`top --help` lists them).
const std::vector<const char*>& counters_levels();
// key/value pairs (labels: a remote node's text) as a JSON object of strings, each key once with
// its first value: a node that repeats a key (zone=a, zone=b) gave an object with duplicate keys,
// which JSON readers resolve differently.
std::string labels_object(const std::vector<std::pair<std::string, std::string>>& kv);
// Whether v is a number in JSON's grammar (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?): not
// `007`, `+1`, `.5`, `1.`, `0x10`, `Inf`, which a page's sample value may spell.
bool is_json_number(const std::string& v);

// True, the error named once on stderr ("uvbus WHAT: cannot write the output: Broken pipe"), when
// stdout cannot be written: a loop stops instead of writing into a closed pipe for ever, and a
// command does not exit 0 with its output lost (a full disk, a reader that went).
bool stdout_failed(const char* what);

// Sets SIGPIPE to SIG_IGN, first thing in main, for every subcommand: a write to a closed pipe
// (`uvbus metrics URL | head -c1`) is then an EPIPE that stdout_failed reports, not death by the
// signal. Only the bus subcommands had it ignored (a stream channel sets it, uvbus/stream.h):
// metrics and shm died by SIGPIPE (status 141 in a shell) where the bus subcommands exited 1.
void ignore_sigpipe();

// How long the tool waits for an answer the node times out after timeout_ms: a second more,
// saturated (`--timeout-ms 4294967000` plus 1000 wrapped to 704 ms: "timeout" before the node's).
constexpr uint32_t answer_wait_ms(uint32_t timeout_ms) {
  return timeout_ms > UINT32_MAX - 1000 ? UINT32_MAX : timeout_ms + 1000;
}

// Puts /dev/null, read-only, on each of fds 0..2 that is closed at start (`uvbus ... >&-`): the
// tool's first file or socket took the number, and stdout's text went into it (`shm drain --out
// FILE` wrote its record lines into FILE). A write to it fails (EBADF) as to a closed stdout.
void hold_std_fds();

// The rounds of a loop asked to run `count` times (`ping --count N`, `top --count N`; 0: without
// end), numbered from 1: next() starts the next round, false once `count` have run (number()
// stays the last). Counted in 64 bits: ping and top counted in 32, so after round 4294967295 the
// number wrapped to 0 and `--count 4294967295` never ended. `done` resumes after that many rounds
// (a test starts near the end of the range).
class round_counter {
 public:
  explicit round_counter(uint32_t count, uint32_t done = 0) : count_(count), n_(done) {}
  bool next() {
    if (count_ != 0 && n_ >= count_) return false;
    ++n_;
    return true;
  }
  [[nodiscard]] uint64_t number() const { return n_; }

 private:
  uint32_t count_;
  uint64_t n_;
};

// A node id: decimal or 0x hex, non-zero. False (and *out untouched) otherwise.
bool parse_id(const char* s, uint64_t* out);
// A non-negative integer option value. False if it is not one.
bool parse_u32(const char* s, uint32_t* out);

// The nearest-rank percentile p (0..100] of v: the value of rank ceil(p/100 * size) in sorted
// order (the smallest for p 0); 0 when v is empty. `uvbus ping`'s p50 and p99.
double nearest_rank(std::vector<double> v, double p);

// The most of a metrics page `uvbus metrics` and `top --metrics` read: an answer that never
// ended was held whole until the timeout (--timeout-ms 2000: 834 MB received, 1.15 GB resident).
constexpr size_t kMaxMetricsBytes = size_t{64} << 20;

// GET url (libcurl): kExitOk with the body, or kExitFailed (HTTP status >= 400, a body over
// kMaxMetricsBytes, and after the connection was made: no complete answer within timeout_ms, an
// answer that is not HTTP), kExitJoin (no connection: refused, no such host, connect timeout),
// kExitUsage (malformed URL) with *error saying what happened (a timeout: "timeout: ..." naming
// the URL and timeout_ms; a failed transfer leaves *body empty).
int http_get(const std::string& url, uint32_t timeout_ms, std::string* body, std::string* error);

// Subcommand entry points: argv[0] is the subcommand's name.
// How long `shm drain` waits with nothing arriving before it ends, in microseconds: 200 ms and
// twice the region's abandon timeout, whichever is longer. Twice it was computed in 32 bits and
// wrapped for a timeout from 2^31 us (35 minutes) on: the drain ended before a record left
// half-written was skipped.
constexpr uint64_t drain_quiet_us(uint32_t abandon_timeout_us) {
  return std::max<uint64_t>(200000, uint64_t{2} * abandon_timeout_us);
}

int shm_main(int argc, char** argv);
int shm_inspect_legacy_main(int argc, char** argv);
int bus_main(int argc, char** argv);
int metrics_main(int argc, char** argv);

}  // namespace uvbus_tool
