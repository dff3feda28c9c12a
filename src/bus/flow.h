// Flows: the per-(source, target) state behind end-to-end delivery — the source's retransmit
// buffer of unacknowledged messages (tx_flow) and the target's in-order position (rx_flow).
// The logic that drives them is node_flow.cpp; docs/bus.md "Flows" states the guarantees.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/ring_fifo.h"
#include "uvbus/error.h"
#include "uvbus/histogram.h"
#include "uvbus/subnet.h"

namespace uvbus::detail {

// A flow's retransmit buffer starts at this size and doubles as it fills; an idle flow's goes.
inline constexpr size_t kFlowStoreMin = 16384;
// ... and an idle flow's ring of entries goes when it holds room for more than this many.
inline constexpr size_t kFlowEntriesKept = 256;

// Whole messages (header + body) of one flow, in sequence order, in one growable ring of bytes
// (node_flow.cpp allocates in it). A message is stored contiguously: when it does not fit before
// the end of the buffer it starts at offset 0 and the rest of the buffer waits until the ring has
// wrapped past it. The ring is "wrapped" when tail <= the front message's offset.
struct byte_ring {
  std::unique_ptr<uint8_t[]> buf;
  size_t cap = 0;
  size_t tail = 0;  // next free byte
};

// One unacknowledged (or not yet sent) message of a flow.
struct tx_entry {
  uint64_t seq = 0;
  uint64_t message_id = 0;  // what send_data() returned; the report carries it
  size_t offset = 0;        // in the flow's byte_ring
  uint32_t size = 0;
  bool settled = false;  // reported failed while later messages were still unacknowledged
  bool any = false;      // sent by send_any(): fails at once when its target leaves (fan_departed)
  uint64_t deadline_ms = 0;
  uint64_t sent_ns = 0;  // first send (node_config::latency_histograms; 0 when off)
};
static_assert(sizeof(tx_entry) == 48, "docs/bus.md counts 48-byte entries");

struct tx_flow {
  bus_id target = 0;
  uint64_t next_seq = 1;     // the sequence the next message gets
  uint64_t next_unsent = 1;  // the first message not handed to a channel since the last resend
  uint64_t acked = 0;        // highest sequence the target acknowledged
  uint64_t high_sent = 0;    // highest sequence ever handed to a channel (resends are below it)
  uint64_t peer_incarnation = 0;  // the target's incarnation in its last acknowledgement
  // The target must be told to skip settled sequences: the next transmission of the first
  // unsettled message (the front of `entries`, or a new message when none waits) carries flag_sync.
  // Never a later one: flag_sync says every sequence before it is settled, so a target that missed
  // an unsettled one before it would skip it, drop its resend as a duplicate and acknowledge it as
  // delivered. A later message goes without it; the target asks for the gap, or the resend timer's
  // probe (which flags the front) tells it.
  bool need_sync = true;
  bool blocked = false;           // a transmission met a full queue: retried by the flow timer
  bool user_blocked = false;      // send_data() got queue_full here: on_writable when it drains
  uint64_t last_progress_ms = 0;  // last acknowledgement that advanced, or the first send
  uint64_t resend_ms = 0;         // when the last resend started
  uint64_t resend_from = 0;       // ... and from which sequence (drop notices)
  uint32_t rto_ms = 0;            // current retransmission timeout (backs off while no progress)
  uint32_t srtt_ms = 0;           // smoothed send-to-acknowledgement time (0: no sample yet)
  size_t bytes = 0;               // bytes held in entries
  ring_fifo<tx_entry> entries;    // in sequence order, contiguous: entries[i].seq = front + i
  byte_ring store;
  std::unique_ptr<latency_histogram> latency;  // send-to-acknowledgement (latency_histograms)
  // Its series at the last metrics render (node_metrics.cpp): none yet, its own, or summed under
  // target="other" (its samples since are recorded there too).
  enum class series : uint8_t { none, own, other };
  mutable series metrics_series = series::none;
};

// A flow whose full retransmit buffer refused a send (queue_full) and is at most half full again
// (acknowledged, or settled: refused for good, past its deadline, its send_any target gone):
// on_writable is owed. max_*: node_config::retransmit_max_messages and retransmit_max_bytes.
inline bool drained_to_half(const tx_flow& f, size_t max_messages, size_t max_bytes) {
  return f.user_blocked && f.entries.size() <= max_messages / 2 && f.bytes <= max_bytes / 2;
}

struct rx_flow {
  uint64_t epoch = 0;         // the source's flow epoch (0: none yet)
  uint64_t resync_epoch = 0;  // the epoch a resync request answers (one we hold no position for)
  uint64_t through = 0;       // highest sequence delivered in order
  uint32_t unacked = 0;       // delivered since the last acknowledgement
  uint8_t kind = 0;           // proto::ack_kind owed with the next acknowledgement
  bool queued = false;        // in node::impl::ack_queue
  // A sync message of a left epoch came since the current epoch's last message, at stale_since_ms.
  bool stale_seen = false;
  uint64_t last_nack_ms = 0;
  uint64_t last_rx_ms = 0;  // the current epoch's last message (a stale one does not count)
  uint64_t stale_since_ms = 0;
  // The epochs this flow switched away from, newest first, with the position each had. A
  // source's epochs are random, so only this tells a late message of a dead incarnation from a
  // new one's: it is stale, not taken — unless the current epoch falls silent while a left one
  // keeps sending sync messages (node_flow.cpp, rx_epoch: that one is live; it is taken back
  // at its position).
  struct left_epoch {
    uint64_t epoch = 0;
    uint64_t through = 0;
  };
  std::array<left_epoch, 2> left{};
  // The index in left of epoch e, or -1.
  [[nodiscard]] int left_index(uint64_t e) const {
    if (e == 0) return -1;
    if (e == left[0].epoch) return 0;
    return e == left[1].epoch ? 1 : -1;
  }
  // Switches to epoch e at position `at`: the current epoch (if any) becomes left[0], e (if it
  // was left) leaves the list, the oldest falls off.
  void switch_to(uint64_t e, uint64_t at) {
    const int taken = left_index(e);
    const std::array<left_epoch, 2> was = left;
    left = {};
    size_t n = 0;
    if (epoch != 0) left[n++] = {epoch, through};
    for (int k = 0; k < 2 && n < 2; ++k) {
      if (k != taken && was[k].epoch != 0) left[n++] = was[k];
    }
    epoch = e;
    through = at;
    stale_seen = false;
  }
};

// One source's position in a node::flow_positions() blob (docs/protocol.md "Flow positions").
struct flow_position {
  uint64_t source = 0;
  uint64_t epoch = 0;
  uint64_t through = 0;
  std::array<rx_flow::left_epoch, 2> left{};
};
// Parses node `self`'s flow_positions() blob (this release's, or an earlier one's) into *out.
// The one parser of the blob: node::validate() and start() both use it (node_flow.cpp).
// protocol_error (not such a blob: cut short, or of a later release) or invalid_argument (another
// node's): *why says which, naming the sizes or both ids.
errc parse_flow_positions(uint64_t self, const uint8_t* p, size_t n,
                          std::vector<flow_position>* out, std::string* why);

// Target side: when a resync request last went to a source this node holds no position for (a
// resync needs no state: the source answers with a sync message, which makes it). A fixed table
// indexed by a hash of the source id, allocated at first use: sources that collide only cost an
// extra request, and memory does not grow with the number of (possibly forged) sources.
struct resync_limiter {
  struct slot {
    uint64_t source = 0;
    uint64_t epoch = 0;
    uint64_t at_ms = 0;
  };
  static constexpr size_t kSlots = 1024;
  std::unique_ptr<slot[]> slots;
  // Whether a request for (source, epoch) may go now (then noted as sent): not if one went less
  // than interval_ms ago.
  bool allow(uint64_t source, uint64_t epoch, uint64_t now_ms, uint64_t interval_ms) {
    if (!slots) slots = std::make_unique<slot[]>(kSlots);
    slot& s = slots[(source * 0x9E3779B97F4A7C15ULL) >> 54];  // the top 10 bits: kSlots
    if (s.source == source && s.epoch == epoch && now_ms - s.at_ms < interval_ms) return false;
    s = {source, epoch, now_ms};
    return true;
  }
};
static_assert(resync_limiter::kSlots == size_t{1} << 10, "allow() indexes with 10 bits");

}  // namespace uvbus::detail
