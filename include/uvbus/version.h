#pragma once

#define UVBUS_VERSION_MAJOR 0
#define UVBUS_VERSION_MINOR 1
#define UVBUS_VERSION_PATCH 0

namespace uvbus {
inline constexpr const char* kVersionString = "0.1.0";
}  // namespace uvbus
