// Planned hand-over: a parent gives its listening sockets and flow positions to its next process
// (node::detach_listeners, node_config::inherit_listeners, uvbus/handover.h); peers that connect
// meanwhile wait in the backlog and are never refused; bad sockets, bad peers and missing
// partners give clear errors.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "bus/bus_harness.h"
#include "bus/handover_check.h"
#include "bus/node_types.h"
#include "uvbus/handover.h"
#include "uvbus/stream.h"

namespace uvbus::node_handover_test {
namespace {

using test::bus_fixture;
using test::bus_node;
using test::fast_config;

std::string temp_path(const char* what) {
  return "/tmp/" + test::unique_name(what);
}

// Connects a plain socket to a TCP port of 127.0.0.1 or a unix path: 0 or the errno.
int probe_connect(uint16_t port, const std::string& unix_path, int* fd_out) {
  const int fd = ::socket(port != 0 ? AF_INET : AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int r = 0;
  if (port != 0) {
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(port);
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&in), sizeof in);
  } else {
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::snprintf(un.sun_path, sizeof un.sun_path, "%s", unix_path.c_str());
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&un), sizeof un);
  }
  const int err = r == 0 ? 0 : errno;
  *fd_out = fd;
  return err;
}

// A unix socket connected to path, once something listens there (a receiver on another thread or
// process); spins until then.
int connect_when_listening(const std::string& path) {
  int fd = -1;
  while (probe_connect(0, path, &fd) != 0) {
    ::close(fd);
    std::this_thread::yield();
  }
  return fd;
}

bool fd_is_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

class NodeHandoverTest : public bus_fixture {
 protected:
  // Root P on TCP and a unix socket; A registers over TCP, B over the unix socket.
  void make_tree() {
    unix_ = temp_path("handover-root.sock");
    pc_ = fast_config();
    pc_.listen = {"ipv4://127.0.0.1:0", "unix://" + unix_};
    pc_.subnets = {{0x100, 8}};
    p_ = make(0x100, pc_);
    a_ = make(0x101, fast_config(p_->n->listen_urls().at(0)));
    b_ = make(0x102, fast_config(p_->n->listen_urls().at(1)));
    ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up(); }));
  }
  void send_some(int n) {
    for (int i = 0; i < n; ++i, ++next_) {
      ASSERT_EQ(a_->n->send_data(0x102, 1, &next_, sizeof next_), errc::ok);
    }
  }

  std::string unix_;
  node_config pc_;
  bus_node* p_ = nullptr;
  bus_node* a_ = nullptr;
  bus_node* b_ = nullptr;
  uint64_t next_ = 0;
};

