// Prometheus text exposition format 0.0.4: escaping, number formatting, histogram samples.
#include "obs/prom_text.h"

#include <cmath>
#include <cstdio>

namespace uvbus::obs {
namespace {

// HELP text: backslash and newline escaped; label values also double quotes.
void append_escaped(std::string* out, std::string_view s, bool quotes) {
  for (const char c : s) {
    if (c == '\\') {
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
  if (std::isnan(v)) {
    out_ += "NaN";
  } else if (std::isinf(v)) {
    out_ += v > 0 ? "+Inf" : "-Inf";
  } else if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    out_ += buf;
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    out_ += buf;
  }
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
    if (i < count) {
      std::snprintf(le, sizeof le, "%.9g", buckets[i].first);
    } else {
      std::snprintf(le, sizeof le, "+Inf");
    }
    const label extra{"le", le};
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
