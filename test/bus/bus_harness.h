// The shared harness of the bus tests (test/bus, test/hardening): a node_config with fast timers,
// a loop runner that runs until a condition holds or a deadline passes, and node wrappers that
// collect everything their callbacks report. Deadlines are sized for ASan + UBSan on a busy 2-core
// machine (5-10x slower than a release build): a wait costs only as long as its condition takes,
// so they are generous; the node timers are short only where nothing depends on their speed.
#pragma once

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "uvbus/node.h"

namespace uvbus::test {

// How long a test waits for something that should happen "soon" (a registration, a delivery).
constexpr std::chrono::milliseconds kWait{30000};
// How long the loop may take to close every handle after the nodes are destroyed.
constexpr std::chrono::milliseconds kCloseWait{10000};

// A node_config for tests: TCP on a port the OS picks, no shared memory, fast reconnects and
// heartbeats, and timeouts long enough that a slow sanitizer build never trips them by accident.
// Tests that exercise a timeout set it short themselves.
inline node_config fast_config() {
  node_config c;
  c.listen = {"ipv4://127.0.0.1:0"};
  c.enable_shm = false;
  c.heartbeat_interval_ms = 100;
  c.heartbeat_timeout_ms = 5000;
  c.reconnect_min_ms = 10;
  c.reconnect_max_ms = 100;
  c.handshake_timeout_ms = 5000;
  c.pending_timeout_ms = 5000;
  c.response_timeout_ms = 5000;
  c.child_grace_ms = 300;  // a fresh parent refuses unknown children after 0.3 s, not 2 s
  return c;
}

// The same with a parent to register to (none for an empty URL).
inline node_config fast_config(const std::string& parent_url) {
  node_config c = fast_config();
  if (!parent_url.empty()) c.parent_urls = {parent_url};
  return c;
}

// The same for a node of type `type` (what pick(), send_any() and broadcasts by type select).
inline node_config typed_config(const std::string& type, const std::string& parent_url = {}) {
  node_config c = fast_config(parent_url);
  c.type = type;
  return c;
}

// test::run_until with the harness's deadline: for tests that run a loop of their own.
template <class Pred>
bool wait_until(uv_loop_t* loop, Pred&& pred, std::chrono::milliseconds deadline = kWait) {
  return run_until(loop, std::forward<Pred>(pred), deadline);
}

// Runs `loop` until nothing is left on it (every handle closed) or `deadline` passes; returns
// uv_loop_close()'s result (0: the loop closed cleanly). Spins with UV_RUN_NOWAIT: after the nodes
// are gone only close callbacks remain, and a leaked timer must not block the test.
inline int close_loop(uv_loop_t* loop, std::chrono::milliseconds deadline = kCloseWait) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (uv_loop_alive(loop) != 0 && std::chrono::steady_clock::now() < end) {
    uv_run(loop, UV_RUN_NOWAIT);
  }
  return uv_loop_close(loop);
}

struct received {
  bus_id source;
  uint32_t type;
  std::string bytes;
  // The first 8 bytes as a number (0 if shorter): tests send sequence numbers this way.
  [[nodiscard]] uint64_t value() const {
    uint64_t v = 0;
    if (bytes.size() >= 8) std::memcpy(&v, bytes.data(), 8);
    return v;
  }
};

// A node plus everything its callbacks reported, in order.
struct bus_node {
  std::unique_ptr<node> n;
  std::vector<received> got;
  bool keep_bytes = true;  // false: only count deliveries (got_count), for bulk traffic
  uint64_t got_count = 0;
  std::vector<delivery_report> reports;
  std::vector<errc> registrations;
  std::vector<std::string> registration_details;
  int ups = 0;
  std::vector<errc> downs;
  std::vector<endpoint_info> added;
  std::vector<std::pair<bus_id, errc>> removed;
  std::vector<errc> errors;
  std::vector<std::string> error_texts;
  std::vector<std::pair<log_level, std::string>> logs;
  std::vector<errc> drops;  // on_dropped: relays' notices about messages reported ok here
  uint64_t writable = 0;

  // Callbacks that record into this object. A test may wrap or replace any of them before it
  // constructs the node (bus_fixture::make takes a hook for that).
  node_callbacks callbacks() {
    node_callbacks cb;
    cb.on_data = [this](bus_id src, uint32_t type, const uint8_t* p, size_t size) {
      ++got_count;
      if (keep_bytes)
        got.push_back({src, type, std::string(reinterpret_cast<const char*>(p), size)});
    };
    cb.on_report = [this](const delivery_report& r) { reports.push_back(r); };
    cb.on_registration = [this](errc e, const std::string& d) {
      registrations.push_back(e);
      registration_details.push_back(d);
    };
    cb.on_up = [this](bus_id) { ++ups; };
    cb.on_dropped = [this](bus_id, uint64_t, errc why) { drops.push_back(why); };
    cb.on_down = [this](errc e) { downs.push_back(e); };
    cb.on_endpoint_added = [this](const endpoint_info& e) { added.push_back(e); };
    cb.on_endpoint_removed = [this](const endpoint_info& e, errc why) {
      removed.emplace_back(e.id, why);
    };
    cb.on_error = [this](errc e, const std::string& what) {
      errors.push_back(e);
      error_texts.push_back(what);
    };
    cb.on_log = [this](log_level lv, const std::string& m) { logs.emplace_back(lv, m); };
    cb.on_writable = [this](bus_id) { ++writable; };
    return cb;
  }

