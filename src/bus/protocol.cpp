// The bus wire codec's encoders and parsers (declared in bus/wire.h), and subnet::to_string.
#include "bus/wire.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "uvbus/subnet.h"

namespace uvbus {

std::string subnet::to_string() const {
  char buf[48];
  std::snprintf(buf, sizeof buf, "0x%llx/%u", static_cast<unsigned long long>(prefix),
                static_cast<unsigned>(mask_bits));
  return buf;
}

namespace proto {
namespace {

inline void put16(uint8_t* p, uint16_t v) noexcept {
  store_le(p, v);
}
inline void put32(uint8_t* p, uint32_t v) noexcept {
  store_le(p, v);
}
inline void put64(uint8_t* p, uint64_t v) noexcept {
  store_le(p, v);
}
inline uint16_t get16(const uint8_t* p) noexcept {
  return load_le<uint16_t>(p);
}
inline uint32_t get32(const uint8_t* p) noexcept {
  return load_le<uint32_t>(p);
}
inline uint64_t get64(const uint8_t* p) noexcept {
  return load_le<uint64_t>(p);
}

class writer {
 public:
  explicit writer(std::vector<uint8_t>* out) : out_(out) {}
  void u8(uint8_t v) { out_->push_back(v); }
  void u16(uint16_t v) {
    uint8_t b[2];
    put16(b, v);
    bytes(b, 2);
  }
  void u32(uint32_t v) {
    uint8_t b[4];
    put32(b, v);
    bytes(b, 4);
  }
  void u64(uint64_t v) {
    uint8_t b[8];
    put64(b, v);
    bytes(b, 8);
  }
  // resize + memcpy rather than vector::insert: g++ 12 at -O3 reports a false stringop-overflow
  // for insert of a byte range.
  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t off = out_->size();
    out_->resize(off + n);
    std::memcpy(out_->data() + off, p, n);
  }
  // A string with a u8 length, truncated to limit (<= 255) so the output always parses.
  void str8(const std::string& s, size_t limit) {
    const size_t n = std::min({s.size(), limit, size_t{255}});
    u8(static_cast<uint8_t>(n));
    bytes(s.data(), n);
  }
  void str16(const std::string& s, size_t limit) {
    const size_t n = std::min(s.size(), limit);
    u16(static_cast<uint16_t>(n));
    bytes(s.data(), n);
  }

 private:
  std::vector<uint8_t>* out_;
};

// Bounds-checked cursor: every read checks the bytes left first; after a failed read the reader
// stays failed, so callers check ok() once at the end.
class reader {
 public:
  reader(const uint8_t* p, size_t n) : p_(p), left_(n) {}
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] bool done() const { return ok_ && left_ == 0; }
  [[nodiscard]] size_t left() const { return left_; }
  const uint8_t* take(size_t n) {
    if (!ok_ || n > left_) {
      ok_ = false;
      return nullptr;
    }
    const uint8_t* r = p_;
    p_ += n;
    left_ -= n;
    return r;
  }
  uint8_t u8() {
    const uint8_t* b = take(1);
    return b ? b[0] : 0;
  }
  uint16_t u16() {
    const uint8_t* b = take(2);
    return b ? get16(b) : 0;
  }
  uint32_t u32() {
    const uint8_t* b = take(4);
    return b ? get32(b) : 0;
  }
  uint64_t u64() {
    const uint8_t* b = take(8);
    return b ? get64(b) : 0;
  }
  bool str8(std::string* s, size_t limit) {
    const size_t n = u8();
    if (n > limit) ok_ = false;
    const uint8_t* b = take(n);
    if (b == nullptr) return false;
    s->assign(reinterpret_cast<const char*>(b), n);
    return true;
  }
  bool str16(std::string* s, size_t limit) {
    const size_t n = u16();
    if (n > limit) ok_ = false;
    const uint8_t* b = take(n);
    if (b == nullptr) return false;
    s->assign(reinterpret_cast<const char*>(b), n);
    return true;
  }
  void fail(bool when = true) { ok_ = ok_ && !when; }

