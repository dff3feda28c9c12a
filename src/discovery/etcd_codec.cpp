// The discovery entry's JSON value and key, base64, and etcd JSON gateway request/response
// bodies. Every parse is non-throwing (json::parse(..., nullptr, false), type checks before get).
#include "discovery/etcd_codec.h"

#include <charconv>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

namespace uvbus::detail::etcd {

// Parsing uses nlohmann::json (a std::map per object): ordered_json's object insert scans every
// key, so a value of N unknown keys (accepted: forward compatible) would cost O(N^2). The entry's
// encoding keeps its field order (ordered_json); its decoding notes the labels' order while
// parsing (parse_entry_json).
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// An entry's JSON, and in *label_order the keys of its top-level "labels" object in document order
// (json's objects are sorted): the labels keep the order they were written in.
json parse_entry_json(std::string_view s, std::vector<std::string>* label_order) {
  std::string top_key;
  bool in_labels = false;
  const json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    // Depth: 0 for the top-level object's start and end, 1 for its keys and for the start and
    // end of an object that is one of its values, 2 for that object's keys.
    if (ev == json::parse_event_t::key && depth == 1) {
      top_key = parsed.get<std::string>();
    } else if (ev == json::parse_event_t::object_start && depth == 1) {
      in_labels = top_key == "labels";
      if (in_labels) label_order->clear();  // a repeated "labels": the last one counts
    } else if (ev == json::parse_event_t::object_end && depth == 1) {
      in_labels = false;
    } else if (ev == json::parse_event_t::key && depth == 2 && in_labels) {
      label_order->push_back(parsed.get<std::string>());
    }
    return true;
  };
  return json::parse(s.begin(), s.end(), cb, /*allow_exceptions=*/false);
}

// A JSON int64 as the gateway writes it (a decimal string) or as a number, below INT64_MAX (a
// revision + 1 must not overflow; a number above it is no negative ID or TTL).
bool get_i64(const json& o, const char* field, int64_t* out) {
  auto it = o.find(field);
  *out = 0;
  if (it == o.end()) return true;
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() >= uint64_t{INT64_MAX}) return false;
    *out = static_cast<int64_t>(it->get<uint64_t>());
    return true;
  }
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return true;
  }
  if (!it->is_string()) return false;
  const auto& s = it->get_ref<const std::string&>();
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && *out != INT64_MAX;
}