  [[nodiscard]] size_t ok_reports() const {
    size_t k = 0;
    for (const auto& r : reports) k += r.status == errc::ok ? 1 : 0;
    return k;
  }
  // True when some log line contains `text`.
  [[nodiscard]] bool logged(const std::string& text) const {
    for (const auto& [lv, m] : logs) {
      if (m.find(text) != std::string::npos) return true;
    }
    return false;
  }
  // The report for message `id`, or nullptr.
  [[nodiscard]] const delivery_report* report_for(uint64_t id) const {
    for (const auto& r : reports) {
      if (r.message_id == id) return &r;
    }
    return nullptr;
  }
};

inline errc send_str(bus_node* t, bus_id to, uint32_t type, const std::string& s,
                     const send_options& o = {}, uint64_t* id = nullptr) {
  return t->n->send_data(to, type, s.data(), s.size(), o, id);
}

// A node on a loop of its own that runs only when a test turns it (a frozen process, or a peer
// whose loop a test holds still while the fixture's runs). Its callbacks record as bus_node's do;
// finish() destroys the node and expects the loop to close with no handle left open (the
// destructor does it for a test that ended early).
struct own_loop_node : bus_node {
  own_loop_node() = default;
  own_loop_node(const own_loop_node&) = delete;
  own_loop_node& operator=(const own_loop_node&) = delete;
  ~own_loop_node() { finish(); }

  // Inits the loop and starts node `id` on it (fatal failures: wrap in ASSERT_NO_FATAL_FAILURE).
  void start(bus_id id, node_config cfg) {
    ASSERT_EQ(uv_loop_init(&loop), 0);
    open = true;
    n = std::make_unique<node>(&loop, id, std::move(cfg), callbacks());
    ASSERT_EQ(n->start(), errc::ok);
  }
  // Runs the loop once without blocking: from a wait's predicate, to let this node move too.
  void turn() { uv_run(&loop, UV_RUN_NOWAIT); }
  void finish() {
    if (!open) return;
    open = false;
    n.reset();
    EXPECT_EQ(close_loop(&loop), 0) << "handles left open on the node's own loop";
  }

  uv_loop_t loop{};
  bool open = false;
};

// A fixture owning one loop and the nodes on it. TearDown destroys the nodes and expects the
// loop to close with no handle left open.
class bus_fixture : public ::testing::Test {
 protected:
  using tweak_fn = std::function<void(node_callbacks*)>;

  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    nodes_.clear();
    EXPECT_EQ(close_loop(&loop_), 0) << "handles left open on the loop";
  }

  // A node with recording callbacks (tweak may change them), started unless start is false.
  bus_node* make(bus_id id, node_config cfg, bool start = true, const tweak_fn& tweak = {}) {
    auto t = std::make_unique<bus_node>();
    bus_node* raw = t.get();
    node_callbacks cb = raw->callbacks();
    if (tweak) tweak(&cb);
    t->n = std::make_unique<node>(&loop_, id, std::move(cfg), std::move(cb));
    if (start) {
      const errc e = t->n->start();
      EXPECT_EQ(e, errc::ok) << to_string(e);
    }
    nodes_.push_back(std::move(t));
    return raw;
  }
  bus_node* make_root(bus_id id, std::vector<subnet> nets, node_config cfg = fast_config()) {
    cfg.subnets = std::move(nets);
    return make(id, std::move(cfg));
  }
  bus_node* make_child(bus_id id, bus_node* parent, std::vector<subnet> nets = {},
                       node_config cfg = fast_config()) {
    cfg.subnets = std::move(nets);
    cfg.parent_urls = {parent->n->listen_urls().at(0)};
    return make(id, std::move(cfg));
  }

  // Root 0x100 owning 0x100/8 (*root), and the config of a child of it that sends everything
  // through it (no direct sibling links), for the caller to adjust and make.
  node_config make_root_for_sender(bus_node** root) {
    *root = make_root(0x100, {{0x100, 8}});
    node_config c = fast_config((*root)->n->listen_urls().at(0));
    c.sibling_direct = false;
    return c;
  }

  // Runs the loop until pred() holds (true) or the deadline passes (false).
  bool wait(const std::function<bool()>& pred, std::chrono::milliseconds d = kWait) {
    return run_until(&loop_, pred, d);
  }
  // Runs the loop for d, for checks that something does NOT happen.
  void run_for(std::chrono::milliseconds d) {
    run_until(
        &loop_, [] { return false; }, d);
  }
  // Destroys t's node (the wrapper and what it collected stay).
  void destroy(bus_node* t) { t->n.reset(); }
  // A new node `id` with cfg, started on a dead one's address: its socket may still be closing,
  // so it is tried until it binds (a start that never succeeds fails the test).
  bus_node* restart(bus_id id, const node_config& cfg) {
    bus_node* t = nullptr;
    EXPECT_TRUE(wait([&] {
      t = make(id, cfg, false);
      if (t->n->start() == errc::ok) return true;
      destroy(t);
      return false;
    }));
    return t;
  }

  uv_loop_t loop_{};
  std::vector<std::unique_ptr<bus_node>> nodes_;
};

}  // namespace uvbus::test