 private:
  const uint8_t* p_;
  size_t left_;
  bool ok_ = true;
};

bool read_node_info(reader& r, node_info* out) {
  node_info n;
  n.id = r.u64();
  n.pid = r.u32();
  r.str8(&n.host_id, kMaxHostIdBytes);
  r.str8(&n.hostname, kMaxHostnameBytes);
  const size_t subnets = r.u8();
  if (subnets > kMaxSubnets) r.fail();
  for (size_t i = 0; i < subnets && r.ok(); ++i) {
    subnet s;
    s.prefix = r.u64();
    s.mask_bits = r.u8();
    if (!s.valid()) r.fail();
    n.subnets.push_back(s);
  }
  const size_t listen = r.u8();
  if (listen > kMaxListen) r.fail();
  for (size_t i = 0; i < listen && r.ok(); ++i) {
    std::string url;
    r.str16(&url, kMaxUrlBytes);
    n.listen.push_back(std::move(url));
  }
  if (!r.ok()) return false;
  *out = std::move(n);
  return true;
}

}  // namespace

const char* to_string(msg_type t) noexcept {
  switch (t) {
    case msg_type::challenge:
      return "challenge";
    case msg_type::register_req:
      return "register";
    case msg_type::register_reply:
      return "register_reply";
    case msg_type::ping:
      return "ping";
    case msg_type::pong:
      return "pong";
    case msg_type::data:
      return "data";
    case msg_type::forward:
      return "forward";
    case msg_type::ack:
      return "ack";
    case msg_type::command:
      return "command";
    case msg_type::command_reply:
      return "command_reply";
    case msg_type::bye:
      return "bye";
    case msg_type::dropped:
      return "dropped";
    case msg_type::flow_ack:
      return "flow_ack";
    case msg_type::directory:
      return "directory";
    case msg_type::broadcast:
      return "broadcast";
    case msg_type::broadcast_ack:
      return "broadcast_ack";
  }
  return "unknown";
}

reason reason_from_errc(errc e) noexcept {
  switch (e) {
    case errc::ok:
      return reason::ok;
    case errc::access_denied:
      return reason::access_denied;
    case errc::duplicate_id:
      return reason::duplicate_id;
    case errc::out_of_subnet:
      return reason::out_of_subnet;
    case errc::version_mismatch:
      return reason::version_mismatch;
    case errc::protocol_error:
      return reason::protocol_error;
    case errc::closed:
    case errc::cancelled:
      return reason::closing;
    case errc::unknown_route:
      return reason::unknown_route;
    case errc::ttl_expired:
      return reason::ttl_expired;
    case errc::timeout:
      return reason::timeout;
    case errc::not_connected:
    case errc::connection_reset:
    case errc::connection_refused:
      return reason::not_connected;
    case errc::queue_full:
      return reason::queue_full;
    case errc::message_too_large:
      return reason::message_too_large;
    case errc::invalid_argument:
      return reason::invalid_argument;
    default:
      return reason::other;
  }
}

errc errc_from_reason(uint16_t r) noexcept {
  switch (static_cast<reason>(r)) {
    case reason::ok:
      return errc::ok;
    case reason::access_denied:
      return errc::access_denied;
    case reason::duplicate_id:
      return errc::duplicate_id;
    case reason::out_of_subnet:
      return errc::out_of_subnet;
    case reason::version_mismatch:
      return errc::version_mismatch;
    case reason::protocol_error:
      return errc::protocol_error;
    case reason::closing:
      return errc::closed;
    case reason::unknown_route:
      return errc::unknown_route;
    case reason::ttl_expired:
      return errc::ttl_expired;
    case reason::timeout:
      return errc::timeout;
    case reason::not_connected:
      return errc::not_connected;
    case reason::queue_full:
      return errc::queue_full;
    case reason::message_too_large:
      return errc::message_too_large;
    case reason::invalid_argument:
      return errc::invalid_argument;
    case reason::other:
      return errc::io_error;
  }
  return errc::protocol_error;
}