// A boolean field; absent or of another type: false (json::value() would throw on a mismatch).
bool get_bool(const json& o, const char* field) {
  auto it = o.find(field);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

bool get_b64(const json& o, const char* field, std::string* out) {
  out->clear();
  auto it = o.find(field);
  if (it == o.end()) return true;  // an empty value is omitted
  return it->is_string() && base64_decode(it->get_ref<const std::string&>(), out);
}

// An etcd error body, or a non-object: false with *why.
bool check_object(const json& j, std::string* why) {
  if (j.is_discarded() || !j.is_object()) {
    *why = "not a JSON object";
    return false;
  }
  auto err = j.find("error");
  if (err != j.end()) {
    auto msg = j.find("message");
    if (err->is_string()) {
      *why = "etcd: " + err->get_ref<const std::string&>();
    } else if (err->is_object() && err->contains("message") && (*err)["message"].is_string()) {
      *why = "etcd: " + (*err)["message"].get<std::string>();
    } else if (msg != j.end() && msg->is_string()) {
      *why = "etcd: " + msg->get<std::string>();
    } else {
      *why = "etcd: error";
    }
    return false;
  }
  return true;
}

// nlohmann builds the whole document before it can refuse it, at up to ~75 bytes per input byte
// (a '[' is an array holding an array); a hostile etcd (or a man in the middle on http://) could
// so turn a 64 MiB answer into gigabytes. A text nested deeper than kMaxJsonDepth, or holding more
// than kMaxJsonElements containers and separators (one per value or member), is refused before
// parsing: at most ~100 bytes each, so ~400 MB however large max_response_bytes is. A range answer
// of the default 64 MiB bound holds at most ~3 M of them (23 bytes per element for the smallest
// entries etcd can list), so no answer that fits the default bound is refused for its size.
bool json_shape_ok(std::string_view s, std::string* why) {
  size_t depth = 0;
  size_t elements = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    switch (s[i]) {
      case '"':  // a string: skip to its closing quote (a backslash escapes the next character)
        for (++i; i < s.size() && s[i] != '"'; ++i) {
          if (s[i] == '\\') ++i;
        }
        break;
      case '[':
      case '{':
        if (++depth > kMaxJsonDepth) {
          *why = "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
          return false;
        }
        [[fallthrough]];
      case ',':
        if (++elements > kMaxJsonElements) {
          *why = "more than " + std::to_string(kMaxJsonElements) + " JSON elements";
          return false;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return true;
}

// Parses a body that must be a JSON object (json_shape_ok's limits first); false with *why.
bool parse_object(std::string_view s, json* out, std::string* why) {
  if (!json_shape_ok(s, why)) return false;
  *out = json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  return check_object(*out, why);
}

bool get_header_revision(const json& o, int64_t* rev) {
  *rev = 0;
  auto h = o.find("header");
  if (h == o.end()) return true;
  return h->is_object() && get_i64(*h, "revision", rev);
}

bool get_kv(const json& o, kv* out) {
  return o.is_object() && get_b64(o, "key", &out->key) && get_b64(o, "value", &out->value) &&
         get_i64(o, "mod_revision", &out->mod_revision) && get_i64(o, "lease", &out->lease);
}

bool text_field(const json& o, const char* field, std::string* out, std::string* why) {
  auto it = o.find(field);
  if (it == o.end()) {
    out->clear();
    return true;
  }
  if (!it->is_string() || it->get_ref<const std::string&>().size() > kMaxText) {
    *why = std::string("\"") + field + "\" is not a string of at most 256 bytes";
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

bool uint_field(const json& o, const char* field, uint64_t max, uint64_t* out, std::string* why) {
  auto it = o.find(field);
  *out = 0;
  if (it == o.end()) return true;
  if (!it->is_number_unsigned() || it->get<uint64_t>() > max) {
    *why = std::string("\"") + field + "\" is not an unsigned integer in range";
    return false;
  }
  *out = it->get<uint64_t>();
  return true;
}

bool decode_labels(const json& o, const std::vector<std::string>& order, directory_entry* out,
                   std::string* why) {
  auto it = o.find("labels");
  if (it == o.end()) return true;
  if (!it->is_object() || it->size() > kMaxLabels) {
    *why = "\"labels\" is not an object of at most 32 labels";
    return false;
  }
  std::set<std::string_view> seen;  // a repeated key: its first position, its last value
  for (const std::string& k : order) {
    if (!seen.insert(k).second) continue;
    const json& v = (*it)[k];
    if (k.empty() || k.size() > kMaxText || !v.is_string() ||
        v.get_ref<const std::string&>().size() > kMaxText) {
      *why = "\"labels\" has an empty or long key, or a value that is not a short string";
      return false;
    }
    out->labels.emplace_back(k, v.get<std::string>());
  }
  return true;
}

bool decode_urls(const json& o, directory_entry* out, std::string* why) {
  auto it = o.find("urls");
  if (it == o.end()) return true;
  if (!it->is_array() || it->size() > kMaxUrls) {
    *why = "\"urls\" is not an array of at most 16 URLs";
    return false;
  }
  for (const json& u : *it) {
    if (!u.is_string() || u.get_ref<const std::string&>().size() > kMaxText) {
      *why = "\"urls\" has an element that is not a string of at most 256 bytes";
      return false;
    }
    out->listen.push_back(u.get<std::string>());
  }
  return true;
}

}  // namespace

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(in[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(in[i + 1])} << 8) |
                       static_cast<uint8_t>(in[i + 2]);
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out.push_back(kB64[(v >> 6) & 63]);
    out.push_back(kB64[v & 63]);
  }
  const size_t rest = in.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(in[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(in[i + 1])} << 8;
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kB64[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  out->reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return false;  // data after padding
      v[k] = b64_value(c);
      if (v[k] < 0) return false;
    }
    const uint32_t w = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out->push_back(static_cast<char>((w >> 16) & 0xff));
    if (pad < 2) out->push_back(static_cast<char>((w >> 8) & 0xff));
    if (pad < 1) out->push_back(static_cast<char>(w & 0xff));
  }
  return true;
}

std::string node_key(std::string_view prefix, bus_id id) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, id);
  std::string k(prefix);
  k += "/nodes/";
  k += hex;
  return k;
}

