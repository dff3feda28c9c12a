// The compression corpus: deterministic game-like entity snapshots (docs/compression.md), used by
// the compression benchmark and tests.
//
// A snapshot is what a zone server sends a client each tick: a header (tick, zone, entity count)
// then entities, each with an id, a type, position and velocity floats, yaw, health and level
// (small ints), a player or monster name, a guild, a state, flags and an inventory list of
// (item id, count) pairs. Two encodings:
//   json    JSON text, every field named in every entity, floats with two decimals
//   binary  MessagePack-style: maps with string keys, fixints, float32, short strings, arrays
// A message is exactly `size` bytes: entities are appended until the size is reached and the last
// one is cut. The same (seed, size, format) always gives the same bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace uvbus::bench {

enum class corpus_format { json, binary };

inline const char* to_string(corpus_format f) {
  return f == corpus_format::json ? "json" : "binary";
}

namespace corpus_detail {

// splitmix64: small, fast, deterministic everywhere.
class rng {
 public:
  explicit rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  int range(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  float real(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) / static_cast<float>(1ULL << 24);
  }
  template <size_t N>
  const char* pick(const char* const (&a)[N]) {
    return a[next() % N];
  }

 private:
  uint64_t s_;
};

struct entity {
  uint32_t id;
  const char* type;
  float pos[3];
  float vel[3];
  float yaw;
  int health;
  int max_health;
  int level;
  std::string name;
  const char* guild;
  const char* state;
  int flags;
  std::vector<std::pair<int, int>> inventory;  // (item id, count)
};

inline std::string make_name(rng& r) {
  static const char* const syll[] = {"ka", "el",  "thar", "mor", "dra", "zen", "ix",  "lo",
                                     "ra", "vyn", "gor",  "sha", "ni",  "qu",  "bel", "tor"};
  std::string s;
  const int n = r.range(2, 4);
  for (int i = 0; i < n; ++i) s += r.pick(syll);
  s[0] = static_cast<char>(s[0] - 'a' + 'A');
  if (r.range(0, 3) == 0) s += std::to_string(r.range(1, 999));  // "Kaelthar42"
  return s;
}

inline entity make_entity(rng& r, uint32_t id) {
  static const char* const types[] = {"player", "player", "npc", "monster", "projectile", "item"};
  static const char* const guilds[] = {
      "", "", "Iron Wolves", "Dawnbreakers", "The Unseen", "Crimson Pact"};
  static const char* const states[] = {"idle", "moving", "moving", "attacking", "casting", "dead"};
  entity e;
  e.id = id;
  e.type = r.pick(types);
  for (float& p : e.pos) p = r.real(0.0F, 4096.0F);
  e.pos[2] = r.real(0.0F, 64.0F);  // height: a mostly flat world
  for (float& v : e.vel) v = r.range(0, 2) == 0 ? 0.0F : r.real(-8.0F, 8.0F);
  e.yaw = r.real(0.0F, 360.0F);
  e.max_health = 100 * r.range(1, 5);
  e.health = r.range(0, 3) == 0 ? e.max_health : r.range(0, e.max_health);
  e.level = r.range(1, 60);
  e.name = make_name(r);
  e.guild = r.pick(guilds);
  e.state = r.pick(states);
  e.flags = r.range(0, 15);
  const int items = r.range(0, 6);
  for (int i = 0; i < items; ++i) e.inventory.emplace_back(r.range(1000, 1063), r.range(1, 99));
  return e;
}

inline void append_json(std::string& out, const entity& e) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"id\":%u,\"type\":\"%s\",\"pos\":{\"x\":%.2f,\"y\":%.2f,\"z\":%.2f},"
                "\"vel\":{\"x\":%.2f,\"y\":%.2f,\"z\":%.2f},\"yaw\":%.1f,\"health\":%d,"
                "\"max_health\":%d,\"level\":%d,\"name\":\"%s\",\"guild\":\"%s\",\"state\":\"%s\","
                "\"flags\":%d,\"inventory\":[",
                e.id, e.type, static_cast<double>(e.pos[0]), static_cast<double>(e.pos[1]),
                static_cast<double>(e.pos[2]), static_cast<double>(e.vel[0]),
                static_cast<double>(e.vel[1]), static_cast<double>(e.vel[2]),
                static_cast<double>(e.yaw), e.health, e.max_health, e.level, e.name.c_str(),
                e.guild, e.state, e.flags);
  out += buf;
  for (size_t i = 0; i < e.inventory.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s{\"item\":%d,\"count\":%d}", i == 0 ? "" : ",",
                  e.inventory[i].first, e.inventory[i].second);
    out += buf;
  }
  out += "]},";
}

