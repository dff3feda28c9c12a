// shm_reader: the owner-thread checks, the callbacks, last_error and open/close (create or
// reattach a region, close with remove or keep) around the ring_reader engine (ring_reader.h).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/log_limiter.h"
#include "core/thread_check.h"
#include "shm/ring_reader.h"
#include "uvbus/shm.h"

namespace uvbus {

using namespace shm_detail;

// ---- shm_reader: the owner-thread checks, the callbacks and last_error around a ring_reader ----

struct shm_reader::impl {
  detail::owner_thread thread;
  shm_reader_callbacks cbs;
  error_info err;
  std::unique_ptr<ring_reader> ring;  // null while closed
  int in_callback = 0;                // inside on_records or on_log
  bool reattached = false;            // the last successful open() reattached an existing region
  bool reattach_unlogged = false;     // the "reattached" line is still owed (logged by a pass)
  std::string url;                    // for log lines
  // on_log: the skip counters already logged, and the limiter.
  uint64_t logged_abandoned = 0;
  uint64_t logged_checksum = 0;
  uint64_t logged_corrupt = 0;
  detail::log_limiter log_limit;

  // on_log is a callback like on_records: close() inside it is deferred to the end of the pass
  // (no line after it), set_callbacks() is wrong_state, destruction aborts.
  void call_log(log_level lv, const std::string& text) {
    ++in_callback;
    cbs.on_log(lv, text);
    --in_callback;
  }
  void log(size_t kind, log_level lv, const std::string& text) {
    uint64_t suppressed = 0;
    if (!log_limit.allow(kind, static_cast<uint64_t>(mono_ns() / 1000000), &suppressed)) return;
    call_log(lv, suppressed == 0
                     ? text
                     : text + " (" + std::to_string(suppressed) + " more like it not logged)");
  }
  // After a pass (a loop turn's drain or a poll): says once that the region was reattached, then
  // what the pass skipped (the counters grew since the last line that went out).
  static void after_pass(void* u) {
    auto* self = static_cast<impl*>(u);
    const ring_reader& r = *self->ring;
    if (!self->cbs.on_log) return;
    if (self->reattach_unlogged) {
      self->reattach_unlogged = false;
      self->call_log(log_level::info, self->url +
                                          ": reattached an existing region (a previous "
                                          "reader's records are read first)");
    }
    const auto line = [&](size_t kind, uint64_t now, uint64_t* logged, log_level lv,
                          const char* what) {
      if (now == *logged || r.close_requested) return;
      const uint64_t delta = now - *logged;
      *logged = now;
      self->log(kind, lv,
                self->url + ": " + std::to_string(delta) + " record(s) skipped: " + what +
                    " (total " + std::to_string(now) + ")");
    };
    line(0, r.c_abandoned, &self->logged_abandoned, log_level::warn,
         "a writer did not commit in time (died or stalled mid-write)");
    line(1, r.c_checksum, &self->logged_checksum, log_level::error, "checksum mismatch");
    line(2, r.c_corrupt, &self->logged_corrupt, log_level::error, "impossible record header");
  }

