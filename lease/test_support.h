// Helpers shared by the lease tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "lease/ownership_table.h"

namespace fleetfs::lease::testing {

inline OwnerId Owner(const std::string& id) { return *OwnerId::Make(id); }
inline SlotRange Range(int first, int last) { return *SlotRange::Make(first, last); }

inline Grant AsGrant(const Result<Decision>& decision) {
  EXPECT_TRUE(decision.ok()) << decision.status().message();
  if (!decision.ok()) return Grant{SlotRange::All(), Epoch(), 0, false};
  const auto* grant = std::get_if<Grant>(&*decision);
  EXPECT_NE(grant, nullptr) << DescribeDecision(*decision);
  return grant ? *grant : Grant{SlotRange::All(), Epoch(), 0, false};
}
inline Grant AsGrant(const Decision& decision) { return AsGrant(Result<Decision>(decision)); }

}  // namespace fleetfs::lease::testing
