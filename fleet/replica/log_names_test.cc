#include "fleet/replica/log_names.h"

#include <gtest/gtest.h>

namespace fleetfs::replica {
namespace {

TEST(LogNames, a_keys_log_directory_is_its_main_files_path) {
  FleetFile main{.slot = 11264, .role = FileRole::kMain, .key = "acme",
                 .main_path = "176/acme.db"};
  EXPECT_EQ(LogDir(main), "176/acme.db");
}

TEST(LogNames, an_objects_name_is_its_sequence_in_twenty_digits_and_nothing_else) {
  EXPECT_EQ(LogObjectName(0), "00000000000000000000");
  EXPECT_EQ(LogObjectName(42), "00000000000000000042");
  EXPECT_EQ(LogObjectName(UINT64_MAX), "18446744073709551615");
  EXPECT_EQ(LogObjectPath("176/acme.db", 7), "176/acme.db/00000000000000000007");
}

TEST(LogNames, every_sequence_parses_back_from_its_name) {
  for (std::uint64_t seq : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{99999},
                            std::uint64_t{1} << 40, UINT64_MAX}) {
    EXPECT_EQ(ParseLogObjectName(LogObjectName(seq)), seq);
  }
}

TEST(LogNames, names_that_are_not_twenty_digits_or_past_64_bits_are_no_sequence) {
  EXPECT_EQ(ParseLogObjectName("42"), std::nullopt);
  EXPECT_EQ(ParseLogObjectName("000000000000000000042"), std::nullopt);  // 21 digits
  EXPECT_EQ(ParseLogObjectName("0000000000000000004x"), std::nullopt);
  EXPECT_EQ(ParseLogObjectName("+0000000000000000042"), std::nullopt);
  EXPECT_EQ(ParseLogObjectName("18446744073709551616"), std::nullopt);  // 2^64
  EXPECT_EQ(ParseLogObjectName("99999999999999999999"), std::nullopt);
  EXPECT_EQ(ParseLogObjectName("0000000000.snap"), std::nullopt);
  EXPECT_EQ(ParseLogObjectName(""), std::nullopt);
}

TEST(LogNames, a_listing_gives_its_sequences_in_ascending_order) {
  auto seqs = ParseLogListing({LogObjectName(10), LogObjectName(2), LogObjectName(0),
                               LogObjectName(11)});
  ASSERT_TRUE(seqs.ok()) << seqs.status().message();
  EXPECT_EQ(*seqs, (std::vector<std::uint64_t>{0, 2, 10, 11}));
}

TEST(LogNames, an_empty_listing_is_an_empty_log) {
  auto seqs = ParseLogListing({});
  ASSERT_TRUE(seqs.ok());
  EXPECT_TRUE(seqs->empty());
}

TEST(LogNames, the_file_destinations_temporary_files_are_skipped) {
  auto seqs = ParseLogListing({".tmp-4242-7-" + LogObjectName(3), LogObjectName(2)});
  ASSERT_TRUE(seqs.ok()) << seqs.status().message();
  EXPECT_EQ(*seqs, (std::vector<std::uint64_t>{2}));
}

TEST(LogNames, a_name_that_is_no_log_object_is_refused_by_name) {
  auto seqs = ParseLogListing({LogObjectName(0), "notes.txt"});
  ASSERT_FALSE(seqs.ok());
  EXPECT_EQ(seqs.status().code(), Code::kDataLoss);
  EXPECT_NE(seqs.status().message().find("'notes.txt'"), std::string::npos)
      << seqs.status().message();
}

TEST(LogNames, a_refused_name_is_escaped_in_the_message) {
  auto seqs = ParseLogListing({"bad\nname"});
  ASSERT_FALSE(seqs.ok());
  EXPECT_NE(seqs.status().message().find("'bad\\x0aname'"), std::string::npos)
      << seqs.status().message();
}

TEST(LogNames, an_object_of_the_old_layout_inside_a_log_is_no_log_object) {
  auto seqs = ParseLogListing({"0000000003.seg"});
  ASSERT_FALSE(seqs.ok());
  EXPECT_EQ(seqs.status().code(), Code::kDataLoss);
}

TEST(LogNames, a_generation_directory_of_the_old_layout_says_what_to_do) {
  auto seqs = ParseLogListing({"notes.txt", "e00000000000000000007-g00000002"});
  ASSERT_FALSE(seqs.ok());
  EXPECT_EQ(seqs.status().code(), Code::kFailedPrecondition);
  const std::string& m = seqs.status().message();
  EXPECT_NE(m.find("'e00000000000000000007-g00000002'"), std::string::npos) << m;
  EXPECT_NE(m.find("old replica layout"), std::string::npos) << m;
  EXPECT_NE(m.find("older fleetfs"), std::string::npos) << m;
  EXPECT_NE(m.find("new replica directory"), std::string::npos) << m;
}

TEST(LogNames, only_the_exact_old_generation_shape_counts_as_the_old_layout) {
  EXPECT_TRUE(IsOldGenerationName("e00000000000000000007-g00000002"));
  EXPECT_FALSE(IsOldGenerationName("e0000000000000000007-g00000002"));   // 19 digits
  EXPECT_FALSE(IsOldGenerationName("e00000000000000000007-g0000002"));   // 7 digits
  EXPECT_FALSE(IsOldGenerationName("e00000000000000000007_g00000002"));
  EXPECT_FALSE(IsOldGenerationName("x00000000000000000007-g00000002"));
  EXPECT_FALSE(IsOldGenerationName(LogObjectName(7)));
}

}  // namespace
}  // namespace fleetfs::replica
