// Planned hand-over between two processes of a node: listening sockets (SCM_RIGHTS) and flow
// positions over a unix socket, with deadlines, a same-user check on both sides and a bounded
// message.
//
// Message: "UVBH" u8 version=1 u8 count u16 0 u32 body_len (little-endian), the count fds riding
// on the first bytes; body: count × (u16 url_len, url), then u32 positions_len, positions.
// Reply: one byte, 0 accepted, 1 refused.
#include "uvbus/handover.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "bus/handover_check.h"
#include "core/endian.h"

namespace uvbus {
namespace {

constexpr uint8_t kMagic[4] = {'U', 'V', 'B', 'H'};
constexpr uint8_t kVersion = 1;
constexpr size_t kHeader = 12;
constexpr size_t kMaxSockets = 8;
constexpr size_t kMaxBody = size_t{64} << 20;

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

errc say(std::string* detail, errc e, const std::string& what) {
  if (detail != nullptr) *detail = what;
  return e;
}

std::string sys(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

struct fd_guard {
  int fd = -1;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

bool make_sockaddr(const std::string& path, sockaddr_un* sun) {
  if (path.empty() || path.size() >= sizeof sun->sun_path) return false;
  *sun = sockaddr_un{};
  sun->sun_family = AF_UNIX;
  std::memcpy(sun->sun_path, path.c_str(), path.size() + 1);
  return true;
}

// Waits until fd is ready for events or the deadline passes.
bool wait_for(int fd, short events, int64_t deadline) {
  for (;;) {
    const int64_t left = deadline - now_ms();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Writes all of [p, p + n) to the non-blocking fd before the deadline.
errc write_all(int fd, const uint8_t* p, size_t n, int64_t deadline, std::string* detail) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
      return say(detail, errc::io_error, sys("handover: send"));
    } else if (!wait_for(fd, POLLOUT, deadline)) {
      return say(detail, errc::timeout, "handover: the receiver stopped reading");
    }
  }
  return errc::ok;
}

// Reads exactly n bytes into p before the deadline, collecting any fds that come with them. The
// detail of a failure names `who` sent them ("the sender", "the receiver at PATH") and what was
// awaited ("mid-message", "before acknowledging").
errc read_all(int fd, uint8_t* p, size_t n, int64_t deadline, std::vector<int>* fds,
              const std::string& who, const char* during, std::string* detail) {
  while (n > 0) {
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxSockets * sizeof(int))];
    iovec iov{p, n};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    const ssize_t r = ::recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (r > 0 || (r == 0 && m.msg_controllen > 0)) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
          int f = -1;
          std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
          fds->push_back(f);
        }
      }
      if ((m.msg_flags & MSG_CTRUNC) != 0) {
        return say(detail, errc::protocol_error, "handover: more sockets than one message holds");
      }
    }
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return say(detail, errc::timeout, "handover: " + who + " closed " + during);
    } else if (errno != EAGAIN && errno != EINTR) {
      return say(detail, errc::io_error, sys(("handover: recvmsg from " + who).c_str()));
    } else if (!wait_for(fd, POLLIN, deadline)) {
      return say(detail, errc::timeout, "handover: " + who + " stopped " + during);
    }
  }
  return errc::ok;
}

std::vector<uint8_t> encode(const handover_state& st) {
  std::vector<uint8_t> out(kHeader);
  std::memcpy(out.data(), kMagic, 4);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(st.listeners.size());
  for (const inherited_listener& l : st.listeners) {
    const size_t at = out.size();
    out.resize(at + 2 + l.url.size());
    store_le<uint16_t>(out.data() + at, static_cast<uint16_t>(l.url.size()));
    std::memcpy(out.data() + at + 2, l.url.data(), l.url.size());
  }
  const size_t at = out.size();
  out.resize(at + 4 + st.flow_positions.size());
  store_le<uint32_t>(out.data() + at, static_cast<uint32_t>(st.flow_positions.size()));
  if (!st.flow_positions.empty()) {
    std::memcpy(out.data() + at + 4, st.flow_positions.data(), st.flow_positions.size());
  }
  store_le<uint32_t>(out.data() + 8, static_cast<uint32_t>(out.size() - kHeader));
  return out;
}

