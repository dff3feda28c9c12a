// Bus node, posting from any thread: node::post() appends to a bounded mailbox (a mutex-protected
// byte buffer swapped out whole by the loop, so nothing is allocated per message in steady state),
// woken with uv_async_send; the loop runs each posted message through the normal send path.
#include <mutex>
#include <new>

#include "bus/node_impl.h"
#include "core/try_alloc.h"

namespace uvbus {

namespace {

// One posted item in the mailbox's byte stream, followed by its payload padded to 8 bytes.
struct post_record {
  uint64_t seq = 0;  // message id; 0 for a task
  bus_id target = 0;
  uint32_t type = 0;
  uint32_t size = 0;  // payload bytes
  uint8_t task = 0;   // 1: the next task of the mailbox's task list
  uint8_t require_response = 0;
  uint8_t ttl = 0;
  uint8_t has_trace = 0;
  uint8_t pad[4] = {};
  uint8_t trace[proto::kTraceSize] = {};  // send_options::trace, encoded
  uint8_t pad2[7] = {};
};
static_assert(sizeof(post_record) == detail::kPostRecordBytes, "post_record is packed by hand");

// Capacity for n more bytes, without std::bad_alloc (post_queue_bytes may be above 1 GiB): false
// when memory ran out. Then mailbox_append()'s resize allocates nothing.
bool make_room(std::vector<uint8_t>* bytes, size_t n) {
  const size_t had = bytes->size();
  if (bytes->capacity() - had >= n) return true;
  if (!detail::try_resize(bytes, had + n)) return false;
  bytes->resize(had);  // the capacity stays
  return true;
}

}  // namespace

errc node::impl::mailbox_refusal() const {
  return mbox.st == detail::mailbox::status::not_started ? errc::wrong_state : errc::closed;
}

// Under mbox.mu. A batch the loop could not finish (held_*) counts with what waits in the mailbox.
bool node::impl::mailbox_full(size_t need) const {
  return mbox.items + mbox.held_items >= cfg.post_queue_messages ||
         mbox.bytes.size() + mbox.held_bytes + need > cfg.post_queue_bytes;
}

void node::impl::mailbox_append(const void* rec, const void* data, size_t size) {
  const size_t off = mbox.bytes.size();
  mbox.bytes.resize(off + detail::post_item_bytes(size));
  std::memcpy(mbox.bytes.data() + off, rec, sizeof(post_record));
  if (size != 0) std::memcpy(mbox.bytes.data() + off + sizeof(post_record), data, size);
  // Wake the loop on the first item only: it takes everything in one swap.
  if (mbox.items++ == 0) uv_async_send(mbox.async);
}

errc node::impl::post_message(bus_id target, uint32_t type, const void* data, size_t size,
                              const send_options& opt, uint64_t* message_id) {
  // message_limit and post_queue_* never change after construction: safe from any thread.
  if (size > cfg.message_limit) return errc::message_too_large;
  const size_t need = detail::post_item_bytes(size);
  std::scoped_lock lock(mbox.mu);
  if (mbox.st != detail::mailbox::status::open) return mailbox_refusal();
  if (mailbox_full(need)) return errc::queue_full;
  if (!make_room(&mbox.bytes, need)) return errc::no_memory;
  post_record r;
  r.seq = next_seq.fetch_add(1, std::memory_order_relaxed);
  r.target = target;
  r.type = type;
  r.size = static_cast<uint32_t>(size);
  r.require_response = opt.require_response ? 1 : 0;
  r.ttl = opt.ttl;
  if (opt.trace != nullptr) {
    r.has_trace = 1;
    proto::encode_trace(*opt.trace, r.trace);
  }
  mailbox_append(&r, data, size);
  if (message_id != nullptr) *message_id = r.seq;
  return errc::ok;
}

errc node::impl::post_task(std::function<void()> task) {
  std::scoped_lock lock(mbox.mu);
  if (mbox.st != detail::mailbox::status::open) return mailbox_refusal();
  if (mailbox_full(detail::kPostRecordBytes)) return errc::queue_full;
  // The record's room first: a task queued without its record would run in the next one's place.
  if (!make_room(&mbox.bytes, detail::kPostRecordBytes)) return errc::no_memory;
  try {
    mbox.tasks.push_back(std::move(task));  // post_queue_messages of them at most
  } catch (const std::bad_alloc&) {
    return errc::no_memory;
  }
  post_record r;
  r.task = 1;
  mailbox_append(&r, nullptr, 0);
  return errc::ok;
}

void node::impl::on_post_async(uv_async_t* a) {
  auto* n = static_cast<impl*>(a->data);
  n->drain_posts();
  // Stopped and drained: the loop reference close_mailbox() took for the last reports goes.
  if (n->post_offset < n->post_backlog.size()) return;
  std::scoped_lock lock(n->mbox.mu);
  if (n->mbox.st != detail::mailbox::status::open && n->mbox.items == 0) {
    uv_unref(reinterpret_cast<uv_handle_t*>(a));
  }
}

void node::impl::close_mailbox(detail::mailbox::status st) {
  bool pending = false;
  {
    std::scoped_lock lock(mbox.mu);
    if (mbox.st == detail::mailbox::status::gone) return;
    mbox.st = st;
    pending = mbox.items != 0;
  }
  // Stopped: what was accepted still gets its one report (closed), from the loop.
  if (st == detail::mailbox::status::stopped && (pending || post_offset < post_backlog.size())) {
    uv_ref(reinterpret_cast<uv_handle_t*>(mbox.async));  // keep the loop running for them
    uv_async_send(mbox.async);
  }
}

// Runs one posted message; queue_full (while running) leaves it for a retry.
errc node::impl::run_posted(const uint8_t* at) {
  post_record r;
  std::memcpy(&r, at, sizeof r);
  const const_buffer b{at + sizeof r, r.size};
  send_options o;
  o.require_response = r.require_response != 0;
  o.ttl = r.ttl;
  trace_context t;
  if (r.has_trace != 0) {
    proto::parse_trace(r.trace, &t);
    o.trace = &t;
  }
  posting = true;  // the mailbox retries a queue_full itself: no on_writable is owed for it
  const errc e = send_data(r.target, r.type, &b, 1, o, nullptr, r.seq);
  posting = false;
  if (e == errc::ok || (e == errc::queue_full && state == run_state::running)) return e;
  // Refused on the loop (no route, stopped, ...): that is this message's one report.
  defer_report(r.require_response != 0 ? (r.seq | kTagE2e) : r.seq, r.target, e, false);
  return errc::ok;
}

void node::impl::drain_posts() {
  if (post_offset >= post_backlog.size()) {
    post_backlog.clear();
    post_offset = 0;
    post_tasks.clear();
    post_task_next = 0;
    std::scoped_lock lock(mbox.mu);
    if (mbox.items == 0) return;
    post_backlog.swap(mbox.bytes);  // both keep their capacity: no allocation in steady state
    post_tasks.swap(mbox.tasks);
    post_batch_items = mbox.items;
    post_batch_done = 0;
    mbox.items = 0;
  }
  post_blocked = false;
  // One swap per call, so a producer faster than the loop cannot keep it here.
  while (post_offset < post_backlog.size() && !dead) {
    const uint8_t* at = post_backlog.data() + post_offset;
    post_record r;
    std::memcpy(&r, at, sizeof r);
    if (r.task != 0) {
      post_offset += sizeof r;
      ++post_batch_done;
      const std::function<void()> task = std::move(post_tasks[post_task_next++]);
      fire(task);
      continue;
    }
    if (run_posted(at) == errc::queue_full) {
      post_blocked = true;  // retried when a link drains (s_writable) or at the next tick
      std::scoped_lock lock(mbox.mu);
      mbox.held_items = post_batch_items - post_batch_done;
      mbox.held_bytes = post_backlog.size() - post_offset;
      return;
    }
    post_offset += detail::post_item_bytes(r.size);
    ++post_batch_done;
  }
  // Posts that arrived while this batch ran (or while it waited for a full link) did not wake the
  // loop (the mailbox was not empty): come back for them after the loop's next round of I/O.
  std::scoped_lock lock(mbox.mu);
  mbox.held_items = 0;
  mbox.held_bytes = 0;
  if (mbox.items != 0 && mbox.st != detail::mailbox::status::gone) uv_async_send(mbox.async);
}

bool node::impl::posts_drained() {
  if (post_offset < post_backlog.size()) return false;
  std::scoped_lock lock(mbox.mu);
  return mbox.items == 0;
}

void node::impl::drain_posts_for_stop() {
  // The mailbox takes nothing after stop(), and a send no longer meets queue_full (it is refused:
  // closed), so each round runs a whole batch: this ends.
  while (!dead && !posts_drained()) drain_posts();
}

}  // namespace uvbus
