#include "vfs/negative_names.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace fleetfs::vfs {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const MonoTime kT0{seconds(1000)};

ServedRange Range(Slot first, Slot last) {
  return ServedRange{first, last, ServingToken{1, 1}, kT0 + seconds(100)};
}

TEST(NegativeNames, a_claim_forgets_the_names_of_its_ranges_and_only_those) {
  NegativeNames names(10, seconds(1));
  ASSERT_TRUE(names.Remember(2, "a.db-journal", 5, kT0));
  ASSERT_TRUE(names.Remember(3, "b.db", 200, kT0));
  auto forgotten = names.ForgetIn({Range(0, 99)}, kT0 + milliseconds(10));
  ASSERT_EQ(forgotten.size(), 1u);
  EXPECT_EQ(forgotten[0], (EntryName{2, "a.db-journal"}));
  EXPECT_EQ(names.size(), 1u);
  // Forgotten once: a second claim has nothing more to tell the kernel.
  EXPECT_TRUE(names.ForgetIn({Range(0, 99)}, kT0 + milliseconds(20)).empty());
}

TEST(NegativeNames, an_expired_name_is_not_told_to_the_kernel_again) {
  NegativeNames names(10, seconds(1));
  ASSERT_TRUE(names.Remember(2, "a.db", 5, kT0));
  EXPECT_TRUE(names.ForgetIn({Range(0, 99)}, kT0 + seconds(1)).empty());
  EXPECT_EQ(names.size(), 0u);
}

TEST(NegativeNames, at_the_cap_no_more_absent_names_are_cached_until_some_expire) {
  NegativeNames names(2, seconds(1));
  ASSERT_TRUE(names.Remember(2, "a.db", 5, kT0));
  ASSERT_TRUE(names.Remember(2, "b.db", 5, kT0 + milliseconds(500)));
  EXPECT_FALSE(names.Remember(2, "c.db", 5, kT0 + milliseconds(600)));
  // A name already remembered is refreshed, not refused.
  EXPECT_TRUE(names.Remember(2, "a.db", 5, kT0 + milliseconds(700)));
  EXPECT_EQ(names.size(), 2u);
  // b.db expires at 1.5 s; a.db (refreshed) at 1.7 s.
  EXPECT_TRUE(names.Remember(2, "c.db", 5, kT0 + milliseconds(1600)));
  EXPECT_EQ(names.size(), 2u);
}

TEST(NegativeNames, a_name_made_through_the_mount_is_forgotten_at_once) {
  NegativeNames names(10, seconds(1));
  ASSERT_TRUE(names.Remember(2, "a.db", 5, kT0));
  names.Forget(2, "a.db");
  EXPECT_EQ(names.size(), 0u);
  EXPECT_TRUE(names.ForgetIn({Range(0, 99)}, kT0).empty());
}

TEST(NegativeNames, the_same_name_in_two_buckets_is_two_names) {
  NegativeNames names(10, seconds(1));
  ASSERT_TRUE(names.Remember(2, "x", 5, kT0));
  ASSERT_TRUE(names.Remember(3, "x", 70, kT0));
  auto forgotten = names.ForgetIn({Range(0, 16383)}, kT0);
  std::sort(forgotten.begin(), forgotten.end(),
            [](const EntryName& a, const EntryName& b) { return a.parent < b.parent; });
  EXPECT_EQ(forgotten, (std::vector<EntryName>{{2, "x"}, {3, "x"}}));
}

}  // namespace
}  // namespace fleetfs::vfs