TEST_F(NodeHandoverTest, ParentHandsItsListenersOverAndNoConnectionIsRefused) {
  make_tree();
  send_some(200);
  const std::vector<std::string> urls = p_->n->listen_urls();
  const std::string hpath = temp_path("handover.ctl");
  handover_state got;
  errc got_e = errc::ok;
  std::string got_why;
  std::thread receiver([&] { got_e = handover_receive(hpath, 30000, &got, &got_why); });

  handover_state give;
  ASSERT_EQ(p_->n->detach_listeners(&give.listeners), errc::ok);
  ASSERT_EQ(give.listeners.size(), 2u);
  EXPECT_TRUE(p_->n->detach_listeners(&give.listeners) == errc::ok);  // nothing left: no-op
  EXPECT_EQ(give.listeners.size(), 2u);
  // Between the two processes a connecting peer waits in the backlog: it is not refused.
  int tcp_probe = -1;
  int unix_probe = -1;
  const uint16_t port = static_cast<uint16_t>(std::stoi(urls[0].substr(urls[0].rfind(':') + 1)));
  EXPECT_EQ(probe_connect(port, {}, &tcp_probe), 0);
  EXPECT_EQ(probe_connect(0, unix_, &unix_probe), 0);
  const uint64_t a_reconnects = a_->n->counters().reconnects;
  const uint64_t b_reconnects = b_->n->counters().reconnects;
  send_some(200);
  p_->n->stop();
  ASSERT_TRUE(wait([&] { return !p_->downs.empty(); }));
  give.flow_positions = p_->n->flow_positions();
  std::string why;
  EXPECT_EQ(handover_send(hpath, give, 30000, &why), errc::ok) << why;
  receiver.join();
  ASSERT_EQ(got_e, errc::ok) << got_why;
  for (const inherited_listener& l : give.listeners) ::close(l.fd);
  ASSERT_EQ(got.listeners.size(), 2u);
  EXPECT_EQ(got.listeners[0].url, urls[0]);  // detached in listen order
  EXPECT_EQ(got.listeners[1].url, urls[1]);
  EXPECT_EQ(got.flow_positions, give.flow_positions);

  node_config c2 = pc_;
  c2.inherit_listeners = got.listeners;
  c2.inherit_flow_positions = got.flow_positions;
  bus_node* p2 = make(0x100, c2);
  EXPECT_EQ(p2->n->listen_urls(), urls);
  ASSERT_TRUE(wait([&] { return a_->n->up() && b_->n->up() && a_->ups >= 2 && b_->ups >= 2; }));
  send_some(200);
  ASSERT_TRUE(wait([&] { return a_->reports.size() == next_; }, 2 * test::kWait));
  for (const auto& r : a_->reports) EXPECT_EQ(r.status, errc::ok) << to_string(r.status);
  EXPECT_EQ(b_->got.size(), next_);
  // One connection attempt each after the switch: the first one landed.
  EXPECT_EQ(a_->n->counters().reconnects, a_reconnects + 1);
  EXPECT_EQ(b_->n->counters().reconnects, b_reconnects + 1);
  ::close(tcp_probe);
  ::close(unix_probe);
  destroy(p2);
  EXPECT_FALSE(fd_is_open(got.listeners[0].fd));  // closed with the listeners
  EXPECT_NE(::access(unix_.c_str(), F_OK), 0);    // the new owner removed the socket file
}

TEST_F(NodeHandoverTest, DetachListenersNeedsARunningNode) {
  bus_node* t = make(0x42, fast_config(), false);
  std::vector<inherited_listener> out;
  EXPECT_EQ(t->n->detach_listeners(&out), errc::wrong_state);
  ASSERT_EQ(t->n->start(), errc::ok);
  EXPECT_EQ(t->n->detach_listeners(nullptr), errc::invalid_argument);
  ASSERT_EQ(t->n->detach_listeners(&out), errc::ok);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].url, t->n->listen_urls().at(0));
  ::close(out[0].fd);
}

TEST_F(NodeHandoverTest, AnInheritedSocketThatDoesNotFitIsRefusedAndClosed) {
  // Not listening.
  const int plain = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  node_config c = fast_config();
  c.inherit_listeners = {{c.listen[0], plain}};
  bus_node* t = make(0x42, c, false);
  EXPECT_EQ(t->n->start(), errc::invalid_argument);
  EXPECT_NE(t->n->last_error().detail.find("inherit_listeners[0]"), std::string::npos);
  EXPECT_NE(t->n->last_error().detail.find("not listening"), std::string::npos)
      << t->n->last_error().detail;
  EXPECT_FALSE(fd_is_open(plain));
  // Listening, but on another port than the URL says.
  bus_node* other = make(0x43, fast_config());
  std::vector<inherited_listener> out;
  ASSERT_EQ(other->n->detach_listeners(&out), errc::ok);
  c.listen = {"ipv4://127.0.0.1:1"};
  c.inherit_listeners = {{c.listen[0], out[0].fd}};
  bus_node* u = make(0x44, c, false);
  EXPECT_EQ(u->n->start(), errc::invalid_argument);
  EXPECT_NE(u->n->last_error().detail.find("bound to port"), std::string::npos)
      << u->n->last_error().detail;
  EXPECT_FALSE(fd_is_open(out[0].fd));
}

