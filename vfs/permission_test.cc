#include "vfs/permission.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

namespace fleetfs::vfs {
namespace {

struct stat File(uid_t uid, gid_t gid, mode_t mode) {
  struct stat st {};
  st.st_uid = uid;
  st.st_gid = gid;
  st.st_mode = S_IFREG | mode;
  return st;
}

TEST(Permission, an_open_asks_for_its_access_mode_and_write_when_it_truncates) {
  EXPECT_EQ(AccessWanted(O_RDONLY), R_OK);
  EXPECT_EQ(AccessWanted(O_WRONLY), W_OK);
  EXPECT_EQ(AccessWanted(O_RDWR | O_CREAT), R_OK | W_OK);
  EXPECT_EQ(AccessWanted(O_RDONLY | O_TRUNC), R_OK | W_OK);
}

TEST(Permission, nobody_may_not_open_a_file_of_root_with_mode_0600) {
  Caller nobody{65534, 65534, {}};
  EXPECT_FALSE(MayAccess(File(0, 0, 0600), nobody, R_OK | W_OK));
  EXPECT_FALSE(MayAccess(File(0, 0, 0600), nobody, R_OK));
  EXPECT_TRUE(MayAccess(File(0, 0, 0644), nobody, R_OK));
  EXPECT_FALSE(MayAccess(File(0, 0, 0644), nobody, W_OK));
  EXPECT_TRUE(MayAccess(File(0, 0, 0600), Caller{0, 0, {}}, R_OK | W_OK));
}

TEST(Permission, the_owner_class_decides_even_when_other_bits_would_allow_more) {
  // As the kernel: the first class that matches decides.
  EXPECT_FALSE(MayAccess(File(1000, 100, 0066), Caller{1000, 100, {}}, R_OK));
  EXPECT_FALSE(MayAccess(File(1000, 100, 0606), Caller{2000, 100, {}}, R_OK));
  EXPECT_TRUE(MayAccess(File(1000, 100, 0606), Caller{2000, 200, {}}, R_OK | W_OK));
}

TEST(Permission, a_supplementary_group_counts_as_the_group) {
  EXPECT_TRUE(MayAccess(File(0, 50, 0660), Caller{1000, 100, {7, 50}}, R_OK | W_OK));
  EXPECT_FALSE(MayAccess(File(0, 50, 0660), Caller{1000, 100, {7}}, R_OK));
}

TEST(Permission, supplementary_groups_are_read_from_the_status_groups_line) {
  EXPECT_EQ(ParseStatusGroups("Name:\tx\nGroups:\t4 24 27 \nNgid:\t0\n"),
            (std::vector<gid_t>{4, 24, 27}));
  EXPECT_EQ(ParseStatusGroups("Name:\tx\nGroups:\t\nNgid:\t0\n"), std::vector<gid_t>{});
  EXPECT_EQ(ParseStatusGroups("Name:\tx\n"), std::vector<gid_t>{});
  // Not terminated: the text ends on the line (what libfuse's reader overran).
  EXPECT_EQ(ParseStatusGroups("Name:\tx\nGroups:\t5 6"), (std::vector<gid_t>{5, 6}));
}

TEST(Permission, this_process_has_the_groups_the_kernel_says) {
  gid_t groups[256];
  int n = ::getgroups(256, groups);
  ASSERT_GE(n, 0);
  EXPECT_EQ(SupplementaryGroups(::getpid()), std::vector<gid_t>(groups, groups + n));
}

}  // namespace
}  // namespace fleetfs::vfs
