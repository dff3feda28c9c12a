// Hand-over edge cases: receivers racing for one path, a stale socket file, long paths, an
// announced body that never comes, fds on every error path, start() from a wrong thread, and
// inherited sockets a node cannot adopt (one too many, bound elsewhere, a start() retried).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "bus/bus_harness.h"
#include "bus/handover_check.h"
#include "uvbus/handover.h"

namespace uvbus::handover_edge_test {
namespace {

using test::bus_fixture;
using test::fast_config;

// A private directory for one test's receiver paths: what is left in it tells what leaked.
struct temp_dir {
  std::string path;
  temp_dir() {
    std::string t = "/tmp/" + test::unique_name("handover-dir") + "-XXXXXX";
    path = ::mkdtemp(t.data()) != nullptr ? t : std::string();
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() { ::rmdir(path.c_str()); }
  // The names in the directory, "" if none.
  [[nodiscard]] std::string entries() const {
    std::string out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
          out += std::string(e->d_name) + " ";
        }
      }
      ::closedir(d);
    }
    return out;
  }
};

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

bool fd_is_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

// A unix socket connected to path, or -1 if nobody listens there.
int connect_to_once(const std::string& path) {
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::snprintf(un.sun_path, sizeof un.sun_path, "%s", path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&un), sizeof un) == 0) return fd;
  ::close(fd);
  return -1;
}

// A unix socket connected to path once a receiver is there (its file is linked only when it
// listens); spins until then.
int connect_to(const std::string& path) {
  int fd = -1;
  while ((fd = connect_to_once(path)) < 0) std::this_thread::yield();
  return fd;
}

// A socket file nobody listens on (its receiver died): bound, then closed.
void make_stale(const std::string& path) {
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::snprintf(un.sun_path, sizeof un.sun_path, "%s", path.c_str());
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&un), sizeof un), 0);
  ::close(s);
}

// A TCP socket bound to ip:port (port 0: one the OS picks, then *port gets it) and listening.
int listening_socket(const char* ip, uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(*port);
  EXPECT_EQ(::inet_pton(AF_INET, ip, &in.sin_addr), 1) << ip;
  socklen_t len = sizeof in;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&in), sizeof in), 0) << std::strerror(errno);
  EXPECT_EQ(::listen(fd, 16), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&in), &len), 0);
  *port = ntohs(in.sin_port);
  return fd;
}

inherited_listener loopback_listener() {
  uint16_t port = 0;
  const int fd = listening_socket("127.0.0.1", &port);
  return {"ipv4://127.0.0.1:" + std::to_string(port), fd};
}

handover_state small_state() {
  handover_state st;
  st.flow_positions = {1, 2, 3};
  return st;
}

// Set by tests before the receiver under test runs; read by the hook in that receiver's thread.
std::string g_path;
std::atomic<bool> g_hook_done{false};
errc g_second = errc::ok;
std::string g_second_why;
std::thread g_second_thread;
handover_state g_second_got;

// Item 1: a second receiver checked in while the first was bound but not yet listening, found
// "connection refused", took the first's file for stale and replaced it: the first then waited
// on a socket no sender could reach. Now the first binds under a temporary name and links its
// file into place only once listening, so the second never sees it half set up.
TEST(HandoverEdge, ASecondReceiverBetweenBindAndListenDoesNotTakeThePath) {
  const temp_dir dir;
  ASSERT_FALSE(dir.path.empty());
  g_path = dir.path + "/h.ctl";
  g_hook_done = false;
  const size_t fds_before = open_fds();
  detail::handover_hook = [](const char* where) {
    if (std::strcmp(where, "bound") != 0) return;
    detail::handover_hook = nullptr;
    handover_state other;
    g_second = handover_receive(g_path, 200, &other, &g_second_why);  // no sender yet
    g_hook_done = true;
  };
  handover_state got;
  std::string why;
  errc e = errc::ok;
  std::thread first([&] { e = handover_receive(g_path, 10000, &got, &why); });
  while (!g_hook_done) std::this_thread::yield();
  const handover_state st = small_state();
  std::string why_send;
  const errc sent = handover_send(g_path, st, 10000, &why_send);
  first.join();
  detail::handover_hook = nullptr;
  EXPECT_EQ(g_second, errc::timeout) << g_second_why;
  EXPECT_EQ(sent, errc::ok) << why_send;
  EXPECT_EQ(e, errc::ok) << why;
  EXPECT_EQ(got.flow_positions, st.flow_positions);
  EXPECT_EQ(dir.entries(), "");  // no socket file, no temporary name left
  EXPECT_EQ(open_fds(), fds_before);
}

