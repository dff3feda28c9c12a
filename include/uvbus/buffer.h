// const_buffer: the one byte-span type of the public API. Every gather send (stream_channel::sendv,
// shm_writer::sendv, node::send_datav) takes an array of them and sends their concatenation as one
// message; the bytes are copied (or hashed and framed in place) before the call returns.
#pragma once

#include <cstddef>

namespace uvbus {

struct const_buffer {
  const void* data = nullptr;
  size_t size = 0;
};

}  // namespace uvbus
