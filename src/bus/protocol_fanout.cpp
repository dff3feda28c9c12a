// The broadcast body's codec (version 6, bus/wire.h): the selector, the user type, the payload.
#include <cstring>

#include "bus/wire.h"

namespace uvbus::proto {

namespace {
void put_str8(std::vector<uint8_t>* out, const std::string& s) {
  const size_t n = std::min(s.size(), kMaxDirText);
  out->push_back(static_cast<uint8_t>(n));
  out->insert(out->end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
}

// A bounds-checked cursor over [p, p + n).
struct cursor {
  const uint8_t* p;
  size_t left;
  bool ok = true;
  const uint8_t* take(size_t k) {
    if (!ok || k > left) {
      ok = false;
      return nullptr;
    }
    const uint8_t* r = p;
    p += k;
    left -= k;
    return r;
  }
  uint8_t u8() {
    const uint8_t* b = take(1);
    return b != nullptr ? b[0] : 0;
  }
  bool str8(std::string* s) {
    const size_t k = u8();
    const uint8_t* b = k <= kMaxDirText ? take(k) : nullptr;
    if (b == nullptr) return ok = false;
    s->assign(reinterpret_cast<const char*>(b), k);
    return true;
  }
};
}  // namespace

void encode_broadcast_head(const broadcast_target& to, uint32_t user_type,
                           std::vector<uint8_t>* out) {
  uint8_t b[9];
  if (to.by_subnet) {
    out->push_back(2);
    store_le<uint64_t>(b, to.net.prefix);
    b[8] = to.net.mask_bits;
    out->insert(out->end(), b, b + 9);
  } else {
    out->push_back(1);
    put_str8(out, to.type);
    const size_t n = std::min(to.labels.size(), kMaxLabels);
    out->push_back(static_cast<uint8_t>(n));
    for (size_t i = 0; i < n; ++i) {
      put_str8(out, to.labels[i].first);
      put_str8(out, to.labels[i].second);
    }
  }
  store_le<uint32_t>(b, user_type);
  out->insert(out->end(), b, b + 4);
}

errc parse_broadcast(const uint8_t* p, size_t n, broadcast_body* out) {
  if (p == nullptr) return errc::protocol_error;
  cursor c{p, n};
  broadcast_body b;
  const uint8_t kind = c.u8();
  if (kind == 2) {
    const uint8_t* s = c.take(9);
    if (s == nullptr || s[8] > 64) return errc::protocol_error;
    b.to.by_subnet = true;
    b.to.net = subnet{load_le<uint64_t>(s), s[8]};
  } else if (kind == 1) {
    c.str8(&b.to.type);
    const size_t count = c.u8();
    if (count > kMaxLabels) return errc::protocol_error;
    for (size_t i = 0; i < count && c.ok; ++i) {
      node_label l;
      c.str8(&l.first);
      c.str8(&l.second);
      b.to.labels.push_back(std::move(l));
    }
  } else {
    return errc::protocol_error;
  }
  const uint8_t* t = c.take(4);
  if (!c.ok || t == nullptr) return errc::protocol_error;
  b.user_type = load_le<uint32_t>(t);
  b.payload = c.p;
  b.size = c.left;
  *out = std::move(b);
  return errc::ok;
}

}  // namespace uvbus::proto
