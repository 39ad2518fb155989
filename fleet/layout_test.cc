#include "fleet/layout.h"

#include <gtest/gtest.h>

#include <string>

namespace fleetfs {
namespace {

TEST(TenantId, accepts_the_allowed_bytes) {
  EXPECT_TRUE(ValidateTenantId("acme").ok());
  EXPECT_TRUE(ValidateTenantId("Acme-01_eu.west").ok());
  EXPECT_TRUE(ValidateTenantId(std::string(128, 'x')).ok());
  EXPECT_TRUE(ValidateTenantId("a.").ok());
}

TEST(TenantId, refuses_bad_ids_naming_the_rule) {
  const std::string bad[] = {"",     std::string(129, 'x'), ".hidden", "a/b", "a b",
                             "a\nb", "caf\xc3\xa9",         "{tag}",   ".."};
  for (const auto& id : bad) {
    const Status status = ValidateTenantId(id);
    EXPECT_EQ(status.code(), Code::kInvalidArgument) << id;
    EXPECT_NE(status.message().find("1 to 128 bytes of A-Z a-z 0-9 - _ ."), std::string::npos)
        << status.message();
  }
  // The embedded NUL is one of them.
  EXPECT_FALSE(ValidateTenantId(std::string("a\0b", 3)).ok());
}

TEST(TenantId, names_the_offending_byte) {
  const Status status = ValidateTenantId("ab c");
  EXPECT_NE(status.message().find("byte 2 is 0x20"), std::string::npos) << status.message();
  EXPECT_NE(ValidateTenantId(".x").message().find("starts with '.'"), std::string::npos);
}

TEST(Bucket, names_have_three_digits) {
  EXPECT_EQ(BucketName(0), "000");
  EXPECT_EQ(BucketName(17), "017");
  EXPECT_EQ(BucketName(255), "255");
  EXPECT_EQ(ParseBucketName("017"), 17);
  EXPECT_EQ(ParseBucketName("256"), std::nullopt);
  EXPECT_EQ(ParseBucketName("17"), std::nullopt);
  EXPECT_EQ(ParseBucketName("0x1"), std::nullopt);
}

TEST(Paths, follow_both_templates) {
  const Slot slot = KeySlot("acme");
  EXPECT_EQ(TenantPath("acme"), BucketName(slot / 64) + "/acme.db");
  EXPECT_EQ(SlotPath(0), "000/slot-00000.db");
  EXPECT_EQ(SlotPath(16383), "255/slot-16383.db");
  EXPECT_EQ(SlotPath(1000), "015/slot-01000.db");
  EXPECT_EQ(*MainPathForKey(FleetMode::kSlot, "{user1000}.x"), SlotPath(KeySlot("user1000")));
  EXPECT_EQ(*MainPathForKey(FleetMode::kTenant, "acme"), TenantPath("acme"));
  EXPECT_EQ(MainPathForKey(FleetMode::kTenant, "a b").status().code(), Code::kInvalidArgument);
}

TEST(ParseFleetPath, finds_the_main_file_and_each_sidecar) {
  const std::string main = TenantPath("acme");
  const Slot slot = KeySlot("acme");
  struct Case {
    std::string suffix;
    FileRole role;
  };
  const Case cases[] = {{"", FileRole::kMain},
                        {"-wal", FileRole::kWal},
                        {"-shm", FileRole::kShm},
                        {"-journal", FileRole::kJournal},
                        {"-mjA1B2C39D4", FileRole::kSuperJournal},
                        {"-mj0123ABCD", FileRole::kSuperJournal}};
  for (const auto& c : cases) {
    const auto file = ParseFleetPath(FleetMode::kTenant, main + c.suffix);
    ASSERT_TRUE(file.has_value()) << c.suffix;
    EXPECT_EQ(file->role, c.role) << c.suffix;
    EXPECT_EQ(file->slot, slot);
    EXPECT_EQ(file->key, "acme");
    EXPECT_EQ(file->main_path, main);
  }
}

TEST(ParseFleetPath, round_trips_slot_mode_paths) {
  for (Slot slot : {Slot{0}, Slot{63}, Slot{64}, Slot{9999}, kLastSlot}) {
    const auto file = ParseFleetPath(FleetMode::kSlot, SlotPath(slot) + "-wal");
    ASSERT_TRUE(file.has_value()) << slot;
    EXPECT_EQ(file->slot, slot);
    EXPECT_EQ(file->role, FileRole::kWal);
    EXPECT_EQ(file->main_path, SlotPath(slot));
  }
}

TEST(ParseFleetPath, a_tenant_may_look_like_a_sidecar) {
  // "x-wal.db" is the main file of tenant "x-wal", and "a.db.db" of "a.db".
  const auto wal_named = ParseFleetPath(FleetMode::kTenant, TenantPath("x-wal"));
  ASSERT_TRUE(wal_named.has_value());
  EXPECT_EQ(wal_named->role, FileRole::kMain);
  EXPECT_EQ(wal_named->key, "x-wal");
  const auto dotted = ParseFleetPath(FleetMode::kTenant, TenantPath("a.db") + "-journal");
  ASSERT_TRUE(dotted.has_value());
  EXPECT_EQ(dotted->key, "a.db");
  EXPECT_EQ(dotted->role, FileRole::kJournal);
}

TEST(ParseFleetPath, refuses_what_is_no_fleet_file) {
  const std::string main = TenantPath("acme");
  const std::string bucket = main.substr(0, 3);
  const std::string other_bucket = BucketName((std::stoi(bucket) + 1) % 256);
  const std::string bad[] = {
      "acme.db",                                   // no bucket
      other_bucket + "/acme.db",                   // the key's bucket is another
      main + "-wal2",                              // unknown suffix
      main + "-mj12",                              // too few super-journal digits
      main + "-mjGGGGGGGGG",                       // not hex
      bucket + "/acme.sqlite",                     // not .db
      bucket + "/.acme.db",                        // not a tenant id
      bucket + "/sub/acme.db",                     // too deep
      "999/acme.db",                               // no such bucket
      bucket + "/",                                // no name
      ".fleetfs/state",                            // reserved
  };
  for (const auto& path : bad) {
    EXPECT_EQ(ParseFleetPath(FleetMode::kTenant, path), std::nullopt) << path;
  }
  EXPECT_EQ(ParseFleetPath(FleetMode::kSlot, "000/slot-16384.db"), std::nullopt);
  EXPECT_EQ(ParseFleetPath(FleetMode::kSlot, "000/slot-1.db"), std::nullopt);
  EXPECT_EQ(ParseFleetPath(FleetMode::kSlot, "001/slot-00000.db"), std::nullopt);
  EXPECT_EQ(ParseFleetPath(FleetMode::kSlot, main), std::nullopt);
}

TEST(Mode, parses_and_names_the_rule) {
  EXPECT_EQ(*ParseMode("tenant"), FleetMode::kTenant);
  EXPECT_EQ(*ParseMode("slot"), FleetMode::kSlot);
  EXPECT_EQ(ParseMode("Slot").status().message(), "mode 'Slot': use 'tenant' or 'slot'");
}

}  // namespace
}  // namespace fleetfs
