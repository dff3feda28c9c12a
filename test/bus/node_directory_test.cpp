// The bus directory of a static tree: every node learns every other node's entry (name, type,
// labels, parent, listen URLs, pid, start time, version) through registrations flooded along the
// tree, gets added / removed events when a node or a whole subtree comes or goes, and can look
// nodes up by id, name, type and labels; older peers and bad configs are handled; entries left out
// of a full directory are asked for again once room frees (a request answered at most once per
// heartbeat interval).
#include <unistd.h>

#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bus/bus_harness.h"
#include "bus/raw_peer.h"

namespace uvbus::node_directory_test {
namespace {

using test::bus_fixture;
using test::bus_node;
using test::fast_config;

struct dir_event {
  directory_event ev;
  bus_id id;
};

class NodeDirectoryTest : public bus_fixture {
 protected:
  // A node with a name, type and labels whose on_directory events land in events_[index].
  bus_node* make_described(bus_id id, const std::string& name, const std::string& type,
                           std::vector<node_label> labels, node_config c) {
    c.name = name;
    c.type = type;
    c.labels = std::move(labels);
    auto& list = events_.emplace_back();
    return make(id, std::move(c), true, [&list](node_callbacks* cb) {
      cb->on_directory = [&list](directory_event ev, const directory_entry& e) {
        list.push_back({ev, e.id});
      };
    });
  }
  // A large bus made up by a hand-made child: root 0x10000 (0x10000/16) with small messages and
  // link queues, and `src` (kSource, 0x18000/12) registered to it, to announce() entries.
  static constexpr bus_id kSource = 0x18000;
  void large_bus(test::raw_child* src, size_t message_limit, size_t queue_bytes) {
    node_config rc = fast_config();
    rc.subnets = {{0x10000, 16}};
    rc.message_limit = message_limit;
    rc.link_queue_bytes = queue_bytes;
    rc.heartbeat_timeout_ms = 60000;
    r_ = make_described(0x10000, "root", "root", {}, rc);
    src->subnets = {{kSource, 12}};
    src->start(&loop_, r_->n->listen_urls().at(0));
    EXPECT_TRUE(wait([&] { return src->registered; }));
  }
  static void send_dir(test::raw_child& src, const proto::directory_body& b) {
    std::vector<uint8_t> body;
    proto::encode_directory(b, &body);
    src.send(proto::msg_type::directory, body);
  }
  // src announces nodes [from, to] of type logic, `per` a message, each with `pads` labels of 120
  // bytes and a "version" label last.
  static void announce(test::raw_child& src, bus_id from, bus_id to, size_t per, int pads,
                       const std::string& version) {
    proto::directory_body b;
    for (bus_id id = from; id <= to; ++id) {
      directory_entry e;
      e.id = id;
      e.type = "logic";
      for (int k = 0; k < pads; ++k)
        e.labels.emplace_back("k" + std::to_string(k), std::string(120, 'v'));
      e.labels.emplace_back("version", version);
      b.entries.push_back(std::move(e));
      if (b.entries.size() == per || id == to) {
        send_dir(src, b);
        b.entries.clear();
      }
    }
  }
  node_config under(bus_node* parent, std::vector<subnet> nets = {}) {
    node_config c = fast_config();
    c.parent_urls = {parent->n->listen_urls().at(0)};
    c.subnets = std::move(nets);
    return c;
  }
  // Root R 0x100 (0x100/8) with gateway G 0x110 (0x110/4, zone a) below it, logic L1 0x111 (zone
  // a) below G, and logic L2 0x120 (zone b) and chat C 0x121 directly below R.
  void make_tree() {
    node_config rc = fast_config();
    rc.subnets = {{0x100, 8}};
    r_ = make_described(0x100, "root", "root", {}, rc);
    g_ = make_described(0x110, "gw-1", "gateway", {{"zone", "a"}}, under(r_, {{0x110, 4}}));
    ASSERT_TRUE(wait([&] { return g_->n->up(); }));
    l1_ = make_described(0x111, "logic-1", "logic", {{"zone", "a"}, {"version", "7"}}, under(g_));
    l2_ = make_described(0x120, "logic-2", "logic", {{"zone", "b"}, {"version", "7"}}, under(r_));
    c_ = make_described(0x121, "chat-1", "chat", {}, under(r_));
    ASSERT_TRUE(wait([&] { return all_see(5); }));
  }
  bool all_see(size_t n) {
    for (bus_node* t : {r_, g_, l1_, l2_, c_}) {
      if (t != nullptr && t->n != nullptr && t->n->directory().size() != n) return false;
    }
    return true;
  }
  static bool saw(const std::vector<dir_event>& list, directory_event ev, bus_id id) {
    for (const dir_event& e : list) {
      if (e.ev == ev && e.id == id) return true;
    }
    return false;
  }