// MessagePack-style primitives (fixstr / str8, fixint / uint16 / uint32, float32, fixmap,
// fixarray).
inline void mp_str(std::string& out, const char* s) {
  const size_t n = std::strlen(s);
  if (n < 32) {
    out += static_cast<char>(0xa0 | n);
  } else {
    out += static_cast<char>(0xd9);
    out += static_cast<char>(n);
  }
  out.append(s, n);
}
inline void mp_uint(std::string& out, uint32_t v) {
  if (v < 128) {
    out += static_cast<char>(v);
  } else if (v < 65536) {
    out += static_cast<char>(0xcd);
    out += static_cast<char>(v >> 8);
    out += static_cast<char>(v & 0xff);
  } else {
    out += static_cast<char>(0xce);
    for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xff);
  }
}
inline void mp_float(std::string& out, float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  out += static_cast<char>(0xca);
  for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((bits >> s) & 0xff);
}
inline void mp_vec3(std::string& out, const char* key, const float (&v)[3]) {
  mp_str(out, key);
  out += static_cast<char>(0x83);  // fixmap of 3
  mp_str(out, "x");
  mp_float(out, v[0]);
  mp_str(out, "y");
  mp_float(out, v[1]);
  mp_str(out, "z");
  mp_float(out, v[2]);
}

inline void append_binary(std::string& out, const entity& e) {
  out += static_cast<char>(0x8f);  // fixmap of 15 fields
  mp_str(out, "id");
  mp_uint(out, e.id);
  mp_str(out, "type");
  mp_str(out, e.type);
  mp_vec3(out, "pos", e.pos);
  mp_vec3(out, "vel", e.vel);
  mp_str(out, "yaw");
  mp_float(out, e.yaw);
  const std::pair<const char*, int> ints[] = {
      {"health", e.health}, {"max_health", e.max_health}, {"level", e.level}, {"flags", e.flags}};
  for (const auto& kv : ints) {
    mp_str(out, kv.first);
    mp_uint(out, static_cast<uint32_t>(kv.second));
  }
  mp_str(out, "name");
  mp_str(out, e.name.c_str());
  mp_str(out, "guild");
  mp_str(out, e.guild);
  mp_str(out, "state");
  mp_str(out, e.state);
  mp_str(out, "inventory");
  out += static_cast<char>(0x90 | e.inventory.size());  // fixarray
  for (const auto& it : e.inventory) {
    out += static_cast<char>(0x82);
    mp_str(out, "item");
    mp_uint(out, static_cast<uint32_t>(it.first));
    mp_str(out, "count");
    mp_uint(out, static_cast<uint32_t>(it.second));
  }
}

}  // namespace corpus_detail

// One snapshot message of exactly `size` bytes.
inline std::vector<uint8_t> make_snapshot(uint64_t seed, size_t size, corpus_format f) {
  corpus_detail::rng r(seed * 0x2545f4914f6cdd1dULL + 1);
  std::string out;
  out.reserve(size + 1024);
  const int tick = r.range(0, 1 << 20);
  const int zone = r.range(1, 40);
  uint32_t id = static_cast<uint32_t>(r.range(1, 50000));
  if (f == corpus_format::json) {
    out += "{\"tick\":" + std::to_string(tick) + ",\"zone\":" + std::to_string(zone) +
           ",\"entities\":[";
  } else {
    out += static_cast<char>(0x83);
    corpus_detail::mp_str(out, "tick");
    corpus_detail::mp_uint(out, static_cast<uint32_t>(tick));
    corpus_detail::mp_str(out, "zone");
    corpus_detail::mp_uint(out, static_cast<uint32_t>(zone));
    corpus_detail::mp_str(out, "entities");
    out += static_cast<char>(0xdc);  // array16, count unknown until cut: a fixed 0xffff
    out += static_cast<char>(0xff);
    out += static_cast<char>(0xff);
  }
  while (out.size() < size) {
    id += static_cast<uint32_t>(r.range(1, 12));  // ids ascend with small gaps (a sorted view)
    const corpus_detail::entity e = corpus_detail::make_entity(r, id);
    if (f == corpus_format::json) {
      corpus_detail::append_json(out, e);
    } else {
      corpus_detail::append_binary(out, e);
    }
  }
  return std::vector<uint8_t>(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(size));
}

// `count` different snapshots of `size` bytes (seeds seed, seed + 1, ...).
inline std::vector<std::vector<uint8_t>> make_corpus(uint64_t seed, size_t count, size_t size,
                                                     corpus_format f) {
  std::vector<std::vector<uint8_t>> msgs;
  msgs.reserve(count);
  for (size_t i = 0; i < count; ++i) msgs.push_back(make_snapshot(seed + i, size, f));
  return msgs;
}

}  // namespace uvbus::bench
