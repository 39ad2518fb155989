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
  EXPECT_EQ(e.fuse_user, 0u);
}

TEST(MountInfo, the_mounting_uid_is_read_from_the_super_options_only_when_well_formed) {
  MountEntry e;
  ASSERT_TRUE(ParseMountInfoLine("7 2 0:9 / /m rw - fuse.fleetfs fleetfs rw,user_id=1000,group_id=5", e));
  EXPECT_EQ(e.fuse_user, 1000u);
  ASSERT_TRUE(ParseMountInfoLine("7 2 0:9 / /m rw - fuse.fleetfs fleetfs rw,user_id=10x0", e));
  EXPECT_FALSE(e.fuse_user.has_value());
  ASSERT_TRUE(ParseMountInfoLine("7 2 0:9 / /m rw - tmpfs tmpfs rw", e));
  EXPECT_FALSE(e.fuse_user.has_value());
}

TEST(MountInfo, a_line_without_its_separator_is_not_one) {
  MountEntry e;
  EXPECT_FALSE(ParseMountInfoLine("612 25 0:91 / /mnt rw shared:1 fuse.fleetfs fleetfs", e));
  EXPECT_FALSE(ParseMountInfoLine("", e));
}

}  // namespace
}  // namespace fleetfs::agent
