// Prometheus text exposition format 0.0.4 (what /metrics serves): families with HELP and TYPE,
// samples with escaped labels, histograms from cumulative buckets. Appends into one string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace uvbus::obs {

enum class metric_type : uint8_t { counter, gauge, histogram };

// A label pair list, e.g. {{"peer", "0x101"}, {"role", "child"}}; at most 4 labels per sample.
struct label {
  std::string_view name;
  std::string_view value;
};

class prom_text {
 public:
  // Starts a family: "# HELP name help" and "# TYPE name type". name must match
  // [a-zA-Z_:][a-zA-Z0-9_:]* (checked: a bad one is skipped with its samples and counted in
  // bad_names()); counters end in _total by convention (not enforced here).
  void family(std::string_view name, std::string_view help, metric_type type);
  // One sample of the current family: name + suffix (e.g. "_bucket"), labels, value. Values are
  // spelled alike in every locale and read back exactly (integers up to 2^64 as integers); label
  // values and HELP texts go out as UTF-8 (a byte of no well-formed sequence becomes U+FFFD).
  void sample(std::string_view suffix, const label* labels, size_t nlabels, double value);
  void sample(double value) { sample({}, nullptr, 0, value); }
  void sample(const label* labels, size_t nlabels, double value) {
    sample({}, labels, nlabels, value);
  }
  // A histogram's samples: `count` cumulative (upper bound in the family's unit, count) pairs in
  // increasing order (the +Inf bucket is added), then _sum and _count.
  void histogram(const label* labels, size_t nlabels, const std::pair<double, uint64_t>* buckets,
                 size_t count, double sum, uint64_t total);

  [[nodiscard]] const std::string& text() const noexcept { return out_; }
  [[nodiscard]] std::string take() { return std::move(out_); }
  [[nodiscard]] size_t bad_names() const noexcept { return bad_names_; }

  [[nodiscard]] static bool valid_name(std::string_view name) noexcept;

 private:
  void append_value(double v);
  void append_labels(const label* labels, size_t n, const label* extra);

  std::string out_;
  std::string name_;
  bool skip_ = false;
  size_t bad_names_ = 0;
};

}  // namespace uvbus::obs