void encode_node_info(const node_info& n, std::vector<uint8_t>* out) {
  writer w(out);
  w.u64(n.id);
  w.u32(n.pid);
  w.str8(n.host_id, kMaxHostIdBytes);
  w.str8(n.hostname, kMaxHostnameBytes);
  const size_t subnets = std::min(n.subnets.size(), kMaxSubnets);
  w.u8(static_cast<uint8_t>(subnets));
  for (size_t i = 0; i < subnets; ++i) {
    w.u64(n.subnets[i].prefix);
    w.u8(std::min<uint8_t>(n.subnets[i].mask_bits, 64));
  }
  const size_t listen = std::min(n.listen.size(), kMaxListen);
  w.u8(static_cast<uint8_t>(listen));
  for (size_t i = 0; i < listen; ++i) w.str16(n.listen[i], kMaxUrlBytes);
}

errc parse_node_info(const uint8_t* p, size_t n, node_info* out) {
  reader r(p, n);
  node_info tmp;
  if (!read_node_info(r, &tmp) || !r.done()) return errc::protocol_error;
  *out = std::move(tmp);
  return errc::ok;
}

void encode_challenge(const challenge_body& b, std::vector<uint8_t>* out) {
  writer w(out);
  w.u8(b.min_version);
  w.u8(b.max_version);
  w.u64(b.acceptor_id);
  w.bytes(b.nonce, kNonceSize);
}

errc parse_challenge(const uint8_t* p, size_t n, challenge_body* out) {
  reader r(p, n);
  challenge_body b;
  b.min_version = r.u8();
  b.max_version = r.u8();
  b.acceptor_id = r.u64();
  const uint8_t* nonce = r.take(kNonceSize);
  if (!r.done() || b.min_version == 0 || b.min_version > b.max_version) {
    return errc::protocol_error;
  }
  std::memcpy(b.nonce, nonce, kNonceSize);
  *out = b;
  return errc::ok;
}

namespace {

void encode_ext(const reg_extensions& x, std::vector<uint8_t>* out) {
  if (!x.present) return;
  writer w(out);
  w.u8(static_cast<uint8_t>(int{x.has_nonce} + int{x.has_proof} + int{x.has_compression}));
  if (x.has_nonce) {
    w.u8(static_cast<uint8_t>(ext_tag::nonce));
    w.u8(kNonceSize);
    w.bytes(x.nonce, kNonceSize);
  }
  if (x.has_proof) {
    w.u8(static_cast<uint8_t>(ext_tag::proof));
    w.u8(kProofSize);
    w.bytes(x.proof, kProofSize);
  }
  if (x.has_compression) {
    w.u8(static_cast<uint8_t>(ext_tag::compression));
    w.u8(1);
    w.u8(x.compression);
  }
}

// Reads the extension block if bytes are left; true if the rest of r is a well-formed block.
bool parse_ext(reader& r, reg_extensions* x) {
  if (r.left() == 0) return true;
  x->present = true;
  const uint8_t count = r.u8();
  if (count > kMaxExtensions) return false;
  for (uint8_t i = 0; i < count && r.ok(); ++i) {
    const uint8_t tag = r.u8();
    const uint8_t len = r.u8();
    const uint8_t* v = r.take(len);
    if (v == nullptr) return false;
    struct field {
      bool* seen;
      size_t size;
      uint8_t* dst;
    };
    field f{nullptr, 0, nullptr};
    if (tag == static_cast<uint8_t>(ext_tag::nonce)) {
      f = {&x->has_nonce, kNonceSize, x->nonce};
    } else if (tag == static_cast<uint8_t>(ext_tag::proof)) {
      f = {&x->has_proof, kProofSize, x->proof};
    } else if (tag == static_cast<uint8_t>(ext_tag::compression)) {
      f = {&x->has_compression, 1, &x->compression};
    } else {
      continue;  // a later version's field
    }
    if (*f.seen || len != f.size) return false;
    *f.seen = true;
    std::memcpy(f.dst, v, f.size);
  }
  return r.done() && x->compression <= 2;
}

}  // namespace

void encode_register(const register_body& b, std::vector<uint8_t>* out) {
  writer w(out);
  w.u8(b.min_version);
  w.u8(b.max_version);
  w.u8(static_cast<uint8_t>(b.role));
  encode_node_info(b.info, out);
  w.bytes(b.proof, kProofSize);
  encode_ext(b.ext, out);
}

