// Epoch: the fencing token the ownership table grants with each new claim.
//
// Epochs only grow: the table never grants one twice, and a slot's epoch never
// goes down. A write, a replica generation or a handle tagged with an older
// epoch than the slot's current one is stale.
//
// Thread-safety: a value.
#pragma once

#include <compare>
#include <cstdint>
#include <ostream>
#include <string>

namespace fleetfs::lease {

class Epoch {
 public:
  // Epochs are stored as SQLite integers, so they stay within int64.
  static constexpr std::uint64_t kMax = INT64_MAX;

  constexpr Epoch() = default;  // 0: no epoch was ever granted
  constexpr explicit Epoch(std::uint64_t value) : value_(value) {}

  constexpr std::uint64_t value() const { return value_; }
  std::string ToString() const { return std::to_string(value_); }

  auto operator<=>(const Epoch&) const = default;

 private:
  std::uint64_t value_ = 0;
};

inline std::ostream& operator<<(std::ostream& out, Epoch epoch) {
  return out << "epoch " << epoch.value();
}

}  // namespace fleetfs::lease
