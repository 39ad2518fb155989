#include "vfs/inode_table.h"

#include <gtest/gtest.h>

namespace fleetfs::vfs {
namespace {

struct stat Backing(dev_t dev, ino_t ino) {
  struct stat st {};
  st.st_dev = dev;
  st.st_ino = ino;
  return st;
}

FleetFile File(Slot slot, std::string key) {
  return FleetFile{slot, FileRole::kMain, key, "000/" + key + ".db"};
}

TEST(InodeTable, a_lookup_of_the_same_file_under_the_same_name_finds_the_same_inode) {
  InodeTable table;
  auto first = table.Remember(3, "a.db", File(7, "a"), Backing(1, 42));
  auto again = table.Remember(3, "a.db", File(7, "a"), Backing(1, 42));
  EXPECT_EQ(first, again);
  table.Forget(first->ino, 1);
  EXPECT_NE(table.Find(first->ino), nullptr);  // one lookup is still counted
  table.Forget(first->ino, 1);
  EXPECT_EQ(table.Find(first->ino), nullptr);
}

// ext4 hands a deleted file's inode number to the next file it makes, while
// the kernel may still know the deleted one (a descriptor holds it): the new
// file, under another name, must never get the old one's identity.
TEST(InodeTable, a_reused_backing_inode_number_under_another_name_is_another_inode) {
  InodeTable table;
  auto deleted = table.Remember(3, "a.db", File(7, "a"), Backing(1, 42));
  auto reused = table.Remember(9, "b.db", File(900, "b"), Backing(1, 42));
  ASSERT_NE(reused, deleted);
  EXPECT_NE(reused->ino, deleted->ino);
  EXPECT_EQ(reused->bucket, 9);
  EXPECT_EQ(reused->name, "b.db");
  EXPECT_EQ(reused->file.slot, 900u);
  // The same bucket, another name: another inode too.
  auto sibling = table.Remember(3, "c.db", File(7, "c"), Backing(1, 42));
  EXPECT_NE(sibling, deleted);
  EXPECT_EQ(sibling->name, "c.db");
  EXPECT_EQ(table.size(), 3u);
  // Forgetting the old one leaves the new ones found under their names.
  table.Forget(deleted->ino, 1);
  EXPECT_EQ(table.Remember(9, "b.db", File(900, "b"), Backing(1, 42)), reused);
  EXPECT_EQ(table.Remember(3, "c.db", File(7, "c"), Backing(1, 42)), sibling);
  EXPECT_EQ(table.size(), 2u);
}

TEST(InodeTable, a_name_whose_file_was_replaced_gets_a_new_inode) {
  InodeTable table;
  auto old_file = table.Remember(3, "a.db", File(7, "a"), Backing(1, 42));
  auto new_file = table.Remember(3, "a.db", File(7, "a"), Backing(1, 43));
  EXPECT_NE(old_file, new_file);
  EXPECT_EQ(new_file->backing_ino, 43u);
}

}  // namespace
}  // namespace fleetfs::vfs