  static void deliver(void* u, const shm_record* records, size_t count) {
    auto* self = static_cast<impl*>(u);
    if (!self->cbs.on_records) return;
    ++self->in_callback;
    self->cbs.on_records(records, count);
    --self->in_callback;
  }
  errc fail(const char* call, const std::string& url, errc e, const char* why = nullptr) {
    err = error_info{e, open_error_detail(call, url, e, why)};
    return e;
  }
  [[nodiscard]] bool open() const noexcept { return ring && !ring->close_requested; }
};

void finish_close(shm_reader::impl* outer) noexcept {
  outer->ring->shut(outer->ring->close_mode);
  outer->ring.reset();
}

shm_reader::shm_reader(shm_reader_callbacks cbs) : impl_(std::make_unique<impl>()) {
  impl_->cbs = std::move(cbs);
}

shm_reader::~shm_reader() {
  if (impl_->in_callback > 0) {
    std::fprintf(stderr,
                 "uvbus: shm_reader destroyed inside its own callback (on_records or "
                 "on_log): close() it there, destroy it afterwards\n");
    std::abort();
  }
  close();
}

errc shm_reader::set_callbacks(shm_reader_callbacks cbs) {
  UVBUS_ON_OWNER_THREAD(impl_->thread, "shm_reader::set_callbacks");
  if (impl_->in_callback > 0) return errc::wrong_state;
  // A started reader drains into on_records: without one its records would be consumed unseen.
  if (!cbs.on_records && impl_->ring && impl_->ring->started) return errc::invalid_argument;
  impl_->cbs = std::move(cbs);
  return errc::ok;
}

errc shm_reader::open(std::string_view url, const shm_config& cfg) {
  UVBUS_ON_OWNER_THREAD(impl_->thread, "shm_reader::open");
  address addr;
  std::string why;  // names what is wrong with the URL
  if (const errc e = parse_address(url, &addr, &why); e != errc::ok) {
    return impl_->fail("shm_reader::open", std::string(url), e, why.c_str());
  }
  return open(addr, cfg);
}

errc shm_reader::open(const address& addr, const shm_config& cfg) {
  UVBUS_ON_OWNER_THREAD(impl_->thread, "shm_reader::open");
  const char* call = "shm_reader::open";
  if (impl_->ring) return impl_->fail(call, addr.to_string(), errc::wrong_state);
  if (addr.kind != scheme::shm && addr.kind != scheme::mem) {
    return impl_->fail(call, addr.to_string(), errc::unsupported_scheme);
  }
  std::string why;
  if (const errc e = check_address(addr, &why); e != errc::ok) {
    return impl_->fail(call, addr.to_string(), e, why.c_str());
  }
  if (const errc e = shm_validate(cfg, &why); e != errc::ok) {
    return impl_->fail(call, addr.to_string(), e, why.c_str());
  }
  auto p = std::make_unique<ring_reader>();
  if (const errc e = p->init_common(cfg); e != errc::ok) {
    return impl_->fail(call, addr.to_string(), e);
  }
  const std::string url = addr.to_string();
  open_outcome how;
  const auto incompatible = [&](errc e, const std::string& detail) {
    const std::string text = "the existing region is incompatible with this shm_config: " + detail +
                             ". It was left intact with its records: read them with "
                             "`uvbus_shm_inspect --drain " +
                             url + "`, or delete it with `uvbus_shm_inspect --remove " + url + "`";
    return impl_->fail(call, url, e, text.c_str());
  };
  if (const errc e = create_region(addr, cfg, &p->map, &how); e != errc::ok) {
    if (!how.why.empty()) return impl_->fail(call, url, e, how.why.c_str());
    if (how.detail.empty()) return impl_->fail(call, url, e);
    return incompatible(e, how.detail);
  }
  const char* bad = nullptr;
  errc e = validate_header(p->map.base, p->map.size, &p->g, &bad);
  if (e == errc::ok && how.reattached) how.detail = p->resume();
  if (e != errc::ok || !how.detail.empty()) {
    if (how.reattached && p->map.size >= kHeaderSize) {  // never wipe records: hand it back
      detach_region(static_cast<region_header*>(p->map.base));
    }
    release_region(&p->map, !how.reattached);
    if (e != errc::ok) return impl_->fail(call, url, e, bad);
    return incompatible(errc::bad_layout, how.detail);
  }
  impl_->url = url;
  impl_->logged_abandoned = p->c_abandoned;
  impl_->logged_checksum = p->c_checksum;
  impl_->logged_corrupt = p->c_corrupt;
  p->owner = true;
  p->outer = impl_.get();
  impl_->ring = std::move(p);
  impl_->reattached = how.reattached;
  impl_->reattach_unlogged = how.reattached;
  return errc::ok;
}

errc shm_reader::open_image(void* mem, size_t size, const shm_config& cfg) {
  UVBUS_ON_OWNER_THREAD(impl_->thread, "shm_reader::open_image");
  const char* call = "shm_reader::open_image";
  if (impl_->ring) return impl_->fail(call, "image", errc::wrong_state);
  std::string why;
  if (const errc e = shm_validate(cfg, &why); e != errc::ok) {
    return impl_->fail(call, "image", e, why.c_str());
  }
  auto p = std::make_unique<ring_reader>();
  if (const errc e = p->init_common(cfg); e != errc::ok) return impl_->fail(call, "image", e);
  const char* bad = nullptr;
  if (const errc e = validate_header(mem, size, &p->g, &bad); e != errc::ok) {
    return impl_->fail(call, "image", e, bad);
  }
  impl_->url = "image";
  p->map.kind = region_kind::image;
  p->map.base = mem;
  p->map.size = size;
  p->rd = p->published = p->stored_pos = p->g.hdr->read_pos.load(std::memory_order_acquire);
  p->outer = impl_.get();
  impl_->ring = std::move(p);
  return errc::ok;
}

errc shm_reader::start(uv_loop_t* loop) {
  UVBUS_ON_OWNER_THREAD(impl_->thread, "shm_reader::start");
  const char* call = "shm_reader::start";
  impl& im = *impl_;
  if (!im.open()) return im.fail(call, im.url, errc::closed, "not open: open() it first");
  const char* why = nullptr;
  if (!im.cbs.on_records) why = "no on_records callback (set_callbacks first)";
  if (loop == nullptr) why = "the loop is null";
  if (why != nullptr) return im.fail(call, im.url, errc::invalid_argument, why);
  if (im.ring->started) return im.fail(call, im.url, errc::wrong_state, "already started");
  im.ring->after_pass = &impl::after_pass;  // also says "reattached", from the loop
  const errc e = im.ring->start(loop, &impl::deliver, &im);
  if (e != errc::ok) {
    return im.fail(call, im.url, e, "the helper thread or a libuv handle could not be created");
  }
  return errc::ok;
}

void shm_reader::stop() {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::stop", );
  if (impl_->ring) impl_->ring->stop();
}

size_t shm_reader::poll(size_t max_records) {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::poll", 0);
  impl& im = *impl_;
  if (!im.open() || im.ring->started || im.in_callback > 0 || !im.cbs.on_records ||
      max_records == 0) {
    return 0;
  }
  const size_t n = im.ring->drain(&impl::deliver, &im, max_records);
  if (!im.ring->close_requested) impl::after_pass(&im);
  if (im.ring->close_requested) finish_close(&im);
  return n;
}

errc shm_reader::try_receive(void* buf, size_t cap, size_t* len) {
  UVBUS_ON_OWNER_THREAD(impl_->thread, "shm_reader::try_receive");
  if (!impl_->open()) return errc::closed;
  ring_reader& rr = *impl_->ring;
  if (rr.started || impl_->in_callback > 0) return errc::wrong_state;
  // The record is copied into buf before its checksum is verified, on the copy (ring_reader::
  // copy_to): what try_receive returns is exactly what was verified.
  rr.size_limit = cap;
  rr.too_big = 0;
  rr.copy_to = static_cast<uint8_t*>(buf);
  const size_t n = rr.drain(
      [](void* u, const shm_record* r, size_t) { *static_cast<size_t*>(u) = r->size; }, len, 1);
  rr.copy_to = nullptr;
  rr.size_limit = ~size_t{0};
  if (n == 1) return errc::ok;
  if (rr.too_big != 0) {
    *len = rr.too_big;
    return errc::buffer_too_small;
  }
  return errc::would_block;
}

void shm_reader::close() {
  close(shm_close_mode::remove);
}

void shm_reader::close(shm_close_mode mode) {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::close", );
  if (!impl_->ring) return;
  impl_->ring->close_mode = mode;
  if (impl_->in_callback > 0) {  // finish when the callback returns: the drain is still running
    impl_->ring->close_requested = true;
    impl_->ring->stop();
    return;
  }
  finish_close(impl_.get());
}

bool shm_reader::reattached() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::reattached", false);
  return impl_->reattached;
}

