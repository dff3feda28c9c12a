// Test-only access to a shm_writer's internals: a hook run inside send()/sendv()/send_batch() after
// the record's nodes are reserved and before its payload is copied and committed, to hold or kill
// a writer mid-record. Not installed; tests include it from src/.
#pragma once

#include "uvbus/shm.h"

namespace uvbus::shm_detail {

struct region_access {
  // hook(user) runs inside every later SysV reattach, between winning the region's claim and
  // taking it over (the window two racing readers meet in), until removed with nullptr.
  static void set_claim_hook(void (*hook)(void* user), void* user) noexcept;
  // hook(user) runs inside every later POSIX create, between shm_open(O_EXCL) of the new object
  // and its flock (the window another reader opening the name meets it unlocked and empty).
  static void set_create_hook(void (*hook)(void* user), void* user) noexcept;
  // hook(user) runs inside every later POSIX create or reattach, where its pages are reserved:
  // a nonzero return is taken as the reservation's errno (ENOSPC: a /dev/shm without room).
  static void set_reserve_hook(int (*hook)(void* user), void* user) noexcept;
};

struct writer_access {
  // hook(user) runs inside every later send of w until removed with nullptr. No-op if w is closed.
  static void set_test_hook(shm_writer& w, void (*hook)(void* user), void* user) noexcept;
};

}  // namespace uvbus::shm_detail
