// try_resize: a byte buffer grown without an exception, and its failure injection for tests.
#include "core/try_alloc.h"

#include <atomic>
#include <new>
#include <stdexcept>

namespace uvbus::detail {
namespace {

std::atomic<int> g_fail{0};  // failures still to inject (fail_next_try_resize)

bool inject_failure() noexcept {
  int left = g_fail.load(std::memory_order_relaxed);
  while (left > 0) {
    if (g_fail.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

}  // namespace

bool try_resize(std::vector<uint8_t>* v, size_t n) noexcept {
  if (n <= v->capacity()) {
    v->resize(n);  // no allocation: cannot throw
    return true;
  }
  if (inject_failure()) return false;
  try {
    v->resize(n);
  } catch (const std::bad_alloc&) {
    return false;
  } catch (const std::length_error&) {
    return false;
  }
  return true;
}

void fail_next_try_resize(int n) noexcept {
  g_fail.store(n, std::memory_order_relaxed);
}

}  // namespace uvbus::detail