// One socket listed twice (under two URLs) was adopted by two listeners of the node, each of
// which closes it: closed twice, the second time perhaps another thread's descriptor by then.
// Refused, naming both entries, and closed once.
TEST_F(NodeHandoverTest, OneSocketInheritedTwiceIsRefused) {
  bus_node* old = make(0x43, fast_config());
  std::vector<inherited_listener> out;
  ASSERT_EQ(old->n->detach_listeners(&out), errc::ok);
  ASSERT_EQ(out.size(), 1u);
  const int fd = out[0].fd;
  node_config c = fast_config();
  c.listen = {"ipv4://127.0.0.1:0", "ipv4://127.0.0.1:0"};
  c.inherit_listeners = {{out[0].url, fd}, {"ipv4://127.0.0.1:1", fd}};
  std::string why;
  EXPECT_EQ(node::validate(0x44, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("inherit_listeners[1]"), std::string::npos) << why;
  EXPECT_NE(why.find("the same fd as inherit_listeners[0]"), std::string::npos) << why;
  bus_node* t = make(0x44, c, false);
  EXPECT_EQ(t->n->start(), errc::invalid_argument);
  EXPECT_NE(t->n->last_error().detail.find("the same fd"), std::string::npos)
      << t->n->last_error().detail;
  const std::vector<std::string> urls = t->n->listen_urls();
  EXPECT_TRUE(urls.empty()) << urls.size() << " listeners: " << (urls.empty() ? "" : urls[0])
                            << (urls.size() < 2 ? "" : " and " + urls[1]);
  EXPECT_FALSE(fd_is_open(fd));
}

// The same config on both sides, with an IPv6 literal written otherwise than the system prints
// it: the old process gives its socket away under its bound URL ("[::1]"), and the new one, whose
// listen URL says "[0:0:0:0:0:0:0:1]", must still take it (the same address) instead of refusing
// to start.
TEST_F(NodeHandoverTest, AnIpv6LiteralWrittenAnotherWayTakesItsSocketBack) {
  node_config c = fast_config();
  c.listen = {"ipv6://[0:0:0:0:0:0:0:1]:0"};
  bus_node* old = make(0x43, c);
  std::vector<inherited_listener> out;
  ASSERT_EQ(old->n->detach_listeners(&out), errc::ok);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].url.rfind("ipv6://[::1]:", 0), 0u) << out[0].url;
  c.inherit_listeners = out;
  std::string why;
  EXPECT_EQ(node::validate(0x44, c, &why), errc::ok) << why;
  bus_node* t = make(0x44, c, false);
  ASSERT_EQ(t->n->start(), errc::ok) << t->n->last_error().detail;
  EXPECT_EQ(t->n->listen_urls(), std::vector<std::string>{out[0].url});
  // With a fixed port, and hex digits in upper case, the same.
  const std::string port = out[0].url.substr(out[0].url.rfind(':') + 1);
  EXPECT_EQ(detail::match_inherited({"ipv6://[0::1]:" + port}, out), std::vector<int>{0});
  EXPECT_EQ(detail::match_inherited({"ipv6://[FE80::A]:7"}, {{"ipv6://[fe80::a]:7", 3}}),
            std::vector<int>{0});
  EXPECT_EQ(detail::match_inherited({"ipv6://[::2]:7"}, {{"ipv6://[::1]:7", 3}}),
            std::vector<int>{-1});
}

// A port the OS had free a moment ago (bound and closed; nothing connected, so no TIME_WAIT).
uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof in;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&in), sizeof in), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&in), &len), 0);
  ::close(fd);
  return ntohs(in.sin_port);
}

uint16_t port_of(const std::string& url) {
  return static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
}

