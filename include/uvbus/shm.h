// Shared-memory and in-process memory channels: a ring with many writers and one reader.
//
//   shm://name  (or shm:///name)   POSIX shm_open("/name") + mmap, mode 0600 by default
//   shm://0x1234  or  shm://4660   a SysV segment (shmget key), removed by the reader's close
//   mem://name                     the same ring in ordinary memory, for threads of one process
//
// The reader creates the region (shm_reader::open), writers attach to it (shm_writer::open). A
// writer copies each message into the ring and commits it; the reader delivers committed records
// in reservation order, verifying a checksum on every record (CRC-32C; MurmurHash3 in regions of
// layout version 3: shm_config::layout_version). The region is a
// persistent inbox: when its reader dies (or closes with shm_close_mode::keep) the region and its
// records stay, writers keep committing, and the next reader of the same URL with a compatible
// shm_config reattaches and resumes from the consumed cursor kept in the region (docs/shm.md,
// "Restart and reattach"). Nothing blocks: a full
// ring makes send() fail at once with queue_full; a writer that dies or stalls between reserving
// and committing a record is skipped by the reader after `abandon_timeout_us` of monotonic wall
// time, and if it was merely slow its send() then reports errc::abandoned (the message was NOT
// delivered) — a message is never lost silently.
//
// Threads: a shm_reader belongs to the thread that constructs it, which must run its loop; every
// member function checks this (debug builds abort naming the function, release builds fail with
// errc::wrong_thread). A shm_writer has no loop and is not bound to a thread (unless coalesce()
// gave it one): one writer object may be used from any thread, by one thread at a time (not
// checked: it costs an atomic per send); any number of writer objects (in any threads or processes)
// may send into the same region concurrently. The region's layout, memory orders and crash-safety
// argument are in docs/shm.md.
//
// Contract shared by every call taking a callback (from libuv): when a function which takes a
// callback returns an error, the callback will never be called.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "uvbus/address.h"
#include "uvbus/buffer.h"
#include "uvbus/error.h"
#include "uvbus/log.h"

typedef struct uv_loop_s uv_loop_t;  // NOLINT(modernize-use-using): matches libuv's declaration