  std::deque<std::vector<dir_event>> events_;
  bus_node* r_ = nullptr;
  bus_node* g_ = nullptr;
  bus_node* l1_ = nullptr;
  bus_node* l2_ = nullptr;
  bus_node* c_ = nullptr;
};

TEST_F(NodeDirectoryTest, EveryNodeKnowsEveryOtherWithItsFields) {
  make_tree();
  directory_entry e;
  // The deepest leaf knows the farthest one, with what it said about itself.
  ASSERT_TRUE(l1_->n->lookup(0x121, &e));
  EXPECT_EQ(e.name, "chat-1");
  EXPECT_EQ(e.type, "chat");
  EXPECT_EQ(e.parent, 0x100u);
  EXPECT_EQ(e.pid, static_cast<uint32_t>(getpid()));
  EXPECT_EQ(e.listen, c_->n->listen_urls());
  EXPECT_EQ(e.protocol_version, proto::kMaxVersion);
  EXPECT_GT(e.start_time_ms, 1700000000000u);
  ASSERT_TRUE(c_->n->lookup(0x111, &e));
  EXPECT_EQ(e.parent, 0x110u);
  EXPECT_EQ(e.labels, (std::vector<node_label>{{"zone", "a"}, {"version", "7"}}));
  ASSERT_TRUE(c_->n->lookup(0x100, &e));
  EXPECT_EQ(e.parent, 0u);  // the root
  // Itself first, then by id.
  const std::vector<directory_entry> all = l2_->n->directory();
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].id, 0x120u);
  EXPECT_EQ(all[1].id, 0x100u);
  EXPECT_FALSE(l2_->n->lookup(0x999, &e));
}

TEST_F(NodeDirectoryTest, LookupByNameTypeAndLabels) {
  make_tree();
  directory_entry e;
  ASSERT_TRUE(c_->n->lookup_name("logic-1", &e));
  EXPECT_EQ(e.id, 0x111u);
  EXPECT_FALSE(c_->n->lookup_name("nobody", &e));
  std::vector<directory_entry> logic = g_->n->find("logic");
  ASSERT_EQ(logic.size(), 2u);
  EXPECT_EQ(logic[0].id, 0x111u);
  EXPECT_EQ(logic[1].id, 0x120u);
  logic = g_->n->find("logic", {{"zone", "b"}});
  ASSERT_EQ(logic.size(), 1u);
  EXPECT_EQ(logic[0].id, 0x120u);
  EXPECT_EQ(g_->n->find("", {{"zone", "a"}}).size(), 2u);  // any type: G and L1
  EXPECT_TRUE(g_->n->find("logic", {{"zone", "c"}}).empty());
}

TEST_F(NodeDirectoryTest, NodesAndSubtreesThatLeaveAreRemovedEverywhere) {
  make_tree();
  std::vector<dir_event>& c_events = events_[4];
  EXPECT_TRUE(saw(c_events, directory_event::added, 0x111));
  EXPECT_TRUE(saw(c_events, directory_event::added, 0x100));
  destroy(l1_);
  l1_ = nullptr;
  ASSERT_TRUE(wait([&] { return all_see(4); }));
  EXPECT_TRUE(saw(c_events, directory_event::removed, 0x111));
  EXPECT_FALSE(saw(c_events, directory_event::removed, 0x110));
  // A node comes back: added again.
  l1_ = make_described(0x111, "logic-1", "logic", {{"zone", "a"}}, under(g_));
  ASSERT_TRUE(wait([&] { return all_see(5); }));
  // The gateway goes with the leaf below it (its own link to the leaf stays up for now, but
  // nobody above can reach either any more).
  const size_t before = c_events.size();
  destroy(g_);
  g_ = nullptr;
  ASSERT_TRUE(wait([&] {
    return r_->n->directory().size() == 3 && c_->n->directory().size() == 3 &&
           l2_->n->directory().size() == 3;
  }));
  std::vector<dir_event> after(c_events.begin() + static_cast<long>(before), c_events.end());
  EXPECT_TRUE(saw(after, directory_event::removed, 0x110));
  EXPECT_TRUE(saw(after, directory_event::removed, 0x111));
}

