// ParseBoundedJson: nlohmann::json::parse for text from another machine, with
// limits on how deep it nests and how many values it holds. nlohmann's DOM
// costs tens of bytes per value and more per nesting level, so 60 MiB of
// "[[[[" took 4.9 GB; with the limits a hostile answer is refused after at
// most max_values values, whatever its size.
//
// Thread-safety: a pure function.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

#include "fleet/status.h"

namespace fleetfs::lease {

struct JsonLimits {
  int max_depth = 8;                  // objects and arrays inside each other
  std::size_t max_values = 1'000'000;  // every value, key, object and array
};

// The parsed value, or InvalidArgument whose message says which rule the text
// broke ("is not JSON", "nests deeper than 8 levels", "holds more than N
// values"); the caller names where the text came from. Never throws.
Result<nlohmann::json> ParseBoundedJson(std::string_view text, JsonLimits limits);

}  // namespace fleetfs::lease