// Two receivers that found one stale file: the second to act must not remove the first's live
// socket that replaced it meanwhile (it did: unlink(path) after its own check), but yield.
TEST(HandoverEdge, TwoReceiversReplacingOneStaleFileLeaveTheFirstLive) {
  const temp_dir dir;
  ASSERT_FALSE(dir.path.empty());
  g_path = dir.path + "/h.ctl";
  make_stale(g_path);
  g_second_got = {};
  detail::handover_hook = [](const char* where) {
    if (std::strcmp(where, "stale") != 0) return;
    detail::handover_hook = nullptr;
    // Another receiver replaces the stale file before this one does.
    g_second_thread = std::thread(
        [] { g_second = handover_receive(g_path, 10000, &g_second_got, &g_second_why); });
    int c = -1;  // until it listens there
    while ((c = connect_to_once(g_path)) < 0) std::this_thread::yield();
    ::close(c);
  };
  const size_t fds_before = open_fds();
  handover_state got;
  std::string why;
  const errc late = handover_receive(g_path, 10000, &got, &why);  // the hook cleared itself
  const handover_state st = small_state();
  std::string why_send;
  EXPECT_EQ(handover_send(g_path, st, 10000, &why_send), errc::ok) << why_send;
  g_second_thread.join();
  detail::handover_hook = nullptr;  // (the hook cleared itself: in case it never ran)
  EXPECT_EQ(late, errc::address_in_use) << why;
  EXPECT_NE(why.find("another receiver"), std::string::npos) << why;
  EXPECT_EQ(g_second, errc::ok) << g_second_why;
  EXPECT_EQ(g_second_got.flow_positions, st.flow_positions);
  EXPECT_EQ(dir.entries(), "");
  EXPECT_EQ(open_fds(), fds_before);
}

// A stale file is replaced; a file that is no socket is left alone and named.
TEST(HandoverEdge, AStaleFileIsReplacedAndAPlainFileIsNot) {
  const temp_dir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string path = dir.path + "/h.ctl";
  make_stale(path);
  handover_state got;
  std::string why;
  errc e = errc::ok;
  std::thread receiver([&] { e = handover_receive(path, 10000, &got, &why); });
  std::string why_send;
  EXPECT_EQ(handover_send(path, small_state(), 10000, &why_send), errc::ok) << why_send;
  receiver.join();
  EXPECT_EQ(e, errc::ok) << why;
  EXPECT_EQ(dir.entries(), "");
  const int f = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ::close(f);
  EXPECT_EQ(handover_receive(path, 1000, &got, &why), errc::already_exists) << why;
  EXPECT_NE(why.find("no socket"), std::string::npos) << why;
  EXPECT_EQ(dir.entries(), "h.ctl ");
  ::unlink(path.c_str());
}

// A path of the longest length a socket takes (107 bytes): the temporary name beside it is longer
// than a socket address holds, and is bound through /proc/self/fd.
TEST(HandoverEdge, ALongestPathStillWorks) {
  const temp_dir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string sub = dir.path + "/" + std::string(100 - dir.path.size(), 'd');
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  const std::string path = sub + "/" + std::string(107 - sub.size() - 1, 'h');
  ASSERT_EQ(path.size(), 107u);
  handover_state got;
  std::string why;
  errc e = errc::ok;
  std::thread receiver([&] { e = handover_receive(path, 10000, &got, &why); });
  std::string why_send;
  EXPECT_EQ(handover_send(path, small_state(), 10000, &why_send), errc::ok) << why_send;
  receiver.join();
  EXPECT_EQ(e, errc::ok) << why;
  EXPECT_EQ(got.flow_positions, small_state().flow_positions);
  EXPECT_EQ(::rmdir(sub.c_str()), 0) << "left in it: " << std::strerror(errno);
}

