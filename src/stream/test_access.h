// Test-only access to a stream channel's internals: a TLS session put in the state OpenSSL leaves
// it in after a fatal error. Not installed; tests include it from src/.
#pragma once

#include "uvbus/stream.h"

namespace uvbus::detail {

struct stream_access {
  // Shuts conn's TLS session down without telling the peer: every later SSL_write of it fails
  // ("protocol is shutdown"), as after a fatal TLS error. false: no such TLS connection.
  static bool break_tls_writes(stream_channel& ch, connection_id conn) noexcept;
};

}  // namespace uvbus::detail
