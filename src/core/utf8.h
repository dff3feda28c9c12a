// UTF-8 well-formedness (RFC 3629), for the code that escapes a peer's text: the bus's log lines
// (detail::printable) and the uvbus tool's JSON strings.
#pragma once

#include <cstddef>

namespace uvbus::detail {

// The length of the well-formed UTF-8 sequence at p[0, n), n >= 1 (no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when none starts there.
[[nodiscard]] size_t utf8_sequence(const unsigned char* p, size_t n) noexcept;

}  // namespace uvbus::detail