namespace uvbus {

namespace shm_detail {
struct writer_access;  // the test hook's door (src/shm/test_hook.h); not part of the API
}

// Region parameters chosen by the reader at creation. Writers read them from the region header.
struct shm_config {
  // Bytes of the ring's data (the region is this plus a 4096-byte header and an 8-byte head per
  // node: shm_region_size()). A power of two, at least 16 nodes. Default 8 MiB.
  size_t ring_bytes = size_t{8} << 20;
  // Records occupy whole nodes (8-byte length/checksum prefix + payload, rounded up). A power of
  // two in [64, 4096]; 64 suits small messages.
  uint32_t node_size = 64;
  // Largest payload accepted by send(). Must fit in half the ring and in 65535 nodes.
  uint32_t max_record_size = 256 * 1024;
  // A record reserved but not committed for this long (CLOCK_MONOTONIC, wall time, not CPU
  // time) is skipped and counted as abandoned.
  uint32_t abandon_timeout_us = 4000;
  // Nodes of a skipped record are not reused until its writer acknowledged the skip (it does so
  // in send() when it finds out) or this much more time passed (a dead writer never
  // acknowledges). Guards a stalled writer's late copy from landing on newer records: must not
  // be 0 (shm_validate refuses it: every skipped record's nodes would be reused at once).
  uint32_t reclaim_timeout_us = 1000000;
  // Reader on a loop: after the ring runs dry it keeps polling (loop turns without blocking) for
  // this long before it goes to sleep on the futex. 0 = sleep at once (lowest CPU, ~tens of µs
  // wake-up), larger = lower latency under bursty traffic at the cost of CPU while polling.
  uint32_t spin_us = 50;
  // Records handed to the callback per call at most (one batch). Also the most records delivered
  // per loop turn before other handles get a turn. 1..65536 (shm_max_reader_batch): open()
  // allocates the batch's array, 16 bytes a record, up front.
  uint32_t batch_max = 256;
  // Try huge pages (SysV SHM_HUGETLB, or madvise(MADV_HUGEPAGE) for POSIX/mem); silently falls
  // back to normal pages. shm_reader::huge_pages() tells whether the SysV segment or the advice
  // was taken; a POSIX region then gets huge pages where /dev/shm is mounted with huge=advise,
  // within_size or always (its pages are reserved through the advised mapping).
  bool huge_pages = false;
  // Permissions of a created POSIX or SysV region (its low 9 bits, exactly: the umask does not
  // apply).
  uint32_t mode = 0600;
  // open() only reattaches an existing region (its reader dead or closed with keep) and never
  // creates one: not_found when there is nothing to reattach. For operator tools
  // (uvbus_shm_inspect --drain), which must not leave a new region behind.
  bool must_exist = false;
  // The layout version of a region this reader creates: 0 = the newest (4: CRC-32C record
  // checksums), or 3 (MurmurHash3 checksums, about half as fast on large records) so that writers
  // built before version 4, which refuse a version 4 region with bad_layout, can still attach
  // while a fleet is upgraded. A reattached region keeps the version it was created with, and
  // writers of this build attach regions of either version.
  uint32_t layout_version = 0;
};

// How shm_reader::close leaves the region.
enum class shm_close_mode : uint8_t {
  // The region is marked closed for good and its name removed (shm_unlink / IPC_RMID / mem
  // registry): writers get not_connected, unread records are gone. close()'s default.
  remove,
  // The region stays, marked "reader closed, will come back": writers keep committing into the
  // ring (queue_full when it is full) and the next reader that opens the URL with a compatible
  // shm_config reattaches and reads every record not yet consumed, in order.
  keep,
};

// Options of a writer. Zero fields accept whatever the region says; non-zero fields must match
// the region exactly or open() fails with bad_layout.
struct shm_writer_options {
  size_t expect_ring_bytes = 0;
  uint32_t expect_node_size = 0;
};

// A delivered record: points into the ring, valid only during the callback that received it.
struct shm_record {
  const uint8_t* data;
  size_t size;
};

// Counters. Reader-side values come from the region header (all writers' totals where noted);
// writer-side values from shm_writer::metrics() are that writer object's own.
struct shm_metrics {
  uint64_t records_written = 0;  // committed records (region: all writers, may lag: see
                                 // shm_writer::kCounterFlushEvery)
  uint64_t bytes_written = 0;    // their payload bytes
  uint64_t records_read = 0;     // delivered to the reader's callback or try_receive
  uint64_t bytes_read = 0;
  uint64_t queue_full = 0;  // sends rejected because the ring had no room (a coalescing
                            // writer's flush(), loop-turn and timer retries refuse no send: not
                            // counted)
  uint64_t abandoned = 0;   // records the reader skipped because they were not committed in time
  // Reservations of the writer(s) that the reader skipped, learnt at commit: a send that
  // reported errc::abandoned, or a coalescing writer's copy of its stage, which it retries (up
  // to 3 times, each skipped copy counted, whether or not a send then reports it).
  uint64_t writer_abandoned = 0;
  uint64_t checksum_failures = 0;  // committed records whose checksum did not match (skipped)
  uint64_t corrupt = 0;            // record headers with impossible fields (skipped)
  // Sends rejected because the region was removed (writer side; a coalescing writer's flush(),
  // loop-turn and timer flushes refuse no send: what they drop counts in staged_dropped only).
  uint64_t not_connected = 0;
  uint64_t wakeups = 0;         // futex wake-ups issued by writers to a sleeping reader
  uint64_t batches = 0;         // callback batches (reader)
  uint64_t fill_bytes = 0;      // ring bytes reserved and not yet released by the reader
  uint64_t capacity_bytes = 0;  // ring size
  // Coalescing writers (shm_writer::coalesce) only: staged messages published (flushes: ring
  // reservations made for them; this writer's own), and staged messages that send() had accepted
  // (ok) but that never reached the ring (the region was removed, or close() or the destructor
  // could not publish the stage). staged_dropped is this writer's own in shm_writer::metrics(),
  // and the total of every writer of the region in the reader's metrics() and shm_region_info
  // (each writer adds its drops with its other counters, and always at close()).
  uint64_t coalesced_flushes = 0;
  uint64_t staged_dropped = 0;
};

// The reader's callbacks, given at construction or with shm_reader::set_callbacks.
struct shm_reader_callbacks {
  shm_reader_callbacks() = default;
  // From a records callback (and a log one): `shm_reader r({[](auto* recs, size_t n) {...}})`.
  shm_reader_callbacks(  // NOLINT(google-explicit-constructor): brace-initialised by design
      std::function<void(const shm_record* records, size_t count)> records, log_fn log = {})
      : on_records(std::move(records)), on_log(std::move(log)) {}

