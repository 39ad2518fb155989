// Slot ranges as written on the command line and in the config file:
// SlotRange::Parse ("A-B", "N") and ParseRangeList ("0-8191,9000").
//
// Properties: an accepted range lies in 0-16383 with first <= last and
// parses back from its ToString; Make agrees with Parse; an accepted list is
// non-empty, has no overlap, and parses back from its rendering.
#include <cstdint>
#include <string>

#include "lease/slot_range.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using fleetfs::lease::SlotRange;
  std::string_view text = fleetfs::fuzz::AsText(data, size);

  auto range = SlotRange::Parse(text);
  if (range.ok()) {
    FUZZ_CHECK(range->first() <= range->last(), "first above last");
    FUZZ_CHECK(range->last() <= fleetfs::kLastSlot, "a slot above 16383");
    FUZZ_CHECK(range->size() >= 1, "an empty range");
    auto again = SlotRange::Parse(range->ToString());
    FUZZ_CHECK(again.ok() && *again == *range, "a range does not parse back from ToString");
    auto made = SlotRange::Make(range->first(), range->last());
    FUZZ_CHECK(made.ok() && *made == *range, "Make disagrees with Parse");
  } else {
    FUZZ_CHECK(!range.status().message().empty(), "a refusal that does not say why");
  }

  auto list = fleetfs::lease::ParseRangeList(text);
  if (list.ok()) {
    FUZZ_CHECK(!list->empty(), "an accepted empty list");
    FUZZ_CHECK(fleetfs::lease::CheckConfiguredRanges(*list).ok(), "accepted ranges overlap");
    std::string rendered;
    for (const SlotRange& r : *list) rendered += (rendered.empty() ? "" : ",") + r.ToString();
    auto again = fleetfs::lease::ParseRangeList(rendered);
    FUZZ_CHECK(again.ok() && *again == *list, "a list does not parse back from its rendering");
    std::size_t commas = 0;
    for (char c : text) commas += c == ',';
    FUZZ_CHECK(list->size() == commas + 1, "a list of another length than its pieces");
  }
  return 0;
}