// This process's resident set now ("VmRSS") or at its peak ("VmHWM"), in KiB.
long status_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  long kib = 0;
  char line[256];
  const size_t n = std::strlen(field);
  while (f != nullptr && std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, field, n) == 0 && line[n] == ':')
      kib = std::strtol(line + n + 1, nullptr, 10);
  }
  if (f != nullptr) std::fclose(f);
  return kib;
}

// Item 2: the receiver allocated (and zeroed) the whole announced body before any of it came: a
// header announcing 64 MiB followed by 10 bytes cost the receiving process 64 MiB. The receiver
// runs in a child that reports how far its peak resident set rose over its set at the start.
TEST(HandoverEdge, AnAnnouncedBodyIsNotAllocatedBeforeItComes) {
  const temp_dir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string path = dir.path + "/h.ctl";
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const long start = status_kib("VmRSS");
    handover_state st;
    const errc e = handover_receive(path, 30000, &st, nullptr);
    const long grew = e == errc::timeout ? status_kib("VmHWM") - start : -1;
    (void)::write(report[1], &grew, sizeof grew);
    ::_exit(0);
  }
  ::close(report[1]);
  const int fd = connect_to(path);
  const uint32_t body = 64U << 20;
  uint8_t head[22] = {'U', 'V', 'B', 'H', 1, 0, 0, 0};
  std::memcpy(head + 8, &body, 4);  // little-endian host; then 10 bytes of body
  ASSERT_EQ(::send(fd, head, sizeof head, MSG_NOSIGNAL), 22);
  ::close(fd);
  long grew = -2;
  EXPECT_EQ(::read(report[0], &grew, sizeof grew), static_cast<ssize_t>(sizeof grew));
  ::close(report[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  std::printf("the receiver's peak resident set rose by %ld KiB\n", grew);
  EXPECT_GE(grew, 0);  // -1: not the timeout expected
  EXPECT_LT(grew, 16 * 1024) << "KiB";
  ::unlink(path.c_str());
}

// A sender that sends its header with sockets and goes: every socket is closed, by either side.
void send_raw(const std::string& path, const uint8_t* head, size_t n, int nfds) {
  std::vector<int> fds(static_cast<size_t>(nfds));
  for (int& f : fds) f = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int c = connect_to(path);
  iovec iov{const_cast<uint8_t*>(head), n};
  alignas(cmsghdr) char control[CMSG_SPACE(16 * sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* h = CMSG_FIRSTHDR(&m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(h), fds.data(), fds.size() * sizeof(int));
  EXPECT_EQ(::sendmsg(c, &m, MSG_NOSIGNAL), static_cast<ssize_t>(n));
  for (const int f : fds) ::close(f);
  ::close(c);
}

// Every way a hand-over can fail leaves the fd count where it was, on both sides.
TEST(HandoverEdge, NoErrorPathLeaksAnFd) {
  const temp_dir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string path = dir.path + "/h.ctl";
  const size_t before = open_fds();
  handover_state got;
  std::string why;
  EXPECT_EQ(handover_receive(path, 20, &got, &why), errc::timeout);
  EXPECT_EQ(handover_send(path, small_state(), 20, &why), errc::timeout);
  struct raw_case {
    std::vector<uint8_t> msg;
    int nfds;
    errc want;
  };
  const std::vector<raw_case> cases = {
      {{'X', 'V', 'B', 'H', 1, 2, 0, 0, 4, 0, 0, 0}, 2, errc::protocol_error},  // no magic
      {{'U', 'V', 'B', 'H', 1, 1, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0}, 3, errc::protocol_error},
      {{'U', 'V', 'B', 'H', 1, 8, 0, 0, 4, 0, 0, 0}, 12, errc::protocol_error},  // truncated
      {{'U', 'V', 'B', 'H', 1, 2, 0, 0, 99, 0, 0, 0}, 2, errc::timeout},         // gone mid-body
      {{'U', 'V', 'B', 'H', 1, 2, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0}, 2, errc::protocol_error},
  };
  for (const raw_case& c : cases) {
    errc e = errc::ok;
    std::thread receiver([&] { e = handover_receive(path, 10000, &got, &why); });
    send_raw(path, c.msg.data(), c.msg.size(), c.nfds);
    receiver.join();
    EXPECT_EQ(e, c.want) << why;
    EXPECT_TRUE(got.listeners.empty());
  }
  // A receiver that refuses the message: the sender's sockets stay the sender's, and open.
  handover_state st = small_state();
  st.listeners = {{"ipv4://127.0.0.1:1", ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)}};
  std::thread refuser([&] {
    const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::snprintf(un.sun_path, sizeof un.sun_path, "%s", path.c_str());
    EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&un), sizeof un), 0) << std::strerror(errno);
    EXPECT_EQ(::listen(s, 1), 0) << std::strerror(errno);
    const int c = ::accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    uint8_t buf[64];
    size_t n = 0;  // the whole message (12 + 2 + 18 + 4 + 3 bytes), then refuse
    for (ssize_t r; n < 39 && (r = ::recv(c, buf, sizeof buf, 0)) > 0;) n += static_cast<size_t>(r);
    const uint8_t no = 1;
    (void)::send(c, &no, 1, MSG_NOSIGNAL);
    ::close(c);
    ::close(s);
  });
  std::string why_send;
  EXPECT_EQ(handover_send(path, st, 10000, &why_send), errc::protocol_error) << why_send;
  refuser.join();
  ::unlink(path.c_str());
  EXPECT_TRUE(fd_is_open(st.listeners[0].fd));
  ::close(st.listeners[0].fd);
  EXPECT_EQ(open_fds(), before);
  EXPECT_EQ(dir.entries(), "");
}

