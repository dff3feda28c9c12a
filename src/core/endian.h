// Little-endian loads and stores of unsigned integers at any alignment, the one place wire formats
// (stream frames, bus messages, MurmurHash3 blocks, the shm region) read and write fixed-width
// little-endian fields. memcpy keeps unaligned access well defined and compiles to one plain load
// or store on little-endian hosts; big-endian hosts add one byte swap.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace uvbus {

// v converted between host order and little-endian (its own inverse).
template <class T>
[[nodiscard]] constexpr T to_le(T v) noexcept {
  static_assert(std::is_unsigned<T>::value, "unsigned integers only");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if constexpr (sizeof(T) == 2) return __builtin_bswap16(v);
  if constexpr (sizeof(T) == 4) return __builtin_bswap32(v);
  if constexpr (sizeof(T) == 8) return __builtin_bswap64(v);
#endif
  return v;
}

// Writes v to p[0, sizeof v) little-endian.
template <class T>
inline void store_le(uint8_t* p, T v) noexcept {
  v = to_le(v);
  std::memcpy(p, &v, sizeof v);
}

// Reads a little-endian T from p[0, sizeof(T)).
template <class T>
[[nodiscard]] inline T load_le(const uint8_t* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return to_le(v);
}

[[nodiscard]] inline uint16_t load_le16(const uint8_t* p) noexcept {
  return load_le<uint16_t>(p);
}
[[nodiscard]] inline uint32_t load_le32(const uint8_t* p) noexcept {
  return load_le<uint32_t>(p);
}
[[nodiscard]] inline uint64_t load_le64(const uint8_t* p) noexcept {
  return load_le<uint64_t>(p);
}

}  // namespace uvbus
