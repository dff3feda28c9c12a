// The whole public API of uvbus in one include. Everything lives in namespace uvbus.
#pragma once

#include "uvbus/address.h"
#include "uvbus/buffer.h"
#include "uvbus/call.h"
#include "uvbus/error.h"
#include "uvbus/handover.h"
#include "uvbus/histogram.h"
#include "uvbus/log.h"
#include "uvbus/node.h"
#include "uvbus/protocol.h"
#include "uvbus/queue_config.h"
#include "uvbus/shm.h"
#include "uvbus/stream.h"
#include "uvbus/subnet.h"
#include "uvbus/trace.h"
#include "uvbus/version.h"