TEST_F(NodeDirectoryTest, AVersion4ChildIsLeftOutAndNothingElseChanges) {
  node_config rc = fast_config();
  rc.subnets = {{0x100, 8}};
  r_ = make_described(0x100, "root", "root", {}, rc);
  node_config old = under(r_);
  old.protocol_max = 4;
  bus_node* o = make_described(0x101, "old", "logic", {}, old);
  c_ = make_described(0x121, "chat-1", "chat", {}, under(r_));
  ASSERT_TRUE(wait([&] { return o->n->up() && c_->n->directory().size() == 2; }));
  directory_entry e;
  EXPECT_FALSE(c_->n->lookup(0x101, &e));
  EXPECT_EQ(o->n->directory().size(), 1u);  // only itself
  ASSERT_EQ(test::send_str(c_, 0x101, 1, "still routed"), errc::ok);
  ASSERT_TRUE(wait([&] { return o->got.size() == 1; }));
  EXPECT_EQ(r_->n->counters().protocol_errors, 0u);
}

// A directory larger than a link's send queue: the snapshot a registering node gets meets the full
// queue, and what did not fit follows as the queue drains (before: cut at the queue's size, the
// rest never sent, so the new node never saw most of the bus). Removals after it arrive too.
TEST_F(NodeDirectoryTest, ADirectoryLargerThanTheLinkQueueReachesANewNodeWhole) {
  constexpr size_t kEntries = 1500;
  test::raw_child src(kSource, 0x10000);
  large_bus(&src, size_t{16} * 1024, size_t{64} * 1024);
  ASSERT_TRUE(src.registered);
  for (bus_id from = kSource + 1; from <= kSource + kEntries; from += 500) {
    announce(src, from, from + 499, 40, 1, "1");
  }
  ASSERT_TRUE(wait([&] { return r_->n->directory().size() == kEntries + 1; }));
  l1_ = make_described(0x10001, "logic-1", "logic", {}, under(r_));  // the new node
  ASSERT_TRUE(wait([&] { return l1_->n->directory().size() == kEntries + 2; }))
      << l1_->n->directory().size() << " of " << kEntries + 2;
  proto::directory_body gone;
  gone.op = proto::dir_op::remove;
  for (bus_id id = kSource + 1; id <= kSource + kEntries; ++id) {
    if (id % 3 != 0) gone.ids.push_back(id);
  }
  send_dir(src, gone);
  const size_t left = kEntries - gone.ids.size() + 2;
  ASSERT_TRUE(wait([&] { return l1_->n->directory().size() == left; }));
  directory_entry e;
  EXPECT_TRUE(l1_->n->lookup(kSource + 3, &e));
  EXPECT_FALSE(l1_->n->lookup(kSource + 1, &e));
  src.ch->close();
  ASSERT_TRUE(wait([&] { return src.ch->closed(); }));
}

// A peer that does not read while the directory changes: its snapshot stalls on the full queue
// (and the kernel's buffers: 8 MB of entries), removals and changes made meanwhile wait behind
// it, and once it reads it ends with exactly the root's directory (before: the snapshot was cut,
// and the removals and changes that met the full queue were lost).
TEST_F(NodeDirectoryTest, RemovalsAndChangesWaitBehindAStalledSnapshotInOrder) {
  constexpr size_t kEntries = 4000;
  test::raw_child src(kSource, 0x10000);
  large_bus(&src, size_t{64} * 1024, size_t{256} * 1024);
  ASSERT_TRUE(src.registered);
  for (bus_id from = kSource + 1; from <= kSource + kEntries; from += 400) {  // 0.9 MB at a time:
    announce(src, from, from + 399, 20, 15, "1");  // under the raw child's own 2 MiB queue
    ASSERT_TRUE(wait([&] { return r_->n->directory().size() == from + 400 - kSource; }));
  }
  test::raw_child dst(0x10002, 0x10000);
  dst.pause_after_register = true;
  dst.start(&loop_, r_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return dst.registered; }));
  run_for(std::chrono::milliseconds(200));  // the root's snapshot fills what it can
  proto::directory_body gone;
  gone.op = proto::dir_op::remove;
  for (bus_id id = kSource + 1; id <= kSource + 1000; ++id) gone.ids.push_back(id);
  send_dir(src, gone);
  announce(src, kSource + 3990, kSource + 3999, 20, 15, "2");  // changed
  directory_entry e;
  ASSERT_TRUE(wait([&] {
    return r_->n->directory().size() == kEntries - 1000 + 1 && r_->n->lookup(kSource + 3999, &e) &&
           e.labels.back().second == "2";
  }));
  dst.resume_reading();
  // What the peer makes of what it got, in order, against the root's own directory.
  std::map<bus_id, std::string> want;
  for (const directory_entry& d : r_->n->directory()) {
    want[d.id] = d.labels.empty() ? "" : d.labels.back().second;
  }
  std::map<bus_id, std::string> view;
  const auto rebuild = [&] {
    view.clear();
    for (const auto& m : dst.got) {
      proto::directory_body b;
      if (m.hd.type != proto::msg_type::directory ||
          proto::parse_directory(m.body.data(), m.body.size(), &b) != errc::ok) {
        continue;
      }
      for (const directory_entry& d : b.entries)
        view[d.id] = d.labels.empty() ? "" : d.labels.back().second;
      for (const bus_id id : b.ids) view.erase(id);
    }
    return view == want;
  };
  ASSERT_TRUE(wait(rebuild)) << view.size() << " entries seen, " << want.size() << " wanted";
  src.ch->close();
  dst.ch->close();
  ASSERT_TRUE(wait([&] { return src.ch->closed() && dst.ch->closed(); }));
}

