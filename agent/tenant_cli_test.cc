#include "agent/tenant_cli.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fleet/layout.h"

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

TEST(TenantLive, an_unshippable_tenant_is_shown_as_not_replicated) {
  auto live = ParseTenantLive(
      R"({"path":"017/acme.db","open_handles":1,"shipped_seq":null,"unshippable":true})");
  ASSERT_TRUE(live.has_value());
  EXPECT_TRUE(live->second.unshippable);
  TenantLine t = Acme();
  t.unshippable = true;
  t.shipped_seq.reset();
  t.shipped_ms.reset();
  EXPECT_TRUE(TenantLineJson(t)["unshippable"].get<bool>());
  EXPECT_FALSE(TenantLineJson(Acme())["unshippable"].get<bool>());
  EXPECT_NE(TenantTextRow(t).find("not replicated"), std::string::npos) << TenantTextRow(t);
}

// A directory that looks like a mount with replication on and one tenant,
// but whose agent gives no tenants-live.jsonl.
class FakeMount : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fleetfs-tcli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    mount_ = dir_ / "mnt";
    backing_ = dir_ / "backing";
    std::filesystem::create_directories(mount_ / ".fleetfs");
    path_ = TenantPath("acme");
    std::filesystem::create_directories((backing_ / path_).parent_path());
    std::ofstream(backing_ / path_) << "SQLite format 3";
    std::ofstream(mount_ / ".fleetfs" / "status.json")
        << R"({"owner":"h1","store":"mem://","backing":")" << backing_.string()
        << R"(","mode":"tenant","now_ms":1,"ranges":[{"range":"0-16383","serving":true,)"
        << R"("epoch":3,"lease_left_ms":5000,"state":"serving"}],)"
        << R"("replication":{"replica":"file:///nowhere"}})";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_, mount_, backing_;
  std::string path_;
};

TEST_F(FakeMount, ls_without_the_live_file_says_so_and_shows_lag_and_opens_unknown) {
  for (bool json : {true, false}) {
    std::ostringstream out, err;
    EXPECT_EQ(RunLs(mount_.string(), json, out, err), 0);
    EXPECT_NE(err.str().find("tenants-live.jsonl"), std::string::npos) << err.str();
    EXPECT_EQ(err.str().find("tenants-live.jsonl"), err.str().rfind("tenants-live.jsonl"))
        << "warned more than once: " << err.str();
    if (json) {
      const auto j = nlohmann::json::parse(out.str());
      EXPECT_TRUE(j["lag_s"].is_null()) << out.str();
      EXPECT_TRUE(j["open_handles"].is_null()) << out.str();
    } else {
      std::istringstream lines(out.str());
      std::string header, row;
      std::getline(lines, header);
      std::getline(lines, row);
      EXPECT_EQ(row.substr(row.size() - 1), "?") << row;
      EXPECT_EQ(row.find("0.0s"), std::string::npos) << row;
    }
  }
}

TEST_F(FakeMount, inspect_without_the_live_file_says_so_and_shows_lag_and_opens_unknown) {
  InspectArgs args;
  args.mount = mount_.string();
  args.tenant = "acme";
  args.json = true;
  std::ostringstream out, err;
  RunInspect(args, out, err);
  EXPECT_NE(err.str().find("tenants-live.jsonl"), std::string::npos) << err.str();
  const auto j = nlohmann::json::parse(out.str());
  EXPECT_TRUE(j["lag_s"].is_null()) << out.str();
  EXPECT_TRUE(j["open_handles"].is_null()) << out.str();
  args.json = false;
  std::ostringstream text, err2;
  RunInspect(args, text, err2);
  EXPECT_NE(text.str().find("unknown"), std::string::npos) << text.str();
}

TEST_F(FakeMount, inspect_reaches_an_s3_replica_with_the_agents_endpoint_settings) {
  std::ofstream(mount_ / ".fleetfs" / "status.json", std::ios::trunc)
      << R"({"owner":"h1","store":"mem://","backing":")" << backing_.string()
      << R"(","mode":"tenant","now_ms":1,"ranges":[{"range":"0-16383","serving":true,)"
      << R"("epoch":3,"lease_left_ms":5000,"state":"serving"}],)"
      << R"("replication":{"replica":"s3://bucket/prefix","replica_endpoint":"ftp://agents.example",)"
      << R"("replica_region":"eu-west-1","replica_path_style":true}})";
  InspectArgs args;
  args.mount = mount_.string();
  args.tenant = "acme";
  args.json = true;
  std::ostringstream out, err;
  RunInspect(args, out, err);
  const auto j = nlohmann::json::parse(out.str());
  // The agent's endpoint is used (and refused here for its scheme, before any request).
  ASSERT_TRUE(j["replica"].contains("error")) << out.str();
  EXPECT_NE(j["replica"]["error"].get<std::string>().find("ftp://agents.example"),
            std::string::npos)
      << out.str();
}

}  // namespace
}  // namespace fleetfs::agent
