#include "fleet/tenant_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace fleetfs {
namespace {

class TenantFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fleetfs-tenant-file-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    root_ = UniqueFd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY));
    ASSERT_TRUE(root_.valid());
  }
  void TearDown() override { ASSERT_EQ(std::system(("rm -rf " + dir_).c_str()), 0); }
  std::string dir_;
  UniqueFd root_;
};

TEST_F(TenantFileTest, a_new_bucket_gets_the_roots_mode_whatever_the_umask) {
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  mode_t old = ::umask(022);
  auto bucket = OpenOrMakeBucket(root_.get(), 7);
  ::umask(old);
  ASSERT_TRUE(bucket.ok()) << bucket.status().message();
  struct stat st;
  ASSERT_EQ(::fstat(bucket->get(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
}

TEST_F(TenantFileTest, an_existing_bucket_is_opened_and_left_as_it_is) {
  ASSERT_EQ(::mkdir((dir_ + "/009").c_str(), 0750), 0);
  auto bucket = OpenOrMakeBucket(root_.get(), 9);
  ASSERT_TRUE(bucket.ok());
  struct stat st;
  ASSERT_EQ(::fstat(bucket->get(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
}

TEST_F(TenantFileTest, a_symlinked_bucket_is_refused_by_name) {
  ASSERT_EQ(::symlink("/etc", (dir_ + "/010").c_str()), 0);
  auto bucket = OpenOrMakeBucket(root_.get(), 10);
  ASSERT_FALSE(bucket.ok());
  EXPECT_NE(bucket.status().message().find("bucket 010 is a symlink"), std::string::npos)
      << bucket.status().message();
}

TEST_F(TenantFileTest, stamps_round_trip_through_a_path_descriptor) {
  std::string path = dir_ + "/t.db";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT, 0600));
  ASSERT_TRUE(fd.valid());
  UniqueFd path_fd(::open(path.c_str(), O_PATH));
  EXPECT_EQ(ReadEpochStamp(path_fd.get()), std::nullopt);
  ASSERT_TRUE(WriteStamps(fd.get(), 42, "acme", "t.db").ok());
  EXPECT_EQ(ReadEpochStamp(path_fd.get()), 42u);
  EXPECT_EQ(ReadKeyStamp(path_fd.get()), "acme");
}

TEST_F(TenantFileTest, an_epoch_stamp_that_is_not_a_number_reads_as_none) {
  std::string path = dir_ + "/t.db";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT, 0600));
  ASSERT_EQ(::fsetxattr(fd.get(), kEpochStampXattr.data(), "12x", 3, 0), 0);
  EXPECT_EQ(ReadEpochStamp(fd.get()), std::nullopt);
}

TEST_F(TenantFileTest, a_shipped_stamp_round_trips_and_a_malformed_one_reads_as_none) {
  std::string path = dir_ + "/t.db";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT, 0600));
  UniqueFd path_fd(::open(path.c_str(), O_PATH));
  EXPECT_EQ(ReadShippedStamp(path_fd.get()), std::nullopt);
  const ShippedStamp s{17, 0xfedcba9876543210ull, FileIdentity{5, 4096, 123456789012345678ull, 0, 0}};
  ASSERT_TRUE(WriteShippedStamp(path_fd.get(), s, "t.db").ok());
  EXPECT_EQ(ReadShippedStamp(path_fd.get()), s);
  for (std::string_view bad : {"17", "17 1 2 3 4 5", "17 1 2 3 4 5 6 ", "x 1 2 3 4 5 6",
                               "17 1g 2 3 4 5 6", " 17 1 2 3 4 5 6", "17  1 2 3 4 5 6",
                               "17 1 2 3 4 5 6 7"}) {
    ASSERT_EQ(::fsetxattr(fd.get(), kShippedStampXattr.data(), bad.data(), bad.size(), 0), 0);
    EXPECT_EQ(ReadShippedStamp(fd.get()), std::nullopt) << bad;
  }
}

TEST_F(TenantFileTest, a_files_identity_changes_with_a_write_to_it_or_its_wal) {
  std::string path = dir_ + "/t.db";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT, 0600));
  UniqueFd root(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY));
  auto before = ReadFileIdentity(root.get(), "t.db");
  ASSERT_TRUE(before.has_value());
  EXPECT_EQ(ReadFileIdentity(root.get(), "t.db"), before);
  ASSERT_EQ(::pwrite(fd.get(), "x", 1, 0), 1);
  EXPECT_NE(ReadFileIdentity(root.get(), "t.db"), before);
  auto with_main = ReadFileIdentity(root.get(), "t.db");
  UniqueFd wal(::open((path + "-wal").c_str(), O_RDWR | O_CREAT, 0600));
  ASSERT_EQ(::pwrite(wal.get(), "y", 1, 0), 1);
  EXPECT_NE(ReadFileIdentity(root.get(), "t.db"), with_main);
  EXPECT_EQ(ReadFileIdentity(root.get(), "missing.db"), std::nullopt);
}

}  // namespace
}  // namespace fleetfs