errc parse_register(const uint8_t* p, size_t n, register_body* out) {
  reader r(p, n);
  register_body b;
  b.min_version = r.u8();
  b.max_version = r.u8();
  const uint8_t role = r.u8();
  if (!r.ok() || b.min_version == 0 || b.min_version > b.max_version) return errc::protocol_error;
  if (role < static_cast<uint8_t>(link_role::child) ||
      role > static_cast<uint8_t>(link_role::tool)) {
    return errc::protocol_error;
  }
  b.role = static_cast<link_role>(role);
  if (!read_node_info(r, &b.info)) return errc::protocol_error;
  const uint8_t* proof = r.take(kProofSize);
  if (!r.ok() || !parse_ext(r, &b.ext)) return errc::protocol_error;
  std::memcpy(b.proof, proof, kProofSize);
  *out = std::move(b);
  return errc::ok;
}

void encode_register_reply(const register_reply_body& b, std::vector<uint8_t>* out) {
  writer w(out);
  w.u16(static_cast<uint16_t>(b.status));
  w.u8(b.version);
  encode_node_info(b.info, out);
  w.str8(b.message, kMaxReasonBytes);
  encode_ext(b.ext, out);
}

errc parse_register_reply(const uint8_t* p, size_t n, register_reply_body* out) {
  reader r(p, n);
  register_reply_body b;
  const uint16_t status = r.u16();
  b.version = r.u8();
  if (!r.ok() || status > static_cast<uint16_t>(reason::other)) return errc::protocol_error;
  b.status = static_cast<reason>(status);
  if (!read_node_info(r, &b.info)) return errc::protocol_error;
  r.str8(&b.message, kMaxReasonBytes);
  if (!r.ok() || !parse_ext(r, &b.ext)) return errc::protocol_error;
  if (b.status == reason::ok && (b.version < kMinVersion || b.version == 0)) {
    return errc::protocol_error;
  }
  *out = std::move(b);
  return errc::ok;
}

void encode_ping(const ping_body& b, uint8_t out[kPingSize]) noexcept {
  put64(out, b.send_time_ns);
}

errc parse_ping(const uint8_t* p, size_t n, ping_body* out) noexcept {
  if (n != kPingSize) return errc::protocol_error;
  out->send_time_ns = get64(p);
  return errc::ok;
}

errc parse_data(const uint8_t* p, size_t n, data_body* out) noexcept {
  if (n < kDataPrefix) return errc::protocol_error;
  out->user_type = get32(p);
  out->payload = p + kDataPrefix;
  out->size = n - kDataPrefix;
  return errc::ok;
}

void encode_ack(const ack_body& b, uint8_t out[kAckSize]) noexcept {
  put64(out, b.acked_sequence);
  put16(out + 8, static_cast<uint16_t>(b.status));
}

errc parse_ack(const uint8_t* p, size_t n, ack_body* out) noexcept {
  if (n != kAckSize) return errc::protocol_error;
  const uint16_t status = get16(p + 8);
  if (status > static_cast<uint16_t>(reason::other)) return errc::protocol_error;
  out->acked_sequence = get64(p);
  out->status = static_cast<reason>(status);
  return errc::ok;
}

void encode_bye(const bye_body& b, std::vector<uint8_t>* out) {
  writer(out).u16(static_cast<uint16_t>(b.why));
}

errc parse_bye(const uint8_t* p, size_t n, bye_body* out) noexcept {
  if (n != 2) return errc::protocol_error;
  const uint16_t why = get16(p);
  if (why > static_cast<uint16_t>(reason::other)) return errc::protocol_error;
  out->why = static_cast<reason>(why);
  return errc::ok;
}

void encode_dropped(const dropped_body& b, std::vector<uint8_t>* out) {
  writer w(out);
  w.u64(b.message_id);
  w.u64(b.original_target);
  w.u16(static_cast<uint16_t>(b.why));
}

