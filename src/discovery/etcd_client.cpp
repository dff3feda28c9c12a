// libcurl's multi-socket interface on a libuv loop: curl tells which sockets to watch
// (CURLMOPT_SOCKETFUNCTION -> uv_poll) and when to time out (CURLMOPT_TIMERFUNCTION -> uv_timer);
// the loop tells curl what happened (curl_multi_socket_action). User callbacks run only after
// curl returned, so they may add, cancel, or destroy the client.
#include "discovery/etcd_client.h"

#include <curl/curl.h>
#include <uv.h>

#include <cstring>
#include <mutex>
#include <utility>

namespace uvbus::detail {

struct etcd_client::request {
  uint64_t id = 0;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string body;  // the request body (curl reads it in place)
  std::string buf;   // the response (unary) or the unconsumed part of a stream
  bool streaming = false;
  bool oversize = false;
  size_t line_len = 0;                     // a stream's bytes since its last newline
  size_t max = 0;                          // max_body
  std::vector<uint64_t>* dirty = nullptr;  // the client's dirty_ list
  line_fn on_line;
  done_fn done;
  char errbuf[CURL_ERROR_SIZE] = {};
  ~request() {
    if (easy != nullptr) curl_easy_cleanup(easy);
    if (headers != nullptr) curl_slist_free_all(headers);
  }
};

struct etcd_client::poll_ctx {
  uv_poll_t poll{};
  etcd_client* owner = nullptr;
  int fd = -1;
};

namespace {

CURLM* multi_of(void* m) {
  return static_cast<CURLM*>(m);
}

int socket_cb(CURL*, curl_socket_t fd, int what, void* userp, void* socketp) {
  return static_cast<etcd_client*>(userp)->on_socket(fd, what, socketp);
}

int timer_cb(CURLM*, long timeout_ms, void* userp) {
  static_cast<etcd_client*>(userp)->on_curl_timer(timeout_ms);
  return 0;
}

void on_poll(uv_poll_t* h, int status, int events) {
  auto* ctx = static_cast<etcd_client::poll_ctx*>(h->data);
  int flags = 0;
  if (status < 0) flags |= CURL_CSELECT_ERR;
  if ((events & UV_READABLE) != 0) flags |= CURL_CSELECT_IN;
  if ((events & UV_WRITABLE) != 0) flags |= CURL_CSELECT_OUT;
  ctx->owner->action(ctx->fd, flags);
}

void on_timeout(uv_timer_t* t) {
  static_cast<etcd_client*>(t->data)->action(CURL_SOCKET_TIMEOUT, 0);
}

errc errc_of(CURLcode c) {
  switch (c) {
    case CURLE_OK:
      return errc::ok;
    case CURLE_COULDNT_CONNECT:
      return errc::connection_refused;
    case CURLE_OPERATION_TIMEDOUT:
      return errc::timeout;
    case CURLE_COULDNT_RESOLVE_HOST:
      return errc::resolve_failed;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return errc::bad_url;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
      return errc::connection_reset;
    case CURLE_OUT_OF_MEMORY:
      return errc::no_memory;
    case CURLE_PEER_FAILED_VERIFICATION:  // etcd's certificate: unknown CA, expired, another name
      return errc::peer_not_authenticated;
    case CURLE_SSL_CONNECT_ERROR:
      return errc::tls_handshake_failed;
    case CURLE_SSL_CERTPROBLEM:  // our certificate or key could not be used
    case CURLE_SSL_CACERT_BADFILE:
      return errc::invalid_argument;
    default:
      return errc::io_error;
  }
}

}  // namespace

namespace {
// Runs inside curl_multi_socket_action: only buffers (user callbacks run in after_action).
size_t write_cb(char* data, size_t size, size_t n, void* userp) {
  auto* r = static_cast<etcd_client::request*>(userp);
  const size_t len = size * n;
  if (!r->streaming && r->buf.size() + len > r->max) {
    r->oversize = true;
    return 0;  // curl fails the transfer with CURLE_WRITE_ERROR
  }
  // A stream's bound is one message (line): several complete ones may arrive in one socket action
  // (curl reads on while data is pending) before after_action delivers them.
  const char* p = data;
  const char* const end = data + len;
  while (r->streaming && p < end) {
    const auto* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
    const auto seg = static_cast<size_t>((nl != nullptr ? nl : end) - p);
    if (r->line_len + seg > r->max) {
      r->oversize = true;
      return 0;
    }
    r->line_len = nl != nullptr ? 0 : r->line_len + seg;
    p = nl != nullptr ? nl + 1 : end;
  }
  r->buf.append(data, len);
  if (r->streaming && (r->dirty->empty() || r->dirty->back() != r->id)) r->dirty->push_back(r->id);
  return len;
}
}  // namespace

void set_tls_options(void* easy, const etcd_tls& tls) {
  CURL* e = easy;
  // etcd's certificate and host name are verified (curl's defaults, stated); the files are read
  // at each new connection.
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!tls.ca_file.empty()) {
    curl_easy_setopt(e, CURLOPT_CAINFO, tls.ca_file.c_str());
    // The CA file is the only trust anchor: a libcurl built with a default CA directory (Debian's:
    // /etc/ssl/certs) keeps it beside CURLOPT_CAINFO, so any certificate from a public CA for
    // etcd's host name was trusted too. (No CA blob or native store is set either.)
    curl_easy_setopt(e, CURLOPT_CAPATH, nullptr);
  }
  if (!tls.cert_file.empty()) {
    curl_easy_setopt(e, CURLOPT_SSLCERT, tls.cert_file.c_str());
    curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(e, CURLOPT_SSLKEY, tls.key_file.c_str());
    curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
  }
}