  // A batch of 1..batch_max records, in ring order.
  //   Consumed: the region's consumed cursor moves past a batch only after this callback returns
  //     for it. If the process dies inside the callback, the next reader that reattaches the
  //     region delivers that batch's records again (and nothing delivered in earlier batches);
  //     records after a stop() or close() in the callback were not handed out and are delivered
  //     once. Delivery across a reader crash is thus at-least-once, the duplicates being at most
  //     the one callback batch that was running (at most batch_max records).
  //   Thread: the reader's thread: from its loop once start()ed, or inside poll().
  //   Records: point into the ring, valid only until the callback returns (their nodes are then
  //     released to writers): copy what must outlive it. Nothing is allocated per record.
  //   Re-entrancy: may call stop() (no further batch is delivered, the records already handed
  //     over stay valid until return) and close() (takes effect when the callback returns; no
  //     callback after it); metrics() and the other const calls too. Not set_callbacks
  //     (wrong_state), poll() or try_receive() (0 / wrong_state).
  //   Destruction: the reader must NOT be destroyed from inside its own callback (that aborts
  //     with a message); call close() there and destroy it afterwards.
  std::function<void(const shm_record* records, size_t count)> on_records;
  // Log lines about records the reader skipped (a writer that did not commit in time: warn; a
  // checksum failure or an impossible record header: error), with the counts since the last
  // line, and once after an open() that reattached a region (info: from the first pass of the
  // loop after start(), or of poll(); never inside start()). Rate limited (uvbus/log.h). Same
  // thread as on_records, never inside it. Re-entrancy as on_records: it may call close() (takes
  // effect when the pass ends, no line after it) and the const calls; set_callbacks is
  // wrong_state; the reader must not be destroyed inside it (that aborts with a message).
  log_fn on_log;
};

// Read-only view of a region header, for tools (uvbus_shm_inspect) and tests.
struct shm_region_info {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t header_size = 0;
  uint64_t region_size = 0;
  uint64_t ring_bytes = 0;
  uint32_t node_size = 0;
  uint32_t max_record_size = 0;
  uint32_t abandon_timeout_us = 0;
  uint32_t owner_pid = 0;
  uint64_t owner_start_time = 0;  // the reader's process start time (clock ticks since boot)
  uint32_t reader_state = 0;      // 0 initialising, 1 open (or its reader died), 2 closed for good,
                                  // 3 closed with shm_close_mode::keep (will come back)
  uint32_t reader_incarnation = 0;  // 1 at creation, +1 at every reattach
  bool reader_alive = false;        // state open and owner process alive (same start time)
  bool huge_pages = false;
  uint64_t write_pos = 0;     // node positions (monotonic, never wrap)
  uint64_t read_pos = 0;      // nodes released to writers
  uint64_t consumed_pos = 0;  // where a reattaching reader resumes (read_pos <= it <= write_pos)
  bool reader_sleeping = false;
  shm_metrics metrics;  // records_*/bytes_*, queue_full, abandoned, checksum/corrupt, fill
};

// Reads a region's header without attaching as reader or writer. Errors: bad_url,
// unsupported_scheme, not_found, permission_denied, not_connected (its reader has not finished
// creating it), bad_layout (not a uvbus region, or the header is inconsistent; *out still holds
// what could be read).
[[nodiscard]] errc shm_inspect(std::string_view url, shm_region_info* out);
// The same, and on bad_url or unsupported_scheme *detail (if given) says what is wrong with the
// URL, as parse_address does ("\"0x\" is not a SysV key ..."), or that a valid URL of another
// scheme (ipv4://, unix://) names no region; else it is left empty.
[[nodiscard]] errc shm_inspect(std::string_view url, shm_region_info* out, std::string* detail);

// Removes a region's name for good (uvbus_shm_inspect --remove): marks it closed (its writers
// then get not_connected) and shm_unlinks / IPC_RMIDs it. Refuses a region whose reader is alive
// (busy) and an object that is not a uvbus region (bad_layout) unless force. Errors also as
// shm_inspect. *detail (if given) says what was done or why not.
[[nodiscard]] errc shm_remove(std::string_view url, bool force = false,
                              std::string* detail = nullptr);

// Bytes a region with this config occupies (header + ring); 0 if the config is invalid.
[[nodiscard]] size_t shm_region_size(const shm_config& cfg) noexcept;

// Checks a config: invalid_argument if a size is not a power of two, out of range, or the record
// limit does not fit. *detail (if given) then names the field, its value and the rule, e.g.
// "shm_config.node_size (100) must be a power of two in [64, 4096]".
[[nodiscard]] errc shm_validate(const shm_config& cfg, std::string* detail = nullptr);
// The largest shm_config::batch_max shm_validate accepts.
inline constexpr uint32_t shm_max_reader_batch = 65536;

// Writes a fresh, empty region (header + ring) with this config into caller-owned memory of at
// least shm_region_size(cfg) bytes, 64-byte aligned. For tests and fuzzing, together with
// shm_reader::open_image / shm_writer::open_image. Errors: invalid_argument.
[[nodiscard]] errc shm_format_image(void* mem, size_t size, const shm_config& cfg) noexcept;

class shm_reader {
 public:
  explicit shm_reader(shm_reader_callbacks cbs = {});
  ~shm_reader();  // close()
  shm_reader(const shm_reader&) = delete;
  shm_reader& operator=(const shm_reader&) = delete;

