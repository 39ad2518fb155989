#include "lease/owner_id.h"

#include <cstdio>
#include <optional>
#include <vector>

namespace fleetfs::lease {
namespace {

constexpr std::string_view kRule =
    "an owner id is 1 to 128 bytes of UTF-8 with no control characters and no white space at "
    "either end";

// Decodes `text` as UTF-8; nullopt when any byte sequence is not (overlong
// forms, surrogates and code points above U+10FFFF included).
std::optional<std::vector<char32_t>> Decode(std::string_view text) {
  std::vector<char32_t> out;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    int extra = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if (b0 < 0x80) {
      cp = b0;
    } else if ((b0 & 0xe0) == 0xc0) {
      extra = 1, cp = b0 & 0x1f, min = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      extra = 2, cp = b0 & 0x0f, min = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      extra = 3, cp = b0 & 0x07, min = 0x10000;
    } else {
      return std::nullopt;
    }
    if (i + static_cast<std::size_t>(extra) >= text.size() && extra > 0) return std::nullopt;
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]);
      if ((b & 0xc0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (b & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return std::nullopt;
    out.push_back(cp);
    i += 1 + static_cast<std::size_t>(extra);
  }
  return out;
}

// C0, DEL and C1 (U+0085 NEXT LINE among them).
bool IsControl(char32_t c) { return c < 0x20 || (c >= 0x7f && c <= 0x9f); }

// Unicode White_Space, and the invisible characters that look like nothing
// (zero-width space and joiners, word joiner, byte order mark): "a" and
// "a\u00a0" would be two owners that look alike.
bool IsBlank(char32_t c) {
  switch (c) {
    case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f:
    case 0x205f: case 0x3000: case 0x200b: case 0x200c: case 0x200d: case 0x2060: case 0xfeff:
      return true;
    default: return (c >= 0x09 && c <= 0x0d) || (c >= 0x2000 && c <= 0x200a);
  }
}

}  // namespace

bool IsValidUtf8(std::string_view text) { return Decode(text).has_value(); }

std::string Printable(std::string_view text) {
  std::string shown;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      shown += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      shown += escaped;
    }
  }
  return shown;
}

Result<OwnerId> OwnerId::Make(std::string_view id) {
  auto bad = [&](std::string_view why) {
    // Shown escaped: control characters would break the message line, and
    // bytes that are not UTF-8 would break every document that quotes it.
    std::string shown = Printable(id.substr(0, 64));
    if (id.size() > 64) shown += "...";
    return InvalidArgument("owner id '" + shown + "': " + std::string(why) + "; " +
                           std::string(kRule));
  };
  if (id.empty()) return bad("empty");
  if (id.size() > kMaxBytes) return bad("is " + std::to_string(id.size()) + " bytes");
  const auto chars = Decode(id);
  if (!chars) return bad("is not valid UTF-8");
  for (char32_t c : *chars) {
    if (IsControl(c)) return bad("has a control character");
  }
  if (IsBlank(chars->front()) || IsBlank(chars->back())) return bad("has white space at an end");
  return OwnerId(std::string(id));
}

}  // namespace fleetfs::lease