errc parse_dropped(const uint8_t* p, size_t n, dropped_body* out) noexcept {
  if (n != 18) return errc::protocol_error;
  const uint16_t why = get16(p + 16);
  // 0 (ok) included: no relay drops a message for no reason, and a source would take it for the
  // message's success report.
  if (why == 0 || why > static_cast<uint16_t>(reason::other)) return errc::protocol_error;
  out->message_id = get64(p);
  out->original_target = get64(p + 8);
  out->why = static_cast<reason>(why);
  return errc::ok;
}

void encode_command(uint32_t command, const void* args, size_t n, std::vector<uint8_t>* out) {
  writer w(out);
  w.u32(command);
  w.bytes(args, n);
}

errc parse_command(const uint8_t* p, size_t n, command_body* out) noexcept {
  if (n < 4) return errc::protocol_error;
  out->command = get32(p);
  out->args = p + 4;
  out->args_size = n - 4;
  return errc::ok;
}

void encode_command_reply(uint32_t command, reason status, const void* result, size_t n,
                          std::vector<uint8_t>* out) {
  writer w(out);
  w.u32(command);
  w.u16(static_cast<uint16_t>(status));
  w.bytes(result, n);
}

errc parse_command_reply(const uint8_t* p, size_t n, command_reply_body* out) noexcept {
  if (n < 6) return errc::protocol_error;
  const uint16_t status = get16(p + 4);
  if (status > static_cast<uint16_t>(reason::other)) return errc::protocol_error;
  out->command = get32(p);
  out->status = static_cast<reason>(status);
  out->result = p + 6;
  out->result_size = n - 6;
  return errc::ok;
}

std::vector<uint8_t> build(header h, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> m(kHeaderSize + body.size());
  h.body_len = static_cast<uint32_t>(body.size());
  encode_header(h, m.data());
  if (!body.empty()) std::memcpy(m.data() + kHeaderSize, body.data(), body.size());
  return m;
}

// ------------------------------------------------------------------------------ directory --
namespace {

void write_entry(writer& w, const directory_entry& e) {
  w.u64(e.id);
  w.u64(e.parent);
  w.u32(e.pid);
  w.u64(e.start_time_ms);
  w.u8(e.protocol_version);
  w.str8(e.name, kMaxDirText);
  w.str8(e.type, kMaxDirText);
  w.str8(e.host_id, kMaxHostIdBytes);
  w.str8(e.hostname, kMaxHostnameBytes);
  const size_t labels = std::min(e.labels.size(), kMaxLabels);
  w.u8(static_cast<uint8_t>(labels));
  for (size_t i = 0; i < labels; ++i) {
    w.str8(e.labels[i].first, kMaxDirText);
    w.str8(e.labels[i].second, kMaxDirText);
  }
  const size_t listen = std::min(e.listen.size(), kMaxListen);
  w.u8(static_cast<uint8_t>(listen));
  for (size_t i = 0; i < listen; ++i) w.str16(e.listen[i], kMaxUrlBytes);
}

bool read_entry(reader& r, directory_entry* out) {
  directory_entry e;
  e.id = r.u64();
  e.parent = r.u64();
  e.pid = r.u32();
  e.start_time_ms = r.u64();
  e.protocol_version = r.u8();
  r.str8(&e.name, kMaxDirText);
  r.str8(&e.type, kMaxDirText);
  r.str8(&e.host_id, kMaxHostIdBytes);
  r.str8(&e.hostname, kMaxHostnameBytes);
  const size_t labels = r.u8();
  if (labels > kMaxLabels) r.fail();
  for (size_t i = 0; i < labels && r.ok(); ++i) {
    node_label l;
    r.str8(&l.first, kMaxDirText);
    r.str8(&l.second, kMaxDirText);
    for (const node_label& o : e.labels) r.fail(o.first == l.first);  // no key twice, as in config
    e.labels.push_back(std::move(l));
  }
  const size_t listen = r.u8();
  if (listen > kMaxListen) r.fail();
  for (size_t i = 0; i < listen && r.ok(); ++i) {
    std::string url;
    r.str16(&url, kMaxUrlBytes);
    e.listen.push_back(std::move(url));
  }
  if (!r.ok() || e.id == 0) return false;
  *out = std::move(e);
  return true;
}

}  // namespace