etcd_client::etcd_client(uv_loop_t* loop, size_t max_body, etcd_tls tls)
    : loop_(loop), max_body_(max_body), tls_(std::move(tls)), life_(std::make_shared<char>(0)) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURLM* m = curl_multi_init();
  multi_ = m;
  auto* t = new uv_timer_t;
  uv_timer_init(loop_, t);
  t->data = this;
  timer_ = t;
  curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, socket_cb);
  curl_multi_setopt(m, CURLMOPT_SOCKETDATA, this);
  curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, timer_cb);
  curl_multi_setopt(m, CURLMOPT_TIMERDATA, this);
}

etcd_client::~etcd_client() {
  life_.reset();
  for (auto& [id, r] : reqs_) curl_multi_remove_handle(multi_of(multi_), r->easy);
  reqs_.clear();
  curl_multi_cleanup(multi_of(multi_));  // may still report sockets to forget (on_socket)
  for (auto& [fd, ctx] : polls_) {
    uv_poll_stop(&ctx->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(&ctx->poll),
             [](uv_handle_t* h) { delete static_cast<poll_ctx*>(h->data); });
  }
  polls_.clear();
  auto* t = static_cast<uv_timer_t*>(timer_);
  uv_timer_stop(t);
  uv_close(reinterpret_cast<uv_handle_t*>(t),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
}

uint64_t etcd_client::post(const std::string& url, std::string body, uint32_t timeout_ms,
                           done_fn done) {
  return add(url, std::move(body), timeout_ms, timeout_ms, nullptr, std::move(done));
}

uint64_t etcd_client::stream(const std::string& url, std::string body, uint32_t connect_timeout_ms,
                             line_fn on_line, done_fn done) {
  return add(url, std::move(body), 0, connect_timeout_ms, std::move(on_line), std::move(done));
}

uint64_t etcd_client::add(const std::string& url, std::string body, uint32_t timeout_ms,
                          uint32_t connect_timeout_ms, line_fn on_line, done_fn done) {
  auto r = std::make_unique<request>();
  r->id = next_id_++;
  r->body = std::move(body);
  r->streaming = static_cast<bool>(on_line);
  r->on_line = std::move(on_line);
  r->done = std::move(done);
  r->easy = curl_easy_init();
  if (r->easy == nullptr) return 0;
  r->max = max_body_;
  r->dirty = &dirty_;
  CURL* e = r->easy;
  r->headers = curl_slist_append(nullptr, "Content-Type: application/json");
  r->headers = curl_slist_append(r->headers, "Expect:");
  if (!token_.empty())
    r->headers = curl_slist_append(r->headers, ("Authorization: " + token_).c_str());
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body.c_str());
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r->body.size()));
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r.get());
  curl_easy_setopt(e, CURLOPT_PRIVATE, r.get());
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->errbuf);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_timeout_ms));
  if (timeout_ms > 0) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  if (r->streaming) curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  set_tls_options(e, tls_);
  if (curl_multi_add_handle(multi_of(multi_), e) != CURLM_OK) return 0;
  const uint64_t id = r->id;
  reqs_.emplace(id, std::move(r));
  return id;
}