// A port-0 URL before a fixed-port URL on the same host: each gets its own socket back (the fixed
// port its exact match, the port-0 URL what is left), whatever the order they were detached in.
TEST_F(NodeHandoverTest, PortZeroAndFixedPortListenersEachAdoptTheirOwnSocket) {
  node_config c = fast_config();
  c.listen = {"ipv4://127.0.0.1:0", "ipv4://127.0.0.1:" + std::to_string(free_port())};
  bus_node* a = make(0x42, c);
  const std::vector<std::string> urls = a->n->listen_urls();
  ASSERT_EQ(urls.size(), 2u);
  std::vector<inherited_listener> out;
  ASSERT_EQ(a->n->detach_listeners(&out), errc::ok);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].url, urls[0]);  // in listen order
  EXPECT_EQ(out[1].url, urls[1]);
  a->n->stop();
  destroy(a);
  c.inherit_listeners = out;
  bus_node* b = make(0x42, c, false);
  ASSERT_EQ(b->n->start(), errc::ok) << b->n->last_error().detail;
  EXPECT_EQ(b->n->listen_urls(), urls);
  // Both sockets are adopted and listening (the port-0 one was not closed).
  for (const std::string& u : urls) {
    int fd = -1;
    EXPECT_EQ(probe_connect(port_of(u), {}, &fd), 0) << u;
    ::close(fd);
  }
  destroy(b);
  for (const inherited_listener& l : out) EXPECT_FALSE(fd_is_open(l.fd));
}

// Reversed inherited order and a dns:// URL: exact ports first, wildcards take what is left.
TEST(NodeHandoverConfig, InheritedSocketsAreMatchedExactFirstThenByPortZero) {
  const std::vector<std::string> listen = {"ipv4://127.0.0.1:0", "ipv4://127.0.0.1:7",
                                           "dns://localhost:9", "ipv4://127.0.0.1:0"};
  const std::vector<inherited_listener> in = {
      {"ipv4://127.0.0.1:9", 3}, {"ipv4://127.0.0.1:7", 4}, {"ipv4://127.0.0.1:5", 5}};
  EXPECT_EQ(detail::match_inherited(listen, in), (std::vector<int>{2, 1, 0, -1}));
  EXPECT_EQ(detail::match_inherited({"ipv4://127.0.0.1:0", "ipv4://127.0.0.1:0"}, in),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(detail::match_inherited({"ipv4://127.0.0.1:8"}, in), (std::vector<int>{-1}));
  EXPECT_EQ(detail::match_inherited({"ipv4://127.0.0.1:7"}, {}), (std::vector<int>{-1}));
}

// Flow positions inherited by a node started long after its loop last updated its time (the new
// process blocked in handover_receive()) are kept, not forgotten as idle at the first tick.
TEST_F(NodeHandoverTest, InheritedFlowPositionsSurviveAStaleLoopClock) {
  std::vector<uint8_t> blob(4 + 24, 0);
  blob[0] = 1;     // one entry
  blob[4] = 0x42;  // source 0x42
  blob[12] = 7;    // epoch 7
  blob[20] = 99;   // through 99
  node_config c = fast_config();
  c.flow_idle_ms = 1000;
  c.delivery_timeout_ms = 500;
  c.inherit_flow_positions = blob;
  // On purpose: the loop's cached time (set when the fixture initialised it) goes stale.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  bus_node* b = make(0x100, c);
  run_for(std::chrono::milliseconds(300));
  // Given in the oldest releases' form (no node id), given back in this one's: "UVF2", the id,
  // and each entry with its two left epochs (none here).
  std::vector<uint8_t> now = {'U', 'V', 'F', '2', 0, 1, 0, 0, 0, 0, 0, 0};
  now.insert(now.end(), blob.begin(), blob.end());
  now.resize(now.size() + 32, 0);
  EXPECT_EQ(b->n->flow_positions(), now);
  // In this release's form it is taken too, and in the previous one's ("UVFP", the id).
  c.inherit_flow_positions = now;
  bus_node* again = make(0x100, c);
  EXPECT_EQ(again->n->flow_positions(), now);
  std::vector<uint8_t> previous = {'U', 'V', 'F', 'P', 0, 1, 0, 0, 0, 0, 0, 0};
  previous.insert(previous.end(), blob.begin(), blob.end());
  c.inherit_flow_positions = previous;
  bus_node* third = make(0x100, c);
  EXPECT_EQ(third->n->flow_positions(), now);
}

// Flow positions handed to a node of another id (a deployment that mixed up two nodes' state
// files): its sources' sequences to it started at 1 like those to the node the positions were
// taken from, so the first messages were dropped as duplicates and acknowledged, their senders
// told ok. Refused at start(), naming both ids.
TEST_F(NodeHandoverTest, FlowPositionsOfAnotherNodeAreRefused) {
  make_tree();
  send_some(50);
  ASSERT_TRUE(wait([&] { return b_->got.size() == 50 && a_->reports.size() == 50; }));
  node_config cc = fast_config(p_->n->listen_urls().at(0));
  cc.inherit_flow_positions = b_->n->flow_positions();  // 0x102's, given to 0x103
  bus_node* c = make(0x103, cc, false);
  const errc started = c->n->start();
  EXPECT_EQ(started, errc::invalid_argument);
  EXPECT_NE(c->n->last_error().detail.find("0x102"), std::string::npos)
      << c->n->last_error().detail;
  if (started != errc::ok) return;
  ASSERT_TRUE(wait([&] { return c->n->up(); }));
  for (uint64_t i = 0; i < 50; ++i) {
    ASSERT_EQ(a_->n->send_data(0x103, 1, &i, sizeof i), errc::ok);
  }
  ASSERT_TRUE(wait([&] { return a_->reports.size() == 100; }));
  size_t ok = 0;
  for (size_t i = 50; i < 100; ++i) ok += a_->reports[i].status == errc::ok ? 1 : 0;
  EXPECT_EQ(c->got.size(), ok) << ok << " reported ok, " << c->got.size() << " delivered";
}

TEST(NodeHandoverConfig, InheritedSocketsMustNameAListenUrl) {
  node_config c = fast_config();
  std::string why;
  c.inherit_listeners = {{"ipv4://127.0.0.1:7", 3}};  // port 0 in listen: any port fits
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  for (const char* other : {"ipv6://[::1]:7", "ipv4://127.0.0.2:7", "unix:///tmp/x.sock", "x"}) {
    c.inherit_listeners = {{other, 3}};
    EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument) << other;
    EXPECT_NE(why.find("inherit_listeners[0]"), std::string::npos) << why;
  }
  c.listen = {"ipv4://127.0.0.1:8"};
  c.inherit_listeners = {{"ipv4://127.0.0.1:7", 3}};
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  c.listen = {"dns://localhost:7"};
  EXPECT_EQ(node::validate(1, c, &why), errc::ok) << why;
  c = fast_config();
  c.inherit_listeners = {{c.listen[0], -1}};
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  c.inherit_listeners = {{c.listen[0], 3}, {c.listen[0], 4}};
  EXPECT_EQ(node::validate(1, c, &why), errc::invalid_argument);
  EXPECT_NE(why.find("the same URL"), std::string::npos) << why;
}

