// The whole public API of uvbus. Everything lives in namespace uvbus.
#pragma once

#include "uvbus/address.h"
#include "uvbus/error.h"
#include "uvbus/frame.h"
#include "uvbus/murmur3.h"
#include "uvbus/varint.h"
#include "uvbus/version.h"
#include "uvbus/write_queue.h"
// Components add their headers here as they land (stream.h, shm.h, node.h).
#if __has_include("uvbus/stream.h")
#include "uvbus/stream.h"
#endif
#if __has_include("uvbus/shm.h")
#include "uvbus/shm.h"
#endif
#if __has_include("uvbus/node.h")
#include "uvbus/node.h"
#endif
