#include "fleet/wal_format.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fleet/unique_fd.h"

namespace fleetfs::wal {
namespace {

namespace fs = std::filesystem;

// A WAL database written by SQLite itself, with automatic checkpoints off so
// the log keeps every frame.
class WalFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fleetfs-wal-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "t.db").string();
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db_), SQLITE_OK);
    Exec("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t(x)");
  }
  void TearDown() override {
    sqlite3_close(db_);
    fs::remove_all(dir_);
  }
  void Exec(const std::string& sql) {
    char* err = nullptr;
    ASSERT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
  }
  void Insert(int from, int to) {
    for (int i = from; i < to; ++i) Exec("INSERT INTO t VALUES (" + std::to_string(i) + ")");
  }
  UniqueFd OpenWal() { return UniqueFd(::open((path_ + "-wal").c_str(), O_RDONLY)); }
  // Rebuilds the database from the main file plus `txns`, and counts its rows.
  int RowsAfter(const std::vector<CommittedTxn>& txns) {
    std::string copy = (dir_ / "rebuilt.db").string();
    fs::copy_file(path_, copy, fs::copy_options::overwrite_existing);
    {
      UniqueFd fd(::open(copy.c_str(), O_RDWR));
      for (const auto& t : txns) {
        for (const auto& [pgno, data] : t.pages) {
          EXPECT_EQ(::pwrite(fd.get(), data.data(), data.size(),
                             static_cast<off_t>(pgno - 1) * t.page_size),
                    static_cast<ssize_t>(data.size()));
        }
        EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(t.db_pages) * t.page_size), 0);
      }
    }
    // The rebuilt file says WAL mode in its header; read it without its log.
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(("file:" + copy + "?immutable=1").c_str(), &db,
                              SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr),
              SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    int n = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM t", -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      n = sqlite3_column_int(stmt, 0);
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return n;
  }

  fs::path dir_;
  std::string path_;
  sqlite3* db_ = nullptr;
};

TEST_F(WalFile, committed_transactions_rebuild_what_sqlite_committed) {
  Insert(0, 10);
  UniqueFd fd = OpenWal();
  WalCursor cursor;
  auto read = ReadCommitted(fd.get(), cursor);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->txns.size(), 11u);  // the CREATE TABLE and ten inserts
  EXPECT_FALSE(read->restarted);
  EXPECT_EQ(RowsAfter(read->txns), 10);
}

TEST_F(WalFile, reading_resumes_at_the_cursor) {
  Insert(0, 3);
  UniqueFd fd = OpenWal();
  WalCursor cursor;
  ASSERT_EQ(ReadCommitted(fd.get(), cursor)->txns.size(), 4u);
  EXPECT_TRUE(ReadCommitted(fd.get(), cursor)->txns.empty());
  Insert(3, 5);
  auto more = ReadCommitted(fd.get(), cursor);
  EXPECT_EQ(more->txns.size(), 2u);
}

TEST_F(WalFile, a_broken_checksum_ends_the_committed_part) {
  Insert(0, 5);
  UniqueFd fd = OpenWal();
  WalCursor probe;
  auto all = ReadCommitted(fd.get(), probe);
  ASSERT_EQ(all->txns.size(), 6u);
  // Flip a byte inside the last transaction's page: its chain no longer holds.
  std::uint64_t last = all->txns.back().commit_frame_offset;
  UniqueFd rw(::open((path_ + "-wal").c_str(), O_RDWR));
  char byte;
  ASSERT_EQ(::pread(rw.get(), &byte, 1, static_cast<off_t>(last + kFrameHeaderSize + 100)), 1);
  byte ^= 0x5a;
  ASSERT_EQ(::pwrite(rw.get(), &byte, 1, static_cast<off_t>(last + kFrameHeaderSize + 100)), 1);
  WalCursor cursor;
  auto read = ReadCommitted(fd.get(), cursor);
  EXPECT_EQ(read->txns.size(), 5u);
  EXPECT_EQ(cursor.offset, all->txns[4].commit_frame_offset + kFrameHeaderSize +
                               all->txns[4].page_size);
}

TEST_F(WalFile, a_transaction_cut_short_is_not_committed) {
  Insert(0, 5);
  UniqueFd fd = OpenWal();
  WalCursor probe;
  auto all = ReadCommitted(fd.get(), probe);
  std::uint64_t last = all->txns.back().commit_frame_offset;
  // The log ends in the middle of the last commit frame (a crash mid-write).
  ASSERT_EQ(::truncate((path_ + "-wal").c_str(), static_cast<off_t>(last + 1000)), 0);
  WalCursor cursor;
  EXPECT_EQ(ReadCommitted(fd.get(), cursor)->txns.size(), all->txns.size() - 1);
}

