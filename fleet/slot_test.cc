#include "fleet/slot.h"

#include <gtest/gtest.h>

namespace fleetfs {
namespace {

TEST(Crc16, matches_the_xmodem_check_value) { EXPECT_EQ(Crc16("123456789"), 0x31C3); }

TEST(Crc16, of_nothing_is_zero) { EXPECT_EQ(Crc16(""), 0); }

TEST(KeySlot, matches_the_values_redis_documents) {
  // From the Redis CLUSTER KEYSLOT documentation and cluster specification.
  EXPECT_EQ(KeySlot("somekey"), 11058);
  EXPECT_EQ(KeySlot("foo{hash_tag}"), 2515);
  EXPECT_EQ(KeySlot("foo"), 12182);
}

TEST(KeySlot, keys_with_one_hash_tag_share_a_slot) {
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
}

TEST(KeySlot, an_empty_tag_hashes_the_whole_key) {
  EXPECT_EQ(HashTag("foo{}{bar}"), "foo{}{bar}");
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") % kSlotCount);
}

TEST(KeySlot, only_the_first_tag_counts_and_may_hold_a_brace) {
  EXPECT_EQ(HashTag("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  EXPECT_EQ(HashTag("foo{bar}{zap}"), "bar");
}

TEST(KeySlot, an_unclosed_brace_hashes_the_whole_key) {
  EXPECT_EQ(HashTag("foo{bar"), "foo{bar");
  EXPECT_EQ(HashTag("}foo{"), "}foo{");
}

TEST(KeySlot, any_bytes_are_a_key) {
  const std::string binary("\x00\xff{\x01}", 5);
  EXPECT_EQ(KeySlot(binary), KeySlot(std::string("\x01", 1)));
  EXPECT_LT(KeySlot(binary), kSlotCount);
}

TEST(Bucket, holds_64_slots) {
  EXPECT_EQ(BucketOf(0), 0);
  EXPECT_EQ(BucketOf(63), 0);
  EXPECT_EQ(BucketOf(64), 1);
  EXPECT_EQ(BucketOf(kLastSlot), 255);
}

}  // namespace
}  // namespace fleetfs