void encode_directory(const directory_body& b, std::vector<uint8_t>* out) {
  writer w(out);
  w.u8(static_cast<uint8_t>(b.op));
  if (b.op == dir_op::upsert) {
    const size_t n = std::min(b.entries.size(), kMaxDirItems);
    w.u16(static_cast<uint16_t>(n));
    for (size_t i = 0; i < n; ++i) write_entry(w, b.entries[i]);
  } else if (b.op == dir_op::load) {
    const size_t n = std::min(b.loads.size(), kMaxDirItems);
    w.u16(static_cast<uint16_t>(n));
    for (size_t i = 0; i < n; ++i) w.u64(b.loads[i].first), w.u32(b.loads[i].second);
  } else {
    const size_t n = std::min(b.ids.size(), kMaxDirItems);
    w.u16(static_cast<uint16_t>(n));
    for (size_t i = 0; i < n; ++i) w.u64(b.ids[i]);
  }
}

errc parse_directory(const uint8_t* p, size_t n, directory_body* out) {
  reader r(p, n);
  directory_body b;
  const uint8_t op = r.u8();
  const size_t count = r.u16();
  if (!r.ok() || count > kMaxDirItems) return errc::protocol_error;
  if (op == static_cast<uint8_t>(dir_op::upsert)) {
    b.op = dir_op::upsert;
    // Each entry takes at least 33 bytes: never reserve more than the input can hold.
    b.entries.reserve(std::min(count, r.left() / 33));
    for (size_t i = 0; i < count; ++i) {
      directory_entry e;
      if (!read_entry(r, &e)) return errc::protocol_error;
      b.entries.push_back(std::move(e));
    }
  } else if (op == static_cast<uint8_t>(dir_op::remove)) {
    b.op = dir_op::remove;
    if (r.left() != count * 8) return errc::protocol_error;
    for (size_t i = 0; i < count; ++i) b.ids.push_back(r.u64());
  } else if (op == static_cast<uint8_t>(dir_op::load)) {
    b.op = dir_op::load;
    if (r.left() != count * 12) return errc::protocol_error;
    for (size_t i = 0; i < count; ++i) {
      const uint64_t id = r.u64();
      b.loads.emplace_back(id, r.u32());
    }
  } else {
    return errc::protocol_error;
  }
  if (!r.done()) return errc::protocol_error;
  *out = std::move(b);
  return errc::ok;
}

namespace {
std::vector<uint8_t> labelled_input(const char* label, const uint8_t nonce[kNonceSize], bus_id id,
                                    link_role role) {
  std::vector<uint8_t> v;
  writer w(&v);
  w.bytes(label, std::strlen(label));
  w.bytes(nonce, kNonceSize);
  w.u64(id);
  w.u8(static_cast<uint8_t>(role));
  return v;
}
}  // namespace

std::vector<uint8_t> auth_input(const uint8_t nonce[kNonceSize], bus_id id, link_role role) {
  return labelled_input("uvbus-register-v1", nonce, id, role);
}

std::vector<uint8_t> accept_auth_input(const uint8_t nonce[kNonceSize], bus_id acceptor,
                                       link_role role) {
  return labelled_input("uvbus-accept-v1", nonce, acceptor, role);
}

std::vector<uint8_t> refuse_auth_input(const uint8_t nonce[kNonceSize], bus_id acceptor,
                                       link_role role, reason status) {
  std::vector<uint8_t> v = labelled_input("uvbus-refuse-v1", nonce, acceptor, role);
  writer(&v).u16(static_cast<uint16_t>(status));
  return v;
}

std::vector<uint8_t> shm_tag_input(bus_id reader_id, bus_id writer_id) {
  static constexpr char kLabel[] = "uvbus-shm-writer-v1";
  std::vector<uint8_t> v;
  writer w(&v);
  w.bytes(kLabel, sizeof kLabel - 1);
  w.u64(reader_id);
  w.u64(writer_id);
  return v;
}

}  // namespace proto
}  // namespace uvbus
