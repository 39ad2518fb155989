// Owner ids, from --owner, the config file or the host name (OwnerId::Make).
//
// Properties: an accepted id is the input, 1-128 bytes, without control
// characters or white space at its ends, and every document that quotes it
// serializes (the status JSON; a JSON exception would abort the agent at its
// first /status); a refusal says why.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "lease/owner_id.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text = fleetfs::fuzz::AsText(data, size);
  auto id = fleetfs::lease::OwnerId::Make(text);
  if (!id.ok()) {
    FUZZ_CHECK(!id.status().message().empty(), "a refusal that does not say why");
    return 0;
  }
  const std::string& s = id->str();
  FUZZ_CHECK(s == text, "an accepted id is not the input");
  FUZZ_CHECK(!s.empty() && s.size() <= fleetfs::lease::OwnerId::kMaxBytes, "an id's length");
  for (unsigned char c : s) FUZZ_CHECK(c >= 0x20 && c != 0x7f, "a control character");
  auto blank = [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  FUZZ_CHECK(!blank(s.front()) && !blank(s.back()), "white space at an end");
  try {
    std::string json = nlohmann::json{{"owner", s}}.dump();
    FUZZ_CHECK(!json.empty(), "an empty document");
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "json: %s\n", e.what());
    FUZZ_CHECK(false, "an accepted owner id does not serialize into the status JSON");
  }
  return 0;
}