// directory_max_entries bounds what others can make a node hold: new entries beyond it are left
// out, counted and logged; the rest of the bus is not affected.
TEST_F(NodeDirectoryTest, ANewEntryBeyondTheCapIsLeftOutCountedAndLogged) {
  node_config rc = fast_config();
  rc.subnets = {{0x100, 8}};
  r_ = make_described(0x100, "root", "root", {}, rc);
  node_config small = under(r_);
  small.directory_max_entries = 1;
  c_ = make_described(0x121, "chat-1", "chat", {}, small);
  l1_ = make_described(0x111, "logic-1", "logic", {}, under(r_));
  l2_ = make_described(0x120, "logic-2", "logic", {}, under(r_));
  ASSERT_TRUE(wait(
      [&] { return r_->n->directory().size() == 4 && c_->n->counters().directory_skipped >= 2; }));
  EXPECT_EQ(c_->n->directory().size(), 2u);  // itself and one other
  EXPECT_TRUE(c_->logged("directory_max_entries (1) reached"));
  EXPECT_EQ(l1_->n->directory().size(), 4u);
  ASSERT_EQ(test::send_str(c_, 0x120, 1, "routed all the same"), errc::ok);
  ASSERT_TRUE(wait([&] { return l2_->got.size() == 1; }));
  node_config zero = fast_config();
  zero.directory_max_entries = 0;
  std::string why;
  EXPECT_EQ(node::validate(0x100, zero, &why), errc::invalid_argument);
  EXPECT_NE(why.find("directory_max_entries"), std::string::npos) << why;
}

// A new entry left out because the directory was full is learned once room frees, although its
// node never announces itself again: the relay asks its parent for the directory again, and passes
// the entry on to the node below it. Before, it stayed out for good, here and behind the relay
// (unseen by find(), pick() and broadcast()).
TEST_F(NodeDirectoryTest, AnEntryLeftOutForWantOfRoomIsLearnedOnceRoomFrees) {
  node_config rc = fast_config();
  rc.subnets = {{0x100, 8}};
  r_ = make_described(0x100, "root", "root", {}, rc);
  l1_ = make_described(0x111, "logic-1", "logic", {}, under(r_));
  node_config small = under(r_, {{0x130, 4}});
  small.directory_max_entries = 3;
  bus_node* relay = make_described(0x130, "relay", "gateway", {}, small);
  bus_node* leaf = make_described(0x131, "leaf", "chat", {}, under(relay));
  // The relay knows the root, logic-1 and the leaf: full.
  ASSERT_TRUE(wait([&] {
    return relay->n->directory().size() == 4 && leaf->n->directory().size() == 4 &&
           r_->n->directory().size() == 4;
  }));
  l2_ = make_described(0x120, "logic-2", "logic", {}, under(r_));
  ASSERT_TRUE(wait([&] { return relay->n->counters().directory_skipped == 1; }));
  directory_entry e;
  EXPECT_FALSE(relay->n->lookup(0x120, &e));
  EXPECT_FALSE(leaf->n->lookup(0x120, &e));
  destroy(l1_);  // room for one at the relay
  l1_ = nullptr;
  ASSERT_TRUE(wait([&] { return relay->n->lookup(0x120, &e) && leaf->n->lookup(0x120, &e); }));
  EXPECT_EQ(e.name, "logic-2");
  EXPECT_TRUE(saw(events_[2], directory_event::added, 0x120));
  EXPECT_TRUE(saw(events_[3], directory_event::added, 0x120));
  bus_id picked = 0;
  ASSERT_EQ(leaf->n->pick("logic", {}, {}, &picked), errc::ok);
  EXPECT_EQ(picked, 0x120u);
  EXPECT_EQ(relay->n->directory().size(), 4u);
  EXPECT_EQ(relay->n->counters().directory_skipped, 1u);  // nothing else was left out meanwhile
}