TEST(Handover, NobodyOnTheOtherSideTimesOut) {
  const std::string path = temp_path("handover-none.ctl");
  handover_state st;
  std::string why;
  EXPECT_EQ(handover_receive(path, 50, &st, &why), errc::timeout);
  EXPECT_NE(why.find("no sender"), std::string::npos) << why;
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_EQ(handover_send(path, st, 50, &why), errc::timeout);
  EXPECT_NE(why.find("no receiver"), std::string::npos) << why;
  EXPECT_EQ(handover_receive(std::string(200, 'x'), 50, &st, &why), errc::invalid_argument);
}

TEST(Handover, GarbageIsRefusedAndItsSocketsClosed) {
  const std::string path = temp_path("handover-garbage.ctl");
  handover_state st;
  std::string why;
  errc e = errc::ok;
  std::thread receiver([&] { e = handover_receive(path, 30000, &st, &why); });
  const int fd = connect_when_listening(path);
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(fd, junk, sizeof junk, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof junk));
  receiver.join();
  EXPECT_EQ(e, errc::protocol_error);
  EXPECT_NE(why.find("not a hand-over message"), std::string::npos) << why;
  char ack = 0;
  EXPECT_EQ(::recv(fd, &ack, 1, 0), 1);
  EXPECT_EQ(ack, 1);  // refused
  ::close(fd);
  EXPECT_TRUE(st.listeners.empty());
}

