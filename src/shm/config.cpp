// Config validation, image formatting, read-only inspection and removal of a region.
#include <cstring>
#include <string>

#include "shm/region.h"
#include "uvbus/shm.h"

namespace uvbus {

using namespace shm_detail;

namespace {
bool is_pow2(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}
}  // namespace

namespace {
// The detail text is built only when the caller asked for it.
template <class F>
errc refuse(std::string* detail, F why) {
  if (detail != nullptr) *detail = "shm_config." + why();
  return errc::invalid_argument;
}
}  // namespace

errc shm_validate(const shm_config& cfg, std::string* detail) {
  if (!is_pow2(cfg.node_size) || cfg.node_size < kMinNodeSize || cfg.node_size > kMaxNodeSize) {
    return refuse(detail, [&] {
      return std::string("node_size (" + std::to_string(cfg.node_size) +
                         ") must be a power of two in [" + std::to_string(kMinNodeSize) + ", " +
                         std::to_string(kMaxNodeSize) + "]");
    });
  }
  if (!is_pow2(cfg.ring_bytes) || cfg.ring_bytes < cfg.node_size * kMinNodes ||
      cfg.ring_bytes > (uint64_t{1} << 46)) {
    return refuse(detail, [&] {
      return std::string("ring_bytes (" + std::to_string(cfg.ring_bytes) +
                         ") must be a power of two of at least " + std::to_string(kMinNodes) +
                         " nodes (" + std::to_string(cfg.node_size * kMinNodes) +
                         " bytes) and at most 2^46");
    });
  }
  const uint64_t nodes = cfg.ring_bytes / cfg.node_size;
  const uint64_t max_nodes =
      (uint64_t{cfg.max_record_size} + kRecordHeaderSize + cfg.node_size - 1) / cfg.node_size;
  if (cfg.max_record_size == 0 || max_nodes > kMaxRecordNodes || max_nodes > nodes / 2) {
    return refuse(detail, [&] {
      return std::string("max_record_size (" + std::to_string(cfg.max_record_size) +
                         ") must be non-zero and fit, with its 8-byte prefix, in half the "
                         "ring (" +
                         std::to_string(nodes / 2) + " nodes of " + std::to_string(cfg.node_size) +
                         " bytes) and in " + std::to_string(kMaxRecordNodes) + " nodes");
    });
  }
  if (cfg.batch_max == 0 || cfg.batch_max > shm_max_reader_batch) {
    return refuse(detail, [&] {
      return "batch_max (" + std::to_string(cfg.batch_max) + ") must be from 1 to " +
             std::to_string(shm_max_reader_batch) +
             " (open() allocates a batch array of that many records)";
    });
  }
  if (cfg.abandon_timeout_us == 0)
    return refuse(detail, [&] { return std::string("abandon_timeout_us must be non-zero"); });
  // 0 would reuse a skipped record's nodes at once, under a merely slow writer's late copy.
  if (cfg.reclaim_timeout_us == 0)
    return refuse(detail, [&] { return std::string("reclaim_timeout_us must be non-zero"); });
  if (cfg.layout_version != 0 &&
      (cfg.layout_version < kOldestVersion || cfg.layout_version > kVersion)) {
    return refuse(detail, [&] {
      return std::string("layout_version (" + std::to_string(cfg.layout_version) +
                         ") must be 0 (the newest) or from " + std::to_string(kOldestVersion) +
                         " to " + std::to_string(kVersion));
    });
  }
  return errc::ok;
}

size_t shm_region_size(const shm_config& cfg) noexcept {
  return shm_validate(cfg) == errc::ok ? region_bytes(cfg.ring_bytes, cfg.node_size) : 0;
}

errc shm_format_image(void* mem, size_t size, const shm_config& cfg) noexcept {
  if (shm_validate(cfg) != errc::ok || mem == nullptr || size < shm_region_size(cfg) ||
      (reinterpret_cast<uintptr_t>(mem) & 63) != 0) {
    return errc::invalid_argument;
  }
  format_header(mem, cfg, 0, false);
  return errc::ok;
}

errc shm_inspect(std::string_view url, shm_region_info* out) {
  return shm_inspect(url, out, nullptr);
}

errc shm_inspect(std::string_view url, shm_region_info* out, std::string* detail) {
  address addr;
  std::string why;
  if (detail != nullptr) detail->clear();
  if (const errc e = parse_address(url, &addr, &why); e != errc::ok) {
    if (detail != nullptr) *detail = std::move(why);
    return e;
  }
  if (addr.kind != scheme::shm && addr.kind != scheme::mem) {
    if (detail != nullptr) {
      *detail = std::string(url) + " names no region: only shm:// and mem:// URLs name one";
    }
    return errc::unsupported_scheme;
  }
  mapping m;
  if (const errc e = attach_region(addr, &m); e != errc::ok) return e;
  *out = shm_region_info{};
  errc result = errc::ok;
  if (m.size >= kHeaderSize) {
    auto* h = static_cast<region_header*>(m.base);
    out->magic = h->magic.load(std::memory_order_acquire);
    out->version = h->version;
    out->header_size = h->header_size;
    out->region_size = h->region_size;
    out->ring_bytes = h->ring_bytes;
    out->node_size = h->node_size;
    out->max_record_size = h->max_record_size;
    out->abandon_timeout_us = h->abandon_timeout_us;
    out->owner_pid = h->owner_pid.load(std::memory_order_relaxed);
    out->owner_start_time = h->owner_start_time.load(std::memory_order_relaxed);
    out->reader_state = h->reader_state.load(std::memory_order_acquire);
    out->reader_incarnation = h->reader_incarnation.load(std::memory_order_relaxed);
    out->consumed_pos = h->consumed_pos.load(std::memory_order_relaxed);
    out->reader_alive = out->magic == kMagic && reader_alive(h, m.kind, true);
    out->huge_pages = (h->flags & kFlagHugePages) != 0;
    out->write_pos = h->write_pos.load(std::memory_order_acquire);
    out->read_pos = h->read_pos.load(std::memory_order_acquire);
    out->reader_sleeping = h->reader_sleeping.load(std::memory_order_relaxed) != 0;
    auto& mt = out->metrics;
    mt.records_written = h->records_written.load(std::memory_order_relaxed);
    mt.bytes_written = h->bytes_written.load(std::memory_order_relaxed);
    mt.records_read = h->records_read.load(std::memory_order_relaxed);
    mt.bytes_read = h->bytes_read.load(std::memory_order_relaxed);
    mt.queue_full = h->queue_full.load(std::memory_order_relaxed);
    mt.abandoned = h->abandoned.load(std::memory_order_relaxed);
    mt.writer_abandoned = h->writer_abandoned.load(std::memory_order_relaxed);
    mt.checksum_failures = h->checksum_failures.load(std::memory_order_relaxed);
    mt.corrupt = h->corrupt.load(std::memory_order_relaxed);
    mt.wakeups = h->wakeups.load(std::memory_order_relaxed);
    mt.staged_dropped = h->staged_dropped.load(std::memory_order_relaxed);
    mt.batches = h->batches.load(std::memory_order_relaxed);
    mt.capacity_bytes = out->ring_bytes;
    if (out->write_pos >= out->read_pos) {
      mt.fill_bytes = (out->write_pos - out->read_pos) * out->node_size;
    }
    geometry g;
    result = validate_header(m.base, m.size, &g);
    // A zero header on an object no region's size: someone else's, not one being created.
    if (result == errc::not_connected && !possible_region_size(m.size)) result = errc::bad_layout;
  } else {
    result = errc::bad_layout;
  }
  release_region(&m, false);
  return result;
}

errc shm_remove(std::string_view url, bool force, std::string* detail) {
  address addr;
  std::string d;
  std::string why;  // what parse_address found wrong with the URL
  errc e = parse_address(url, &addr, &why);
  if (e == errc::ok && addr.kind != scheme::shm && addr.kind != scheme::mem) {
    e = errc::unsupported_scheme;
  }
  if (e == errc::ok) {
    e = remove_region(addr, force, &d);
  } else {
    d = std::string(to_string(e)) + (why.empty() ? "" : ": " + why);
  }
  if (detail != nullptr) *detail = "shm_remove(" + std::string(url) + "): " + d;
  return e;
}

namespace shm_detail {

errc check_address(const address& addr, std::string* why) {
  // parse_address's own rules, applied by reading the canonical URL back: no second copy of them.
  const std::string url = addr.to_string();
  address back;
  if (const errc e = parse_address(url, &back, why); e != errc::ok) return e;
  if (back.host != addr.host || back.shm_numeric != addr.shm_numeric ||
      back.shm_key != addr.shm_key) {
    *why = "the name \"" + addr.host + "\" is not one parse_address gives (" + url +
           " reads back as " + back.to_string() + ")";
    return errc::bad_url;
  }
  return errc::ok;
}

// ok, or bad_layout with *why naming the expectation the region does not meet.
errc check_writer_options(const geometry& g, const shm_writer_options& opt, const char** why) {
  if (opt.expect_node_size != 0 && opt.expect_node_size != g.node_size) {
    *why = "the region's node_size differs from shm_writer_options.expect_node_size";
    return errc::bad_layout;
  }
  if (opt.expect_ring_bytes != 0 && opt.expect_ring_bytes != g.nodes * g.node_size) {
    *why = "the region's ring_bytes differ from shm_writer_options.expect_ring_bytes";
    return errc::bad_layout;
  }
  return errc::ok;
}
std::string open_error_detail(const char* call, const std::string& url, errc e, const char* why) {
  std::string d = std::string(call) + "(" + url + "): ";
  if (why != nullptr) return d + why;
  switch (e) {
    case errc::bad_url:
      return d + "malformed URL";
    case errc::unsupported_scheme:
      return d + "only shm:// and mem:// URLs name shared-memory regions";
    case errc::busy:
      return d + "a live reader already owns this region";
    case errc::bad_layout:
      return d + "an object of this name exists and is not a uvbus region (left alone)";
    case errc::not_found:
      return d + "no such region (its reader has not created it)";
    case errc::not_connected:
      return d + "the region's reader has not finished creating it, has closed or is dead";
    case errc::permission_denied:
      return d + "permission denied (the region's mode)";
    case errc::wrong_state:
      return d + "already open: close() first";
    default:
      return d + to_string(e);
  }
}

}  // namespace shm_detail

}  // namespace uvbus
