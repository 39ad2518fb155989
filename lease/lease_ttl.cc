#include "lease/lease_ttl.h"

#include <charconv>
#include <cstdio>
#include <string>

#include "lease/owner_id.h"

namespace fleetfs::lease {

Result<Millis> ParseDuration(std::string_view what, std::string_view text) {
  auto bad = [&] {
    return InvalidArgument(std::string(what) + " '" + Printable(text) +
                           "': not a duration; write a whole number with its unit, ms, s, m or "
                           "h (\"30s\", \"200ms\")");
  };
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 9) return bad();
  long long number = 0;
  std::from_chars(text.data(), text.data() + digits, number);
  const std::string_view unit = text.substr(digits);
  long long scale = 0;
  if (unit.empty()) {
    // "200" could mean seconds or milliseconds: the agent does not guess.
    return InvalidArgument(std::string(what) + " '" + std::string(text) +
                           "': a duration needs its unit; write " + std::string(text) + "s or " +
                           std::string(text) + "ms (ms, s, m or h)");
  }
  if (unit == "ms") scale = 1;
  else if (unit == "s") scale = 1000;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else return bad();
  return Millis(number * scale);
}

Status CheckTtl(Millis ttl) {
  if (ttl < kMinTtl || ttl > kMaxTtl) {
    return InvalidArgument("ttl " + FormatDuration(ttl) +
                           ": a lease lasts 3s to 3600s (shorter cannot be renewed in time, "
                           "longer stalls a failover)");
  }
  return Status::Ok();
}

Result<Millis> ParseTtl(std::string_view text) {
  FLEETFS_ASSIGN_OR_RETURN(Millis ttl, ParseDuration("ttl", text));
  FLEETFS_RETURN_IF_ERROR(CheckTtl(ttl));
  return ttl;
}

std::string FormatDuration(Millis duration) {
  const long long ms = duration.count();
  char buffer[48];
  if (ms % 1000 == 0) {
    std::snprintf(buffer, sizeof buffer, "%llds", ms / 1000);
  } else if (ms < 1000 && ms > -1000) {
    std::snprintf(buffer, sizeof buffer, "%lldms", ms);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.1fs", static_cast<double>(ms) / 1000.0);
  }
  return buffer;
}

}  // namespace fleetfs::lease
