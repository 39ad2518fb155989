#include "lease/bounded_json.h"

#include <new>
#include <string>

namespace fleetfs::lease {
namespace {

using Json = nlohmann::json;

// Thrown from the parser's callback to stop it at once (returning false
// would only drop the value and parse on).
struct LimitBroken {
  std::string rule;
};

}  // namespace

Result<Json> ParseBoundedJson(std::string_view text, JsonLimits limits) {
  int depth = 0;
  std::size_t values = 0;
  const Json::parser_callback_t count = [&](int, Json::parse_event_t event, Json&) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (++depth > limits.max_depth) {
          throw LimitBroken{"nests deeper than " + std::to_string(limits.max_depth) + " levels"};
        }
        [[fallthrough]];
      case Json::parse_event_t::key:
      case Json::parse_event_t::value:
        if (++values > limits.max_values) {
          throw LimitBroken{"holds more than " + std::to_string(limits.max_values) + " values"};
        }
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        --depth;
        break;
    }
    return true;
  };
  try {
    Json json = Json::parse(text.begin(), text.end(), count, /*allow_exceptions=*/false);
    if (json.is_discarded()) return InvalidArgument("is not JSON");
    return json;
  } catch (const LimitBroken& broken) {
    return InvalidArgument(broken.rule);
  } catch (const std::bad_alloc&) {
    return InvalidArgument("is too large to hold in memory");
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("could not be parsed: ") + e.what());
  }
}

}  // namespace fleetfs::lease
