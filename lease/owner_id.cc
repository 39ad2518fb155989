#include "lease/owner_id.h"

namespace fleetfs::lease {
namespace {

constexpr std::string_view kRule =
    "an owner id is 1 to 128 bytes with no control characters and no white space at either end";

bool IsSpace(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

Result<OwnerId> OwnerId::Make(std::string_view id) {
  auto bad = [&](std::string_view why) {
    // Control characters are not echoed: they would break the message line.
    std::string shown;
    for (unsigned char c : id.substr(0, 64)) shown += (c < 0x20 || c == 0x7f) ? '?' : char(c);
    if (id.size() > 64) shown += "...";
    return InvalidArgument("owner id '" + shown + "': " + std::string(why) + "; " +
                           std::string(kRule));
  };
  if (id.empty()) return bad("empty");
  if (id.size() > kMaxBytes) return bad("is " + std::to_string(id.size()) + " bytes");
  for (unsigned char c : id) {
    if (c < 0x20 || c == 0x7f) return bad("has a control character");
  }
  if (IsSpace(id.front()) || IsSpace(id.back())) return bad("has white space at an end");
  return OwnerId(std::string(id));
}

}  // namespace fleetfs::lease
