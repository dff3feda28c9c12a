// etcd_discovery against a scripted fake etcd gateway (a libuv HTTP/1.1 server on 127.0.0.1, port
// from the OS): watch cancels that are not a compaction gap, or repeat right after a resync, fail
// the session naming the reason; a watch stream that never says `created` fails after
// request_timeout_ms, and a watch-only instance probes while it waits.
#include <uv.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "discovery/discovery_harness.h"

namespace uvbus {
namespace {

using std::chrono::seconds;
using test::disc_instance;

// Answers a lease grant or keep-alive with lease 7, every other POST but /v3/watch with a
// range-shaped body (revision 5, no kvs), and closes the connection; answers /v3/watch with
// `watch_lines` (a 200 response read until close) and keeps the connection open, or sends nothing
// at all when watch_lines is empty.
class fake_etcd {
 public:
  explicit fake_etcd(uv_loop_t* loop) : srv_(new uv_tcp_t) {
    uv_tcp_init(loop, srv_);
    srv_->data = this;
    sockaddr_in a{};
    uv_ip4_addr("127.0.0.1", 0, &a);
    ok_ = uv_tcp_bind(srv_, reinterpret_cast<const sockaddr*>(&a), 0) == 0 &&
          uv_listen(reinterpret_cast<uv_stream_t*>(srv_), 16, on_connection) == 0;
    int len = sizeof a;
    uv_tcp_getsockname(srv_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~fake_etcd() {
    for (conn* c : conns_) close_conn(c);
    uv_close(reinterpret_cast<uv_handle_t*>(srv_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
  }
  fake_etcd(const fake_etcd&) = delete;
  fake_etcd& operator=(const fake_etcd&) = delete;

  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] size_t count(const std::string& path, const std::string& needle = "") const {
    size_t n = 0;
    for (const auto& [p, b] : requests_) n += p == path && b.find(needle) != std::string::npos;
    return n;
  }
  std::string watch_lines;

 private:
  struct conn {
    uv_tcp_t h{};
    fake_etcd* owner = nullptr;
    std::string in;
    bool closing = false;
  };
  struct write_req {
    uv_write_t req{};
    std::string data;
    conn* c = nullptr;
    bool close_after = false;
  };

  static void on_connection(uv_stream_t* s, int status) {
    auto* self = static_cast<fake_etcd*>(s->data);
    if (status < 0) return;
    auto* c = new conn;
    c->owner = self;
    c->h.data = c;
    uv_tcp_init(s->loop, &c->h);
    if (uv_accept(s, reinterpret_cast<uv_stream_t*>(&c->h)) != 0) {
      uv_close(reinterpret_cast<uv_handle_t*>(&c->h),
               [](uv_handle_t* h) { delete static_cast<conn*>(h->data); });
      return;
    }
    self->conns_.insert(c);
    uv_read_start(
        reinterpret_cast<uv_stream_t*>(&c->h),
        [](uv_handle_t*, size_t n, uv_buf_t* b) { *b = uv_buf_init(new char[n], n); }, on_read);
  }
  static void on_read(uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
    auto* c = static_cast<conn*>(s->data);
    if (n > 0) c->in.append(b->base, static_cast<size_t>(n));
    delete[] b->base;
    if (n < 0) return c->owner->close_conn(c);
    c->owner->serve(c);
  }
  void serve(conn* c) {
    const size_t end = c->in.find("\r\n\r\n");
    if (end == std::string::npos) return;
    const std::string head = c->in.substr(0, end);
    size_t len = 0;
    const size_t cl = head.find("Content-Length: ");
    if (cl != std::string::npos) len = std::stoul(head.substr(cl + 16));
    if (c->in.size() < end + 4 + len) return;
    const size_t sp = head.find(' ');
    const std::string path = head.substr(sp + 1, head.find(' ', sp + 1) - sp - 1);
    requests_.emplace_back(path, c->in.substr(end + 4, len));
    c->in.clear();
    if (path == "/v3/watch") {
      if (!watch_lines.empty()) {
        send(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + watch_lines, false);
      }
      return;
    }
    std::string body = R"({"header":{"revision":"5"},"count":"0"})";
    if (path == "/v3/lease/grant") body = R"({"header":{"revision":"5"},"ID":"7","TTL":"2"})";
    if (path == "/v3/lease/keepalive") body = R"({"result":{"ID":"7","TTL":"2"}})";
    send(c,
         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
         "Content-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body,
         true);
  }
  static void send(conn* c, std::string data, bool close_after) {
    auto* w = new write_req;
    w->data = std::move(data);
    w->c = c;
    w->close_after = close_after;
    w->req.data = w;
    uv_buf_t b = uv_buf_init(w->data.data(), w->data.size());
    uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->h), &b, 1, [](uv_write_t* r, int st) {
      auto* wr = static_cast<write_req*>(r->data);
      if (st == 0 && wr->close_after) wr->c->owner->close_conn(wr->c);
      delete wr;
    });
  }
  void close_conn(conn* c) {
    if (c->closing) return;
    c->closing = true;
    conns_.erase(c);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->h),
             [](uv_handle_t* h) { delete static_cast<conn*>(h->data); });
  }

