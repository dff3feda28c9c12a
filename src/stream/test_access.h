// Test-only access to a stream channel's internals: a TLS session put in the state OpenSSL leaves
// it in after a fatal error, a reserve descriptor lost, the accept failures counted, a dns answer,
// the sweep's largest slice, the connection id generation, a read buffer that finds no memory.
// Not installed; tests include it from src/.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include <vector>

#include "uvbus/stream.h"

namespace uvbus::detail {

struct stream_access {
  // Shuts conn's TLS session down without telling the peer: every later SSL_write of it fails
  // ("protocol is shutdown"), as after a fatal TLS error. false: no such TLS connection.
  static bool break_tls_writes(stream_channel& ch, connection_id conn) noexcept;
  // The same at conn's next key renewal (tls_config::key_update_bytes, key_update_interval_ms):
  // the SSL_write it comes before fails, those before it in the same batch have succeeded.
  static bool break_tls_writes_at_renewal(stream_channel& ch, connection_id conn) noexcept;
  // Closes the channel's reserve descriptor as if it had been lost (another thread took the slot
  // while it was free); the descriptor number it had, or -1.
  static int drop_reserve(stream_channel& ch) noexcept;
  // accept() failures of ch's listeners that no shedding mended (each one paused a listener).
  static uint64_t accept_errors(const stream_channel& ch) noexcept;
  // Every later dns:// dial of ch tries these addresses, in this order, instead of the resolver's
  // answer (the name is still resolved, and must resolve). Empty: the resolver's answer again.
  static void set_dns_answer(stream_channel& ch, std::vector<sockaddr_storage> addrs);
  // The most connections one firing of ch's sweep has looked at so far.
  static size_t sweep_largest_slice(const stream_channel& ch) noexcept;
  // How often the sweep has fired; the connection its next slice starts at (none: a new pass);
  // how many connections a slice looks at (kSweepSlice unless set).
  static uint64_t sweep_firings(const stream_channel& ch) noexcept;
  static connection_id sweep_cursor(const stream_channel& ch) noexcept;
  static void set_sweep_slice(stream_channel& ch, size_t n) noexcept;
  // The generation the next connection id of any channel is made from (process-wide; 0 is
  // skipped): lets a test wrap the counter around without 4 billion connections.
  static void set_next_generation(uint32_t gen) noexcept;
  // This thread's read buffer is freed, and allocating it again fails once (as out of memory).
  static void fail_read_buffer() noexcept;
};

}  // namespace uvbus::detail