TEST(Handover, APeerOfAnotherUserIsNotTrusted) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  std::string why;
  EXPECT_EQ(detail::check_peer_owner(sv[0], ::geteuid(), "/p", &why), errc::ok) << why;
  EXPECT_EQ(detail::check_peer_owner(sv[0], ::geteuid() + 1, "/p", &why), errc::permission_denied);
  EXPECT_NE(why.find("uid " + std::to_string(::geteuid())), std::string::npos) << why;
  EXPECT_NE(why.find("/p"), std::string::npos) << why;
  const int plain = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // no peer credentials
  EXPECT_NE(detail::check_peer_owner(plain, ::geteuid(), "/p", &why), errc::ok);
  ::close(plain);
  ::close(sv[0]);
  ::close(sv[1]);
}

// Run in a forked child (another user listening at path, mode 0777): accepts one connection,
// reads what comes with its fds, acknowledges it, writes the number of fds received to `report`.
[[noreturn]] void foreign_receiver(const std::string& path, int report) {
  int got = -1;
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::snprintf(un.sun_path, sizeof un.sun_path, "%s", path.c_str());
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  pollfd p{s, POLLIN, 0};
  if (::setuid(65534) == 0 && ::bind(s, reinterpret_cast<sockaddr*>(&un), sizeof un) == 0 &&
      ::chmod(path.c_str(), 0777) == 0 && ::listen(s, 4) == 0 && ::poll(&p, 1, 30000) == 1) {
    const int c = ::accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    uint8_t head[12];
    iovec iov{head, sizeof head};
    alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    got = 0;
    if (::recvmsg(c, &m, MSG_CMSG_CLOEXEC) > 0) {
      for (cmsghdr* h = CMSG_FIRSTHDR(&m); h != nullptr; h = CMSG_NXTHDR(&m, h)) {
        got += static_cast<int>((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      }
      const uint8_t ack = 0;
      (void)::send(c, &ack, 1, MSG_NOSIGNAL);
    }
  }
  (void)::write(report, &got, sizeof got);
  ::_exit(0);
}

// Another user who pre-creates the receiver's socket gets nothing: the sender checks the peer.
TEST(Handover, TheSenderRefusesAReceiverOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a receiver as another user";
  const std::string path = temp_path("handover-foreign.ctl");
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) foreign_receiver(path, report[1]);
  ::close(report[1]);
  handover_state st;
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  st.listeners = {{"ipv4://127.0.0.1:1", lfd}};
  std::string why;
  EXPECT_EQ(handover_send(path, st, 30000, &why), errc::permission_denied) << why;
  EXPECT_NE(why.find("uid 65534"), std::string::npos) << why;
  EXPECT_NE(why.find(path), std::string::npos) << why;
  int got = -1;
  EXPECT_EQ(::read(report[0], &got, sizeof got), static_cast<ssize_t>(sizeof got));
  EXPECT_EQ(got, 0) << "the foreign receiver got the listening socket";
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  ::close(report[0]);
  ::close(lfd);
  ::unlink(path.c_str());
}

// Run in a forked child: with every fd slot taken but one (the receiver's socket), accept fails
// with EMFILE while a sender waits; writes the result and its detail to `report`.
[[noreturn]] void receiver_out_of_fds(const std::string& path, int report) {
  rlimit lim{256, 256};
  (void)::setrlimit(RLIMIT_NOFILE, &lim);
  int last = -1;
  for (int f; (f = ::dup(report)) >= 0;) last = f;
  ::close(last);
  handover_state st;
  std::string why;
  const errc e = handover_receive(path, 5000, &st, &why);
  const std::string msg = std::to_string(static_cast<int>(e)) + " " + why;
  (void)::write(report, msg.data(), msg.size());
  ::_exit(0);
}

// A receiver that can not accept (out of fds) fails with the reason instead of spinning on the
// waiting connection until its deadline.
TEST(Handover, AReceiverOutOfFdsFailsWithTheReason) {
  const std::string path = temp_path("handover-emfile.ctl");
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) receiver_out_of_fds(path, report[1]);
  ::close(report[1]);
  const int fd = connect_when_listening(path);
  std::string msg;
  char buf[512];
  for (ssize_t r; (r = ::read(report[0], buf, sizeof buf)) > 0;) msg.append(buf, r);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  ::close(report[0]);
  ::close(fd);
  EXPECT_EQ(msg.substr(0, msg.find(' ')), std::to_string(static_cast<int>(errc::io_error))) << msg;
  EXPECT_NE(msg.find("accept"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EMFILE)), std::string::npos) << msg;
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

