// The owner-thread check as debug builds compile it (NDEBUG unset whatever the build type, in a
// binary of its own so no other translation unit sees a different thread_check.h): a call from a
// foreign thread aborts with a message naming the function. node_thread_test.cpp covers the
// node's own calls in the suite's build type (release: errc::wrong_thread).
#undef NDEBUG
#include "core/thread_check.h"

#include <gtest/gtest.h>

#include <thread>

namespace uvbus::thread_check_test {
namespace {

struct guarded {
  detail::owner_thread owner_;
  errc call() {
    UVBUS_ON_OWNER_THREAD(owner_, "guarded::call");
    return errc::ok;
  }
};

TEST(ThreadCheck, OwnerThreadCallsPass) {
  guarded g;
  EXPECT_EQ(g.call(), errc::ok);
}

TEST(ThreadCheck, DebugBuildsAbortNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  guarded g;
  EXPECT_DEATH(
      {
        std::thread t([&] { (void)g.call(); });
        t.join();
      },
      "guarded::call called from a thread other than its loop's thread");
}

}  // namespace
}  // namespace uvbus::thread_check_test