// Parses the body into *out (urls and positions; the fds are paired by the caller).
bool decode_body(const std::vector<uint8_t>& body, size_t count, handover_state* out) {
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    if (body.size() - at < 2) return false;
    const size_t n = load_le16(body.data() + at);
    at += 2;
    if (body.size() - at < n) return false;
    out->listeners.push_back({std::string(reinterpret_cast<const char*>(body.data() + at), n), -1});
    at += n;
  }
  if (body.size() - at < 4) return false;
  const size_t n = load_le32(body.data() + at);
  at += 4;
  if (body.size() - at != n) return false;
  out->flow_positions.assign(body.begin() + static_cast<std::ptrdiff_t>(at), body.end());
  return true;
}

// Connects to path, retrying while nobody listens there yet.
errc connect_until(const sockaddr_un& sun, int64_t deadline, int* out, std::string* detail) {
  for (;;) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return say(detail, errc::io_error, sys("handover: socket"));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sun), sizeof sun) == 0) {
      *out = fd;
      return errc::ok;
    }
    const int err = errno;
    ::close(fd);
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
      errno = err;
      return say(detail, errc::io_error, sys("handover: connect"));
    }
    if (now_ms() >= deadline) {
      return say(detail, errc::timeout,
                 std::string("handover: no receiver at ") + sun.sun_path + " in time");
    }
    ::poll(nullptr, 0, 5);
  }
}

}  // namespace

void (*detail::handover_hook)(const char* where) = nullptr;

errc detail::check_peer_owner(int fd, uid_t expect, const std::string& path, std::string* why) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return say(why, errc::io_error,
               sys(("handover: the peer at " + path + ": SO_PEERCRED").c_str()));
  }
  if (cred.uid != expect) {
    return say(why, errc::permission_denied,
               "handover: the peer at " + path + " runs as uid " + std::to_string(cred.uid) +
                   ", not uid " + std::to_string(expect));
  }
  return errc::ok;
}

errc handover_send(const std::string& path, const handover_state& st, int timeout_ms,
                   std::string* detail) {
  sockaddr_un sun{};
  if (!make_sockaddr(path, &sun)) {
    return say(detail, errc::invalid_argument, "handover_send: path empty or too long");
  }
  if (st.listeners.size() > kMaxSockets) {
    return say(detail, errc::invalid_argument, "handover_send: more than 8 sockets");
  }
  std::vector<int> fds;
  for (const inherited_listener& l : st.listeners) {
    if (l.fd < 0 || l.url.size() > 0xffff) {
      return say(detail, errc::invalid_argument, "handover_send: \"" + l.url + "\": bad fd or url");
    }
    fds.push_back(l.fd);
  }
  const std::vector<uint8_t> msg = encode(st);
  if (msg.size() - kHeader > kMaxBody) {
    return say(detail, errc::invalid_argument, "handover_send: flow positions over 64 MiB");
  }
  const int64_t deadline = now_ms() + timeout_ms;
  int raw = -1;
  errc e = connect_until(sun, deadline, &raw, detail);
  if (e != errc::ok) return e;
  const fd_guard s(raw);
  // Only a receiver of our own user gets the sockets (another user could have made the path).
  e = detail::check_peer_owner(s.fd, ::geteuid(), path, detail);
  if (e != errc::ok) return e;
  // The header carries the fds; the rest follows as plain bytes.
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxSockets * sizeof(int))] = {};
  iovec iov{const_cast<uint8_t*>(msg.data()), kHeader};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (!fds.empty()) {
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  ssize_t w = -1;
  while ((w = ::sendmsg(s.fd, &m, MSG_NOSIGNAL)) < 0 && (errno == EAGAIN || errno == EINTR)) {
    if (!wait_for(s.fd, POLLOUT, deadline)) {
      return say(detail, errc::timeout, "handover: the receiver at " + path + " stopped reading");
    }
  }
  if (w < 0) return say(detail, errc::io_error, sys("handover: sendmsg"));
  const auto sent = static_cast<size_t>(w);
  e = write_all(s.fd, msg.data() + sent, msg.size() - sent, deadline, detail);
  if (e != errc::ok) return e;
  uint8_t ack = 1;
  std::vector<int> none;
  e = read_all(s.fd, &ack, 1, deadline, &none, "the receiver at " + path, "before acknowledging",
               detail);
  for (const int f : none) ::close(f);
  if (e != errc::ok) return e;
  if (ack != 0) {
    return say(detail, errc::protocol_error, "handover: the receiver at " + path + " refused it");
  }
  return errc::ok;
}