// A header from another version of the library, or announcing more than it may: the refusal
// names the field and its value (it said "not a version-1 hand-over message" for all of them).
TEST(Handover, ABadHeaderIsRefusedNamingTheField) {
  struct bad {
    uint8_t version;
    uint8_t count;
    uint32_t body_len;
    const char* named;
  };
  for (const bad& b : {bad{2, 0, 4, "version 2"}, bad{1, 9, 4, "9 sockets"},
                       bad{1, 0, 0xffffffffU, "4294967295 bytes"}}) {
    const std::string path = temp_path("handover-header.ctl");
    handover_state st;
    std::string why;
    errc e = errc::ok;
    std::thread receiver([&] { e = handover_receive(path, 30000, &st, &why); });
    const int fd = connect_when_listening(path);
    uint8_t head[12] = {'U', 'V', 'B', 'H', b.version, b.count, 0, 0};
    std::memcpy(head + 8, &b.body_len, 4);  // little-endian host
    ASSERT_EQ(::send(fd, head, sizeof head, MSG_NOSIGNAL), 12);
    receiver.join();
    ::close(fd);
    EXPECT_EQ(e, errc::protocol_error) << why;
    EXPECT_NE(why.find(b.named), std::string::npos) << why;
  }
  const std::string path = temp_path("handover-header.ctl");
  handover_state st;
  std::string why;
  std::thread receiver([&] { (void)handover_receive(path, 30000, &st, &why); });
  const int fd = connect_when_listening(path);
  ASSERT_EQ(::send(fd, "HTTP/1.1 200", 12, MSG_NOSIGNAL), 12);
  receiver.join();
  ::close(fd);
  EXPECT_NE(why.find("not a hand-over message"), std::string::npos) << why;
  // A whole version-1 message announcing one socket, sent without it.
  std::thread again([&] { (void)handover_receive(path, 30000, &st, &why); });
  const int fd2 = connect_when_listening(path);
  const uint8_t msg[19] = {'U', 'V', 'B', 'H', 1, 1, 0, 0, 7, 0, 0, 0, 1, 0, 'x', 0, 0, 0, 0};
  ASSERT_EQ(::send(fd2, msg, sizeof msg, MSG_NOSIGNAL), 19);
  again.join();
  ::close(fd2);
  EXPECT_NE(why.find("0 sockets came for 1 announced"), std::string::npos) << why;
  EXPECT_TRUE(st.listeners.empty());
}

// A sender that connects and goes before a whole header: a clear timeout, nothing adopted.
TEST(Handover, ASenderGoneMidHeaderIsAClearError) {
  const std::string path = temp_path("handover-short.ctl");
  handover_state st;
  std::string why;
  errc e = errc::ok;
  std::thread receiver([&] { e = handover_receive(path, 30000, &st, &why); });
  const int fd = connect_when_listening(path);
  ASSERT_EQ(::send(fd, "UVB", 3, MSG_NOSIGNAL), 3);
  ::close(fd);
  receiver.join();
  EXPECT_EQ(e, errc::timeout);
  EXPECT_NE(why.find("closed mid-message"), std::string::npos) << why;
  EXPECT_TRUE(st.listeners.empty());
}