  // Replaces the callbacks. Errors: wrong_state (from inside a callback), invalid_argument (no
  // on_records while started: its records would be consumed unseen; stop() first).
  [[nodiscard]] errc set_callbacks(shm_reader_callbacks cbs);

  // Creates the region named by url (shm:// or mem://) and becomes its only reader, or
  // REATTACHES an existing one: a region whose reader is dead (POSIX: its flock is gone; SysV:
  // owner pid + start time no longer alive) or closed with shm_close_mode::keep, and whose layout
  // is compatible with cfg (a layout version this build reads, which it keeps whatever
  // cfg.layout_version says; the same ring_bytes, node_size, max_record_size): its
  // records are kept, this reader takes ownership (new owner pid, incarnation + 1) and delivers
  // every record not yet consumed, in order, from the consumed cursor stored in the region (see
  // on_records for what a crash redelivers); every record is still checksum-checked and records
  // a writer abandoned mid-write are still skipped. reattached() tells which happened. A region
  // closed for good whose name was not removed yet, or whose creator died before publishing it,
  // is replaced (it holds no records).
  // Errors: bad_url (also an address given directly that parse_address would not give: SysV key
  // 0, which is IPC_PRIVATE; an empty name, one with a NUL or '/', over 200 bytes, "." or ".."),
  // unsupported_scheme, invalid_argument (cfg), busy (a live reader owns it),
  // bad_layout (an object of that name is not a uvbus region, or the existing region is
  // incompatible with cfg: last_error().detail names the field, the region's value and the
  // requested one, and how to clear it with uvbus_shm_inspect --drain / --remove; the region is
  // left intact, never wiped), not_found (cfg.must_exist and nothing to reattach),
  // permission_denied, no_memory (also: a POSIX region's pages are reserved in /dev/shm at open,
  // so one larger than its free room is refused here, the detail naming the size and /dev/shm,
  // instead of a SIGBUS in a writer later; a reattached region left intact), io_error,
  // wrong_state (already open). On an error last_error() names the URL and what was wrong.
  [[nodiscard]] errc open(std::string_view url, const shm_config& cfg = {});
  [[nodiscard]] errc open(const address& addr, const shm_config& cfg = {});