namespace {

// Where a receiver's socket file stands: the file's identity, to remove only our own at the end.
struct placed {
  dev_t dev = 0;
  ino_t ino = 0;
};

// Whether a receiver listens on the socket file at sun: ok (live; a full backlog counts), closed
// (nobody: its receiver died and left the file), or the error that kept us from asking.
errc probe_live(const sockaddr_un& sun) {
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe < 0) return errc::io_error;
  const int r = ::connect(probe, reinterpret_cast<const sockaddr*>(&sun), sizeof sun);
  const int err = r == 0 ? 0 : errno;
  ::close(probe);
  if (r == 0 || err == EAGAIN) return errc::ok;
  if (err == ECONNREFUSED) return errc::closed;
  errno = err;
  return err == EACCES || err == EPERM ? errc::permission_denied : errc::io_error;
}

// Names for a receiver's own files in path's directory: the file's name, and a socket address
// for it (through /proc/self/fd/DIRFD when the whole name is too long for one).
struct beside {
  std::string dir;  // with its trailing '/', or empty
  int dirfd = -1;
  explicit beside(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos) dir = path.substr(0, slash + 1);
  }
  beside(const beside&) = delete;
  beside& operator=(const beside&) = delete;
  ~beside() {
    if (dirfd >= 0) ::close(dirfd);
  }
  bool address(const std::string& name, sockaddr_un* sun) {
    if (make_sockaddr(dir + name, sun)) return true;
    if (dirfd < 0) dirfd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    return dirfd >= 0 && make_sockaddr("/proc/self/fd/" + std::to_string(dirfd) + "/" + name, sun);
  }
};

// Puts the listening socket file dir+name in place at path. link() fails if anything is at path,
// so a live receiver's file is never replaced. A stale one (nobody listens: its receiver died) is
// moved aside and asked again there, where no other receiver can replace it: still nobody's, it
// is removed; live (another receiver replaced the stale file meanwhile), it is linked back and we
// yield. (Not by inode number: a removed file's number is reused at once on ext4.)
errc link_into_place(const sockaddr_un& sun, beside* near, const std::string& name,
                     std::string* detail) {
  const std::string path = sun.sun_path;
  const std::string tmp = near->dir + name;
  const std::string aside = tmp + "-stale";
  sockaddr_un aside_at{};
  for (int attempt = 0; attempt < 16; ++attempt) {
    if (::link(tmp.c_str(), path.c_str()) == 0) return errc::ok;
    if (errno != EEXIST) {
      const errc e = errno == EACCES || errno == EPERM ? errc::permission_denied : errc::io_error;
      return say(detail, e, sys(("handover: linking the socket to " + path).c_str()));
    }
    struct stat found {};
    if (::lstat(path.c_str(), &found) != 0) continue;  // removed meanwhile
    if (!S_ISSOCK(found.st_mode)) {
      return say(detail, errc::already_exists, "handover: " + path + " exists and is no socket");
    }
    const errc live = probe_live(sun);
    if (live == errc::ok) {
      return say(detail, errc::address_in_use, "handover: another receiver at " + path);
    }
    if (live != errc::closed) {
      return say(detail, live, sys(("handover: asking the socket at " + path).c_str()));
    }
    if (detail::handover_hook != nullptr) detail::handover_hook("stale");
    if (!near->address(name + "-stale", &aside_at)) {
      return say(detail, errc::io_error, sys(("handover: the directory of " + path).c_str()));
    }
    if (::rename(path.c_str(), aside.c_str()) != 0) continue;  // another receiver removed it
    const bool stale = probe_live(aside_at) == errc::closed;
    if (!stale) (void)::link(aside.c_str(), path.c_str());  // a live one: give it back
    ::unlink(aside.c_str());
    if (!stale) return say(detail, errc::address_in_use, "handover: another receiver at " + path);
  }
  return say(detail, errc::io_error, "handover: " + path + " kept changing while replacing it");
}

