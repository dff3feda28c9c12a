// Owner-thread checks: every uvbus object belongs to the thread that constructed it (its loop's
// thread) and every member function starts with UVBUS_ON_OWNER_THREAD. A call from another thread
// is a bug in the caller: debug builds (NDEBUG unset) abort with a message naming the function;
// release builds make the call fail with errc::wrong_thread (one pthread_equal, a few ns).
#pragma once

#include <pthread.h>

#include <cstdio>
#include <cstdlib>

#include "uvbus/error.h"

namespace uvbus::detail {

class owner_thread {
 public:
  owner_thread() noexcept : owner_(pthread_self()) {}
  [[nodiscard]] bool here() const noexcept { return pthread_equal(owner_, pthread_self()) != 0; }
  // Re-binds to the calling thread (for objects handed to another thread before first use).
  void rebind() noexcept { owner_ = pthread_self(); }

 private:
  pthread_t owner_;
};

// Called on a wrong-thread call: aborts in debug builds, returns in release builds.
inline void wrong_thread(const char* function) noexcept {
#ifndef NDEBUG
  std::fprintf(stderr, "uvbus: %s called from a thread other than its loop's thread\n", function);
  std::abort();
#else
  (void)function;
#endif
}

}  // namespace uvbus::detail

// In a member function returning errc: `UVBUS_ON_OWNER_THREAD(owner_, "node::send_data");`
#define UVBUS_ON_OWNER_THREAD(guard, function) \
  do {                                         \
    if (!(guard).here()) {                     \
      ::uvbus::detail::wrong_thread(function); \
      return ::uvbus::errc::wrong_thread;      \
    }                                          \
  } while (0)

// In a member function returning void (or a value): `UVBUS_ON_OWNER_THREAD_OR(owner_, "...", );`
#define UVBUS_ON_OWNER_THREAD_OR(guard, function, value) \
  do {                                                   \
    if (!(guard).here()) {                               \
      ::uvbus::detail::wrong_thread(function);           \
      return value;                                      \
    }                                                    \
  } while (0)