TEST_F(WalFile, a_restart_is_seen_by_its_header_and_old_frames_are_not_read_again) {
  Insert(0, 20);
  UniqueFd fd = OpenWal();
  WalCursor cursor;
  ASSERT_EQ(ReadCommitted(fd.get(), cursor)->txns.size(), 21u);
  Exec("PRAGMA wal_checkpoint(PASSIVE)");
  Insert(20, 21);  // the next writer restarts the log at offset 0
  auto read = ReadCommitted(fd.get(), cursor);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read->restarted);
  EXPECT_EQ(read->txns.size(), 1u);  // not the 21 stale frames beyond the new tail
  // The file did not shrink: a size check would not have seen the restart.
  EXPECT_GT(fs::file_size(path_ + "-wal"), cursor.offset);
}

TEST_F(WalFile, only_the_frames_of_the_current_log_are_counted_after_a_restart) {
  Insert(0, 20);
  UniqueFd fd = OpenWal();
  auto before = CountFrames(fd.get(), 1000);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->valid, 22u);  // page 1 and the table's root, then one frame a row
  EXPECT_EQ(before->committed, 22u);
  EXPECT_FALSE(before->capped);
  Exec("PRAGMA wal_checkpoint(RESTART)");
  Insert(20, 21);  // reuses the file from its start, untruncated
  const auto size = fs::file_size(path_ + "-wal");
  auto after = CountFrames(fd.get(), 1000);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->valid, 1u);
  EXPECT_EQ(after->committed, 1u);
  EXPECT_GT((size - kHeaderSize) / (kFrameHeaderSize + 4096), 1u) << "the file kept old frames";
}

TEST_F(WalFile, counting_frames_stops_at_its_bound) {
  Insert(0, 20);
  UniqueFd fd = OpenWal();
  auto counted = CountFrames(fd.get(), 5);
  ASSERT_TRUE(counted.ok());
  EXPECT_EQ(counted->valid, 5u);
  EXPECT_TRUE(counted->capped);
  UniqueFd none(::open((dir_ / "absent-wal").c_str(), O_RDONLY | O_CREAT, 0600));
  auto empty = CountFrames(none.get(), 5);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->valid, 0u);
  EXPECT_FALSE(empty->header_valid);
}

TEST_F(WalFile, a_transaction_larger_than_the_bound_comes_back_without_its_pages) {
  Insert(0, 2);
  // One transaction of about 200 pages, between two small ones.
  Exec("BEGIN");
  for (int i = 0; i < 200; ++i) Exec("INSERT INTO t VALUES (randomblob(4000))");
  Exec("COMMIT");
  Insert(2, 3);
  UniqueFd fd = OpenWal();
  WalCursor cursor;
  auto read = ReadCommitted(fd.get(), cursor, 0, 64 * 4096);
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_EQ(read->txns.size(), 5u);  // the CREATE TABLE, two inserts, the large one, one insert
  EXPECT_FALSE(read->txns[2].oversized);
  EXPECT_TRUE(read->txns[3].oversized) << "a transaction above the bound was held whole";
  EXPECT_TRUE(read->txns[3].pages.empty());
  EXPECT_GT(read->txns[3].db_pages, 200u);
  EXPECT_FALSE(read->txns[4].oversized) << "the transaction after the large one was lost";
  EXPECT_FALSE(read->txns[4].pages.empty());
  EXPECT_TRUE(ReadCommitted(fd.get(), cursor)->txns.empty()) << "the cursor stopped before the end";
}

TEST_F(WalFile, the_index_of_committed_pages_rebuilds_what_sqlite_committed) {
  Insert(0, 10);
  Exec("BEGIN");
  for (int i = 0; i < 100; ++i) Exec("INSERT INTO t VALUES (randomblob(4000))");
  Exec("COMMIT");
  UniqueFd fd = OpenWal();
  auto index = IndexCommitted(fd.get());
  ASSERT_TRUE(index.ok()) << index.status().message();
  ASSERT_NE(index->page_size, 0u);
  // The main file with each indexed page read from the log laid over it.
  std::vector<CommittedTxn> one(1);
  one[0].page_size = index->page_size;
  one[0].db_pages = index->db_pages;
  for (const auto& [pgno, at] : index->pages) {
    std::string page(index->page_size, '\0');
    ASSERT_EQ(::pread(fd.get(), page.data(), page.size(), static_cast<off_t>(at)),
              static_cast<ssize_t>(page.size()));
    one[0].pages.emplace_back(pgno, std::move(page));
  }
  EXPECT_EQ(RowsAfter(one), 110);
}

TEST_F(WalFile, the_index_leaves_out_a_transaction_not_yet_committed) {
  Insert(0, 3);
  UniqueFd fd = OpenWal();
  ASSERT_TRUE(IndexCommitted(fd.get()).ok());
  // The log's end cut back into the last transaction's frames.
  const auto size = fs::file_size(path_ + "-wal");
  fs::resize_file(path_ + "-wal", size - 100);
  auto cut = IndexCommitted(fd.get());
  ASSERT_TRUE(cut.ok());
  std::vector<CommittedTxn> one(1);
  one[0].page_size = cut->page_size;
  one[0].db_pages = cut->db_pages;
  for (const auto& [pgno, at] : cut->pages) {
    std::string page(cut->page_size, '\0');
    ASSERT_EQ(::pread(fd.get(), page.data(), page.size(), static_cast<off_t>(at)),
              static_cast<ssize_t>(page.size()));
    one[0].pages.emplace_back(pgno, std::move(page));
  }
  EXPECT_EQ(RowsAfter(one), 2) << "a cut transaction was indexed as committed";
}

