// uvbus shm inspect|drain|remove (and uvbus_shm_inspect): a shared-memory region's header, fill
// and counters (like libatbus's show_shm_channel), draining a region left by a dead or closed
// reader, or removing one.
//
//   inspect shm://name                  print the header (never attaches)
//   drain shm://name [--quiet] [--out FILE]
//   remove shm://name [--force]
//
// Exit status (also in --help, docs/shm.md and docs/tools.md): 0 done (inspect: region valid),
// 1 not a usable uvbus region (inspect still prints what could be read; drain/remove: foreign
// object or another layout version), 2 usage, open or write error (no such region, permission,
// --out FILE full, stdout full or closed), 3 refused: a live reader owns the region (drain; remove
// without --force).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "uvbus/shm.h"

namespace uvbus_tool {
namespace {

constexpr int kExitUnusable = 1;
constexpr int kExitLiveReader = 3;

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: uvbus_shm_inspect URL [--json]             print a region's header, fill and "
      "counters\n"
      "       uvbus_shm_inspect --drain URL [--quiet] [--out FILE]\n"
      "           take the reader role of a region whose reader is dead or closed with keep\n"
      "           (whatever its ring size), consume every record, print each record's size and\n"
      "           checksum status (--quiet: only the totals), --out: append each record to FILE\n"
      "           as [u32 little-endian length][payload]; the region stays, empty and closed\n"
      "           with keep\n"
      "       uvbus_shm_inspect --remove URL [--force]\n"
      "           mark the region closed for good (its writers get not_connected) and remove its\n"
      "           name; --force: even when a live reader owns it (or it is not a uvbus region)\n"
      "URL: shm://name | shm://0xKEY | shm://KEY\n"
      "exit status: 0 done (inspect: region valid), 1 not a usable uvbus region, 2 usage, open or\n"
      "write error (e.g. no such region, --out FILE or stdout full), 3 refused: a live reader\n"
      "owns the region\n");
}

void print_counters(const uvbus::shm_metrics& m) {
  std::printf("records_written   %" PRIu64 "\n", m.records_written);
  std::printf("bytes_written     %" PRIu64 "\n", m.bytes_written);
  std::printf("records_read      %" PRIu64 "\n", m.records_read);
  std::printf("bytes_read        %" PRIu64 "\n", m.bytes_read);
  std::printf("batches           %" PRIu64 "\n", m.batches);
  std::printf("queue_full        %" PRIu64 "\n", m.queue_full);
  std::printf("abandoned         %" PRIu64 " skipped by the reader, %" PRIu64
              " reported to writers\n",
              m.abandoned, m.writer_abandoned);
  std::printf("checksum_failures %" PRIu64 "\n", m.checksum_failures);
  std::printf("corrupt           %" PRIu64 "\n", m.corrupt);
  std::printf("wakeups           %" PRIu64 "\n", m.wakeups);
  std::printf("staged_dropped    %" PRIu64
              " accepted by coalescing writers, never published (region removed, close)\n",
              m.staged_dropped);
  std::printf(
      "note              writer-side counters (records_written, bytes_written, queue_full,\n"
      "                  writers' abandoned, wakeups) are published by each writer every %u "
      "sends,\n"
      "                  when it wakes a sleeping reader and when it closes: they may lag by up "
      "to\n"
      "                  %u sends per open writer%s\n",
      uvbus::shm_writer::kCounterFlushEvery, uvbus::shm_writer::kCounterFlushEvery,
      m.records_written < m.records_read ? " (they lag now: records_written < records_read)" : "");
}

// inspect --json: the same fields as one JSON object.
void inspect_json(const char* url, uvbus::errc e, const uvbus::shm_region_info& i) {
  const auto& m = i.metrics;
  std::printf("{\"region\":%s,\"layout\":%s,\"version\":%u,\"region_size\":%" PRIu64
              ",\"ring_bytes\":%" PRIu64 ",\"node_size\":%u,\"max_record_size\":%u,",
              json_str(url).c_str(),
              json_str(e == uvbus::errc::ok ? "valid" : uvbus::to_string(e)).c_str(), i.version,
              i.region_size, i.ring_bytes, i.node_size, i.max_record_size);
  std::printf(
      "\"reader\":{\"pid\":%u,\"state\":%u,\"alive\":%s,\"sleeping\":%s,"
      "\"incarnation\":%u},",
      i.owner_pid, i.reader_state, i.reader_alive ? "true" : "false",
      i.reader_sleeping ? "true" : "false", i.reader_incarnation);
  std::printf("\"write_pos\":%" PRIu64 ",\"read_pos\":%" PRIu64 ",\"consumed_pos\":%" PRIu64
              ",\"fill_bytes\":%" PRIu64 ",\"capacity_bytes\":%" PRIu64 ",",
              i.write_pos, i.read_pos, i.consumed_pos, m.fill_bytes, m.capacity_bytes);
  std::printf(
      "\"records_written\":%" PRIu64 ",\"records_read\":%" PRIu64 ",\"queue_full\":%" PRIu64
      ",\"abandoned\":%" PRIu64 ",\"checksum_failures\":%" PRIu64 ",\"corrupt\":%" PRIu64 "}\n",
      m.records_written, m.records_read, m.queue_full, m.abandoned, m.checksum_failures, m.corrupt);
}

