// OwnerId: the id of a host (a volume) in the ownership table.
//
// Two hosts must never share an id: the table could not tell them apart.
// Processes that share one backing directory share its id.
//
// Thread-safety: a value.
#pragma once

#include <compare>
#include <string>
#include <string_view>

#include "fleet/status.h"

namespace fleetfs::lease {

class OwnerId {
 public:
  static constexpr std::size_t kMaxBytes = 128;

  // InvalidArgument for an empty id, one over 128 bytes, one that is not
  // UTF-8 (it is quoted in JSON documents), one with control characters (C0,
  // DEL, C1), or one with white space at either end, Unicode's included
  // (" a", "a\u00a0" and "a" would be owners that look alike).
  static Result<OwnerId> Make(std::string_view id);

  const std::string& str() const { return id_; }

  auto operator<=>(const OwnerId&) const = default;

 private:
  explicit OwnerId(std::string id) : id_(std::move(id)) {}
  std::string id_;
};

// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates).
// Owner ids and the configured paths must be: every status document quotes
// them.
bool IsValidUtf8(std::string_view text);

// `text` for a message line: printable ASCII as is, every other byte as \xNN.
std::string Printable(std::string_view text);

}  // namespace fleetfs::lease
