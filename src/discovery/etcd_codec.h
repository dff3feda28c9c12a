// Pure encoders and decoders of discovery: the directory entry's JSON value and key, base64, and
// the etcd JSON gateway's responses. No I/O, no exceptions out (nlohmann is used non-throwing).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "uvbus/directory.h"

namespace uvbus::detail::etcd {

// Value format version written into "v".
constexpr int kEntryVersion = 1;
// Limits of a decoded entry (a value breaking them is malformed).
constexpr size_t kMaxText = 256;  // name, type, host, hostname, a label key or value, a URL
constexpr size_t kMaxLabels = 32;
constexpr size_t kMaxUrls = 16;
// Limits of any JSON text parsed (a body, a watch message, an entry's value), checked before the
// parser builds it: nesting depth, and '[', '{' and ',' outside strings (one per value or member).
// Above either the text is refused as malformed, *why naming the limit.
constexpr size_t kMaxJsonDepth = 64;
constexpr size_t kMaxJsonElements = size_t{4} << 20;

std::string base64_encode(std::string_view in);
// false on a character outside the alphabet, bad padding or a bad length.
bool base64_decode(std::string_view in, std::string* out);

// prefix + "/nodes/" + 16 lowercase hex digits.
std::string node_key(std::string_view prefix, bus_id id);
// The first key after every key starting with `p` (etcd's range_end for a prefix).
std::string prefix_end(std::string_view p);
// The id of a key <prefix>/nodes/<16 hex>; false for any other key.
bool id_from_key(std::string_view prefix, std::string_view key, bus_id* id);

// The JSON value of an entry (docs/cluster.md "Value"). parent is not written.
std::string encode_entry(const directory_entry& e);
// Decodes a value written by encode_entry (or a compatible writer). false with *why naming the
// field on anything malformed; *out is then unspecified.
bool decode_entry(std::string_view json, directory_entry* out, std::string* why);

// ------------------------------------------------------------------ gateway responses --
struct kv {
  std::string key;  // decoded
  std::string value;
  int64_t mod_revision = 0;  // the revision of its last change (0 when absent)
  int64_t lease = 0;         // the lease it is on (0: none, or not given)
};
struct range_reply {
  int64_t revision = 0;
  std::vector<kv> kvs;
};
struct watch_event {
  bool deleted = false;
  kv item;
};
struct watch_reply {
  int64_t revision = 0;  // header.revision (0 when absent)
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;
  std::string error;  // a stream-level {"error":...} or cancel_reason
  std::vector<watch_event> events;
};
struct lease_reply {
  int64_t id = 0;
  int64_t ttl = 0;  // 0: the lease does not exist (any more)
};

// Each returns false with *why when the body is not the expected JSON. An etcd error body
// ({"error":..,"code":..}) is reported through *why as well.
bool parse_range(std::string_view body, range_reply* out, std::string* why);
bool parse_watch(std::string_view line, watch_reply* out, std::string* why);
bool parse_lease_grant(std::string_view body, lease_reply* out, std::string* why);
bool parse_keepalive(std::string_view body, lease_reply* out, std::string* why);
// A put/deleterange/revoke answer: true when it carries a header (success).
bool parse_ok(std::string_view body, std::string* why);
// An /v3/auth/authenticate answer: its non-empty token (at most 4096 bytes, printable ASCII: it
// goes into a header line).
bool parse_authenticate(std::string_view body, std::string* token, std::string* why);

// Request bodies.
std::string range_request(std::string_view prefix_key);
// A linearizable count of the keys under a prefix (a cheap "is the cluster there" probe).
std::string count_request(std::string_view prefix_key);
std::string watch_request(std::string_view prefix_key, int64_t start_revision);
std::string put_request(std::string_view key, std::string_view value, int64_t lease);
std::string grant_request(int64_t ttl_s);
std::string lease_id_request(int64_t id);  // keep-alive, revoke
std::string authenticate_request(std::string_view name, std::string_view password);

}  // namespace uvbus::detail::etcd
