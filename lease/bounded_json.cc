#include "lease/bounded_json.h"

#include <new>
#include <string>

namespace fleetfs::lease {
namespace {

using Json = nlohmann::json;

// Counts what the text holds without building anything, and stops at the
// first rule broken. (nlohmann's parser callback would do the counting in one
// pass, but its DOM builder rescans the parent on every object it closes:
// quadratic, minutes for a million small objects.)
class Counter final : public nlohmann::json_sax<Json> {
 public:
  explicit Counter(JsonLimits limits) : limits_(limits) {}

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool key(string_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    rule_ = "is not JSON";
    return false;
  }

  const std::string& rule() const { return rule_; }

 private:
  bool Value() {
    if (++values_ <= limits_.max_values) return true;
    rule_ = "holds more than " + std::to_string(limits_.max_values) + " values";
    return false;
  }
  bool Open() {
    if (++depth_ > limits_.max_depth) {
      rule_ = "nests deeper than " + std::to_string(limits_.max_depth) + " levels";
      return false;
    }
    return Value();
  }
  bool Close() {
    --depth_;
    return true;
  }

  const JsonLimits limits_;
  int depth_ = 0;
  std::size_t values_ = 0;
  std::string rule_;
};

}  // namespace

Result<Json> ParseBoundedJson(std::string_view text, JsonLimits limits) {
  try {
    // Two passes: the count costs no memory, and only text within the
    // limits is built into a DOM.
    Counter counter(limits);
    if (!Json::sax_parse(text.begin(), text.end(), &counter)) {
      return InvalidArgument(counter.rule().empty() ? "is not JSON" : counter.rule());
    }
    Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) return InvalidArgument("is not JSON");
    return json;
  } catch (const std::bad_alloc&) {
    return InvalidArgument("is too large to hold in memory");
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("could not be parsed: ") + e.what());
  }
}

}  // namespace fleetfs::lease
