// shm_writer's public calls (open, send, coalesce, close, metrics) over shm_writer::impl
// (writer_impl.h).
#include "shm/writer_impl.h"

namespace uvbus {

using namespace shm_detail;

static_assert(shm_writer::batch_bytes(0) == batch_item_bytes(0) &&
                  shm_writer::batch_bytes(13) == batch_item_bytes(13),
              "the public batch size formula is the layout's");

struct shm_writer::impl : writer_core {};

shm_writer::shm_writer() = default;
shm_writer::~shm_writer() {
  close();
}

errc shm_writer::open(std::string_view url, const shm_writer_options& opt) {
  address addr;
  std::string why;  // names what is wrong with the URL
  if (const errc e = parse_address(url, &addr, &why); e != errc::ok) {
    last_error_ =
        error_info{e, open_error_detail("shm_writer::open", std::string(url), e, why.c_str())};
    return e;
  }
  return open(addr, opt);
}

errc shm_writer::open(const address& addr, const shm_writer_options& opt) {
  const char* call = "shm_writer::open";
  const auto fail = [&](errc e, const char* why) {
    last_error_ = error_info{e, open_error_detail(call, addr.to_string(), e, why)};
    return e;
  };
  if (impl_) return fail(errc::wrong_state, nullptr);
  if (addr.kind != scheme::shm && addr.kind != scheme::mem) {
    return fail(errc::unsupported_scheme, nullptr);
  }
  if (std::string bad; check_address(addr, &bad) != errc::ok)
    return fail(errc::bad_url, bad.c_str());
  auto p = std::make_unique<impl>();
  if (const errc e = attach_region(addr, &p->map); e != errc::ok) return fail(e, nullptr);
  const char* why = nullptr;
  errc e = validate_header(p->map.base, p->map.size, &p->g, &why);
  if (e == errc::not_connected && !possible_region_size(p->map.size)) {
    e = errc::bad_layout;  // a zero header, but no region has its size: someone else's object
    why = "the header's magic is 0 and its size is no region's: not a uvbus region";
  }
  const std::string sized = shm_detail::object_size_mismatch(p->map);
  if ((e == errc::ok || e == errc::bad_layout) && !sized.empty()) {
    e = errc::bad_layout;
    why = sized.c_str();
  }
  if (e == errc::ok) e = check_writer_options(p->g, opt, &why);
  if (e == errc::ok && (p->g.hdr->reader_state.load(std::memory_order_acquire) == kReaderClosed ||
                        shm_detail::region_removed(p->map))) {
    e = errc::not_connected;
    why = "the region's reader closed it for good (its name is being removed)";
  }
  if (e != errc::ok) {
    release_region(&p->map, false);
    return fail(e, why);
  }
  p->cached_read = p->g.hdr->read_pos.load(std::memory_order_acquire);
  impl_ = std::move(p);
  return errc::ok;
}

errc shm_writer::open_image(void* mem, size_t size, const shm_writer_options& opt) {
  const auto fail = [&](errc e, const char* why) {
    last_error_ = error_info{e, open_error_detail("shm_writer::open_image", "image", e, why)};
    return e;
  };
  if (impl_) return fail(errc::wrong_state, nullptr);
  auto p = std::make_unique<impl>();
  const char* why = nullptr;
  errc e = validate_header(mem, size, &p->g, &why);
  if (e == errc::ok) e = check_writer_options(p->g, opt, &why);
  if (e != errc::ok) return fail(e, why);
  p->map.kind = region_kind::image;
  p->map.base = mem;
  p->map.size = size;
  p->cached_read = p->g.hdr->read_pos.load(std::memory_order_acquire);
  impl_ = std::move(p);
  return errc::ok;
}

errc shm_writer::send(const void* data, size_t len) noexcept {
  const const_buffer s{data, len};
  return sendv(&s, 1);
}

errc shm_writer::sendv(const const_buffer* parts, size_t count) noexcept {
  if (!impl_) return errc::not_connected;
  if (impl_->stage_cap != 0) {
    return impl_->closing ? errc::closed : impl_->stage_send(parts, count);
  }
  return impl_->send(parts, count);
}

errc shm_writer::sendv_now(const const_buffer* parts, size_t count) noexcept {
  if (!impl_) return errc::not_connected;
  if (const errc e = impl_->flush_stage(); e != errc::ok) return e;
  return impl_->send(parts, count);
}

errc shm_writer::send_batch(const const_buffer* msgs, size_t count) noexcept {
  if (!impl_) return errc::not_connected;
  if (const errc e = impl_->flush_stage(); e != errc::ok) return e;
  return impl_->send_batch(msgs, count);
}

errc shm_writer::coalesce(uv_loop_t* loop, size_t stage_bytes) noexcept {
  if (!impl_) return errc::not_connected;
  if (impl_->stage_cap != 0) return errc::wrong_state;
  if (stage_bytes < 64) return errc::invalid_argument;
  // The stage is one batch body: it must fit the record limit (below 64 on a region of small
  // records). At least one empty message's 8 bytes: a stage of one message is a plain record.
  const size_t cap = std::max<size_t>(
      std::min<size_t>(stage_bytes, impl_->g.max_record) & ~size_t{7}, kRecordHeaderSize);
  impl_->stage.reset(new (std::nothrow) uint8_t[cap]());
  if (!impl_->stage) return errc::no_memory;
  if (loop != nullptr) {
    if (const errc e = impl_->start_glue(loop); e != errc::ok) {
      impl_->stage.reset();
      return e;
    }
  }
  impl_->stage_cap = cap;
  return errc::ok;
}

bool shm_writer::coalescing() const noexcept {
  return impl_ && impl_->stage_cap != 0;
}

errc shm_writer::flush() noexcept {
  if (!impl_) return errc::not_connected;
  return impl_->flush_uncounted();
}

void shm_writer::on_staged_dropped(std::function<void(const uint8_t*, size_t)> f) {
  if (!impl_) return;
  impl_->on_dropped =
      f ? std::make_shared<const std::function<void(const uint8_t*, size_t)>>(std::move(f))
        : nullptr;
}

size_t shm_writer::staged() const noexcept {
  return impl_ ? impl_->stage_count : 0;
}

bool shm_writer::reader_alive() const noexcept {
  return impl_ && shm_detail::reader_alive(impl_->g.hdr, impl_->map.kind, true);
}

size_t shm_writer::close() {
  if (!impl_) return 0;
  if (impl_->dropping != 0) {  // from on_staged_dropped: the call that drops still runs on impl_
    last_error_ = error_info{errc::wrong_state,
                             "shm_writer::close() from on_staged_dropped: close after it returns"};
    return 0;
  }
  const size_t dropped = impl_->stop_coalescing();
  impl_->flush();  // the counters, staged_dropped among them, into the region
  release_region(&impl_->map, false);
  impl_.reset();
  return dropped;
}

bool shm_writer::is_open() const noexcept {
  return impl_ != nullptr;
}

size_t shm_writer::max_record_size() const noexcept {
  return impl_ ? impl_->g.max_record : 0;
}

shm_metrics shm_writer::metrics() const noexcept {
  if (!impl_) return {};
  shm_metrics m = impl_->local;
  const region_header* h = impl_->g.hdr;
  const uint64_t w = h->write_pos.load(std::memory_order_relaxed);
  const uint64_t r = h->read_pos.load(std::memory_order_relaxed);
  m.fill_bytes = w >= r ? (w - r) * impl_->g.node_size : 0;
  m.capacity_bytes = impl_->g.nodes * impl_->g.node_size;
  return m;
}

error_info shm_writer::last_error() const {
  return last_error_;
}

namespace shm_detail {
void writer_access::set_test_hook(shm_writer& w, void (*hook)(void*), void* user) noexcept {
  if (!w.impl_) return;
  w.impl_->hook = hook;
  w.impl_->hook_user = user;
}
}  // namespace shm_detail

}  // namespace uvbus
