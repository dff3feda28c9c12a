// Owner-thread checks: every uvbus object belongs to the thread that constructed it (its loop's
// thread) and every member function starts with UVBUS_ON_OWNER_THREAD. A call from another thread
// is a bug in the caller: debug builds (NDEBUG unset) abort with a message naming the function;
// release builds make the call fail with errc::wrong_thread (one register read and a compare).
#pragma once

#include <pthread.h>

#include <cstdio>
#include <cstdlib>

#include "uvbus/error.h"

namespace uvbus::detail {

#if defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer) && defined(__linux__)
#define UVBUS_THREAD_POINTER 1
#endif
#endif

#ifdef UVBUS_THREAD_POINTER
// The calling thread's identity: its thread pointer (the TLS base, one register read; on x86-64
// glibc it is also the thread's pthread_t). Every live thread has its own, as pthread_self() has,
// and a call through the PLT to pthread_self() cost a hot send path a few per cent.
class owner_thread {
 public:
  owner_thread() noexcept : owner_(__builtin_thread_pointer()) {}
  [[nodiscard]] bool here() const noexcept { return owner_ == __builtin_thread_pointer(); }
  // Re-binds to the calling thread (for objects handed to another thread before first use).
  void rebind() noexcept { owner_ = __builtin_thread_pointer(); }

 private:
  const void* owner_;
};
#else
class owner_thread {
 public:
  owner_thread() noexcept : owner_(pthread_self()) {}
  [[nodiscard]] bool here() const noexcept { return pthread_equal(owner_, pthread_self()) != 0; }
  // Re-binds to the calling thread (for objects handed to another thread before first use).
  void rebind() noexcept { owner_ = pthread_self(); }

 private:
  pthread_t owner_;
};
#endif

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
