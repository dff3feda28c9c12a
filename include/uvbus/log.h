// Log levels and the logging callback shared by the node and the channels (node_callbacks::on_log,
// stream_callbacks::on_log, shm_reader_callbacks::on_log).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace uvbus {

enum class log_level : uint8_t { debug, info, warn, error };

[[nodiscard]] const char* to_string(log_level l) noexcept;

// One log line, without a trailing newline. Runs on the owner's loop thread (as the other
// callbacks of the same object, with their rules). Repeated events of one kind are rate limited
// by the emitter (a burst of 5 per second per kind, then one line saying how many were left out),
// so a flood of bad input cannot flood the log.
using log_fn = std::function<void(log_level level, const std::string& message)>;

}  // namespace uvbus