std::string prefix_end(std::string_view p) {
  std::string end(p);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  end.assign(1, '\0');  // every key
  return end;
}

bool id_from_key(std::string_view prefix, std::string_view key, bus_id* id) {
  constexpr std::string_view kNodes = "/nodes/";
  if (key.size() != prefix.size() + kNodes.size() + 16 || key.substr(0, prefix.size()) != prefix ||
      key.substr(prefix.size(), kNodes.size()) != kNodes) {
    return false;
  }
  const std::string_view hex = key.substr(prefix.size() + kNodes.size());
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  const auto r = std::from_chars(hex.data(), hex.data() + hex.size(), *id, 16);
  return r.ec == std::errc() && r.ptr == hex.data() + hex.size();
}

std::string encode_entry(const directory_entry& e) {
  ordered_json j;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, e.id);
  j["v"] = kEntryVersion;
  j["id"] = hex;
  j["name"] = e.name;
  j["type"] = e.type;
  ordered_json labels = ordered_json::object();
  for (const auto& [k, v] : e.labels) labels[k] = v;
  j["labels"] = std::move(labels);
  j["urls"] = e.listen;
  j["host"] = e.host_id;
  j["hostname"] = e.hostname;
  j["pid"] = e.pid;
  j["start"] = e.start_time_ms;
  j["proto"] = e.protocol_version;
  // Invalid UTF-8 in a caller's string must not throw: replace it.
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

bool decode_entry(std::string_view text, directory_entry* out, std::string* why) {
  std::vector<std::string> label_order;
  if (!json_shape_ok(text, why)) return false;
  const json j = parse_entry_json(text, &label_order);
  if (j.is_discarded() || !j.is_object()) {
    *why = "not a JSON object";
    return false;
  }
  *out = directory_entry{};
  uint64_t v = 0;
  uint64_t pid = 0;
  uint64_t proto = 0;
  std::string id_hex;
  if (!uint_field(j, "v", 1000000, &v, why)) return false;
  if (v < static_cast<uint64_t>(kEntryVersion)) {
    *why = "\"v\" is missing or below 1";
    return false;
  }
  if (!text_field(j, "id", &id_hex, why)) return false;
  bus_id id = 0;
  if (id_hex.size() != 16 || !id_from_key("", "/nodes/" + id_hex, &id) || id == 0) {
    *why = "\"id\" is not 16 lowercase hex digits of a non-zero id";
    return false;
  }
  out->id = id;
  if (!text_field(j, "name", &out->name, why) || !text_field(j, "type", &out->type, why) ||
      !text_field(j, "host", &out->host_id, why) ||
      !text_field(j, "hostname", &out->hostname, why) || !decode_labels(j, label_order, out, why) ||
      !decode_urls(j, out, why) || !uint_field(j, "pid", UINT32_MAX, &pid, why) ||
      !uint_field(j, "start", UINT64_MAX, &out->start_time_ms, why) ||
      !uint_field(j, "proto", 255, &proto, why)) {
    return false;
  }
  out->pid = static_cast<uint32_t>(pid);
  out->protocol_version = static_cast<uint8_t>(proto);
  return true;
}

bool parse_range(std::string_view body, range_reply* out, std::string* why) {
  json j;
  if (!parse_object(body, &j, why)) return false;
  // etcd always sends the store's revision (>= 1); a body without it is no range answer (taking
  // it for an empty range would remove every entry from the directory).
  if (!get_header_revision(j, &out->revision) || out->revision <= 0) {
    *why = "no header.revision of at least 1";
    return false;
  }
  out->kvs.clear();
  auto kvs = j.find("kvs");
  if (kvs == j.end()) return true;
  if (!kvs->is_array()) {
    *why = "\"kvs\" is not an array";
    return false;
  }
  out->kvs.reserve(kvs->size());
  for (const json& o : *kvs) {
    kv item;
    if (!get_kv(o, &item)) {
      *why = "a kv with a bad key or value";
      return false;
    }
    out->kvs.push_back(std::move(item));
  }
  return true;
}

