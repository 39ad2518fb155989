#include "fleet/db_header.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fleetfs::db {
namespace {

namespace fs = std::filesystem;

// A database written by SQLite itself in `journal_mode`, with `rows` rows
// of 1 KiB; returns the main file's bytes (the -wal stays beside it).
std::vector<std::uint8_t> MakeDb(const fs::path& path, const std::string& journal_mode, int rows,
                                 int page_size = 4096) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string sql = "PRAGMA page_size=" + std::to_string(page_size) +
                          "; PRAGMA journal_mode=" + journal_mode +
                          "; PRAGMA wal_autocheckpoint=0; CREATE TABLE t(x);"
                          "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<" +
                          std::to_string(rows) + ") INSERT INTO t SELECT randomblob(1024) FROM n;";
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  std::ifstream in(path, std::ios::binary);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  // Closed after reading: the last connection's close would checkpoint the WAL.
  sqlite3_close(db);
  return bytes;
}

class DbHeaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fleetfs-dbh-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(DbHeaderTest, a_rollback_database_reads_its_page_size_and_count) {
  const auto bytes = MakeDb(dir_ / "r.db", "DELETE", 20, 1024);
  auto h = ParseHeader(bytes.data(), bytes.size());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->page_size, 1024u);
  EXPECT_FALSE(h->wal());
  EXPECT_EQ(PageCount(*h, bytes.size()), bytes.size() / 1024);
  EXPECT_EQ(JournalMode(h, bytes.size(), false), "rollback");
}

TEST_F(DbHeaderTest, a_wal_database_says_wal_even_before_a_checkpoint) {
  const auto bytes = MakeDb(dir_ / "w.db", "WAL", 5);
  auto h = ParseHeader(bytes.data(), bytes.size());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->page_size, 4096u);
  EXPECT_TRUE(h->wal());
  EXPECT_EQ(JournalMode(h, bytes.size(), true), "wal");
}

TEST_F(DbHeaderTest, a_page_size_of_65536_is_written_as_one) {
  const auto bytes = MakeDb(dir_ / "big.db", "DELETE", 1, 65536);
  auto h = ParseHeader(bytes.data(), bytes.size());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->page_size, 65536u);
}

TEST(DbHeader, bytes_that_are_no_database_read_as_no_header) {
  std::vector<std::uint8_t> junk(100, 'x');
  EXPECT_FALSE(ParseHeader(junk.data(), junk.size()).has_value());
  EXPECT_FALSE(ParseHeader(junk.data(), 10).has_value());
  EXPECT_FALSE(ParseHeader(nullptr, 0).has_value());
  EXPECT_EQ(JournalMode(std::nullopt, junk.size(), false), "not-sqlite");
  EXPECT_EQ(JournalMode(std::nullopt, 0, false), "empty");
}

TEST(DbHeader, an_impossible_page_size_is_refused) {
  std::vector<std::uint8_t> h(100, 0);
  std::memcpy(h.data(), "SQLite format 3", 16);
  for (std::uint32_t size : {0u, 3u, 256u, 1000u, 0xffffu}) {
    h[16] = static_cast<std::uint8_t>(size >> 8);
    h[17] = static_cast<std::uint8_t>(size);
    EXPECT_FALSE(ParseHeader(h.data(), h.size()).has_value()) << size;
  }
}

TEST(DbHeader, a_stale_in_header_size_is_not_believed) {
  std::vector<std::uint8_t> h(100, 0);
  std::memcpy(h.data(), "SQLite format 3", 16);
  h[16] = 0x10;  // 4096
  h[31] = 7;     // 7 pages in the header
  h[27] = 2;     // change counter 2
  h[95] = 1;     // valid for version 1: stale
  auto parsed = ParseHeader(h.data(), h.size());
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(PageCount(*parsed, 3 * 4096), 3u);
  h[95] = 2;
  EXPECT_EQ(PageCount(*ParseHeader(h.data(), h.size()), 8 * 4096), 7u);
}

TEST(DbHeader, an_in_header_size_beyond_the_file_is_not_believed) {
  std::vector<std::uint8_t> h(100, 0);
  std::memcpy(h.data(), "SQLite format 3", 16);
  h[16] = 0x10;  // 4096
  h[28] = 0xff;  // about 4 billion pages in the header
  h[27] = 2;
  h[95] = 2;     // valid for this version
  auto parsed = ParseHeader(h.data(), h.size());
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(PageCount(*parsed, 3 * 4096), 3u);
}

}  // namespace
}  // namespace fleetfs::db