int inspect_main(const char* url, bool json) {
  uvbus::shm_region_info i;
  std::string why;  // what is wrong with the URL (bad_url): the parser's reason
  const uvbus::errc e = uvbus::shm_inspect(url, &i, &why);
  if (e != uvbus::errc::ok && e != uvbus::errc::bad_layout) {
    std::fprintf(stderr, "%s: %s%s%s\n", url, uvbus::to_string(e), why.empty() ? "" : ": ",
                 why.c_str());
    return kExitUsage;
  }
  if (json) {
    inspect_json(url, e, i);
    return e == uvbus::errc::ok ? kExitOk : kExitUnusable;
  }
  const char* states[] = {"initialising", "open", "closed", "closed with keep (will come back)"};
  const auto& m = i.metrics;
  const double fill_pct = m.capacity_bytes ? 100.0 * static_cast<double>(m.fill_bytes) /
                                                 static_cast<double>(m.capacity_bytes)
                                           : 0;
  std::printf("region            %s\n", url);
  std::printf("layout            %s\n", e == uvbus::errc::ok ? "valid" : uvbus::to_string(e));
  std::printf("magic             0x%016" PRIx64 "\n", i.magic);
  std::printf("version           %u\n", i.version);
  std::printf("header_size       %u\n", i.header_size);
  std::printf("region_size       %" PRIu64 "\n", i.region_size);
  std::printf("ring_bytes        %" PRIu64 "\n", i.ring_bytes);
  std::printf("node_size         %u\n", i.node_size);
  std::printf("max_record_size   %u\n", i.max_record_size);
  std::printf("abandon_timeout   %u us\n", i.abandon_timeout_us);
  std::printf("huge_pages        %s\n", i.huge_pages ? "yes" : "no");
  std::printf("reader            pid %u, start time %" PRIu64 ", state %s, %s%s, incarnation %u\n",
              i.owner_pid, i.owner_start_time, i.reader_state < 4 ? states[i.reader_state] : "?",
              i.reader_alive ? "alive" : "NOT alive", i.reader_sleeping ? ", sleeping" : "",
              i.reader_incarnation);
  std::printf("write_pos         %" PRIu64 " nodes\n", i.write_pos);
  std::printf("read_pos          %" PRIu64 " nodes\n", i.read_pos);
  std::printf("consumed_pos      %" PRIu64 " nodes\n", i.consumed_pos);
  std::printf("fill              %" PRIu64 " / %" PRIu64 " bytes (%.1f%%)\n", m.fill_bytes,
              m.capacity_bytes, fill_pct);
  print_counters(m);
  return e == uvbus::errc::ok ? kExitOk : kExitUnusable;
}

// Where --drain's records go. With --out each record is flushed to FILE before the next one is
// consumed (the drain reads one record per batch then): a write that fails (a full disk) stops
// the drain with that one record lost, said so, and the records behind it left in the region.
struct drain_sink {
  bool quiet = false;
  FILE* out = nullptr;
  const char* out_name = nullptr;
  int write_errno = 0;  // the first failed write to out (0: none)
  uint64_t records = 0;
  uint64_t bytes = 0;
  void take(const uvbus::shm_record* r, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      ++records;
      bytes += r[i].size;
      if (!quiet) std::printf("record %" PRIu64 ": %zu bytes, checksum ok\n", records, r[i].size);
      if (out != nullptr && write_errno == 0) {
        const auto len = static_cast<uint32_t>(r[i].size);
        const uint8_t le[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                               static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
        errno = 0;
        if (std::fwrite(le, 1, 4, out) != 4 ||
            std::fwrite(r[i].data, 1, r[i].size, out) != r[i].size || std::fflush(out) != 0) {
          write_errno = errno != 0 ? errno : EIO;
        }
      }
    }
  }
};