bool shm_reader::is_open() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::is_open", false);
  return impl_->open();
}

shm_metrics shm_reader::metrics() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::metrics", {});
  if (!impl_->open()) return {};
  const ring_reader& rr = *impl_->ring;
  const region_header* h = rr.g.hdr;
  shm_metrics m;
  m.records_written = h->records_written.load(std::memory_order_relaxed);
  m.bytes_written = h->bytes_written.load(std::memory_order_relaxed);
  m.queue_full = h->queue_full.load(std::memory_order_relaxed);
  m.writer_abandoned = h->writer_abandoned.load(std::memory_order_relaxed);
  m.wakeups = h->wakeups.load(std::memory_order_relaxed);
  m.staged_dropped = h->staged_dropped.load(std::memory_order_relaxed);
  m.records_read = rr.c_records;
  m.bytes_read = rr.c_bytes;
  m.abandoned = rr.c_abandoned;
  m.checksum_failures = rr.c_checksum;
  m.corrupt = rr.c_corrupt;
  m.batches = rr.c_batches;
  const uint64_t w = h->write_pos.load(std::memory_order_relaxed);
  m.fill_bytes = w >= rr.published ? (w - rr.published) * rr.g.node_size : 0;
  m.capacity_bytes = rr.g.nodes * rr.g.node_size;
  return m;
}

bool shm_reader::huge_pages() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::huge_pages", false);
  return impl_->open() && impl_->ring->map.huge;
}
size_t shm_reader::ring_bytes() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::ring_bytes", 0);
  return impl_->open() ? impl_->ring->g.nodes * impl_->ring->g.node_size : 0;
}
size_t shm_reader::max_record_size() const noexcept {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::max_record_size", 0);
  return impl_->open() ? impl_->ring->g.max_record : 0;
}
error_info shm_reader::last_error() const {
  UVBUS_ON_OWNER_THREAD_OR(impl_->thread, "shm_reader::last_error",
                           (error_info{errc::wrong_thread, "shm_reader::last_error"}));
  return impl_->err;
}

}  // namespace uvbus