// Listens at path (mode 0600 from its first instant). The socket is bound and listening under a
// temporary name before it is linked into place, so a receiver that checks path never finds a
// bound socket not yet listening there (it took that for stale and replaced it).
errc listen_at(const sockaddr_un& sun, int* out, placed* where, std::string* detail) {
  static std::atomic<unsigned> counter{0};
  const std::string path = sun.sun_path;
  beside near(path);
  const std::string name = ".uvbh-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
  const std::string tmp = near.dir + name;
  sockaddr_un bind_as{};
  if (!near.address(name, &bind_as)) {
    return say(detail, errc::io_error, sys(("handover: the directory of " + path).c_str()));
  }
  fd_guard s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s.fd < 0) return say(detail, errc::io_error, sys("handover: socket"));
  const auto bind_tmp = [&] {
    return ::bind(s.fd, reinterpret_cast<const sockaddr*>(&bind_as), sizeof bind_as) == 0;
  };
  // A file of this name is a crashed process's of our pid: no live one names its files so.
  if (!bind_tmp() && (errno != EADDRINUSE || ::unlink(tmp.c_str()) != 0 || !bind_tmp())) {
    const errc e = errno == EACCES ? errc::permission_denied : errc::io_error;
    return say(detail, e, sys(("handover: binding a socket beside " + path).c_str()));
  }
  struct unlink_tmp {
    const std::string& p;
    ~unlink_tmp() { ::unlink(p.c_str()); }
  } remove_tmp{tmp};
  if (detail::handover_hook != nullptr) detail::handover_hook("bound");
  struct stat st {};
  if (::chmod(tmp.c_str(), 0600) != 0 || ::listen(s.fd, 4) != 0 || ::lstat(tmp.c_str(), &st) != 0) {
    return say(detail, errc::io_error, sys(("handover: listening beside " + path).c_str()));
  }
  const errc e = link_into_place(sun, &near, name, detail);
  if (e != errc::ok) return e;
  *where = placed{st.st_dev, st.st_ino};
  *out = s.fd;
  s.fd = -1;
  return errc::ok;
}

// Waits for the first byte from the connected peer c, leaving it unread: ok once it is there;
// closed if the peer went without sending any (another receiver's liveness probe in listen_at(),
// or a sender that gave up before starting); timeout at the deadline; io_error (errno set).
errc first_byte(int c, int64_t deadline) {
  for (;;) {
    uint8_t b = 0;
    const ssize_t r = ::recv(c, &b, 1, MSG_PEEK);
    if (r > 0) return errc::ok;
    if (r == 0 || errno == ECONNRESET) return errc::closed;
    if (errno != EAGAIN && errno != EINTR) return errc::io_error;
    if (!wait_for(c, POLLIN, deadline)) return errc::timeout;
  }
}

// Whether a received header is one this library reads; the refusal names the field.
errc check_header(const uint8_t* head, std::string* detail) {
  const auto no = [detail](const std::string& why) {
    return say(detail, errc::protocol_error, "handover: " + why);
  };
  if (std::memcmp(head, kMagic, 4) != 0) return no("not a hand-over message (no \"UVBH\" magic)");
  if (head[4] != kVersion) {
    return no("a message of hand-over version " + std::to_string(head[4]) +
              " (another uvbus release); this one reads version " + std::to_string(kVersion));
  }
  if (head[5] > kMaxSockets) {
    return no("the header announces " + std::to_string(head[5]) + " sockets, at most " +
              std::to_string(kMaxSockets));
  }
  if (load_le32(head + 8) > kMaxBody) {
    return no("the header announces a body of " + std::to_string(load_le32(head + 8)) +
              " bytes, at most " + std::to_string(kMaxBody));
  }
  return errc::ok;
}

// Reads n body bytes from the sender c into *body, growing it as they come (by what came, at
// least 64 KiB a step): a sender that announces 64 MiB and sends 10 bytes costs 64 KiB.
errc read_growing(int c, size_t n, int64_t deadline, std::vector<uint8_t>* body,
                  std::vector<int>* fds, std::string* detail) {
  constexpr size_t kStep = size_t{64} << 10;
  while (body->size() < n) {
    const size_t have = body->size();
    body->resize(std::min(n, have + std::max(kStep, have)));
    const errc e = read_all(c, body->data() + have, body->size() - have, deadline, fds,
                            "the sender", "mid-message", detail);
    if (e != errc::ok) return e;
  }
  return errc::ok;
}

