// Growing a byte buffer to a size that a peer's message or the configuration chose (up to the
// message limit, which may be 1 GiB), without letting std::bad_alloc out: the caller gets false
// and reports no_memory. Small, fixed allocations elsewhere still treat exhaustion as fatal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace uvbus::detail {

// v->resize(n): true when done, false (v unchanged) when memory ran out or n is beyond what a
// vector can hold. A call that needs no new storage (n <= capacity) always succeeds.
[[nodiscard]] bool try_resize(std::vector<uint8_t>* v, size_t n) noexcept;

// Tests only: the next n calls of try_resize that need new storage fail as if memory had run out.
// Process-wide.
void fail_next_try_resize(int n) noexcept;

}  // namespace uvbus::detail
