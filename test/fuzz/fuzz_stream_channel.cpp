// Fuzzes the stream channel's receive path end to end (include/uvbus/stream.h): the bytes go
// through a real unix socket into a listening stream_channel, in chunks the input chooses, with
// the loop running between chunks so the channel sees them in separate reads.
//
//
// Input layout:
//   byte 0   channel: even = message limit 300, odd = 64 KiB (two channels, made once)
//   byte 1   chunking as in fuzz_frame_decoder (0 = one write, 1..127 fixed, else random sizes)
//   byte 2-3 seed for random chunk sizes
//   rest     the bytes a peer sends
//
// Invariants (against the one-shot reference decoder of frame_reference.h): the channel delivers
// exactly the reference's payloads, in order, intact; if the reference ends in an error the
// connection is closed with the matching errc (bad_hash / oversize / bad_varint) and nothing after
// the bad frame is delivered; otherwise the connection stays up until the peer closes, which
// then ends it with ok when the stream stopped at a frame boundary, else with connection_reset. The
// process never crashes, and nothing leaks (libFuzzer's leak check at exit, ASan throughout).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "frame_reference.h"
#include "fuzz_util.h"
#include "uvbus/stream.h"

namespace {

using uvbus::errc;
using uvbus::frame_status;

struct harness {
  uv_loop_t loop{};
  std::unique_ptr<uvbus::stream_channel> ch[2];
  std::string path[2];
  // Per input.
  uint64_t conn_id = 0;
  bool ended = false;
  errc why = errc::ok;
  std::vector<std::vector<uint8_t>> got;

  harness() {
    uv_loop_init(&loop);
    uvbus::stream_callbacks cb;
    harness* h = this;
    cb.on_accepted = [h](uvbus::connection_id c) {
      FUZZ_CHECK(h->conn_id == 0);
      h->conn_id = c.value;
    };
    cb.on_disconnected = [h](uvbus::connection_id c, errc why) {
      FUZZ_CHECK(c.value == h->conn_id && !h->ended);
      h->ended = true;
      h->why = why;
    };
    cb.on_received = [h](uvbus::connection_id c, const uint8_t* p, size_t n) {
      FUZZ_CHECK(c.value == h->conn_id && !h->ended);
      h->got.emplace_back(p, p + n);
    };
    for (int i = 0; i < 2; ++i) {
      uvbus::stream_config cfg;
      cfg.message_limit = i == 0 ? 300 : 64 * 1024;
      ch[i] = std::make_unique<uvbus::stream_channel>(&loop, cfg, cb);
      path[i] = "/tmp/uvbus-fuzz-stream-" + std::to_string(getpid()) + "-" + std::to_string(i);
      FUZZ_CHECK(ch[i]->listen("unix://" + path[i]) == errc::ok);
    }
  }

  // Runs the loop until pred() holds; a deadline turns a hang into a finding.
  template <class Pred>
  void run_until(Pred&& pred) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!pred()) {
      FUZZ_CHECK(std::chrono::steady_clock::now() < end);
      uv_run(&loop, UV_RUN_NOWAIT);
    }
  }
};

harness* g_harness = nullptr;

harness& the_harness() {
  if (g_harness == nullptr) {
    g_harness = new harness();  // lives for the whole fuzzing process
    // The listeners are never closed (libFuzzer exits from inside a run): remove their files.
    std::atexit([] {
      for (const std::string& p : g_harness->path) unlink(p.c_str());
    });
  }
  return *g_harness;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harness& h = the_harness();
  uvbus::fuzz::byte_reader in(data, size);
  const int which = in.u8() & 1;
  const size_t limit = which == 0 ? 300 : 64 * 1024;
  const uint8_t mode = in.u8();
  uint32_t state = (static_cast<uint32_t>(in.u16()) << 8) | 1u;
  const uint8_t* stream = in.data();
  const size_t len = in.left();

  std::vector<uvbus::fuzz::frame_ref> want;
  const frame_status end = uvbus::fuzz::reference_decode(stream, len, limit, &want);

  h.conn_id = 0;
  h.ended = false;
  h.why = errc::ok;
  h.got.clear();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, h.path[which].c_str(), sizeof a.sun_path - 1);
  FUZZ_CHECK(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  h.run_until([&] { return h.conn_id != 0; });

  size_t pos = 0;
  while (pos < len && !h.ended) {
    size_t n = len - pos;
    if (mode != 0 && mode < 128) {
      n = mode;
    } else if (mode >= 128) {
      state ^= state << 13;
      state ^= state >> 17;
      state ^= state << 5;
      n = 1 + state % (2u * (mode - 127u));
    }
    if (n > len - pos) n = len - pos;
    const ssize_t w = send(fd, stream + pos, n, MSG_NOSIGNAL);
    if (w <= 0) break;  // the channel closed the connection (a decode error): fine
    pos += static_cast<size_t>(w);
    uv_run(&h.loop, UV_RUN_NOWAIT);
  }
  if (end == frame_status::need_more) {
    // A clean stream: every whole frame arrives; the connection stays up until we close.
    h.run_until([&] { return h.got.size() >= want.size() || h.ended; });
    FUZZ_CHECK(!h.ended);
    close(fd);
    h.run_until([&] { return h.ended; });
    // A graceful end when the last frame was whole, a reset when the peer cut one.
    const bool at_boundary = want.empty() ? len == 0 : want.back().offset + want.back().size == len;
    FUZZ_CHECK(h.why == (at_boundary ? errc::ok : errc::connection_reset));
  } else {
    h.run_until([&] { return h.ended; });
    const errc expect = end == frame_status::bad_hash   ? errc::bad_hash
                        : end == frame_status::oversize ? errc::oversize
                                                        : errc::bad_varint;
    FUZZ_CHECK(h.why == expect);
    close(fd);
  }
  FUZZ_CHECK(h.got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    FUZZ_CHECK(h.got[i].size() == want[i].size);
    FUZZ_CHECK(want[i].size == 0 ||
               std::memcmp(h.got[i].data(), stream + want[i].offset, want[i].size) == 0);
  }
  return 0;
}
