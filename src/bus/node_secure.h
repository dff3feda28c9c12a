// The state behind protocol version 6's link protection (node_secure.cpp): the compressor and its
// scratch buffers, and the cache of shared-memory writer tags. One per node, loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "bus/wire.h"
#include "core/compress.h"
#include "uvbus/buffer.h"

namespace uvbus::detail {

struct link_security {
  compressor comp;
  // compress_out(): the gathered body, the block, the new header and the spans sent.
  std::vector<uint8_t> body;
  std::vector<uint8_t> block;
  uint8_t head[proto::kHeaderSize] = {};
  const_buffer spans[2] = {};
  // transmit(): the writer's envelope and the message's spans, for a tagged shm peer.
  std::vector<const_buffer> tagged;
  // inflate_in(): the restored message (header + body) and the largest body restored.
  std::vector<uint8_t> restored;
  size_t body_limit = 0;
  // shm_accept(): the expected 7-byte tag of each writer id seen, one per access token (a ring
  // accepts any token's tag, as registration does). Bounded: cleared when it reaches kMaxWriters.
  static constexpr size_t kMaxWriters = 4096;
  std::unordered_map<uint64_t, std::vector<uint64_t>> writer_tags;
};

}  // namespace uvbus::detail