// Reads one hand-over message from the connected sender c into *out (fds owned by *out).
errc receive_from(int c, int64_t deadline, handover_state* out, std::string* detail) {
  std::vector<int> fds;
  uint8_t head[kHeader] = {};
  errc e = read_all(c, head, kHeader, deadline, &fds, "the sender", "mid-message", detail);
  const size_t count = e == errc::ok ? head[5] : 0;
  const size_t body_len = e == errc::ok ? load_le32(head + 8) : 0;
  if (e == errc::ok) e = check_header(head, detail);
  std::vector<uint8_t> body;
  if (e == errc::ok) e = read_growing(c, body_len, deadline, &body, &fds, detail);
  handover_state st;
  if (e == errc::ok && fds.size() != count) {
    e = say(detail, errc::protocol_error,
            "handover: " + std::to_string(fds.size()) + " sockets came for " +
                std::to_string(count) + " announced");
  } else if (e == errc::ok && !decode_body(body, count, &st)) {
    e = say(detail, errc::protocol_error,
            "handover: a malformed body: " + std::to_string(count) +
                " URLs and the flow positions do not fill its " + std::to_string(body.size()) +
                " bytes exactly");
  }
  if (e != errc::ok) {
    for (const int f : fds) ::close(f);
    const uint8_t no = 1;
    (void)::send(c, &no, 1, MSG_NOSIGNAL);
    return e;
  }
  for (size_t i = 0; i < count; ++i) st.listeners[i].fd = fds[i];
  const uint8_t yes = 0;
  (void)write_all(c, &yes, 1, deadline, nullptr);  // the state is ours even if the ack is lost
  *out = std::move(st);
  return errc::ok;
}

}  // namespace

errc handover_receive(const std::string& path, int timeout_ms, handover_state* out,
                      std::string* detail) {
  sockaddr_un sun{};
  if (out == nullptr || !make_sockaddr(path, &sun)) {
    return say(detail, errc::invalid_argument, "handover_receive: out null, or path bad");
  }
  const int64_t deadline = now_ms() + timeout_ms;
  int raw = -1;
  placed ours;
  const errc e = listen_at(sun, &raw, &ours, detail);
  if (e != errc::ok) return e;
  const fd_guard s(raw);
  struct unlink_guard {  // our file only (while we listen, no other receiver replaces it)
    const std::string& p;
    placed ours;
    ~unlink_guard() {
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0 && st.st_dev == ours.dev && st.st_ino == ours.ino) {
        ::unlink(p.c_str());
      }
    }
  } remove_file{path, ours};
  std::string refused;
  for (;;) {
    if (!wait_for(s.fd, POLLIN, deadline)) {
      std::string why = "handover: no sender at " + path + " in time";
      why += refused;
      return say(detail, errc::timeout, why);
    }
    const fd_guard c(::accept4(s.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (c.fd < 0) {
      // A sender that went, or a signal: wait for the next. Anything else (out of fds or
      // memory) would fail again at once for as long as the sender waits: give up with it.
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ||
          errno == EPROTO) {
        continue;
      }
      return say(detail, errc::io_error, sys(("handover: accept at " + path).c_str()));
    }
    std::string why;
    if (detail::check_peer_owner(c.fd, ::geteuid(), path, &why) != errc::ok) {
      // Not ours to trust: ignore it and keep waiting for the real sender.
      refused = " (refused: " + why + ")";
      continue;
    }
    // A connection that ends before its first byte carried no state: keep waiting. It is what
    // a second receiver started at this path does to tell a live receiver from a stale file.
    const errc first = first_byte(c.fd, deadline);
    if (first == errc::closed) continue;
    if (first == errc::io_error) {
      return say(detail, errc::io_error, sys(("handover: reading a sender at " + path).c_str()));
    }
    if (first == errc::timeout) {
      return say(detail, errc::timeout,
                 "handover: a sender connected at " + path + " and sent nothing in time");
    }
    return receive_from(c.fd, deadline, out, detail);
  }
}

}  // namespace uvbus
