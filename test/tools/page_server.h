// The tools tests' HTTP stand-ins on 127.0.0.1 (ports from the OS): page_server answers each
// connection with a page (or raw bytes that are not HTTP), stall_server connects and never answers.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>

namespace uvbus::test {

// A listening socket on 127.0.0.1, port from the OS; port() 0 when it could not be made.
class listener {
 public:
  listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd_, 4) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
  }
  ~listener() { ::close(fd_); }
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;
  [[nodiscard]] std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/metrics";
  }
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Connections complete (the kernel's backlog) and the request goes out, but no answer ever comes:
// a metrics page that stalls after the connection is made.
class stall_server : public listener {};

// Answers every connection (until destroyed) with 200 and `body`, then `filler` bytes of 'x', no
// Content-Length, and closes; `raw`: with `body` alone, no HTTP status line (garbage).
class page_server : public listener {
 public:
  explicit page_server(const std::string& body, size_t filler = 0, bool raw = false) {
    if (port() == 0) return;
    thread_ = std::thread([this, body, filler, raw] {
      int c = -1;
      while ((c = ::accept(fd(), nullptr, nullptr)) >= 0) serve(c, body, filler, raw);
    });
  }
  ~page_server() {
    ::shutdown(fd(), SHUT_RDWR);  // wakes the accept() waiting for the next client
    if (thread_.joinable()) thread_.join();
  }
  page_server(const page_server&) = delete;
  page_server& operator=(const page_server&) = delete;

 private:
  static void serve(int c, const std::string& body, size_t bytes, bool raw) {
    std::string req;
    char buf[4096];
    ssize_t n = 0;
    while (req.find("\r\n\r\n") == std::string::npos && (n = ::recv(c, buf, sizeof buf, 0)) > 0) {
      req.append(buf, static_cast<size_t>(n));
    }
    const std::string chunk =
        raw ? body
            : "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + body;
    size_t sent = 0;
    const std::string lines(std::string(size_t{65536} / 16 * 16, 'x'));
    bool ok = chunk.empty() || ::send(c, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0;
    while (ok && sent < bytes) {
      const size_t k = std::min(lines.size(), bytes - sent);
      ok = ::send(c, lines.data(), k, MSG_NOSIGNAL) == static_cast<ssize_t>(k);
      sent += k;
    }
    ::close(c);
  }
  std::thread thread_;
};

}  // namespace uvbus::test