void etcd_client::drop(uint64_t id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  curl_multi_remove_handle(multi_of(multi_), it->second->easy);
  reqs_.erase(it);
}

void etcd_client::cancel(uint64_t id) {
  drop(id);
}

int etcd_client::on_socket(int fd, int what, void* socketp) {
  auto* ctx = static_cast<poll_ctx*>(socketp);
  if (what == CURL_POLL_REMOVE) {
    if (ctx != nullptr) {
      uv_poll_stop(&ctx->poll);
      uv_close(reinterpret_cast<uv_handle_t*>(&ctx->poll),
               [](uv_handle_t* h) { delete static_cast<poll_ctx*>(h->data); });
      polls_.erase(fd);
      curl_multi_assign(multi_of(multi_), fd, nullptr);
    }
    return 0;
  }
  if (ctx == nullptr) {
    ctx = new poll_ctx;
    ctx->owner = this;
    ctx->fd = fd;
    ctx->poll.data = ctx;
    if (uv_poll_init_socket(loop_, &ctx->poll, fd) != 0) {
      delete ctx;
      return -1;
    }
    polls_[fd] = ctx;
    curl_multi_assign(multi_of(multi_), fd, ctx);
  }
  int events = 0;
  if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) events |= UV_READABLE;
  if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) events |= UV_WRITABLE;
  uv_poll_start(&ctx->poll, events, on_poll);
  return 0;
}

void etcd_client::on_curl_timer(long timeout_ms) {
  auto* t = static_cast<uv_timer_t*>(timer_);
  if (timeout_ms < 0) {
    uv_timer_stop(t);
  } else {
    uv_timer_start(t, on_timeout, static_cast<uint64_t>(timeout_ms), 0);
  }
}

void etcd_client::action(int fd, int flags) {
  int running = 0;
  curl_multi_socket_action(multi_of(multi_), fd, flags, &running);
  after_action();
}

// Each stream's complete lines in one pass: the consumed part is erased once at the end (erasing
// each line from the front moved the rest every time, quadratic in a burst of small messages).
void etcd_client::deliver_lines(const std::weak_ptr<char>& alive) {
  std::vector<uint64_t> ids;
  ids.swap(dirty_);
  for (const uint64_t id : ids) {
    size_t from = 0;
    for (;;) {
      auto it = reqs_.find(id);
      if (it == reqs_.end()) break;  // cancelled from a line's callback: its buffer is gone
      request& r = *it->second;
      const size_t nl = r.buf.find('\n', from);
      if (nl == std::string::npos) {
        r.buf.erase(0, from);
        break;
      }
      std::string line = r.buf.substr(from, nl - from);
      from = nl + 1;
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      line_fn cb = r.on_line;  // the request may be cancelled from inside
      cb(line);
      if (alive.expired()) return;
    }
  }
}

void etcd_client::after_action() {
  const std::weak_ptr<char> alive = life_;
  deliver_lines(alive);
  if (alive.expired()) return;
  CURLMsg* m = nullptr;
  int left = 0;
  while ((m = curl_multi_info_read(multi_of(multi_), &left)) != nullptr) {
    if (m->msg != CURLMSG_DONE) continue;
    void* wp = nullptr;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &wp);
    const uint64_t id = static_cast<request*>(wp)->id;
    auto it = reqs_.find(id);
    if (it == reqs_.end()) continue;
    request& r = *it->second;
    http_result res;
    res.code = errc_of(m->data.result);
    if (r.oversize) res.code = errc::oversize;
    curl_easy_getinfo(r.easy, CURLINFO_RESPONSE_CODE, &res.status);
    if (res.code != errc::ok) {
      res.detail = r.oversize ? "response above max_response_bytes"
                              : std::string(curl_easy_strerror(m->data.result)) +
                                    (r.errbuf[0] != '\0' ? std::string(": ") + r.errbuf : "");
    }
    res.body = std::move(r.buf);
    done_fn done = std::move(r.done);
    drop(id);
    if (done) done(res);
    if (alive.expired()) return;
  }
}

}  // namespace uvbus::detail
