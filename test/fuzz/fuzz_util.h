// Helpers shared by the libFuzzer targets.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// An invariant of the code under test. A failure aborts, which libFuzzer records as a crash and
// saves the input; the message says which invariant broke. Always on (not tied to NDEBUG).
#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace uvbus::fuzz {

// Reads input bytes front to back; past the end it yields zeros, so a short input is still a
// valid (if dull) program and every prefix of an interesting input stays meaningful.
class byte_reader {
 public:
  byte_reader(const uint8_t* data, size_t size) noexcept : p_(data), left_(size) {}
  [[nodiscard]] bool empty() const noexcept { return left_ == 0; }
  [[nodiscard]] size_t left() const noexcept { return left_; }
  [[nodiscard]] const uint8_t* data() const noexcept { return p_; }
  uint8_t u8() noexcept {
    if (left_ == 0) return 0;
    --left_;
    return *p_++;
  }
  uint16_t u16() noexcept { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() noexcept {
    return static_cast<uint32_t>(u16() | static_cast<uint32_t>(u16()) << 16);
  }
  uint64_t u64() noexcept { return u32() | static_cast<uint64_t>(u32()) << 32; }
  // Takes up to n bytes (fewer at the end of the input).
  size_t take(size_t n, const uint8_t** out) noexcept {
    if (n > left_) n = left_;
    *out = p_;
    p_ += n;
    left_ -= n;
    return n;
  }

 private:
  const uint8_t* p_;
  size_t left_;
};

}  // namespace uvbus::fuzz