int refusal(const char* url, uvbus::errc e, const std::string& detail) {
  std::fprintf(stderr, "%s: %s: %s\n", url, uvbus::to_string(e), detail.c_str());
  if (e == uvbus::errc::busy) return kExitLiveReader;
  return e == uvbus::errc::bad_layout ? kExitUnusable : kExitUsage;
}

// Reads every record of a region whose reader is gone, with the region's own geometry. Stops
// once nothing arrived for 200 ms and twice the abandon timeout (a record a dead writer left
// half-written is skipped after the abandon timeout, and the records behind it then flow).
int drain_main(const char* url, drain_sink* sink) {
  uvbus::shm_region_info i;
  std::string why;
  uvbus::errc e = uvbus::shm_inspect(url, &i, &why);
  if (e != uvbus::errc::ok) return refusal(url, e, why.empty() ? "cannot read its header" : why);
  if (i.reader_alive) return refusal(url, uvbus::errc::busy, "a live reader owns it");
  uvbus::shm_config cfg;
  cfg.ring_bytes = i.ring_bytes;
  cfg.node_size = i.node_size;
  cfg.max_record_size = i.max_record_size;
  cfg.abandon_timeout_us = i.abandon_timeout_us != 0 ? i.abandon_timeout_us : 4000;
  cfg.must_exist = true;
  if (sink->out != nullptr) cfg.batch_max = 1;  // one record consumed per write (drain_sink)
  uvbus::shm_reader r({[sink](const uvbus::shm_record* recs, size_t n) { sink->take(recs, n); }});
  e = r.open(url, cfg);
  if (e != uvbus::errc::ok) return refusal(url, e, r.last_error().detail);
  const std::chrono::microseconds quiet_for(drain_quiet_us(cfg.abandon_timeout_us));
  auto last = std::chrono::steady_clock::now();
  while (sink->write_errno == 0 && std::chrono::steady_clock::now() - last < quiet_for) {
    if (r.poll(sink->out != nullptr ? 1 : 1024) > 0) {
      last = std::chrono::steady_clock::now();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  const uvbus::shm_metrics m = r.metrics();
  r.close(uvbus::shm_close_mode::keep);
  if (sink->write_errno != 0) {
    std::fprintf(stderr,
                 "%s: writing %s failed (%s): drain stopped after %" PRIu64
                 " records, 1 record consumed and not written; the rest stay in the region\n",
                 url, sink->out_name, std::strerror(sink->write_errno), sink->records);
    return kExitUsage;
  }
  std::printf("drained %s: %" PRIu64 " records, %" PRIu64 " bytes; skipped: %" PRIu64
              " checksum failures, %" PRIu64 " corrupt, %" PRIu64 " abandoned (region totals)\n",
              url, sink->records, sink->bytes, m.checksum_failures, m.corrupt, m.abandoned);
  std::printf(
      "the region stays (empty, reader closed with keep): uvbus_shm_inspect --remove %s "
      "deletes it\n",
      url);
  return kExitOk;
}

int remove_main(const char* url, bool force) {
  std::string detail;
  const uvbus::errc e = uvbus::shm_remove(url, force, &detail);
  if (e != uvbus::errc::ok) return refusal(url, e, detail);
  std::printf("%s\n", detail.c_str());
  return kExitOk;
}

// `--x` or `-x`: `-json` was taken for the region's URL (or refused as a second one, unnamed).
bool is_option(const std::string& s) {
  return s.size() > 1 && s[0] == '-';
}

// uvbus_shm_inspect [--drain|--remove] URL [...] (argv[0] the program name), stdout unchecked.
int shm_run(int argc, char** argv) {
  const char* url = nullptr;
  const char* out = nullptr;
  bool drain = false, remove = false, force = false, quiet = false, json = false;
  std::set<std::string> given;  // an option given twice (`--out A --out B` took B): refused
  for (int a = 1; a < argc; ++a) {
    const std::string s = argv[a];
    if (s == "--help" || s == "-h") {
      usage(stdout);
      return kExitOk;
    }
    if (is_option(s) && !given.insert(s).second) {
      std::fprintf(stderr, "uvbus shm: option %s given twice\n", argv[a]);
      usage(stderr);
      return kExitUsage;
    }
    if (s == "--drain") {
      drain = true;
    } else if (s == "--remove") {
      remove = true;
    } else if (s == "--force") {
      force = true;
    } else if (s == "--quiet") {
      quiet = true;
    } else if (s == "--json") {
      json = true;
    } else if (s == "--out" && a + 1 < argc) {
      out = argv[++a];
    } else if (!is_option(s) && url == nullptr) {
      url = argv[a];
    } else {
      // Each refusal names the argument (the usage text alone said nothing of what was wrong).
      std::fprintf(stderr,
                   s == "--out"   ? "uvbus shm: %s needs a value\n"
                   : is_option(s) ? "uvbus shm: unknown option '%s'\n"
                                  : "uvbus shm: unexpected argument '%s'\n",
                   argv[a]);
      usage(stderr);
      return kExitUsage;
    }
  }
  const char* why = url == nullptr              ? "no region URL"
                    : drain && remove           ? "--drain and --remove together"
                    : force && !remove          ? "--force only with remove"
                    : quiet && !drain           ? "--quiet only with drain"
                    : out != nullptr && !drain  ? "--out only with drain"
                    : json && (drain || remove) ? "--json only with inspect"
                                                : nullptr;
  if (why != nullptr) {
    std::fprintf(stderr, "uvbus shm: %s\n", why);
    usage(stderr);
    return kExitUsage;
  }
  // A mem:// region lives in one process's heap: this process can only ever find none (it said
  // not_found, as if the region were merely not created yet).
  if (std::strncmp(url, "mem://", 6) == 0) {
    std::fprintf(stderr,
                 "%s: a mem:// region lives inside the process that created it: no other process "
                 "can inspect, drain or remove it (use shm:// for a region tools can reach)\n",
                 url);
    return kExitUsage;
  }
  if (remove) return remove_main(url, force);
  if (!drain) return inspect_main(url, json);
  drain_sink sink;
  sink.quiet = quiet;
  if (out != nullptr) {
    sink.out = std::fopen(out, "ab");
    if (sink.out == nullptr) {
      std::fprintf(stderr, "%s: cannot open %s\n", url, out);
      return kExitUsage;
    }
  }
  sink.out_name = out;
  const int rc = drain_main(url, &sink);
  if (sink.out != nullptr && std::fclose(sink.out) != 0 && rc == kExitOk) {
    std::fprintf(stderr, "%s: closing %s failed: %s\n", url, out, std::strerror(errno));
    return kExitUsage;
  }
  return rc;
}

}  // namespace

// uvbus_shm_inspect [--drain|--remove] URL [...]: argv[0] is the program name.
int shm_inspect_legacy_main(int argc, char** argv) {
  const int rc = shm_run(argc, argv);
  // Output that could not be written (stdout on a full disk, closed) is a write error (2), named:
  // `uvbus shm inspect URL >/dev/full` exited 0 with the header lost.
  if (rc != kExitLiveReader && rc != kExitUsage && stdout_failed("shm")) return kExitUsage;
  return rc;
}

// uvbus shm inspect|drain|remove URL [...]: the same options and exit status as
// uvbus_shm_inspect (argv[0] is "shm").
int shm_main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "usage: uvbus shm inspect URL [--json] | drain URL [--quiet] [--out FILE] |"
                 " remove URL [--force]\n"
                 "(the same as uvbus_shm_inspect URL | --drain URL ... | --remove URL ...;"
                 " details below)\n\n");
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 || stdout_failed("shm") ? kExitUsage : kExitOk;
  }
  const std::string verb = argv[1];
  std::vector<char*> args;
  args.push_back(argv[0]);
  std::string flag = verb == "drain" ? "--drain" : "--remove";
  if (verb == "drain" || verb == "remove") {
    args.push_back(&flag[0]);
  } else if (verb != "inspect") {
    std::fprintf(stderr, "uvbus shm: unknown action '%s' (inspect, drain or remove)\n",
                 verb.c_str());
    return kExitUsage;
  }
  for (int a = 2; a < argc; ++a) {
    // The verb says what to do: `inspect --remove URL` removed the region it was to only read.
    if (std::strcmp(argv[a], "--drain") == 0 || std::strcmp(argv[a], "--remove") == 0) {
      std::fprintf(stderr, "uvbus shm %s: unknown option '%s' (the action is the verb)\n",
                   verb.c_str(), argv[a]);
      return kExitUsage;
    }
    args.push_back(argv[a]);
  }
  return shm_inspect_legacy_main(static_cast<int>(args.size()), args.data());
}

}  // namespace uvbus_tool
