// uvbus_shm_inspect: the old name of `uvbus shm` (CI and docs/shm.md use it); same code.
#include "uvbus/common.h"  // tools/uvbus/common.h

int main(int argc, char** argv) {
  uvbus_tool::ignore_sigpipe();  // a closed pipe is a write error (exit 2), as for `uvbus shm`
  uvbus_tool::hold_std_fds();
  return uvbus_tool::shm_inspect_legacy_main(argc, argv);
}
