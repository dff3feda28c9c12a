// uvbus metrics: fetches a node's metrics endpoint with libcurl; prints it or converts it to JSON.
#include <curl/curl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace uvbus_tool {
namespace {

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: uvbus metrics URL [--json] [--timeout-ms MS]\n"
      "  GET a node's metrics endpoint (node_config::metrics_url, e.g.\n"
      "  http://127.0.0.1:9100/metrics) and print the Prometheus text, or with --json\n"
      "  one object {\"family\": [{\"labels\": {...}, \"value\": number}]} (a sample's\n"
      "  name is its family: histogram _bucket/_sum/_count samples stay apart).\n"
      "exit status: 0 ok, 1 HTTP error status, timeout or no HTTP answer after connecting,\n"
      "2 usage, 3 could not connect\n");
}

// The body so far; too_large once it would pass kMaxMetricsBytes (libcurl then stops the transfer).
struct collected {
  std::string* body;
  bool too_large = false;
};

size_t collect(char* p, size_t size, size_t n, void* out) {
  auto* c = static_cast<collected*>(out);
  if (size * n > kMaxMetricsBytes - std::min(c->body->size(), kMaxMetricsBytes)) {
    c->too_large = true;
    return 0;  // less than given: CURLE_WRITE_ERROR
  }
  c->body->append(p, size * n);
  return size * n;
}

// One sample line's labels ("{a=\"x\",b=\"y\"}") as a JSON object; *pos past the '}', or npos
// when they do not close (the line is malformed: `x{a="b` took *pos past the line's end, and the
// caller's substr threw std::out_of_range).
std::string labels_json(const std::string& l, size_t* pos) {
  std::vector<std::pair<std::string, std::string>> kv;
  size_t i = *pos + 1;
  while (i < l.size() && l[i] != '}') {
    const size_t eq = l.find('=', i);
    if (eq == std::string::npos || eq + 1 >= l.size() || l[eq + 1] != '"') break;
    std::string key = l.substr(i, eq - i), val;
    size_t j = eq + 2;
    for (; j < l.size() && l[j] != '"'; ++j) {
      if (l[j] == '\\' && j + 1 < l.size()) {
        ++j;
        val += l[j] == 'n' ? '\n' : l[j];
      } else {
        val += l[j];
      }
    }
    kv.emplace_back(std::move(key), std::move(val));
    i = j + 1;
    if (i < l.size() && l[i] == ',') ++i;
  }
  *pos = i < l.size() && l[i] == '}' ? i + 1 : std::string::npos;
  return labels_object(kv);  // x{a="1",a="2"}: {"a":"1"}, each key once
}

// A sample's value as a JSON number when it is spelled as one and finite, else as a string: the
// page is a remote node's text, and `x 007`, `x +1`, `x .5`, `x 1.` or `x 0x10` went out as they
// were, which made the whole document invalid.
std::string value_json(const std::string& v) {
  if (!is_json_number(v)) return json_str(v);
  // 1e999 is no double (a JSON reader takes it as infinity or refuses it): a string. The cut was
  // at +-1.7e308, so the finite 1.75e308 and 1.79e308 (DBL_MAX is 1.7977e308) were strings too.
  return std::isfinite(std::strtod(v.c_str(), nullptr)) ? v : json_str(v);
}

std::string to_json(const std::string& text) {
  std::map<std::string, std::vector<std::string>> fam;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t i = line.find_first_of("{ ");
    if (i == std::string::npos) continue;
    const std::string name = line.substr(0, i);
    std::string labels = "{}";
    if (line[i] == '{') labels = labels_json(line, &i);
    if (i == std::string::npos) continue;  // labels that do not close: not a sample
    std::istringstream rest(line.substr(i));
    std::string value;
    rest >> value;
    fam[name].push_back("{\"labels\":" + labels + ",\"value\":" + value_json(value) + "}");
  }
  std::string o = "{";
  bool first = true;
  for (const auto& f : fam) {
    o += (first ? "" : ",") + json_str(f.first) + ":[";
    for (size_t k = 0; k < f.second.size(); ++k) o += (k ? "," : "") + f.second[k];
    o += "]";
    first = false;
  }
  return o + "}";
}

// What a failed transfer means (docs/tools.md): the URL malformed (2); no connection made: refused,
// no such host, no TLS session, a connect timeout (3); after the connection, a timeout or an
// answer that is not HTTP (1: the operation failed, as a bus command whose answer did not come).
// Every failure was 3 ("could not connect"), a page that stalled after connecting too.
int fetch_failure(CURLcode r, bool connected) {
  switch (r) {
    case CURLE_URL_MALFORMAT:
      return kExitUsage;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
      return kExitJoin;
    default:  // after connecting, "unsupported protocol" is an answer in HTTP/0.9: garbage
      return connected ? kExitFailed : r == CURLE_UNSUPPORTED_PROTOCOL ? kExitUsage : kExitJoin;
  }
}

}  // namespace