// Whether a receiver listens at path: its socket file is there (a receiver links it there only
// once listening). Without connecting: a connection would be a peer of whoever listens there.
bool unix_listening_at(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// A second receiver started at the path of a live one gets address_in_use; its check whether the
// first is alive must not end the first's wait (nor remove its socket file): the real sender that
// comes next still hands over to it.
TEST(Handover, ASecondReceiverAtTheSamePathLeavesTheFirstWaiting) {
  const std::string path = temp_path("handover-second.ctl");
  handover_state got;
  std::string why;
  errc e = errc::ok;
  std::thread receiver([&] { e = handover_receive(path, 30000, &got, &why); });
  while (!unix_listening_at(path)) std::this_thread::yield();
  handover_state other;
  std::string why2;
  EXPECT_EQ(handover_receive(path, 1000, &other, &why2), errc::address_in_use) << why2;
  EXPECT_NE(why2.find("another receiver"), std::string::npos) << why2;
  handover_state st;
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  st.listeners = {{"ipv4://127.0.0.1:1", lfd}};
  st.flow_positions = {1, 2, 3};
  std::string why3;
  EXPECT_EQ(handover_send(path, st, 10000, &why3), errc::ok) << why3;
  receiver.join();
  EXPECT_EQ(e, errc::ok) << why;
  ASSERT_EQ(got.listeners.size(), 1u);
  EXPECT_EQ(got.listeners[0].url, "ipv4://127.0.0.1:1");
  EXPECT_EQ(got.flow_positions, st.flow_positions);
  for (const inherited_listener& l : got.listeners) ::close(l.fd);
  ::close(lfd);
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

// A receiver that goes without acknowledging (it crashed, or the path is some other program's
// socket): the sender's detail names the receiver and its path, not "the sender".
TEST(Handover, AReceiverGoneBeforeItsAcknowledgementIsNamedAsTheReceiver) {
  const std::string path = temp_path("handover-noack.ctl");
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::snprintf(un.sun_path, sizeof un.sun_path, "%s", path.c_str());
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&un), sizeof un), 0);
  ASSERT_EQ(::listen(s, 4), 0);
  std::thread fake([&] {
    const int c = ::accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    uint8_t buf[64];
    size_t got = 0;  // the whole message (12 + 4 + 3 bytes), so the sender is waiting for its ack
    for (ssize_t r; got < 19 && (r = ::recv(c, buf, sizeof buf, 0)) > 0;)
      got += static_cast<size_t>(r);
    ::close(c);
  });
  handover_state st;
  st.flow_positions = {1, 2, 3};
  std::string why;
  EXPECT_EQ(handover_send(path, st, 10000, &why), errc::timeout) << why;
  fake.join();
  EXPECT_NE(why.find("receiver"), std::string::npos) << why;
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_EQ(why.find("sender"), std::string::npos) << why;
  ::close(s);
  ::unlink(path.c_str());
}

TEST(Handover, StreamListenerMovesBetweenChannelsWithItsBacklog) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    stream_channel a(&loop, stream_config{}, {});
    listener_id l;
    ASSERT_EQ(a.listen("ipv4://127.0.0.1:0", &l), errc::ok);
    const uint16_t port = a.listener_port(l);
    int fd = -1;
    ASSERT_EQ(a.detach_listener(l, &fd), errc::ok);
    EXPECT_EQ(a.detach_listener(l, &fd), errc::closed);
    int waiting = -1;
    EXPECT_EQ(probe_connect(port, {}, &waiting), 0);  // queued, not refused
    int accepted = 0;
    stream_callbacks cb;
    cb.on_accepted = [&](connection_id) { ++accepted; };
    stream_channel b(&loop, stream_config{}, cb);
    listener_id l2;
    ASSERT_EQ(b.listen_fd("ipv4://127.0.0.1:0", fd, &l2), errc::ok);
    EXPECT_EQ(b.listener_port(l2), port);
    EXPECT_TRUE(test::wait_until(&loop, [&] { return accepted == 1; }));
    ::close(waiting);
    EXPECT_EQ(b.listen_fd("unix:///nonexistent.sock",
                          ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), nullptr),
              errc::invalid_argument);
  }
  EXPECT_EQ(test::close_loop(&loop), 0);
}

}  // namespace
}  // namespace uvbus::node_handover_test
