// UTF-8 well-formedness (RFC 3629) and the escaping of a peer's text for log lines
// (detail::printable: the bus, the stream channel's TLS details, the uvbus tool's output).
#pragma once

#include <cstddef>
#include <string>

namespace uvbus::detail {

// The length of the well-formed UTF-8 sequence at p[0, n), n >= 1 (no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when none starts there.
[[nodiscard]] size_t utf8_sequence(const unsigned char* p, size_t n) noexcept;

// Whether s is well-formed UTF-8 throughout (ASCII included).
[[nodiscard]] bool valid_utf8(const std::string& s) noexcept;

// Text a peer sent (a host name, a refusal's message, a node's labels, a certificate's name) for
// our log lines, error details and the uvbus tool's terminal output. Kept as they are: printable
// ASCII (0x20..0x7e) and each well-formed UTF-8 sequence (RFC 3629) of a code point from U+00A0 on
// ("é", "日本"). Escaped as \xNN, one per byte: the C0 controls (< 0x20) and DEL (0x7f); the C1
// controls U+0080..U+009F (both bytes of their UTF-8 form, 0xc2 0x80..0x9f); and every byte that is
// not part of a well-formed sequence (a lone 0x9b, which a terminal reading 8-bit controls takes
// for CSI; a cut sequence, an overlong form, a surrogate, a code point above U+10FFFF, 0xf5..0xff).
// So a peer can neither write lines of its own into a log nor send a terminal a control sequence,
// and the result is valid UTF-8. Other code points pass, format characters (U+200B..U+200F,
// U+202A..U+202E) among them.
[[nodiscard]] std::string printable(const std::string& s);

}  // namespace uvbus::detail