  // Testing and fuzzing: reads the region image at mem (size bytes, caller-owned, 64-byte aligned,
  // must outlive the reader) without creating, formatting or removing anything, and without any
  // liveness logic. Every header field is checked (bad_layout); every offset and length read from
  // the ring afterwards is bounds-checked, so a corrupt or hostile image can make the reader skip
  // and count records but never crash it, read outside [mem, mem+size) or loop forever.
  // cfg supplies only the reader-local knobs (timeouts, spin, batch_max); it must pass
  // shm_validate (invalid_argument, the detail naming the field).
  [[nodiscard]] errc open_image(void* mem, size_t size, const shm_config& cfg = {});

  // Drains the ring from `loop` (run by this thread): on_records gets batches on the loop
  // thread. When the ring runs dry the reader polls for spin_us, then a small helper thread
  // sleeps on the region's futex word and wakes the loop with uv_async_send when a writer commits
  // (or when an in-flight record's abandon timeout expires). The helper looks at the ring itself
  // at least every 200 ms, so a writer stopped or killed between taking the wake-up and sending it
  // delays delivery by at most that (plus abandon_timeout_us when a writer also died mid-record
  // at the head), never for ever. Keeps the loop alive until stop() or
  // close(). Errors: closed (not open), wrong_state (already started), invalid_argument (null
  // loop or no on_records), io_error (thread or libuv handle creation failed).
  [[nodiscard]] errc start(uv_loop_t* loop);
  // Stops delivering (idempotent; callable from the callback). start() may be called again.
  void stop();

  // Polling API (not while started): delivers up to max_records committed records to on_records
  // in batches, synchronously, before it returns; returns how many were delivered (0: nothing
  // ready, not open, started, or no on_records). Also advances abandon timeouts.
  [[nodiscard]] size_t poll(size_t max_records);
  // Copies the next record into buf (no callback). The checksum is verified on the copy in buf, so
  // the bytes returned are exactly the bytes verified. Errors: would_block (no record ready now;
  // retry later), buffer_too_small (*len = the record's size; it stays at the head), closed (not
  // open), wrong_state (started, or inside the callback). On an error buf's contents are
  // unspecified (a record skipped for a bad checksum may have been copied into it).
  [[nodiscard]] errc try_receive(void* buf, size_t cap, size_t* len);

  // Stops and closes the region as `mode` says (shm_close_mode: remove marks it closed for good
  // and removes its name, writers then get not_connected; keep leaves it for the next reader,
  // writers keep committing), then unmaps it. The consumed cursor in the region covers every
  // callback batch that returned. Idempotent. From inside the callback it takes effect when the
  // callback returns (that batch counts as consumed). Safe to destroy the object right after
  // close() returns (outside the callback), even before the loop runs again. The destructor and
  // close() without an argument use shm_close_mode::remove.
  void close();
  void close(shm_close_mode mode);
  // Whether the last successful open() reattached an existing region (false: created it).
  [[nodiscard]] bool reattached() const noexcept;

  [[nodiscard]] bool is_open() const noexcept;
  [[nodiscard]] shm_metrics metrics() const noexcept;
  [[nodiscard]] bool huge_pages() const noexcept;
  [[nodiscard]] size_t ring_bytes() const noexcept;
  [[nodiscard]] size_t max_record_size() const noexcept;
  // The last failed open()/open_image()/start(): its code and a detail naming the URL and the
  // rule that was violated. A call that returns ok leaves it unchanged.
  [[nodiscard]] error_info last_error() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;  // never null
};

class shm_writer {
 public:
  shm_writer();
  ~shm_writer();  // close()
  shm_writer(const shm_writer&) = delete;
  shm_writer& operator=(const shm_writer&) = delete;

  // Attaches to a region created by a reader. Checks every layout field (magic, version, header
  // size, region size against the mapped size, node size, ring size, record header size, record
  // limit) and the options' expectations. A region whose reader is dead or closed with
  // shm_close_mode::keep is attached: its records wait for the next reader. Errors: bad_url,
  // unsupported_scheme, not_found (no such region), not_connected (the region exists but its
  // reader has not finished creating it, or closed it for good), bad_layout, permission_denied,
  // io_error, wrong_state (already open).
  // On an error last_error() names the URL and what was wrong (which layout field, ...).
  [[nodiscard]] errc open(std::string_view url, const shm_writer_options& opt = {});
  [[nodiscard]] errc open(const address& addr, const shm_writer_options& opt = {});
  // Testing and fuzzing: writes into a caller-owned image (see shm_reader::open_image).
  [[nodiscard]] errc open_image(void* mem, size_t size, const shm_writer_options& opt = {});