int http_get(const std::string& url, uint32_t timeout_ms, std::string* body, std::string* error) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL* c = curl_easy_init();
  char err[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
  collected into{body};
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &into);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  const CURLcode r = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  long sent = 0;  // the request's bytes: none when no connection was made
  curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &sent);
  curl_easy_cleanup(c);
  curl_global_cleanup();
  if (into.too_large) {
    *error = url + " answered more than " + std::to_string(kMaxMetricsBytes) + " bytes";
    body->clear();
    return kExitFailed;
  }
  if (r != CURLE_OK) {
    body->clear();  // a page cut short is no page
    const std::string what = err[0] != '\0' ? err : curl_easy_strerror(r);
    const int rc = fetch_failure(r, sent > 0);
    if (r == CURLE_OPERATION_TIMEDOUT) {
      // A page that stalls after the connection was made is not "could not connect": named apart.
      *error = (rc == kExitFailed ? "timeout: no complete answer from " + url + " within "
                                  : "timeout: could not connect to " + url + " within ") +
               std::to_string(timeout_ms) + " ms (--timeout-ms): " + what;
    } else if (rc == kExitJoin) {
      *error = "cannot fetch " + url + ": could not connect: " + what;
    } else {
      *error = "cannot fetch " + url + ": " + what;
    }
    return rc;
  }
  if (code >= 400) {
    *error = url + " answered HTTP " + std::to_string(code);
    return kExitFailed;
  }
  return kExitOk;
}

namespace {

struct metrics_args {
  const char* url = nullptr;
  bool json = false;
  uint32_t timeout_ms = 5000;
};

// The command line; -1 to go on, else the exit status (the refusal names the argument: each was
// refused with the usage text alone).
int parse_metrics_args(int argc, char** argv, metrics_args* m) {
  std::set<std::string> given;  // an option given twice took its last value silently: refused
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--help" || s == "-h") {
      usage(stdout);
      return kExitOk;
    }
    const char* why = nullptr;  // a format naming argv[i]
    if ((s == "--json" || s == "--timeout-ms") && !given.insert(s).second) {
      why = "option %s given twice";
    } else if (s == "--json") {
      m->json = true;
    } else if (s == "--timeout-ms" && i + 1 >= argc) {
      why = "%s needs a value";
    } else if (s == "--timeout-ms") {
      // 0 is no timeout at all to libcurl: refused, as the bus subcommands refuse it.
      if (!parse_u32(argv[++i], &m->timeout_ms) || m->timeout_ms == 0) {
        std::fprintf(stderr,
                     "uvbus metrics: bad value '%s' for --timeout-ms (milliseconds, >= 1)\n",
                     argv[i]);
        return kExitUsage;
      }
    } else if (s.size() > 1 && s[0] == '-') {  // `-json` too: it was taken for the URL
      why = "unknown option '%s'";
    } else if (m->url != nullptr) {
      why = "unexpected argument '%s' (one URL)";
    } else {
      m->url = argv[i];
    }
    if (why != nullptr) {
      std::fputs("uvbus metrics: ", stderr);
      std::fprintf(stderr, why, argv[i]);
      std::fputc('\n', stderr);
      usage(stderr);
      return kExitUsage;
    }
  }
  return -1;
}

}  // namespace

int metrics_main(int argc, char** argv) {
  metrics_args m;
  const int parsed = parse_metrics_args(argc, argv, &m);
  if (parsed >= 0) return parsed;
  if (m.url == nullptr) {
    std::fprintf(stderr, "uvbus metrics: no URL (see uvbus metrics --help)\n");
    return kExitUsage;
  }
  const std::string u = m.url;
  const bool json = m.json;
  const uint32_t timeout_ms = m.timeout_ms;
  if (u.rfind("http://", 0) != 0 && u.rfind("https://", 0) != 0) {
    std::fprintf(stderr, "uvbus metrics: bad URL '%s' (http://HOST:PORT[/PATH])\n", u.c_str());
    return kExitUsage;
  }
  std::string body, err;
  const int rc = http_get(u, timeout_ms, &body, &err);
  if (rc != kExitOk) {
    std::fprintf(stderr, "uvbus metrics: %s\n", err.c_str());
    return rc;
  }
  // The page whole: fputs stopped at its first NUL.
  const std::string out = json ? to_json(body) + "\n" : body;
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace uvbus_tool
