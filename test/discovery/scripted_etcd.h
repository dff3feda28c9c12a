// A scripted fake etcd gateway for the discovery tests: a libuv HTTP/1.1 server on 127.0.0.1 (port
// from the OS) whose answers to each POST (at once or late) and to /v3/watch a test sets, and
// which counts requests and answers and keeps their headers.
#pragma once

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace uvbus::test {

// A watch stream's first message: the watch is created (at revision 5).
inline const std::string kCreated = R"({"result":{"header":{"revision":"5"},"created":true}})"
                                    "\n";

// A POST's scripted answer: a status and body (the connection is closed after it), or nothing.
struct reply {
  int status = 200;
  std::string body;
  bool silent = false;    // never answered
  uint32_t delay_ms = 0;  // answered this much later (from a timer)
};

// Answers each POST with on_post(path, nth) (nth: how many POSTs to that path came before; by
// default a healthy etcd's answer, healthy_post()) and /v3/watch with on_watch(nth): the stream's
// bytes after the headers, and whether the stream then ends (connection closed) or stays open.
// With no on_watch (the default) a watch is accepted and never answered.
class scripted_etcd {
 public:
  std::function<reply(const std::string& path, size_t nth)> on_post = healthy_post;
  std::function<std::pair<std::string, bool>(size_t nth)> on_watch;

  // Lease 7 (TTL 2) for a lease grant or keep-alive; a range-shaped body (revision 5, no kvs) for
  // any other path.
  static reply healthy_post(const std::string& path, size_t /*nth*/) {
    reply r;
    r.body = R"({"header":{"revision":"5"}})";
    if (path == "/v3/lease/grant") r.body = R"({"header":{"revision":"5"},"ID":"7","TTL":"2"})";
    if (path == "/v3/lease/keepalive") r.body = R"({"result":{"ID":"7","TTL":"2"}})";
    return r;
  }

  explicit scripted_etcd(uv_loop_t* loop) : srv_(new uv_tcp_t) {
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
  ~scripted_etcd() {
    while (!delayed_.empty()) drop_delayed(*delayed_.begin());
    while (!conns_.empty()) close_conn(*conns_.begin());
    uv_close(reinterpret_cast<uv_handle_t*>(srv_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
  }
  scripted_etcd(const scripted_etcd&) = delete;
  scripted_etcd& operator=(const scripted_etcd&) = delete;

  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // How many requests to `path` came whose body contains `needle`.
  [[nodiscard]] size_t count(const std::string& path, const std::string& needle = "") const {
    size_t n = 0;
    for (const auto& [p, b] : requests_) n += p == path && b.find(needle) != std::string::npos;
    return n;
  }
  // How many answers to `path` were written (a delayed one counts when its delay is over).
  [[nodiscard]] size_t answered(const std::string& path) const {
    size_t n = 0;
    for (const std::string& p : answered_) n += p == path;
    return n;
  }
  // The body of the request being answered (valid inside on_post and on_watch).
  [[nodiscard]] const std::string& body() const { return requests_.back().second; }
  // The header lines of the n-th request to `path` ("" when there is none), each ending in CRLF.
  [[nodiscard]] std::string headers(const std::string& path, size_t n) const {
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i].first == path && n-- == 0) return heads_[i];
    }
    return {};
  }

 private:
  struct conn {
    uv_tcp_t h{};
    scripted_etcd* owner = nullptr;
    std::string in;
    bool closing = false;
    uint64_t serial = 0;  // tells a new conn at a freed one's address apart
  };
  struct write_req {
    uv_write_t req{};
    std::string data;
    conn* c = nullptr;
    bool close_after = false;
  };
  struct delayed {
    uv_timer_t t{};
    scripted_etcd* owner = nullptr;
    conn* c = nullptr;
    uint64_t serial = 0;
    std::string path;
    std::string data;
  };

  static void on_connection(uv_stream_t* s, int status) {
    auto* self = static_cast<scripted_etcd*>(s->data);
    if (status < 0) return;
    auto* c = new conn;
    c->owner = self;
    c->serial = ++self->serials_;
    c->h.data = c;
    uv_tcp_init(s->loop, &c->h);
    self->conns_.insert(c);
    if (uv_accept(s, reinterpret_cast<uv_stream_t*>(&c->h)) != 0) return self->close_conn(c);
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
    const size_t nth = count(path);
    requests_.emplace_back(path, c->in.substr(end + 4, len));
    heads_.push_back(head.substr(head.find("\r\n") + 2) + "\r\n");
    c->in.clear();
    if (path == "/v3/watch") {
      if (!on_watch) return;
      auto [lines, close] = on_watch(nth);
      send(c,
           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + lines,
           close);
      return;
    }
    const reply r = on_post(path, nth);
    if (r.silent) return;
    std::string data =
        "HTTP/1.1 " + std::to_string(r.status) +
        " X\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
        std::to_string(r.body.size()) + "\r\n\r\n" + r.body;
    if (r.delay_ms == 0) {
      answered_.push_back(path);
      return send(c, std::move(data), true);
    }
    auto* d = new delayed{{}, this, c, c->serial, path, std::move(data)};
    d->t.data = d;
    uv_timer_init(c->h.loop, &d->t);
    delayed_.insert(d);
    uv_timer_start(
        &d->t,
        [](uv_timer_t* t) {
          auto* dl = static_cast<delayed*>(t->data);
          scripted_etcd* self = dl->owner;
          if (self->conns_.count(dl->c) != 0 && dl->c->serial == dl->serial) {
            self->answered_.push_back(dl->path);
            send(dl->c, std::move(dl->data), true);
          }
          self->drop_delayed(dl);
        },
        r.delay_ms, 0);
  }
  void drop_delayed(delayed* d) {
    delayed_.erase(d);
    uv_close(reinterpret_cast<uv_handle_t*>(&d->t),
             [](uv_handle_t* h) { delete static_cast<delayed*>(h->data); });
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
  std::set<delayed*> delayed_;
  uint64_t serials_ = 0;
  std::vector<std::pair<std::string, std::string>> requests_;
  std::vector<std::string> heads_;  // requests_[i]'s header lines
  std::vector<std::string> answered_;
};

}  // namespace uvbus::test