// Item 3: start() from a thread other than the node's is refused with wrong_thread (release
// builds) and takes nothing: the inherited socket stays open and in the config, the caller's,
// and a start() from the node's own thread adopts it.
class HandoverEdgeNode : public bus_fixture {};

TEST_F(HandoverEdgeNode, AStartFromAnotherThreadLeavesTheInheritedSocketsToTheCaller) {
#ifndef NDEBUG
  GTEST_SKIP() << "debug builds abort on a wrong-thread call";
#endif
  test::bus_node* old = make(0x43, fast_config());
  std::vector<inherited_listener> out;
  ASSERT_EQ(old->n->detach_listeners(&out), errc::ok);
  ASSERT_EQ(out.size(), 1u);
  node_config c = fast_config();
  c.inherit_listeners = out;
  test::bus_node* t = make(0x43, c, false);
  errc e = errc::ok;
  std::thread other([&] { e = t->n->start(); });
  other.join();
  EXPECT_EQ(e, errc::wrong_thread);
  EXPECT_TRUE(fd_is_open(out[0].fd));
  ASSERT_EQ(t->n->config().inherit_listeners.size(), 1u);
  EXPECT_EQ(t->n->config().inherit_listeners[0].fd, out[0].fd);
  ASSERT_EQ(t->n->start(), errc::ok) << t->n->last_error().detail;
  EXPECT_EQ(t->n->listen_urls().at(0), out[0].url);  // adopted, not bound afresh
}

// A start() refused for a null loop owns the inherited sockets as any other refusal does (only
// wrong_thread leaves them to the caller): it closes them rather than leaking them for the life
// of the process.
TEST(HandoverEdge, AStartOnANullLoopClosesTheInheritedSockets) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  node_config c = fast_config();
  c.inherit_listeners = {{"ipv4://127.0.0.1:1", fd}};
  {
    node n(nullptr, 0x44, c);
    EXPECT_EQ(n.start(), errc::invalid_argument);
    EXPECT_FALSE(fd_is_open(fd));
  }
  EXPECT_FALSE(fd_is_open(fd));
}

