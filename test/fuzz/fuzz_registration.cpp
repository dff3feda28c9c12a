// Fuzzes the registration parsers (src/bus/wire.h) directly: the node_info block and
// the challenge, register and register_reply bodies, the first input byte choosing which. These
// are what an unauthenticated peer controls before anything else is checked.
//
//
// Invariants: never crash, never read outside the body (an exactly-sized heap copy), never write
// the output on failure; the documented limits hold on success (at most kMaxSubnets subnets with
// mask_bits <= 64, at most kMaxListen URLs of at most kMaxUrlBytes, host id and reason message
// within their bounds, versions ordered); a parsed body re-encodes to the identical bytes.
#include <cstring>
#include <memory>
#include <vector>

#include "bus/wire.h"
#include "fuzz_util.h"

namespace {

namespace proto = uvbus::proto;
using uvbus::errc;

void check_info(const proto::node_info& n) {
  FUZZ_CHECK(n.subnets.size() <= proto::kMaxSubnets);
  for (const uvbus::subnet& s : n.subnets) FUZZ_CHECK(s.valid());
  FUZZ_CHECK(n.listen.size() <= proto::kMaxListen);
  for (const std::string& url : n.listen) FUZZ_CHECK(url.size() <= proto::kMaxUrlBytes);
  FUZZ_CHECK(n.host_id.size() <= proto::kMaxHostIdBytes);
  FUZZ_CHECK(n.hostname.size() <= proto::kMaxHostnameBytes);
}

void check_same(const std::vector<uint8_t>& enc, const uint8_t* p, size_t n) {
  FUZZ_CHECK(enc.size() == n);
  FUZZ_CHECK(n == 0 || std::memcmp(enc.data(), p, n) == 0);
}

// With a version-6 extension block the encoder writes the known entries in its own order and
// leaves unknown tags out: the bytes may differ, but parsing the encoding gives the same fields.
void check_ext(const proto::reg_extensions& a, const proto::reg_extensions& b) {
  FUZZ_CHECK(a.present == b.present && a.has_nonce == b.has_nonce && a.has_proof == b.has_proof);
  FUZZ_CHECK(a.has_compression == b.has_compression && a.compression == b.compression);
  FUZZ_CHECK(std::memcmp(a.nonce, b.nonce, sizeof a.nonce) == 0);
  FUZZ_CHECK(std::memcmp(a.proof, b.proof, sizeof a.proof) == 0);
  FUZZ_CHECK(a.compression <= 2);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 4;
  const size_t n = size - 1;
  std::unique_ptr<uint8_t[]> body(new uint8_t[n == 0 ? 1 : n]);
  if (n != 0) std::memcpy(body.get(), data + 1, n);
  const uint8_t* p = body.get();
  std::vector<uint8_t> enc;

  switch (which) {
    case 0: {
      proto::node_info info;
      info.hostname = "untouched";
      if (proto::parse_node_info(p, n, &info) != errc::ok) {
        FUZZ_CHECK(info.hostname == "untouched" && info.subnets.empty());
        return 0;
      }
      check_info(info);
      proto::encode_node_info(info, &enc);
      check_same(enc, p, n);
      return 0;
    }
    case 1: {
      proto::challenge_body b;
      b.acceptor_id = 42;
      if (proto::parse_challenge(p, n, &b) != errc::ok) {
        FUZZ_CHECK(b.acceptor_id == 42);
        return 0;
      }
      FUZZ_CHECK(b.min_version >= 1 && b.min_version <= b.max_version);
      proto::encode_challenge(b, &enc);
      check_same(enc, p, n);
      return 0;
    }
    case 2: {
      proto::register_body b;
      b.info.hostname = "untouched";
      if (proto::parse_register(p, n, &b) != errc::ok) {
        FUZZ_CHECK(b.info.hostname == "untouched");
        return 0;
      }
      FUZZ_CHECK(b.min_version >= 1 && b.min_version <= b.max_version);
      FUZZ_CHECK(b.role == proto::link_role::child || b.role == proto::link_role::sibling ||
                 b.role == proto::link_role::tool);
      check_info(b.info);
      proto::encode_register(b, &enc);
      if (!b.ext.present) {
        check_same(enc, p, n);
        return 0;
      }
      FUZZ_CHECK(enc.size() <= n);
      proto::register_body again;
      FUZZ_CHECK(proto::parse_register(enc.data(), enc.size(), &again) == errc::ok);
      check_ext(b.ext, again.ext);
      return 0;
    }
    default: {
      proto::register_reply_body b;
      b.message = "untouched";
      if (proto::parse_register_reply(p, n, &b) != errc::ok) {
        FUZZ_CHECK(b.message == "untouched");
        return 0;
      }
      check_info(b.info);
      FUZZ_CHECK(b.message.size() <= proto::kMaxReasonBytes);
      FUZZ_CHECK(b.status != proto::reason::ok || b.version >= proto::kMinVersion);
      proto::encode_register_reply(b, &enc);
      if (!b.ext.present) {
        check_same(enc, p, n);
        return 0;
      }
      FUZZ_CHECK(enc.size() <= n);
      proto::register_reply_body again;
      FUZZ_CHECK(proto::parse_register_reply(enc.data(), enc.size(), &again) == errc::ok);
      check_ext(b.ext, again.ext);
      return 0;
    }
  }
}
