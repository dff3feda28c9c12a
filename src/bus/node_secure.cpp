// Protocol version 6's link protection: the two-way registration proof, the negotiation and use
// of link compression, and the shared-memory writer tags (docs/security.md, docs/protocol.md).
#include "bus/node_impl.h"
#include "core/try_alloc.h"

namespace uvbus {

using detail::link_security;

const char* to_string(compression_codec c) noexcept {
  return to_string(static_cast<codec>(c));
}

namespace {
constexpr uint8_t kV6 = 6;

// Our own allocation failed, not the peer: the message cannot be restored, so it is neither
// delivered nor acknowledged. The link closes with no_memory (not counted as the peer's protocol
// error); end-to-end delivery resends the message over the next link.
void restore_failed(node::impl* n, detail::link* lk, const char* why) {
  char buf[240];
  std::snprintf(buf, sizeof buf, "connection %" PRIu64 " (%s): compressed message not restored: %s",
                lk->conn_id, n->streams->peer_url(lk->conn).c_str(), why);
  n->error(errc::no_memory, buf);
  n->close_link(lk, errc::no_memory);
}

uint64_t tag56(const std::string& token, bus_id reader, bus_id writer) {
  const std::vector<uint8_t> in = proto::shm_tag_input(reader, writer);
  uint8_t mac[detail::kMacSize] = {};
  if (!detail::hmac_sha256(token, in.data(), in.size(), mac)) return 0;
  uint64_t t = 0;
  for (int i = 0; i < 7; ++i) t |= uint64_t{mac[i]} << (8 * i);
  return t;
}
}  // namespace

// ---------------------------------------------------------------------------- registration --
void node::impl::register_ext(link* lk, const proto::challenge_body& ch, proto::register_body* rb) {
  if (ch.max_version < kV6 || cfg.protocol_max < kV6) return;
  rb->ext.present = true;
  if (!cfg.access_tokens.empty() && detail::random_bytes(lk->my_nonce, sizeof lk->my_nonce)) {
    rb->ext.has_nonce = true;
    lk->sent_nonce = true;
    std::memcpy(rb->ext.nonce, lk->my_nonce, sizeof lk->my_nonce);
  }
  rb->ext.has_compression = true;
  rb->ext.compression = static_cast<uint8_t>(cfg.compression);
}

void node::impl::reply_ext(link* lk, const proto::register_body& rb, size_t token, uint8_t version,
                           proto::register_reply_body* rr) {
  if (rr->status != proto::reason::ok) {
    // A refusal is proven when the connector proved a token (`token` indexes it) and sent a nonce
    // (so it reads extensions): it then takes a configuration error as final, and an unproven
    // one (from whatever answers at its parent's URL) as retriable.
    if (cfg.access_tokens.empty() || !rb.ext.has_nonce || token >= cfg.access_tokens.size()) return;
    const std::vector<uint8_t> in =
        proto::refuse_auth_input(rb.ext.nonce, self, rb.role, rr->status);
    rr->ext.present = true;
    rr->ext.has_proof =
        detail::hmac_sha256(cfg.access_tokens[token], in.data(), in.size(), rr->ext.proof);
    return;
  }
  if (version < kV6) return;
  rr->ext.present = true;
  if (!cfg.access_tokens.empty() && rb.ext.has_nonce && token < cfg.access_tokens.size()) {
    const std::vector<uint8_t> in = proto::accept_auth_input(rb.ext.nonce, self, rb.role);
    rr->ext.has_proof =
        detail::hmac_sha256(cfg.access_tokens[token], in.data(), in.size(), rr->ext.proof);
  }
  // Both sides must want compression; the acceptor's codec is the link's.
  const bool both = cfg.compression != compression_codec::none && rb.ext.has_compression &&
                    rb.ext.compression != 0;
  lk->codec = both ? static_cast<uint8_t>(cfg.compression) : 0;
  rr->ext.has_compression = true;
  rr->ext.compression = lk->codec;
}

bool node::impl::check_reply_ext(link* lk, const proto::register_reply_body& rr, std::string* why) {
  if (rr.status != proto::reason::ok) {  // a refusal: proven, or not to be taken as final
    if (cfg.access_tokens.empty()) return true;
    const std::vector<uint8_t> in =
        proto::refuse_auth_input(lk->my_nonce, rr.info.id, lk->role, rr.status);
    if (lk->sent_nonce && rr.ext.has_proof &&
        detail::verify_proof(cfg.access_tokens, in.data(), in.size(), rr.ext.proof)) {
      return true;
    }
    *why += "; not proven by the acceptor (no access token of ours): retrying";
    return false;
  }
  if (!cfg.access_tokens.empty()) {
    if (rr.version < kV6 || !lk->sent_nonce) {
      *why = "the acceptor negotiated protocol version " + std::to_string(rr.version) +
             ", which cannot prove an access token (two-way authentication needs 6)";
      return false;
    }
    const std::vector<uint8_t> in = proto::accept_auth_input(lk->my_nonce, rr.info.id, lk->role);
    if (!rr.ext.has_proof ||
        !detail::verify_proof(cfg.access_tokens, in.data(), in.size(), rr.ext.proof)) {
      *why = "the acceptor did not prove an access token of ours";
      return false;
    }
  }
  const bool wanted = cfg.compression != compression_codec::none;
  lk->codec = wanted && rr.ext.has_compression ? rr.ext.compression : 0;
  return true;
}

// ----------------------------------------------------------------------------- compression --
void node::impl::compress_out(link* lk, const const_buffer** bufs, size_t* n) {
  const const_buffer* b = *bufs;
  if (lk->codec == 0 || *n == 0 || b[0].size < proto::kHeaderSize) return;
  const auto* hb = static_cast<const uint8_t*>(b[0].data);
  if (hb[1] != static_cast<uint8_t>(msg_type::data) &&
      hb[1] != static_cast<uint8_t>(msg_type::forward)) {
    return;
  }
  const size_t body_len = load_le<uint32_t>(hb + 4);
  if (body_len < cfg.compression_threshold || body_len < kCompressMinInput) return;
  link_security& s = *sec;
  // No memory for the gathered body or the block: the message goes out uncompressed.
  if (!detail::try_resize(&s.body, body_len) || !detail::try_resize(&s.block, body_len)) return;
  size_t off = 0;
  size_t skip = proto::kHeaderSize;
  for (size_t i = 0; i < *n; ++i) {
    const auto* d = static_cast<const uint8_t*>(b[i].data);
    const size_t take = b[i].size > skip ? b[i].size - skip : 0;
    if (take != 0 && off + take <= body_len) std::memcpy(s.body.data() + off, d + skip, take);
    off += take;
    skip = skip > b[i].size ? skip - b[i].size : 0;
  }
  if (off != body_len) return;  // not a well-formed message: send it as it is
  const size_t z = s.comp.compress(static_cast<codec>(lk->codec), cfg.compression_level,
                                   s.body.data(), body_len, s.block.data(), body_len);
  if (z == 0) return;
  std::memcpy(s.head, hb, proto::kHeaderSize);
  s.head[2] |= proto::flag_compressed;
  store_le<uint32_t>(s.head + 4, static_cast<uint32_t>(z));
  s.spans[0] = {s.head, proto::kHeaderSize};
  s.spans[1] = {s.block.data(), z};
  *bufs = s.spans;
  *n = 2;
  ++counters.compressed_sent;
  counters.compressed_raw_bytes += body_len;
  counters.compressed_wire_bytes += z;
}

bool node::impl::inflate_in(link* lk, const uint8_t** data, size_t* size) {
  const uint8_t* m = *data;
  if (lk->codec == 0) {
    protocol_violation(lk, "compressed message on a link without compression");
    return false;
  }
  if (m[1] != static_cast<uint8_t>(msg_type::data) &&
      m[1] != static_cast<uint8_t>(msg_type::forward)) {
    protocol_violation(lk, "compressed message that is not data");
    return false;
  }
  link_security& s = *sec;
  if (s.body_limit == 0) s.body_limit = link_stream_config().message_limit - proto::kHeaderSize;
  // The restore buffer holds the largest body the link may carry (up to message_limit, 1 GiB at
  // most): allocated at the first compressed message, so it may not be there.
  if (!detail::try_resize(&s.restored, proto::kHeaderSize + s.body_limit)) {
    char why[96];
    std::snprintf(why, sizeof why, "no memory for a restore buffer of %zu bytes",
                  proto::kHeaderSize + s.body_limit);
    restore_failed(this, lk, why);
    return false;
  }
  const decompress_result r = s.comp.decompress(
      static_cast<codec>(lk->codec), m + proto::kHeaderSize, *size - proto::kHeaderSize,
      s.restored.data() + proto::kHeaderSize, s.body_limit);
  if (r.code == errc::no_memory) {
    restore_failed(this, lk, s.comp.last_error().detail.c_str());
    return false;
  }
  if (r.code != errc::ok) {
    const std::string why = "compressed message refused: " + s.comp.last_error().detail;
    protocol_violation(lk, why.c_str());
    return false;
  }
  std::memcpy(s.restored.data(), m, proto::kHeaderSize);
  s.restored[2] &= static_cast<uint8_t>(~proto::flag_compressed);
  store_le<uint32_t>(s.restored.data() + 4, static_cast<uint32_t>(r.size));
  *data = s.restored.data();
  *size = proto::kHeaderSize + r.size;
  ++counters.decompressed;
  return true;
}

// ---------------------------------------------------------------------- shared-memory tags --
void node::impl::shm_tag_peer(peer_ep* p) {
  p->shm_tagged = false;
  if (cfg.access_tokens.empty() || version_of(p) < kV6) return;
  const uint64_t t = tag56(cfg.access_tokens.front(), p->id, self);
  p->shm_envelope[0] = proto::kShmEnvelopeMarker;
  for (int i = 0; i < 7; ++i) p->shm_envelope[1 + i] = static_cast<uint8_t>(t >> (8 * i));
  store_le<uint64_t>(p->shm_envelope + 8, self);
  p->shm_tagged = true;
}

bool node::impl::shm_accept(const uint8_t** data, size_t* size, bus_id* writer) {
  const uint8_t* d = *data;
  const bool enveloped = *size >= proto::kShmEnvelopeSize && d[0] == proto::kShmEnvelopeMarker;
  if (!enveloped) {
    *writer = 0;
    if (cfg.access_tokens.empty()) return true;  // no tokens: nothing to check
    ++counters.shm_rejected;
    return false;
  }
  *writer = load_le<uint64_t>(d + 8);
  *data = d + proto::kShmEnvelopeSize;
  *size -= proto::kShmEnvelopeSize;
  if (cfg.access_tokens.empty()) return true;
  link_security& s = *sec;
  auto it = s.writer_tags.find(*writer);
  if (it == s.writer_tags.end()) {
    if (s.writer_tags.size() >= link_security::kMaxWriters) s.writer_tags.clear();
    std::vector<uint64_t> tags;
    tags.reserve(cfg.access_tokens.size());
    for (const std::string& t : cfg.access_tokens) tags.push_back(tag56(t, self, *writer));
    it = s.writer_tags.emplace(*writer, std::move(tags)).first;
  }
  uint64_t got = 0;
  for (int i = 0; i < 7; ++i) got |= uint64_t{d[1 + i]} << (8 * i);
  bool ok = false;
  for (const uint64_t t : it->second) ok = ok || t == got;
  if (!ok) {
    ++counters.shm_rejected;
    return false;
  }
  return true;
}

}  // namespace uvbus
