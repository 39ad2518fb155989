#include "vfs/refusal_log.h"

#include <gtest/gtest.h>

namespace fleetfs::vfs {
namespace {

using std::chrono::seconds;

const MonoTime kT0{seconds(1000)};

TEST(RefusalLog, a_name_is_logged_once_per_interval) {
  RefusalLog log(seconds(60), 100);
  EXPECT_TRUE(log.ShouldLog("000/evil.db", kT0));
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(log.ShouldLog("000/evil.db", kT0 + seconds(59)));
  EXPECT_TRUE(log.ShouldLog("000/evil.db", kT0 + seconds(60)));
  EXPECT_TRUE(log.ShouldLog("001/other.db", kT0 + seconds(1)));
}

TEST(RefusalLog, many_names_cannot_flood_it_or_grow_it_without_bound) {
  RefusalLog log(seconds(60), 3);
  EXPECT_TRUE(log.ShouldLog("a", kT0));
  EXPECT_TRUE(log.ShouldLog("b", kT0));
  EXPECT_TRUE(log.ShouldLog("c", kT0));
  EXPECT_FALSE(log.ShouldLog("d", kT0 + seconds(1)));
  EXPECT_TRUE(log.ShouldLog("d", kT0 + seconds(60)));  // the others' interval passed
}

}  // namespace
}  // namespace fleetfs::vfs
