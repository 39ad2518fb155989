// Lease lengths and the durations written on the command line and in config.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "fleet/clock.h"
#include "fleet/status.h"

namespace fleetfs::lease {

inline constexpr Millis kMinTtl{3'000};
inline constexpr Millis kDefaultTtl{30'000};
inline constexpr Millis kMaxTtl{3'600'000};

// Parses "30s", "1500ms", "2m" or "1h". A bare number is refused: "200"
// could be meant as seconds or milliseconds.
Result<Millis> ParseDuration(std::string_view what, std::string_view text);

// Parses a lease ttl and checks it is 3 s to 3600 s.
Result<Millis> ParseTtl(std::string_view text);
Status CheckTtl(Millis ttl);

// "30s", "1.5s", "250ms": for messages and tables.
std::string FormatDuration(Millis duration);

}  // namespace fleetfs::lease
