// Durations and lease lengths as written in flags and the config file
// (ParseDuration, ParseTtl, CheckTtl, FormatDuration).
//
// Properties: an accepted duration is not negative; one formatted without a
// fraction (and in at most 9 digits) parses back to itself; ParseTtl accepts exactly the durations
// CheckTtl accepts; FormatDuration formats any count of milliseconds.
#include <cstdint>
#include <cstring>
#include <string>

#include "lease/lease_ttl.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fleetfs::lease;  // NOLINT: a fuzz entry point outside the namespace
  std::string_view text = fleetfs::fuzz::AsText(data, size);

  auto d = ParseDuration("sync_interval", text);
  auto ttl = ParseTtl(text);
  if (d.ok()) {
    FUZZ_CHECK(d->count() >= 0, "a negative duration");
    const std::string shown = FormatDuration(*d);
    // ParseDuration reads at most 9 digits: "999999999h" formats as
    // "3599999996400s", which is for messages only.
    const std::size_t digits = shown.find_first_not_of("0123456789");
    if (shown.find('.') == std::string::npos && digits <= 9) {
      auto again = ParseDuration("sync_interval", shown);
      FUZZ_CHECK(again.ok() && *again == *d, "a duration does not parse back from its format");
    }
    FUZZ_CHECK(ttl.ok() == CheckTtl(*d).ok(), "ParseTtl and CheckTtl disagree");
  } else {
    FUZZ_CHECK(!d.status().message().empty(), "a refusal that does not say why");
    FUZZ_CHECK(!ttl.ok(), "a ttl that is not a duration");
  }
  if (ttl.ok()) FUZZ_CHECK(*ttl >= kMinTtl && *ttl <= kMaxTtl, "a ttl out of bounds");

  // Any count of milliseconds formats (as messages do with what they refuse).
  if (size >= 8) {
    std::int64_t ms = 0;
    std::memcpy(&ms, data, sizeof ms);
    FUZZ_CHECK(!FormatDuration(fleetfs::Millis(ms)).empty(), "an empty format");
  }
  return 0;
}
