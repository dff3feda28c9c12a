// Bus ids and subnets.
//
// Every node on a bus has a 64-bit id. A node owns zero or more subnets of child ids, each written
// as an id prefix and a count of low-order "mask bits" (as libatbus does): the subnet
// {prefix, mask_bits} holds every id whose bits above the low mask_bits bits equal prefix's.
//
//   {0x1200, 8}  holds 0x1200 .. 0x12FF     {x, 0}  holds exactly x     {x, 64}  holds every id
//
// Every width 0..64 is well defined (no shift by 64 anywhere); wider masks are invalid.
#pragma once

#include <cstdint>
#include <string>

namespace uvbus {

using bus_id = uint64_t;

struct subnet {
  bus_id prefix = 0;
  uint8_t mask_bits = 0;  // 0..64

  // The low-order mask for a width: low_mask(0) == 0, low_mask(64) == ~0.
  [[nodiscard]] static constexpr uint64_t low_mask(unsigned bits) noexcept {
    return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  }
  [[nodiscard]] constexpr bool valid() const noexcept { return mask_bits <= 64; }
  // The first and last id of the subnet (prefix with its low bits cleared / set).
  [[nodiscard]] constexpr bus_id first() const noexcept { return prefix & ~low_mask(mask_bits); }
  [[nodiscard]] constexpr bus_id last() const noexcept { return prefix | low_mask(mask_bits); }
  [[nodiscard]] constexpr bool contains(bus_id id) const noexcept {
    return ((id ^ prefix) & ~low_mask(mask_bits)) == 0;
  }
  // True when every id of `other` is in this subnet.
  [[nodiscard]] constexpr bool contains(const subnet& other) const noexcept {
    return other.mask_bits <= mask_bits && contains(other.prefix);
  }
  [[nodiscard]] constexpr bool overlaps(const subnet& other) const noexcept {
    return contains(other) || other.contains(*this);
  }
  // The same subnet with the host bits of the prefix cleared (canonical form).
  [[nodiscard]] constexpr subnet canonical() const noexcept { return {first(), mask_bits}; }
  friend constexpr bool operator==(const subnet& a, const subnet& b) noexcept {
    return a.mask_bits == b.mask_bits && a.first() == b.first();
  }
  // "0x1200/8" (prefix in hex, then the mask bits).
  [[nodiscard]] std::string to_string() const;
};

}  // namespace uvbus