// An upsert with no entries asks for the receiver's directory. A child asking over and over gets
// it at most once per heartbeat interval (a whole directory can be large): a request inside the
// interval is answered when it ends, once however many came.
TEST_F(NodeDirectoryTest, ARequestForTheDirectoryIsAnsweredAtMostOncePerHeartbeatInterval) {
  node_config rc = fast_config();
  rc.subnets = {{0x100, 8}};
  rc.heartbeat_interval_ms = 3000;
  rc.heartbeat_timeout_ms = 30000;
  r_ = make_described(0x100, "root", "root", {}, rc);
  l1_ = make_described(0x111, "logic-1", "logic", {}, under(r_));
  ASSERT_TRUE(wait([&] { return r_->n->directory().size() == 2; }));
  test::raw_child c(0x120, 0x100);
  c.start(&loop_, r_->n->listen_urls().at(0));
  ASSERT_TRUE(wait([&] { return c.registered; }));
  // Directory entries (upserts) the root sent the child, and the last of them.
  std::vector<bus_id> last;
  const auto snapshots = [&] {
    size_t k = 0;
    for (const auto& m : c.got) {
      proto::directory_body b;
      if (m.hd.type != proto::msg_type::directory ||
          proto::parse_directory(m.body.data(), m.body.size(), &b) != errc::ok ||
          b.op != proto::dir_op::upsert) {
        continue;
      }
      ++k;
      last.clear();
      for (const directory_entry& e : b.entries) last.push_back(e.id);
    }
    return k;
  };
  ASSERT_TRUE(wait([&] { return snapshots() == 1; }));  // at registration
  std::vector<uint8_t> ask;
  proto::encode_directory(proto::directory_body{}, &ask);
  c.send(proto::msg_type::directory, ask);
  ASSERT_TRUE(wait([&] { return snapshots() == 2; }));
  EXPECT_EQ(last, (std::vector<bus_id>{0x100, 0x111}));  // the root itself first, then by id
  for (int i = 0; i < 10; ++i) c.send(proto::msg_type::directory, ask);
  run_for(std::chrono::milliseconds(1000));  // well inside the 3 s after the answer
  EXPECT_EQ(snapshots(), 2u);
  ASSERT_TRUE(wait([&] { return snapshots() == 3; }));
  run_for(std::chrono::milliseconds(300));
  EXPECT_EQ(snapshots(), 3u);  // ten requests, one answer
  EXPECT_FALSE(c.closed);
}

// A child may announce only ids inside its subnets: the rest is ignored and logged. Each one was
// logged on its own: one message of a hostile (or misconfigured) child made 1 000 warnings, each
// formatted and handed to on_log inside the read, with nothing to bound how often it sends one.
TEST_F(NodeDirectoryTest, IdsOutsideAChildsSubnetsAreLoggedOnceAMessage) {
  test::raw_child src(kSource, 0x10000);
  ASSERT_NO_FATAL_FAILURE(large_bus(&src, size_t{256} * 1024, size_t{1} << 20));
  proto::directory_body b;
  for (bus_id id = 0x10001; id <= 0x10000 + 1000; ++id) {  // the root's, not the child's
    directory_entry e;
    e.id = id;
    b.entries.push_back(std::move(e));
  }
  directory_entry inside;
  inside.id = kSource + 1;
  b.entries.push_back(inside);
  send_dir(src, b);
  directory_entry e;
  ASSERT_TRUE(wait([&] { return r_->n->lookup(kSource + 1, &e); }));
  size_t lines = 0;
  for (const auto& [lv, m] : r_->logs) lines += m.find("outside its subnets") != std::string::npos;
  EXPECT_EQ(lines, 1u);
  EXPECT_TRUE(r_->logged("1000 ids outside its subnets (the first 0x10001)"));
  EXPECT_FALSE(r_->n->lookup(0x10001, &e));
  EXPECT_FALSE(r_->n->lookup(0x10000 + 1000, &e));
  src.ch->close();
  ASSERT_TRUE(wait([&] { return src.ch->closed(); }));
}

TEST_F(NodeDirectoryTest, TheDirectoryIsEmptyBeforeStart) {
  bus_node* t = make(0x100, fast_config(), false);
  EXPECT_TRUE(t->n->directory().empty());
  directory_entry e;
  EXPECT_FALSE(t->n->lookup(0x100, &e));
}

}  // namespace
}  // namespace uvbus::node_directory_test
