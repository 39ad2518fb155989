#include <gtest/gtest.h>

#include "lease/lease_ttl.h"
#include "lease/owner_id.h"
#include "lease/slot_range.h"

namespace fleetfs::lease {
namespace {

TEST(SlotRange, parses_a_pair_and_a_single_slot) {
  EXPECT_EQ(SlotRange::Parse("0-8191")->ToString(), "0-8191");
  EXPECT_EQ(SlotRange::Parse(" 7 ")->ToString(), "7-7");
  EXPECT_EQ(SlotRange::Parse("16383")->ToString(), "16383-16383");
  EXPECT_EQ(SlotRange::Parse("0 - 16383")->ToString(), "0-16383");
  EXPECT_EQ(SlotRange::All().size(), 16384);
}

TEST(SlotRange, refuses_bad_input_naming_the_rule) {
  struct Case {
    const char* text;
    const char* why;
  };
  const Case cases[] = {{"", "empty"},
                        {"9-1", "the first slot is above the last"},
                        {"0-16384", "a slot is above 16383"},
                        {"a-b", "not a slot number"},
                        {"1-2-3", "not a slot number"},
                        {"-1", "not a slot number"},
                        {"1-", "not a slot number"},
                        {"0x10", "not a slot number"},
                        {"99999999999999", "not a slot number"}};
  for (const auto& c : cases) {
    const auto range = SlotRange::Parse(c.text);
    ASSERT_FALSE(range.ok()) << c.text;
    EXPECT_EQ(range.status().code(), Code::kInvalidArgument);
    const std::string& message = range.status().message();
    EXPECT_EQ(message.rfind("slot range '" + std::string(c.text) + "'", 0), 0u) << message;
    EXPECT_NE(message.find(c.why), std::string::npos) << message;
    EXPECT_NE(message.find("0 <= A <= B <= 16383"), std::string::npos) << message;
  }
}

TEST(SlotRange, overlap_shares_a_slot) {
  EXPECT_TRUE(SlotRange::Parse("0-10")->Overlaps(*SlotRange::Parse("10-20")));
  EXPECT_FALSE(SlotRange::Parse("0-9")->Overlaps(*SlotRange::Parse("10-20")));
}

TEST(RangeList, keeps_order_and_refuses_overlap_and_emptiness) {
  const auto ranges = ParseRangeList("100-199,0-99");
  ASSERT_TRUE(ranges.ok());
  EXPECT_EQ((*ranges)[0].ToString(), "100-199");
  EXPECT_EQ(ParseRangeList("0-9,9-20").status().message(),
            "slot ranges 0-9 and 9-20 overlap; a host's configured ranges must not share a slot");
  EXPECT_FALSE(ParseRangeList("0-9,").ok());
  EXPECT_FALSE(ParseRangeList("").ok());
  EXPECT_EQ(CheckConfiguredRanges({}).code(), Code::kInvalidArgument);
}

TEST(OwnerId, accepts_ordinary_ids) {
  EXPECT_TRUE(OwnerId::Make("host-a").ok());
  EXPECT_TRUE(OwnerId::Make("host a.example:7878").ok());
  EXPECT_TRUE(OwnerId::Make(std::string(128, 'x')).ok());
  EXPECT_TRUE(OwnerId::Make("h\xc3\xb6st").ok());
}

TEST(OwnerId, refuses_empty_long_control_and_padded_ids) {
  const std::pair<std::string, const char*> cases[] = {
      {"", "empty"},
      {std::string(129, 'x'), "is 129 bytes"},
      {"a\nb", "control character"},
      {"a\x7f", "control character"},
      {std::string("a\0b", 3), "control character"},
      {" host-a", "white space at an end"},
      {"host-a ", "white space at an end"},
      {"host-a\t", "control character"},
      {"host-\xff", "is not valid UTF-8"},
      {"host-\xc0\xaf", "is not valid UTF-8"},        // an overlong '/'
      {"host-\xed\xa0\x80", "is not valid UTF-8"},    // a surrogate
      {"host-\xe2\x82", "is not valid UTF-8"},         // cut short
      {"host-a\xc2\xa0", "white space at an end"},     // no-break space
      {"\xe2\x80\x83host-a", "white space at an end"},  // em space
      {"host-a\xe2\x80\x8b", "white space at an end"},  // zero-width space
      {"host\xc2\x85" "a", "control character"},       // next line (C1)
  };
  for (const auto& [id, why] : cases) {
    const auto owner = OwnerId::Make(id);
    ASSERT_FALSE(owner.ok()) << id;
    EXPECT_EQ(owner.status().code(), Code::kInvalidArgument);
    EXPECT_NE(owner.status().message().find(why), std::string::npos) << owner.status().message();
    EXPECT_NE(owner.status().message().find("1 to 128 bytes"), std::string::npos);
    EXPECT_EQ(owner.status().message().find('\n'), std::string::npos) << "one line";
  }
}

TEST(Ttl, parses_units_and_refuses_a_bare_number) {
  EXPECT_EQ(*ParseTtl("30s"), Millis(30'000));
  EXPECT_NE(ParseTtl("30").status().message().find("'30': a duration needs its unit; write 30s "
                                                   "or 30ms"),
            std::string::npos);
  EXPECT_EQ(*ParseTtl("3000ms"), Millis(3'000));
  EXPECT_EQ(*ParseTtl("2m"), Millis(120'000));
  EXPECT_EQ(*ParseTtl("1h"), Millis(3'600'000));
}

TEST(Ttl, refuses_out_of_bounds_and_garbage) {
  EXPECT_EQ(ParseTtl("2s").status().message(),
            "ttl 2s: a lease lasts 3s to 3600s (shorter cannot be renewed in time, longer stalls "
            "a failover)");
  EXPECT_EQ(ParseTtl("2999ms").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseTtl("3601s").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseTtl("2h").status().code(), Code::kInvalidArgument);
  for (const char* bad : {"", "s", "30x", "-5s", "1.5s", "30 s"}) {
    const auto ttl = ParseTtl(bad);
    ASSERT_FALSE(ttl.ok()) << bad;
    EXPECT_NE(ttl.status().message().find("not a duration"), std::string::npos) << bad;
  }
}

TEST(Duration, formats_for_people) {
  EXPECT_EQ(FormatDuration(Millis(30'000)), "30s");
  EXPECT_EQ(FormatDuration(Millis(250)), "250ms");
  EXPECT_EQ(FormatDuration(Millis(1'500)), "1.5s");
}

}  // namespace
}  // namespace fleetfs::lease