TEST_F(WalFile, reading_in_takes_of_max_bytes_gives_every_commit_once) {
  Insert(0, 40);
  UniqueFd fd = OpenWal();
  WalCursor cursor;
  std::vector<CommittedTxn> all;
  int reads = 0;
  for (bool more = true; more; ++reads) {
    auto read = ReadCommitted(fd.get(), cursor, 4 * 4096);
    ASSERT_TRUE(read.ok()) << read.status().message();
    more = read->more;
    for (auto& t : read->txns) all.push_back(std::move(t));
    ASSERT_LT(reads, 100);
  }
  EXPECT_GT(reads, 3) << "the bound did not split the read";
  EXPECT_EQ(all.size(), 41u);
  EXPECT_EQ(RowsAfter(all), 40);
}

// A log written by hand: the header, then frames chained from it.
std::string HandHeader(std::uint32_t page_size, std::uint32_t salt1, std::uint32_t salt2) {
  std::uint8_t h[kHeaderSize] = {};
  auto be32 = [](std::uint8_t* p, std::uint32_t v) {
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
  };
  be32(h, kMagicLittleEndian);
  be32(h + 4, 3007000);
  be32(h + 8, page_size);
  be32(h + 16, salt1);
  be32(h + 20, salt2);
  const Checksum sum = Continue({}, false, h, 24);
  be32(h + 24, sum.s0);
  be32(h + 28, sum.s1);
  return std::string(reinterpret_cast<char*>(h), sizeof h);
}

std::string HandFrame(Checksum& chain, std::uint32_t pgno, std::uint32_t commit_pages,
                      std::uint32_t salt1, std::uint32_t salt2, const std::string& page) {
  std::uint8_t f[kFrameHeaderSize] = {};
  auto be32 = [](std::uint8_t* p, std::uint32_t v) {
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
  };
  be32(f, pgno);
  be32(f + 4, commit_pages);
  be32(f + 8, salt1);
  be32(f + 12, salt2);
  chain = Continue(chain, false, f, 8);
  chain = Continue(chain, false, reinterpret_cast<const std::uint8_t*>(page.data()), page.size());
  be32(f + 16, chain.s0);
  be32(f + 20, chain.s1);
  return std::string(reinterpret_cast<char*>(f), sizeof f) + page;
}

// Review: the header rewritten with its salts kept and a smaller page size,
// and frames of that size chained on from the cursor, made a page read as
// the old page size: past its frame, into another tenant's bytes.
TEST_F(WalFile, a_header_with_the_same_salts_and_another_page_size_is_a_new_log) {
  const std::string wal = (dir_ / "hand-wal").string();
  const std::uint32_t s1 = 7, s2 = 9;
  std::string bytes = HandHeader(4096, s1, s2);
  WalCursor cursor;
  // Frames chain on from the header's own checksum.
  Checksum chain = Continue({}, false, reinterpret_cast<const std::uint8_t*>(bytes.data()), 24);
  for (std::uint32_t p = 1; p <= 2; ++p) {
    bytes += HandFrame(chain, p, p == 2 ? 2 : 0, s1, s2, std::string(4096, 'a'));
  }
  std::ofstream(wal, std::ios::binary) << bytes;
  {
    UniqueFd fd(::open(wal.c_str(), O_RDONLY));
    auto read = ReadCommitted(fd.get(), cursor);
    ASSERT_TRUE(read.ok());
    ASSERT_EQ(read->txns.size(), 1u);
  }
  // Same salts, 512-byte pages, and one commit chained on at the cursor.
  std::string rewritten = HandHeader(512, s1, s2) + bytes.substr(kHeaderSize);
  Checksum on = cursor.chain;
  rewritten += HandFrame(on, 1, 1, s1, s2, std::string(512, 'b'));
  std::ofstream(wal, std::ios::binary | std::ios::trunc) << rewritten;
  UniqueFd fd(::open(wal.c_str(), O_RDONLY));
  auto read = ReadCommitted(fd.get(), cursor);
  ASSERT_TRUE(read.ok());
  for (const CommittedTxn& t : read->txns) {
    EXPECT_EQ(t.page_size, 512u) << "a page was read with the old header's size";
    for (const auto& [pgno, data] : t.pages) EXPECT_EQ(data.size(), 512u);
  }
}

TEST(WalHeader, a_zeroed_or_torn_header_is_not_a_log) {
  std::uint8_t zero[kHeaderSize] = {};
  EXPECT_FALSE(ParseHeader(zero, sizeof zero));
  EXPECT_FALSE(ParseHeader(zero, 10));
}

}  // namespace
}  // namespace fleetfs::wal
