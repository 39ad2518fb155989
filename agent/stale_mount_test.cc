#include "agent/stale_mount.h"

#include <gtest/gtest.h>

namespace fleetfs::agent {
namespace {

TEST(MountInfo, a_fleetfs_line_gives_its_point_type_and_source) {
  MountEntry e;
  ASSERT_TRUE(ParseMountInfoLine(
      "612 25 0:91 / /tmp/fleet\\040a/mnt rw,nosuid,nodev,relatime shared:301 - fuse.fleetfs "
      "fleetfs rw,user_id=0,group_id=0,default_permissions,allow_other",
      e));
  EXPECT_EQ(e.point, "/tmp/fleet a/mnt");
  EXPECT_EQ(e.fstype, "fuse.fleetfs");
  EXPECT_EQ(e.source, "fleetfs");
}

TEST(MountInfo, a_line_without_its_separator_is_not_one) {
  MountEntry e;
  EXPECT_FALSE(ParseMountInfoLine("612 25 0:91 / /mnt rw shared:1 fuse.fleetfs fleetfs", e));
  EXPECT_FALSE(ParseMountInfoLine("", e));
}

}  // namespace
}  // namespace fleetfs::agent