  // Copies one message (the concatenation of the parts) into the ring as one record. Never blocks.
  //   ok                 committed; the reader will see it unless it finds its checksum broken.
  //                      Also while the reader is dead or closed with keep: the record waits in
  //                      the ring for the reader that reattaches (no reader may ever come: see
  //                      reader_alive())
  //   queue_full         no room now (retriable); a dead reader's ring stays full until a reader
  //                      reattaches or the region is removed
  //   not_connected      the region was removed: its reader closed it for good
  //                      (shm_close_mode::remove) or its name was removed (uvbus_shm_inspect
  //                      --remove, shm_unlink, IPC_RMID); or the writer is not open
  //   message_too_large  above the region's max_record_size
  //   abandoned          this writer stalled between reserve and commit for longer than the
  //                      abandon timeout and the reader skipped the record: NOT delivered
  // Allocates nothing and makes no syscall except a futex wake when the reader sleeps, and a
  // check that the region's name still exists (fstat / IPC_STAT) on the queue_full path (at most
  // once a millisecond) and every 65536 sends. Wake-ups go through the futex word in the region,
  // so they reach a reader that reattached after this writer attached (a reattaching reader also
  // polls the ring when it starts).
  [[nodiscard]] errc send(const void* data, size_t len) noexcept;
  // Gather send: the concatenation of parts[0..count) as one record. Same results as send().
  [[nodiscard]] errc sendv(const const_buffer* parts, size_t count) noexcept;

  // Sends `count` messages (each span is one whole message) as one batch: one reservation, one
  // commit, so the ring's shared words are touched once for the whole batch instead of once per
  // message — the way to carry many small messages fast. All or nothing: on ok every message is
  // committed and the reader delivers them in order, each verified by its own checksum (a
  // message whose checksum fails is skipped and counted alone); on any error none of them will
  // be delivered and the same batch may be sent again. The reader may hand them to its callback
  // split over several batches of records. Errors as send(), plus:
  //   message_too_large  the sum of batch_bytes(size) over the messages exceeds max_record_size()
  //   invalid_argument   count > kMaxBatch
  // count == 0 is ok (nothing sent); count == 1 is the same as send(). Allocates nothing.
  static constexpr size_t kMaxBatch = 1024;
  // A writer adds its counts to the region's shared counters (shm_region_info, the reader's
  // metrics().records_written ...) every this many sends, when it wakes a sleeping reader and at
  // close(): the region's writer-side totals may lag by up to this many sends per open writer.
  static constexpr uint32_t kCounterFlushEvery = 1024;
  [[nodiscard]] errc send_batch(const const_buffer* msgs, size_t count) noexcept;
  // Bytes one message of `size` bytes takes of a batch's max_record_size() budget.
  [[nodiscard]] static constexpr size_t batch_bytes(size_t size) noexcept {
    return 8 + ((size + 7) & ~size_t{7});
  }

