// SlotRange: an inclusive range of routing slots, "A-B" or "N", in 0-16383.
//
// Thread-safety: a value.
#pragma once

#include <compare>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/slot.h"
#include "fleet/status.h"

namespace fleetfs::lease {

class SlotRange {
 public:
  // Every slot, 0-16383.
  static constexpr SlotRange All() { return SlotRange(0, kLastSlot); }

  // The range first..last; InvalidArgument when first > last or last > 16383.
  static Result<SlotRange> Make(int first, int last);

  // Parses "A-B" or "N" (white space around the numbers is allowed).
  static Result<SlotRange> Parse(std::string_view text);

  Slot first() const { return first_; }
  Slot last() const { return last_; }
  int size() const { return last_ - first_ + 1; }
  bool Contains(Slot slot) const { return first_ <= slot && slot <= last_; }
  bool Overlaps(SlotRange other) const { return first_ <= other.last_ && other.first_ <= last_; }

  std::string ToString() const;  // "A-B"

  auto operator<=>(const SlotRange&) const = default;

 private:
  constexpr SlotRange(Slot first, Slot last) : first_(first), last_(last) {}
  Slot first_;
  Slot last_;
};

// Parses a comma-separated list ("0-8191,9000"), refusing an empty list and
// overlapping ranges. The ranges keep their configured order.
Result<std::vector<SlotRange>> ParseRangeList(std::string_view text);

// InvalidArgument naming the first two configured ranges that overlap, or
// an empty list.
Status CheckConfiguredRanges(const std::vector<SlotRange>& ranges);

}  // namespace fleetfs::lease