bool parse_watch(std::string_view line, watch_reply* out, std::string* why) {
  json top;
  if (!parse_object(line, &top, why)) return false;
  auto res = top.find("result");
  if (res == top.end() || !res->is_object()) {
    *why = "no \"result\" object";
    return false;
  }
  const json& r = *res;
  *out = watch_reply{};
  if (!get_header_revision(r, &out->revision) ||
      !get_i64(r, "compact_revision", &out->compact_revision)) {
    *why = "bad revision";
    return false;
  }
  out->created = get_bool(r, "created");
  out->canceled = get_bool(r, "canceled");
  if (r.contains("cancel_reason") && r["cancel_reason"].is_string()) {
    out->error = r["cancel_reason"].get<std::string>();
  }
  auto evs = r.find("events");
  if (evs == r.end()) return true;
  if (!evs->is_array()) {
    *why = "\"events\" is not an array";
    return false;
  }
  for (const json& e : *evs) {
    watch_event ev;
    if (!e.is_object() || !e.contains("kv") || !get_kv(e["kv"], &ev.item)) {
      *why = "an event without a valid kv";
      return false;
    }
    auto t = e.find("type");
    ev.deleted = t != e.end() && t->is_string() && t->get_ref<const std::string&>() == "DELETE";
    out->events.push_back(std::move(ev));
  }
  return true;
}

bool parse_lease_grant(std::string_view body, lease_reply* out, std::string* why) {
  json j;
  if (!parse_object(body, &j, why)) return false;
  if (!get_i64(j, "ID", &out->id) || !get_i64(j, "TTL", &out->ttl) || out->id == 0) {
    *why = "no lease ID/TTL in the grant";
    return false;
  }
  return true;
}

bool parse_keepalive(std::string_view body, lease_reply* out, std::string* why) {
  json top;
  if (!parse_object(body, &top, why)) return false;
  auto res = top.find("result");
  if (res == top.end() || !res->is_object()) {
    *why = "no \"result\" object";
    return false;
  }
  if (!get_i64(*res, "ID", &out->id) || !get_i64(*res, "TTL", &out->ttl)) {
    *why = "bad ID/TTL";
    return false;
  }
  return true;
}

bool parse_ok(std::string_view body, std::string* why) {
  json j;
  if (!parse_object(body, &j, why)) return false;
  if (!j.contains("header")) {
    *why = "no header";
    return false;
  }
  return true;
}

bool parse_authenticate(std::string_view body, std::string* token, std::string* why) {
  json j;
  if (!parse_object(body, &j, why)) return false;
  const auto t = j.find("token");
  if (t == j.end() || !t->is_string() || t->get_ref<const std::string&>().empty()) {
    *why = "no token in the answer";
    return false;
  }
  const auto& v = t->get_ref<const std::string&>();
  if (v.size() > 4096) {
    *why = "a token of " + std::to_string(v.size()) + " bytes (at most 4096)";
    return false;
  }
  for (const char c : v) {
    if (c <= 0x20 || c >= 0x7f) {
      *why = "a token with a byte that cannot go into a header";
      return false;
    }
  }
  *token = v;
  return true;
}

std::string range_request(std::string_view prefix_key) {
  json j;
  j["key"] = base64_encode(prefix_key);
  j["range_end"] = base64_encode(prefix_end(prefix_key));
  return j.dump();
}

std::string count_request(std::string_view prefix_key) {
  json j;
  j["key"] = base64_encode(prefix_key);
  j["range_end"] = base64_encode(prefix_end(prefix_key));
  j["count_only"] = true;
  return j.dump();
}

std::string watch_request(std::string_view prefix_key, int64_t start_revision) {
  json c;
  c["key"] = base64_encode(prefix_key);
  c["range_end"] = base64_encode(prefix_end(prefix_key));
  c["start_revision"] = std::to_string(start_revision);
  json j;
  j["create_request"] = std::move(c);
  return j.dump();
}

std::string put_request(std::string_view key, std::string_view value, int64_t lease) {
  json j;
  j["key"] = base64_encode(key);
  j["value"] = base64_encode(value);
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j.dump();
}

std::string grant_request(int64_t ttl_s) {
  json j;
  j["TTL"] = std::to_string(ttl_s);
  return j.dump();
}

std::string lease_id_request(int64_t id) {
  json j;
  j["ID"] = std::to_string(id);
  return j.dump();
}

std::string authenticate_request(std::string_view name, std::string_view password) {
  json j;
  j["name"] = std::string(name);
  j["password"] = std::string(password);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace uvbus::detail::etcd
