#include "lease/slot_range.h"

#include <algorithm>
#include <charconv>
#include <optional>

namespace fleetfs::lease {
namespace {

constexpr std::string_view kRule = "use A-B or N with 0 <= A <= B <= 16383";

std::string_view Trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// A whole decimal number and nothing else; nullopt for anything else.
std::optional<long> ParseNumber(std::string_view text) {
  text = Trim(text);
  if (text.empty() || text.size() > 9) return std::nullopt;
  long value = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

Status BadRange(std::string_view text, std::string_view why) {
  return InvalidArgument("slot range '" + std::string(text) + "': " + std::string(why) + "; " +
                         std::string(kRule));
}

}  // namespace

Result<SlotRange> SlotRange::Make(int first, int last) {
  const std::string text = std::to_string(first) + "-" + std::to_string(last);
  if (first < 0 || last < 0) return BadRange(text, "slots are not negative");
  if (last > kLastSlot) return BadRange(text, "the last slot is above 16383");
  if (first > last) return BadRange(text, "the first slot is above the last");
  return SlotRange(static_cast<Slot>(first), static_cast<Slot>(last));
}

Result<SlotRange> SlotRange::Parse(std::string_view text) {
  if (Trim(text).empty()) return BadRange(text, "empty");
  const auto dash = text.find('-');
  std::optional<long> from;
  std::optional<long> to;
  if (dash == std::string_view::npos) {
    from = to = ParseNumber(text);
  } else {
    from = ParseNumber(text.substr(0, dash));
    to = ParseNumber(text.substr(dash + 1));
  }
  if (!from || !to) return BadRange(text, "not a slot number or a pair of them");
  if (*to > kLastSlot || *from > kLastSlot) return BadRange(text, "a slot is above 16383");
  if (*from > *to) return BadRange(text, "the first slot is above the last");
  return SlotRange(static_cast<Slot>(*from), static_cast<Slot>(*to));
}

std::string SlotRange::ToString() const {
  return std::to_string(first_) + "-" + std::to_string(last_);
}

Status CheckConfiguredRanges(const std::vector<SlotRange>& ranges) {
  if (ranges.empty()) return InvalidArgument("ranges: no slot range given; name at least one");
  std::vector<SlotRange> sorted = ranges;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1].Overlaps(sorted[i])) {
      return InvalidArgument("slot ranges " + sorted[i - 1].ToString() + " and " +
                             sorted[i].ToString() +
                             " overlap; a host's configured ranges must not share a slot");
    }
  }
  return Status::Ok();
}

Result<std::vector<SlotRange>> ParseRangeList(std::string_view text) {
  std::vector<SlotRange> ranges;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = text.find(',', start);
    const auto piece =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos
                                                           : comma - start);
    FLEETFS_ASSIGN_OR_RETURN(SlotRange range, SlotRange::Parse(piece));
    ranges.push_back(range);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  FLEETFS_RETURN_IF_ERROR(CheckConfiguredRanges(ranges));
  return ranges;
}

}  // namespace fleetfs::lease
