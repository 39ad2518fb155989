#include "agent/tenant_cli.h"

#include <gtest/gtest.h>

namespace fleetfs::agent {
namespace {

TenantLine Acme() {
  TenantLine t;
  t.key = "acme";
  t.path = "017/acme.db";
  t.slot = 1111;
  t.size = 8192;
  t.wal_size = 4096;
  t.journal_mode = "wal";
  t.epoch_stamp = 3;
  t.served_epoch = 3;
  t.shipped_seq = 12;
  t.shipped_ms = 1764000000000;
  t.lag_s = 0.25;
  t.open_handles = 2;
  return t;
}

TEST(TenantLine, json_names_every_field) {
  const nlohmann::json j = TenantLineJson(Acme());
  EXPECT_EQ(j["key"], "acme");
  EXPECT_EQ(j["path"], "017/acme.db");
  EXPECT_EQ(j["slot"], 1111);
  EXPECT_EQ(j["size"], 8192);
  EXPECT_EQ(j["wal_size"], 4096);
  EXPECT_EQ(j["journal_mode"], "wal");
  EXPECT_EQ(j["epoch_stamp"], 3);
  EXPECT_EQ(j["served_epoch"], 3);
  EXPECT_EQ(j["stale"], false);
  EXPECT_EQ(j["shipped_seq"], 12);
  EXPECT_EQ(j["shipped_ms"], 1764000000000);
  EXPECT_DOUBLE_EQ(j["lag_s"].get<double>(), 0.25);
  EXPECT_EQ(j["open_handles"], 2);
}

TEST(TenantLine, unknown_values_are_null_and_a_missing_stamp_is_stale) {
  TenantLine t = Acme();
  t.epoch_stamp.reset();
  t.shipped_seq.reset();
  t.shipped_ms.reset();
  t.lag_s.reset();
  const nlohmann::json j = TenantLineJson(t);
  EXPECT_TRUE(j["epoch_stamp"].is_null());
  EXPECT_TRUE(j["shipped_seq"].is_null());
  EXPECT_TRUE(j["shipped_ms"].is_null());
  EXPECT_TRUE(j["lag_s"].is_null());
  EXPECT_EQ(j["stale"], true);
}

TEST(TenantLine, text_rows_line_up_under_the_header) {
  const std::string header = TenantTextHeader();
  const std::string row = TenantTextRow(Acme());
  EXPECT_EQ(header.find("SLOT"), row.find("1111"));
  EXPECT_EQ(header.find("JOURNAL"), row.find("wal"));
  EXPECT_NE(row.find("12K"), std::string::npos) << row;  // main file and -wal
  EXPECT_NE(row.find("0.2s"), std::string::npos) << row;
}

TEST(TenantLine, a_stamp_below_the_served_epoch_is_starred_in_text) {
  TenantLine t = Acme();
  t.epoch_stamp = 2;
  EXPECT_NE(TenantTextRow(t).find(" 2* "), std::string::npos) << TenantTextRow(t);
  t.epoch_stamp.reset();
  EXPECT_NE(TenantTextRow(t).find(" -* "), std::string::npos) << TenantTextRow(t);
}

TEST(TenantLine, odd_bytes_in_a_key_are_escaped_in_text) {
  TenantLine t = Acme();
  t.key = "a\nb";
  EXPECT_EQ(TenantTextRow(t).find('\n'), std::string::npos);
}

TEST(HumanBytes, sizes_read_as_powers_of_1024) {
  EXPECT_EQ(HumanBytes(0), "0");
  EXPECT_EQ(HumanBytes(1023), "1023");
  EXPECT_EQ(HumanBytes(1536), "1.5K");
  EXPECT_EQ(HumanBytes(20 << 20), "20M");
}

TEST(TenantLive, a_line_of_the_agent_parses) {
  auto live = ParseTenantLive(
      R"({"path":"017/acme.db","open_handles":3,"shipped_seq":7,"shipped_ms":5,)"
      R"("pending_since_ms":null,"unshippable":false})");
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->first, "017/acme.db");
  EXPECT_EQ(live->second.open_handles, 3u);
  EXPECT_EQ(live->second.shipped_seq, 7u);
  EXPECT_EQ(live->second.shipped_ms, 5);
  EXPECT_FALSE(live->second.pending_since_ms.has_value());
}

TEST(TenantLive, lines_that_are_not_such_objects_are_skipped) {
  EXPECT_FALSE(ParseTenantLive("").has_value());
  EXPECT_FALSE(ParseTenantLive("[1,2]").has_value());
  EXPECT_FALSE(ParseTenantLive(R"({"open_handles":1})").has_value());
  EXPECT_FALSE(ParseTenantLive(R"({"path":"x","open_handles":"many"})").has_value());
}

}  // namespace
}  // namespace fleetfs::agent
