#include "vfs/per_uid_limit.h"

#include <gtest/gtest.h>

namespace fleetfs::vfs {
namespace {

TEST(PerUidLimit, a_user_holds_at_most_its_limit_and_others_are_not_hindered) {
  PerUidLimit limit(3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limit.Enter(1000)) << i;
  EXPECT_FALSE(limit.Enter(1000));
  EXPECT_EQ(limit.held(1000), 3);
  EXPECT_TRUE(limit.Enter(1001));
  limit.Leave(1000);
  EXPECT_TRUE(limit.Enter(1000));
  EXPECT_FALSE(limit.Enter(1000));
}

TEST(PerUidLimit, leaving_more_than_entered_never_grants_more) {
  PerUidLimit limit(1);
  limit.Leave(7);
  EXPECT_TRUE(limit.Enter(7));
  EXPECT_FALSE(limit.Enter(7));
  limit.Leave(7);
  limit.Leave(7);
  EXPECT_EQ(limit.held(7), 0);
  EXPECT_TRUE(limit.Enter(7));
  EXPECT_FALSE(limit.Enter(7));
}

}  // namespace
}  // namespace fleetfs::vfs