  // ---- Coalescing (opt-in; docs/shm.md "Coalescing writer") ----
  // Switches this writer to coalescing: from now on send()/sendv() copy each message into a
  // private staging area of `stage_bytes` (default kDefaultStageBytes, at most max_record_size())
  // and return; the staged messages go into the ring together as ONE batch reservation (the
  // send_batch record, every message with its own checksum) when flush() is called, when the
  // stage is full, before any send_batch()/sendv_now(), at close(), and — if `loop` is given —
  // at the end of every turn of that loop (uv_prepare and uv_check handles, unreferenced: they
  // never keep the loop alive). With a loop the writer belongs to that loop's thread.
  //   What ok means then: the message is accepted and will be in the ring, in send order, by
  //   the end of the loop turn (or the next flush()) — unless, first:
  //   - the region is removed (then it is dropped as the records already in the ring are);
  //   - close() or the destructor runs while the stage can not be published (the ring full, or
  //     the copy abandoned 3 times): it is dropped, and close() returns how many were;
  //   - this process dies (then it is lost, never torn: the ring only ever sees whole batches).
  //   The first two are never silent: they are counted in staged_dropped, this writer's and the
  //   region's (the reader's metrics(), shm_inspect, uvbus_shm_inspect).
  //   Back-pressure: a flush that finds the ring full keeps the stage and retries (at the next
  //   send, flush, loop turn, or every millisecond); meanwhile send() tries the flush again and
  //   returns queue_full if the ring is still full (nothing of that message is staged).
  //   not_connected / message_too_large / abandoned keep their meanings; a message larger than
  //   the stage is published alone, after the staged ones.
  // Errors: not_connected (not open), wrong_state (already coalescing), invalid_argument
  // (stage_bytes below 64), no_memory.
  static constexpr size_t kDefaultStageBytes = 4096;
  [[nodiscard]] errc coalesce(uv_loop_t* loop = nullptr,
                              size_t stage_bytes = kDefaultStageBytes) noexcept;
  [[nodiscard]] bool coalescing() const noexcept;
  // Publishes the staged messages now (one reservation): ok (also when nothing was staged),
  // queue_full (still staged, retried later), not_connected (dropped), abandoned (retried 3
  // times, still staged). Without coalesce() a no-op returning ok.
  [[nodiscard]] errc flush() noexcept;
  // Messages staged and not yet in the ring.
  [[nodiscard]] size_t staged() const noexcept;
  // Hands back each staged message this writer drops (the two cases above: the region removed,
  // or close() / the destructor unable to publish), oldest first, before they are counted:
  // [data, data + size) is the message as sent, valid during the call only. It runs inside the
  // call that drops them (a send, flush(), close(), the destructor, or the loop turn's flush), so
  // it must not destroy the writer, and a close() from there is refused (returns 0, last_error()
  // wrong_state; close after it returns); a send on it from there is staged afresh, except inside
  // close() or the destructor, where a send that would be staged returns closed. Replacing or
  // clearing the callback from inside it takes effect at the next drop (the rest of this one
  // still goes to it). Needs an open writer (a no-op otherwise); a relay uses it to tell the
  // sources of what it had accepted.
  void on_staged_dropped(std::function<void(const uint8_t* data, size_t size)> f);
  // The classic contract for one message on a coalescing writer: publishes the stage, then this
  // message as its own record; ok means it is committed in the ring (what a caller that reports
  // delivery needs). On a stage that can not be published it sends nothing (queue_full, ...).
  // Without coalesce() the same as sendv().
  [[nodiscard]] errc sendv_now(const const_buffer* parts, size_t count) noexcept;

  // True if the region's reader is open and its process alive (a kill(pid, 0) and a read of
  // /proc): false while it is dead or closed with keep, true again once a reader reattached.
  [[nodiscard]] bool reader_alive() const noexcept;
  // Detaches (the region itself belongs to the reader). Idempotent. A coalescing writer first
  // publishes its stage once; if that fails (the ring is full, the copy was abandoned 3 times, or
  // the region was removed) the staged messages, which send() had accepted, are dropped. Returns
  // how many were dropped (0 when nothing was staged, the flush succeeded, without coalesce(), or
  // already closed), and adds them to the region's staged_dropped counter, so a drop by the
  // destructor (which calls close() and can return nothing) shows in the reader's metrics() and
  // shm_inspect too. A caller that must drop nothing calls flush() until it returns ok (or gives
  // up knowing what is still staged(): the count) before close().
  size_t close();

  [[nodiscard]] bool is_open() const noexcept;
  [[nodiscard]] size_t max_record_size() const noexcept;
  // This writer's counters (records/bytes_written, queue_full, writer_abandoned, not_connected,
  // wakeups) plus the region's current fill and capacity.
  [[nodiscard]] shm_metrics metrics() const noexcept;
  // The last failed open()/open_image(): its code and a detail naming the URL and the rule that
  // was violated. A call that returns ok leaves it unchanged.
  [[nodiscard]] error_info last_error() const;

  struct impl;

 private:
  friend struct shm_detail::writer_access;
  std::unique_ptr<impl> impl_;
  error_info last_error_;
};

}  // namespace uvbus
