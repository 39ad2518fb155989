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

  // InvalidArgument for an empty id, one over 128 bytes, one with control
  // characters, or one with white space at either end (" a" and "a" would be
  // two owners that look alike).
  static Result<OwnerId> Make(std::string_view id);

  const std::string& str() const { return id_; }

  auto operator<=>(const OwnerId&) const = default;

 private:
  explicit OwnerId(std::string id) : id_(std::move(id)) {}
  std::string id_;
};

}  // namespace fleetfs::lease
