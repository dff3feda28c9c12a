// uvbus_shm_inspect <url>: prints a shared-memory region's header, fill and counters without
// attaching to it as a reader or writer (like libatbus's show_shm_channel).
//
//   uvbus_shm_inspect shm://name      uvbus_shm_inspect shm://0x1234
//
// Exit status: 0 region valid, 1 not a valid uvbus region (what could be read is still printed),
// 2 usage or open error.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "uvbus/shm.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::strcmp(argv[1], "--help") == 0) {
    std::fprintf(stderr, "usage: uvbus_shm_inspect shm://name | shm://0xKEY | shm://KEY\n");
    return 2;
  }
  uvbus::shm_region_info i;
  const uvbus::errc e = uvbus::shm_inspect(argv[1], &i);
  if (e != uvbus::errc::ok && e != uvbus::errc::bad_layout) {
    std::fprintf(stderr, "%s: %s\n", argv[1], uvbus::to_string(e));
    return 2;
  }
  const char* states[] = {"initialising", "open", "closed"};
  const auto& m = i.metrics;
  const double fill_pct = m.capacity_bytes ? 100.0 * static_cast<double>(m.fill_bytes) /
                                                 static_cast<double>(m.capacity_bytes)
                                           : 0;
  std::printf("region            %s\n", argv[1]);
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
  std::printf("reader            pid %u, start time %" PRIu64 ", state %s, %s%s\n", i.owner_pid,
              i.owner_start_time, i.reader_state < 3 ? states[i.reader_state] : "?",
              i.reader_alive ? "alive" : "NOT alive", i.reader_sleeping ? ", sleeping" : "");
  std::printf("write_pos         %" PRIu64 " nodes\n", i.write_pos);
  std::printf("read_pos          %" PRIu64 " nodes\n", i.read_pos);
  std::printf("fill              %" PRIu64 " / %" PRIu64 " bytes (%.1f%%)\n", m.fill_bytes,
              m.capacity_bytes, fill_pct);
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
  std::printf(
      "note              writer-side counters (records_written, bytes_written, queue_full,\n"
      "                  writers' abandoned, wakeups) are published by each writer every %u "
      "sends,\n"
      "                  when it wakes a sleeping reader and when it closes: they may lag by up "
      "to\n"
      "                  %u sends per open writer%s\n",
      uvbus::shm_writer::kCounterFlushEvery, uvbus::shm_writer::kCounterFlushEvery,
      m.records_written < m.records_read ? " (they lag now: records_written < records_read)" : "");
  return e == uvbus::errc::ok ? 0 : 1;
}