  uv_tcp_t* srv_;
  bool ok_ = false;
  int port_ = 0;
  std::set<conn*> conns_;
  std::vector<std::pair<std::string, std::string>> requests_;
};

class DiscoveryFakeTest : public test::discovery_fixture {
 protected:
  void SetUp() override {
    discovery_fixture::SetUp();
    fake_ = std::make_unique<fake_etcd>(&loop_);
  }
  void TearDown() override {
    insts_.clear();
    fake_.reset();
    discovery_fixture::TearDown();
  }
  disc_instance* watcher(uint32_t request_timeout_ms) {
    discovery_config c = config({fake_->url()});
    c.request_timeout_ms = request_timeout_ms;
    return make(directory_entry{}, std::move(c));
  }
  static bool logged(const disc_instance* in, const std::string& a, const std::string& b = "") {
    for (const std::string& l : in->logs) {
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    }
    return false;
  }
  std::unique_ptr<fake_etcd> fake_;
};

const char* const kCreated = R"({"result":{"header":{"revision":"5"},"created":true}})"
                             "\n";

// A cancel with a cancel_reason and no compact_revision is not a gap: before, the session read
// and watched again at once, for ever, connected all along; now it fails (on_state(false),
// stats().failures, last_error() naming the reason) and retries after the backoff.
TEST_F(DiscoveryFakeTest, CancelWithoutCompactRevisionFailsTheSession) {
  ASSERT_TRUE(fake_->ok());
  fake_->watch_lines = std::string(kCreated) +
                       R"({"result":{"canceled":true,"cancel_reason":"permission denied"}})"
                       "\n";
  disc_instance* v = watcher(2000);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 2; }, seconds(20)));
  EXPECT_GE(v->ups, 1);
  EXPECT_GE(v->downs, 1);
  EXPECT_NE(v->d->last_error().detail.find("permission denied"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_TRUE(logged(v, "watch cancelled", "permission denied"));
  EXPECT_FALSE(logged(v, "resync"));
}

// A registering instance whose every watch etcd cancels at once: each session registers (grant +
// put) and fails. The backoff must grow across them; before, the registration reset it and the
// instance put itself again every retry_min_ms, for ever.
TEST_F(DiscoveryFakeTest, SessionsThatFailAfterRegisteringBackOffMoreAndMore) {
  ASSERT_TRUE(fake_->ok());
  fake_->watch_lines = std::string(kCreated) +
                       R"({"result":{"canceled":true,"cancel_reason":"permission denied"}})"
                       "\n";
  discovery_config c = config({fake_->url()});
  c.retry_min_ms = 20;
  c.retry_max_ms = 5000;
  directory_entry self;
  self.id = 0x42;
  self.listen = {"ipv4://127.0.0.1:1"};
  disc_instance* v = make(self, std::move(c));
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 5; }, seconds(30)));
  const discovery_stats st = v->d->stats();
  EXPECT_GE(st.registrations, 5u);
  EXPECT_GE(st.last_retry_delay_ms, 20u * 16 * 8 / 10) << "the 5th failure waits 320 ms +-20 %";
  EXPECT_GE(fake_->count("/v3/lease/grant"), 5u);
}

// A compaction cancel resyncs once (range read, new watch); the same cancel again right after that
// resync (within request_timeout_ms, 10 s here) fails the session instead of looping.
TEST_F(DiscoveryFakeTest, RepeatedCompactionCancelFailsTheSession) {
  ASSERT_TRUE(fake_->ok());
  fake_->watch_lines = std::string(kCreated) +
                       R"({"result":{"canceled":true,"compact_revision":"3"}})"
                       "\n";
  disc_instance* v = watcher(10000);
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
  EXPECT_TRUE(logged(v, "compact_revision 3", "resync"));
  EXPECT_TRUE(logged(v, "compact_revision 3", "of a resync"));
  EXPECT_NE(v->d->last_error().detail.find("compact_revision 3"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_GE(fake_->count("/v3/watch"), 2U);
}

// A watch stream that never says `created` (the fake accepts the POST and sends nothing): the
// watch-only instance probes meanwhile (a count_only range read, every ttl_s/3), and the session
// fails after request_timeout_ms naming why; it was never connected.
TEST_F(DiscoveryFakeTest, WatchNeverCreatedFailsAfterTheRequestTimeout) {
  ASSERT_TRUE(fake_->ok());
  disc_instance* v = watcher(3000);  // ttl_s 2: a probe after ~667 ms, well before the deadline
  ASSERT_TRUE(wait([&] { return fake_->count("/v3/kv/range", "count_only") >= 1; }, seconds(20)));
  ASSERT_TRUE(wait([&] { return v->d->stats().failures >= 1; }, seconds(20)));
  EXPECT_NE(v->d->last_error().detail.find("not created within 3000 ms"), std::string::npos)
      << v->d->last_error().detail;
  EXPECT_EQ(v->ups, 0);
  EXPECT_FALSE(v->d->connected());
}

}  // namespace
}  // namespace uvbus
