// The uvbus tool's bus session: a private loop, one node registered to the parent as a tool.
#include "session.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "bus/auth.h"  // uvbus::detail::printable
#include "common.h"

namespace uvbus_tool {

session::session() {
  uv_loop_init(&loop_);
  uv_timer_init(&loop_, &timer_);
  timer_.data = this;
}

session::~session() {
  if (node_ != nullptr && node_->running()) {
    node_->stop();
    run_until([this] { return stopped_; }, 2000);
  }
  node_.reset();
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
  uv_run(&loop_, UV_RUN_DEFAULT);
  uv_loop_close(&loop_);
}

bool session::run_until(const std::function<bool()>& done, uint32_t ms) {
  fired_ = false;
  uv_timer_start(
      &timer_, [](uv_timer_t* t) { static_cast<session*>(t->data)->fired_ = true; }, ms, 0);
  while (!done() && !fired_) uv_run(&loop_, UV_RUN_ONCE);
  uv_timer_stop(&timer_);
  return done();
}

void session::run_blocking(const std::function<void()>& work) {
  struct job {
    uv_work_t req{};
    const std::function<void()>* work;
    bool done = false;
  } j;
  j.work = &work;
  j.req.data = &j;
  const int e = uv_queue_work(
      &loop_, &j.req, [](uv_work_t* r) { (*static_cast<job*>(r->data)->work)(); },
      [](uv_work_t* r, int) { static_cast<job*>(r->data)->done = true; });
  if (e != 0) {  // cannot happen with a callback given; run it here rather than not at all
    work();
    return;
  }
  // The request keeps the loop alive until its after-work callback ran: j outlives it.
  while (!j.done) uv_run(&loop_, UV_RUN_ONCE);
}

int session::join(const join_options& o, uvbus::node_callbacks cb) {
  uvbus::node_config cfg;
  cfg.parent_urls = {o.parent};
  cfg.join_as_tool = true;
  if (!o.token.empty()) cfg.access_tokens = {o.token};
  cfg.enable_shm = false;
  // Everything goes through the parent (join_as_tool's promise, docs/tools.md): with sibling_direct
  // a message to the parent's child looked the child up and dialled it, an address the operator's
  // host may not reach (a private network: the command timed out).
  cfg.sibling_direct = false;
  cfg.response_timeout_ms = o.timeout_ms;
  // The node's delivery deadline is at most one day (node_config's bound); a longer --timeout-ms
  // still sets the tool's own waits and the call's deadline.
  constexpr uint32_t kMaxDeliveryMs = 86400000;
  cfg.delivery_timeout_ms = std::min(o.timeout_ms, kMaxDeliveryMs);
  cfg.pending_timeout_ms = o.timeout_ms;
  std::string detail;
  const uvbus::errc v = uvbus::node::validate(o.id, cfg, &detail);
  if (v != uvbus::errc::ok) {
    std::fprintf(stderr, "uvbus: bad parent URL or option: %s: %s\n", uvbus::to_string(v),
                 detail.c_str());
    return kExitUsage;
  }
  // The callbacks stay installed on the node after join() returns (a later re-registration, a
  // failed reconnect, stop() with a registration in flight): they touch members, not this frame.
  up_ = false;
  refused_ = uvbus::errc::ok;
  why_.clear();
  cb.on_up = [this](uvbus::bus_id parent) {
    parent_ = parent;
    up_ = true;
  };
  cb.on_down = [this, user = cb.on_down](uvbus::errc why) {
    if (why == uvbus::errc::closed) stopped_ = true;
    if (user) user(why);
  };
  cb.on_registration = [this](uvbus::errc r, const std::string& d) {
    if (r != uvbus::errc::ok && refused_ == uvbus::errc::ok) {
      refused_ = r;
      why_ = d;
    }
  };
  node_ = std::make_unique<uvbus::node>(&loop_, o.id, cfg, cb);
  const uvbus::errc e = node_->start();
  if (e != uvbus::errc::ok) {
    std::fprintf(stderr, "uvbus: cannot start the tool node: %s: %s\n", uvbus::to_string(e),
                 node_->last_error().detail.c_str());
    return kExitJoin;
  }
  run_until([this] { return up_ || refused_ != uvbus::errc::ok; }, o.timeout_ms);
  if (up_) return kExitOk;
  const uvbus::errc refused = refused_ == uvbus::errc::ok ? uvbus::errc::timeout : refused_;
  std::fprintf(stderr, "uvbus: could not join the bus at %s as id %#" PRIx64 ": %s%s%s%s\n",
               o.parent.c_str(), o.id, uvbus::to_string(refused), why_.empty() ? "" : " (",
               why_.c_str(), why_.empty() ? "" : ")");
  if (refused == uvbus::errc::out_of_subnet) {
    std::fprintf(stderr,
                 "uvbus: a tool's id must lie outside the parent's subnets: pass another "
                 "--id (or UVBUS_TOOL_ID), or none for the default\n");
  } else if (refused == uvbus::errc::access_denied) {
    std::fprintf(stderr, "uvbus: pass the bus's access token with --token or UVBUS_TOKEN\n");
  }
  return kExitJoin;
}

std::string peer_text(const std::string& s) {
  std::string out;
  size_t from = 0;
  for (size_t nl = s.find('\n'); nl != std::string::npos; nl = s.find('\n', from)) {
    out += uvbus::detail::printable(s.substr(from, nl - from));
    out += '\n';
    from = nl + 1;
  }
  return out + uvbus::detail::printable(s.substr(from));
}

command_result run_command(session* s, uint64_t target, uvbus::proto::command_id c,
                           const std::string& args, uint32_t timeout_ms) {
  auto r = std::make_shared<command_result>();
  const uvbus::errc e = s->node().send_command(
      target, c, args.data(), args.size(), [r](uvbus::errc st, const uint8_t* p, size_t n) {
        r->done = true;
        r->status = st;
        if (p != nullptr) r->text.assign(reinterpret_cast<const char*>(p), n);
      });
  if (e != uvbus::errc::ok) {
    r->done = true;
    r->status = e;
    return *r;
  }
  if (!s->run_until([r] { return r->done; }, answer_wait_ms(timeout_ms))) {
    r->done = true;
    r->status = uvbus::errc::timeout;
  }
  return *r;
}

}  // namespace uvbus_tool
