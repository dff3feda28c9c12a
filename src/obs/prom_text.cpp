// Prometheus text exposition format 0.0.4: escaping, number formatting, histogram samples.
#include "obs/prom_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/utf8.h"

namespace uvbus::obs {
namespace {

// HELP text: backslash and newline escaped; label values also double quotes. Both are UTF-8 on
// the wire (Prometheus refuses a scrape with a label value that is not): each byte of no
// well-formed sequence (a Latin-1 "caf\xe9" in a shm ring's name) becomes U+FFFD.
void append_escaped(std::string* out, std::string_view s, bool quotes) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (p[i] >= 0x80) {
      const size_t n = detail::utf8_sequence(p + i, s.size() - i);
      if (n == 0) {
        *out += "\xef\xbf\xbd";
      } else {
        out->append(s.data() + i, n);
        i += n - 1;
      }
    } else if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (quotes && c == '"') {
      *out += "\\\"";
    } else {
      out->push_back(c);
    }
  }
}

const char* type_name(metric_type t) {
  switch (t) {
    case metric_type::counter:
      return "counter";
    case metric_type::gauge:
      return "gauge";
    case metric_type::histogram:
      return "histogram";
  }
  return "untyped";
}

// v spelled as the "C" locale's printf("%.Ng") would, whatever the process's locale (std::to_chars:
// a Qt application's de_DE made printf write 12,345, which no scraper reads), N the digits of the
// shortest form that reads back as v, at least 9: %.9g's spelling where that was exact (a le label
// names its series), and every digit needed where it was not (1e16 + 2, 1234567.891). Returns the
// end of the text; [first, last) holds 32 chars.
char* format_double(char* first, char* last, double v) {
  char sci[32];
  const std::to_chars_result shortest =
      std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific);
  int digits = 0;
  for (const char* p = sci; p != shortest.ptr && *p != 'e'; ++p) digits += *p >= '0' && *p <= '9';
  return std::to_chars(first, last, v, std::chars_format::general, std::max(digits, 9)).ptr;
}

bool label_name_ok(std::string_view n) {
  if (n.empty() || (n.size() >= 2 && n[0] == '_' && n[1] == '_')) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

}  // namespace

bool prom_text::valid_name(std::string_view n) noexcept {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

void prom_text::family(std::string_view name, std::string_view help, metric_type type) {
  skip_ = !valid_name(name);
  if (skip_) {
    ++bad_names_;
    return;
  }
  name_.assign(name.data(), name.size());
  out_ += "# HELP ";
  out_ += name_;
  out_.push_back(' ');
  append_escaped(&out_, help, false);
  out_ += "\n# TYPE ";
  out_ += name_;
  out_.push_back(' ');
  out_ += type_name(type);
  out_.push_back('\n');
}

void prom_text::append_value(double v) {
  char buf[32];
  char* end = buf;
  if (std::isnan(v)) {
    out_ += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out_ += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  // Integers as integers, up to 2^64 (a uint64_t counter); -0 as 0.
  if (v == std::floor(v) && v >= -0x1p63 && v < 0x1p64) {
    end = v < 0 ? std::to_chars(buf, buf + sizeof buf, static_cast<long long>(v)).ptr
                : std::to_chars(buf, buf + sizeof buf, static_cast<unsigned long long>(v)).ptr;
  } else {
    end = format_double(buf, buf + sizeof buf, v);
  }
  out_.append(buf, end);
}

void prom_text::append_labels(const label* labels, size_t n, const label* extra) {
  size_t written = 0;
  const auto one = [&](const label& l) {
    if (!label_name_ok(l.name)) {
      ++bad_names_;
      return;
    }
    out_.push_back(written++ == 0 ? '{' : ',');
    out_.append(l.name.data(), l.name.size());
    out_ += "=\"";
    append_escaped(&out_, l.value, true);
    out_.push_back('"');
  };
  for (size_t i = 0; i < n; ++i) one(labels[i]);
  if (extra != nullptr) one(*extra);
  if (written != 0) out_.push_back('}');
}

void prom_text::sample(std::string_view suffix, const label* labels, size_t nlabels, double value) {
  if (skip_) return;
  out_ += name_;
  out_.append(suffix.data(), suffix.size());
  append_labels(labels, nlabels, nullptr);
  out_.push_back(' ');
  append_value(value);
  out_.push_back('\n');
}

void prom_text::histogram(const label* labels, size_t nlabels,
                          const std::pair<double, uint64_t>* buckets, size_t count, double sum,
                          uint64_t total) {
  if (skip_) return;
  char le[32];
  for (size_t i = 0; i <= count; ++i) {
    std::string_view bound = "+Inf";
    if (i < count) {
      const char* end = format_double(le, le + sizeof le, buckets[i].first);
      bound = std::string_view(le, static_cast<size_t>(end - le));
    }
    const label extra{"le", bound};
    out_ += name_;
    out_ += "_bucket";
    append_labels(labels, nlabels, &extra);
    out_.push_back(' ');
    append_value(static_cast<double>(i < count ? buckets[i].second : total));
    out_.push_back('\n');
  }
  sample("_sum", labels, nlabels, sum);
  sample("_count", labels, nlabels, static_cast<double>(total));
}

}  // namespace uvbus::obs