// A release with fewer listen URLs than its predecessor: two sockets handed over, one port-0 URL.
// validate() and start() said ok, start() closed the second socket silently (the peers in its
// backlog reset). Refused, naming the entry no URL is left for; a socket offered to a shm:// URL
// (which never adopts one) likewise.
TEST_F(HandoverEdgeNode, AnInheritedSocketNoListenUrlTakesIsRefused) {
  node_config c = fast_config();
  c.inherit_listeners = {loopback_listener(), loopback_listener()};
  std::string why;
  EXPECT_EQ(node::validate(0x44, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("inherit_listeners[1]"), std::string::npos) << why;
  test::bus_node* t = make(0x44, c, false);
  EXPECT_EQ(t->n->start(), errc::invalid_argument);
  EXPECT_NE(t->n->last_error().detail.find("inherit_listeners[1]"), std::string::npos)
      << t->n->last_error().detail;
  EXPECT_TRUE(t->n->listen_urls().empty());
  for (const inherited_listener& in : c.inherit_listeners) EXPECT_FALSE(fd_is_open(in.fd));
  const std::string shm = "shm://" + test::unique_name("inh");
  c.listen = {"ipv4://127.0.0.1:0", shm};
  c.inherit_listeners = {{shm, 3}};
  EXPECT_EQ(node::validate(0x44, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("inherit_listeners[0]"), std::string::npos) << why;
}

// A socket bound to 0.0.0.0:P handed over for ipv4://127.0.0.1:P (a hand-built state, systemd
// socket activation): adopted, a loopback-only node accepted on every interface. Refused.
TEST_F(HandoverEdgeNode, AWildcardSocketDoesNotServeALoopbackUrl) {
  uint16_t port = 0;
  const int fd = listening_socket("0.0.0.0", &port);
  node_config c = fast_config();
  c.listen = {"ipv4://127.0.0.1:" + std::to_string(port)};
  c.inherit_listeners = {{c.listen[0], fd}};
  test::bus_node* t = make(0x44, c, false);
  EXPECT_EQ(t->n->start(), errc::invalid_argument);
  const std::string why = t->n->last_error().detail;
  EXPECT_NE(why.find("inherit_listeners[0]"), std::string::npos) << why;
  EXPECT_NE(why.find("bound to 0.0.0.0"), std::string::npos) << why;
  EXPECT_TRUE(t->n->listen_urls().empty());
  EXPECT_FALSE(fd_is_open(fd));
}

// A certificate file missing at start(): binding afresh said not_found naming listen[0]; with an
// inherited socket the same failure became invalid_argument blaming the socket. The code and the
// field are now the same either way.
TEST_F(HandoverEdgeNode, AMissingCertificateIsNotFoundWithOrWithoutAnInheritedSocket) {
  node_config c = fast_config();
  c.tls.mode = tls_mode::certificate;
  c.tls.cert_file = c.tls.key_file = c.tls.ca_file = "/nonexistent/" + test::unique_name("cert");
  for (const bool inherit : {false, true}) {
    if (inherit) c.inherit_listeners = {loopback_listener()};
    test::bus_node* t = make(inherit ? 0x45 : 0x44, c, false);
    EXPECT_EQ(t->n->start(), errc::not_found) << inherit;
    const std::string why = t->n->last_error().detail;
    EXPECT_NE(why.find("listen[0]"), std::string::npos) << why;
    EXPECT_EQ(why.find("inherit_listeners"), std::string::npos) << why;
  }
  EXPECT_FALSE(fd_is_open(c.inherit_listeners[0].fd));
}

// A start() that failed (listen[1]'s port busy) has closed the inherited sockets; a second
// start() was refused with "fd -1", which said nothing of why. It now says they were taken.
TEST_F(HandoverEdgeNode, AStartRetriedAfterAFailureSaysTheInheritedSocketsWereTaken) {
  uint16_t busy = 0;
  const int blocker = listening_socket("127.0.0.1", &busy);
  node_config c = fast_config();
  c.listen = {"ipv4://127.0.0.1:0", "ipv4://127.0.0.1:" + std::to_string(busy)};
  c.inherit_listeners = {loopback_listener()};
  test::bus_node* t = make(0x44, c, false);
  EXPECT_EQ(t->n->start(), errc::address_in_use) << t->n->last_error().detail;
  EXPECT_FALSE(fd_is_open(c.inherit_listeners[0].fd));
  ::close(blocker);
  EXPECT_EQ(t->n->start(), errc::invalid_argument);
  const std::string why = t->n->last_error().detail;
  EXPECT_NE(why.find("inherit_listeners[0]"), std::string::npos) << why;
  EXPECT_NE(why.find("closed by an earlier start()"), std::string::npos) << why;
}

}  // namespace
}  // namespace uvbus::handover_edge_test
