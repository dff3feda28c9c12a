// Fuzzes discovery's decoders (src/discovery/etcd_codec.h): a directory entry's JSON value as
// another writer of the etcd prefix may leave it, the gateway's range / watch / lease /
// authenticate bodies, base64 and node keys; the first input byte chooses which. None of them may
// throw or crash.
//
// Invariants: a decoded entry keeps the documented limits (texts <= kMaxText, <= kMaxLabels
// labels with non-empty keys, <= kMaxUrls URLs, a non-zero id) and survives encode -> decode
// unchanged; base64 that decodes re-encodes to the same text; a parsed key re-forms to itself; an
// accepted auth token holds no byte that could break its header line.
#include <string>
#include <string_view>

#include "discovery/etcd_codec.h"
#include "fuzz_util.h"

namespace {

namespace etcd = uvbus::detail::etcd;

void check_entry(std::string_view in) {
  uvbus::directory_entry e;
  std::string why;
  if (!etcd::decode_entry(in, &e, &why)) {
    FUZZ_CHECK(!why.empty());
    return;
  }
  FUZZ_CHECK(e.id != 0);
  FUZZ_CHECK(e.name.size() <= etcd::kMaxText && e.type.size() <= etcd::kMaxText);
  FUZZ_CHECK(e.host_id.size() <= etcd::kMaxText && e.hostname.size() <= etcd::kMaxText);
  FUZZ_CHECK(e.labels.size() <= etcd::kMaxLabels && e.listen.size() <= etcd::kMaxUrls);
  for (const auto& [k, v] : e.labels) FUZZ_CHECK(!k.empty() && k.size() <= etcd::kMaxText);
  uvbus::directory_entry back;
  // Invalid UTF-8 is replaced on encode, so the round trip is checked only for clean text.
  const std::string enc = etcd::encode_entry(e);
  if (etcd::decode_entry(enc, &back, &why) && etcd::encode_entry(back) == enc) {
    FUZZ_CHECK(back.id == e.id && back.pid == e.pid && back.start_time_ms == e.start_time_ms);
  }
}

void check_base64(std::string_view in) {
  std::string out;
  if (etcd::base64_decode(in, &out)) {
    // Non-canonical trailing bits decode too; the canonical form re-decodes to the same bytes.
    std::string again;
    FUZZ_CHECK(etcd::base64_decode(etcd::base64_encode(out), &again) && again == out);
  }
}

void check_key(std::string_view in) {
  uvbus::bus_id id = 0;
  if (etcd::id_from_key("/p", in, &id)) FUZZ_CHECK(etcd::node_key("/p", id) == in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string why;
  switch (data[0] % 6) {
    case 0:
      check_entry(in);
      break;
    case 1: {
      etcd::watch_reply w;
      (void)etcd::parse_watch(in, &w, &why);
      break;
    }
    case 2: {
      etcd::range_reply r;
      (void)etcd::parse_range(in, &r, &why);
      break;
    }
    case 3: {
      etcd::lease_reply l;
      (void)etcd::parse_lease_grant(in, &l, &why);
      (void)etcd::parse_keepalive(in, &l, &why);
      (void)etcd::parse_ok(in, &why);
      std::string token;
      if (etcd::parse_authenticate(in, &token, &why)) {
        // It goes into a header line: never a control byte, a space or a line break.
        for (const char c : token) {
          if (c <= 0x20 || c >= 0x7f) __builtin_trap();
        }
      }
      break;
    }
    case 4:
      check_base64(in);
      break;
    default:
      check_key(in);
      break;
  }
  return 0;
}
